#include "mqa_logits/tensor.hpp"

#include <string>

#include "mqa_logits/errors.hpp"

namespace mqa_logits {

TensorView TensorView::contiguous(const void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, Device device) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument("shape", "expected at most " + std::to_string(kMaxRank) +
                                       " dimensions, got " + std::to_string(shape.size()));
  }
  TensorView view;
  view.data = const_cast<void*>(data);  // written through only where it is an output
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  int dim = 0;
  for (const std::int64_t extent : shape) view.shape[dim++] = extent;
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
  return view;
}

std::int64_t TensorView::numel() const {
  std::int64_t count = 1;
  for (int d = 0; d < rank; ++d) count *= shape[d];
  return count;
}

bool TensorView::is_contiguous() const {
  // An empty tensor addresses no memory, so its strides cannot matter.
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3:
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
  }
  throw InvalidArgument("dtype", "expected a DType enumerator, got " +
                                     std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt32: return "int32";
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown dtype";
}

const char* device_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda";
  }
  return "unknown device";
}

}  // namespace mqa_logits
