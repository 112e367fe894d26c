// Shared pieces of the GPU tests: skipping without a GPU, device buffers, uploading workloads,
// poisoned outputs, and the comparison of GPU logits against the CPU backend.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"
#include "support/workload.hpp"

namespace mqa_logits::gpu_test {

// For the fixtures' SetUp: the test is skipped (visibly) without an sm_90 GPU, and fails instead
// where MQA_LOGITS_REQUIRE_GPU=1 (scripts/gpu-check sets it), so that a broken driver or runtime
// on a GPU machine cannot pass as skipped tests.
inline void skip_without_gpu() {
  if (cuda_backend_available()) return;
  const char* required = std::getenv("MQA_LOGITS_REQUIRE_GPU");
  if (required != nullptr && std::string(required) == "1") {
    FAIL() << "MQA_LOGITS_REQUIRE_GPU=1, but no sm_90 GPU is usable (driver, runtime, device?)";
  }
  GTEST_SKIP() << "no sm_90 GPU: GPU test skipped";
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

template <typename Param>
class GpuParamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

inline constexpr Device kGpu{DeviceType::kCUDA, 0};

// Owning device allocation.
class DeviceBuffer {
 public:
  // 0xff bytes: NaN in fp32 and bf16, so an element the kernel fails to write stays NaN.
  static constexpr unsigned char kPoisonByte = 0xff;

  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  void poison() { check_cuda(cudaMemset(data_, kPoisonByte, bytes_), "cudaMemset"); }
  // Whether `b` is poison()'s byte.
  static bool poisoned(std::byte b) { return b == std::byte{kPoisonByte}; }
  // Whether every byte still holds poison()'s value: nothing was written since.
  bool untouched() const {
    const auto host = download();
    return std::all_of(host.begin(), host.end(), poisoned);
  }

  std::vector<std::byte> download() const { return download(0, bytes_); }
  // Bytes [offset, offset + count) only (outputs too large to copy whole).
  std::vector<std::byte> download(std::size_t offset, std::size_t count) const {
    std::vector<std::byte> host(count);
    if (count > 0) {
      check_cuda(cudaMemcpy(host.data(), static_cast<const std::byte*>(data_) + offset, count,
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy D2H");
    }
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// An output of `bytes` between two poisoned guard bands: whatever a kernel writes outside the
// output lands in a guard (compute-sanitizer's memcheck sees writes farther away).
class GuardedOutput {
 public:
  static constexpr std::size_t kGuardBytes = std::size_t{1} << 20;

  explicit GuardedOutput(std::size_t bytes) : buffer_(bytes + 2 * kGuardBytes) {
    buffer_.poison();
  }
  void* data() const { return static_cast<std::byte*>(buffer_.data()) + kGuardBytes; }
  // Whether both guards still hold only poison.
  bool guards_untouched() const {
    const auto host = buffer_.download();
    return std::all_of(host.begin(), host.begin() + kGuardBytes, DeviceBuffer::poisoned) &&
           std::all_of(host.end() - kGuardBytes, host.end(), DeviceBuffer::poisoned);
  }

 private:
  DeviceBuffer buffer_;
};

// Schedule metadata no metadata function gives, for `workers` workers: every row a pair drawn
// from values around and past any count (negative, 0, the unit count and its neighbours, twice
// it, INT32 extremes) or at random.
inline std::vector<std::int32_t> garbage_metadata(int workers, std::int32_t units,
                                                  std::uint64_t seed) {
  const std::int32_t picks[] = {std::numeric_limits<std::int32_t>::min(), -7, -2, -1, 0, 1, 3,
                                units - 1, units, units + 1, 2 * units + 1,
                                std::numeric_limits<std::int32_t>::max()};
  std::mt19937_64 gen(seed);
  std::vector<std::int32_t> meta(static_cast<std::size_t>(workers + 1) * 2);
  for (auto& value : meta) {
    const auto pick = gen() % (std::size(picks) + 2);
    value = pick < std::size(picks) ? picks[pick] : static_cast<std::int32_t>(gen());
  }
  return meta;
}

// A device copy of `values` (no allocation when empty).
template <typename T>
DeviceBuffer upload_values(const std::vector<T>& values) {
  DeviceBuffer buffer(values.size() * sizeof(T));
  if (!values.empty()) {
    check_cuda(cudaMemcpy(buffer.data(), values.data(), buffer.bytes(), cudaMemcpyHostToDevice),
               "cudaMemcpy H2D");
  }
  return buffer;
}

// Device copies of every input buffer of a workload, and their pointers in slot order.
struct DeviceInputs {
  std::vector<DeviceBuffer> buffers;
  std::vector<void*> pointers;
};

inline DeviceInputs upload(const std::vector<support::HostBuffer>& host) {
  DeviceInputs device;
  for (const auto& buffer : host) {
    DeviceBuffer copy(buffer.bytes.size());
    if (!buffer.bytes.empty()) {
      check_cuda(cudaMemcpy(copy.data(), buffer.bytes.data(), buffer.bytes.size(), cudaMemcpyHostToDevice),
            "cudaMemcpy H2D");
    }
    device.pointers.push_back(copy.data());
    device.buffers.push_back(std::move(copy));
  }
  return device;
}

inline std::vector<std::int64_t> every_row(std::int64_t rows) { return support::all_rows(rows); }

// The largest |GPU - CPU backend| allowed for one in-window logit: 2^-7 of the root mean square
// of all in-window logits, plus a bf16 ulp of the logit where the output is bf16 (both round).
// The benchmark measures the kernels' fp32 logits at a diff of 2e-9 to 9e-9 from the float64
// oracle (the tensor cores' accumulation of FP8 products), an rms error of ~1.3e-4 of the
// logits' rms: the bound is ~60 times that. A logit lost, zeroed or of the wrong sign fails
// unless it lies within 2^-7 of the rms from zero, where the diff over millions of elements
// would not see a few of them.
inline double element_bound(double rms, double cpu, DType dtype) {
  return std::ldexp(rms, -7) + std::abs(cpu) * (dtype == DType::kBFloat16 ? 0x1p-7 : 0x1p-22);
}

// Compares GPU logits with the CPU backend's on every row: with clean_logits the -inf pattern
// must be identical; every in-window element must be finite and within element_bound of the CPU
// backend's; the contract's diff between the two over in-window elements must be below the
// quantized-oracle bound. Also checks the GPU output against the float64 oracle on a sample of
// rows.
template <typename Workload>
void expect_matches_cpu(const Workload& workload, const std::vector<std::byte>& gpu,
                        const std::vector<std::byte>& cpu) {
  const OutputLayout& layout = workload.layout;
  const DType dtype = workload.spec.logits_dtype;
  const bool clean = workload.spec.clean_logits;
  const double tolerance = support::spec_tolerance(workload.spec.format, workload.spec.weights_dtype,
                                                   dtype, support::Operands::kQuantized);
  const auto for_each_logit = [&](const auto& visit) {
    for (std::int64_t row = 0; row < layout.rows; ++row) {
      for (std::int64_t col = 0; col < layout.cols; ++col) {
        visit(row, col, support::read_logit(cpu.data(), dtype, layout, row, col),
              support::read_logit(gpu.data(), dtype, layout, row, col));
      }
    }
  };
  double squares = 0.0;
  std::int64_t in_window_count = 0;
  for_each_logit([&](std::int64_t, std::int64_t, double c, double) {
    if (std::isinf(c)) return;
    squares += c * c;
    ++in_window_count;
  });
  const double rms = in_window_count > 0 ? std::sqrt(squares / in_window_count) : 0.0;
  support::DiffMetric metric;
  std::int64_t mismatched_masks = 0, unwritten = 0, off = 0;
  std::string first_problem;
  const auto problem = [&](std::int64_t& count, std::int64_t row, std::int64_t col,
                           const std::string& what) {
    if (count++ == 0 && first_problem.empty()) {
      first_problem = "row " + std::to_string(row) + " col " + std::to_string(col) + " " + what;
    }
  };
  for_each_logit([&](std::int64_t row, std::int64_t col, double c, double g) {
    if (std::isinf(c)) {  // outside the window
      if (clean && !(std::isinf(g) && g < 0)) {
        problem(mismatched_masks, row, col, "outside the window but " + std::to_string(g));
      }
    } else if (!std::isfinite(g)) {
      problem(unwritten, row, col, "in window but " + std::to_string(g));
    } else {
      metric.add(c, g);
      if (std::abs(g - c) > element_bound(rms, c, dtype)) {
        problem(off, row, col, "is " + std::to_string(g) + ", the CPU backend's " +
                                   std::to_string(c) + " (logits' rms " + std::to_string(rms) + ")");
      }
    }
  });
  EXPECT_EQ(unwritten, 0) << first_problem;
  EXPECT_EQ(mismatched_masks, 0) << first_problem;
  EXPECT_EQ(off, 0) << "logits off the CPU backend's by more than element_bound: " << first_problem;
  EXPECT_LT(metric.value(), tolerance) << "GPU vs CPU backend diff";

  const auto rows = support::sample_rows(layout.rows, 16, 1);
  const auto oracle = support::verify_rows(workload, gpu.data(), rows, support::Operands::kQuantized);
  EXPECT_TRUE(oracle.ok) << oracle.first_failure;
}

// Row padding past the logical columns (the layout's stride) still holds DeviceBuffer's poison,
// but for the elements up to the next 16-byte boundary: the prefill kernel's TMA stores write
// whole 16-byte granules (measured: -inf or logits there), which a row stride of whole 16-byte
// granules holds (docs/contract.md, "Outputs").
template <typename Workload>
void expect_padding_untouched(const Workload& workload, const std::vector<std::byte>& gpu) {
  const OutputLayout& layout = workload.layout;
  const std::size_t element = dtype_size(workload.spec.logits_dtype);
  const auto granule = static_cast<std::int64_t>(16 / element);
  const std::int64_t writable = (layout.cols + granule - 1) / granule * granule;
  std::int64_t touched = 0;
  std::string first;  // where the first few are, and what they hold
  for (std::int64_t row = 0; row < layout.rows; ++row) {
    for (std::int64_t col = writable; col < layout.row_stride; ++col) {
      const std::byte* e = gpu.data() + (row * layout.row_stride + col) * element;
      const bool written = !std::all_of(e, e + element, DeviceBuffer::poisoned);
      if (written && touched++ < 6) {
        first += " [" + std::to_string(row) + ", " + std::to_string(col) + "] = " +
                 std::to_string(support::read_logit(gpu.data(), workload.spec.logits_dtype,
                                                    layout, row, col));
      }
    }
  }
  EXPECT_EQ(touched, 0) << "elements written past the 16-byte granule of the logical columns ("
                        << layout.cols << " of a row stride of " << layout.row_stride
                        << "), into the row padding:" << first;
}

}  // namespace mqa_logits::gpu_test
