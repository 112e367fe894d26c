// Framework-agnostic, non-owning tensor views: what every entry point of the library takes.
// This header, errors.hpp and mqa_logits.hpp compile as C++17 (engines often build with it);
// formats.hpp, the host codecs, needs C++20.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace mqa_logits {

// Element types the library reads or writes. kUInt8 / kInt8 carry packed bytes (MXFP4 values,
// fused paged KV-cache blocks); the library treats both the same.
enum class DType : std::uint8_t { kFloat8E4M3, kUInt8, kInt8, kInt32, kFloat32, kBFloat16 };

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA device ordinal; ignored for the CPU
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline constexpr int kMaxRank = 4;

// A strided view of memory the caller owns. Strides count elements, not bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};
  Device device{};

  // A row-major contiguous view. `data` may point to const memory where the view is an input:
  // the library writes only through the logits and the metadata functions' `out`.
  static TensorView contiguous(const void* data, DType dtype,
                               std::initializer_list<std::int64_t> shape, Device device = {});

  std::int64_t numel() const;
  bool is_contiguous() const;  // row-major, dense (size-1 dims may have any stride)
};

// Quantized operand: element values and, depending on the format, their scales.
//   FP8:    values float8_e4m3 and no scales (queries) / fp32 per-token scales (keys)
//   MXFP8:  values float8_e4m3, int32 packed UE8M0 scales
//   MXFP4:  values uint8/int8 (two e2m1 per byte), int32 packed UE8M0 scales
struct QuantizedTensor {
  TensorView values;
  std::optional<TensorView> scales;
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* device_name(DeviceType type);

}  // namespace mqa_logits
