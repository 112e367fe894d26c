#include "cuda/tensor_map.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/driver_function.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled function = driver_function<EncodeTiled>("cuTensorMapEncodeTiled");
  return function;
}

CUtensorMapSwizzle to_driver(TmaSwizzle swizzle) {
  switch (swizzle) {
    case TmaSwizzle::k32B: return CU_TENSOR_MAP_SWIZZLE_32B;
    case TmaSwizzle::k64B: return CU_TENSOR_MAP_SWIZZLE_64B;
    case TmaSwizzle::k128B: return CU_TENSOR_MAP_SWIZZLE_128B;
    case TmaSwizzle::kNone: break;
  }
  return CU_TENSOR_MAP_SWIZZLE_NONE;
}

// Joins values as "a x b x c".
template <typename T, std::size_t N>
std::string join_dims(const T (&values)[N]) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) text += (i > 0 ? " x " : "") + std::to_string(values[i]);
  return text;
}

template <int Rank>
CUtensorMap encode(const void* base, CUtensorMapDataType dtype, const cuuint64_t (&dims)[Rank],
                   const cuuint64_t (&strides)[Rank - 1], const cuuint32_t (&box)[Rank],
                   TmaSwizzle swizzle) {
  CUtensorMap map{};
  cuuint32_t element_strides[Rank];
  for (cuuint32_t& stride : element_strides) stride = 1;
  const CUresult result =
      encode_tiled()(&map, dtype, Rank, const_cast<void*>(base), dims, strides, box,
                     element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, to_driver(swizzle),
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw CudaError("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(result) +
                    " (dims " + join_dims(dims) + ", strides " + join_dims(strides) +
                    " B, box " + join_dims(box) + ", dtype " + std::to_string(dtype) + ")");
  }
  return map;
}

}  // namespace

TmaSwizzle swizzle_for_row_bytes(std::int64_t row_bytes) {
  switch (row_bytes) {
    case 32: return TmaSwizzle::k32B;
    case 64: return TmaSwizzle::k64B;
    case 128: return TmaSwizzle::k128B;
    default: return TmaSwizzle::kNone;
  }
}

CUtensorMap make_tensor_map_2d(const void* base, CUtensorMapDataType dtype, std::uint64_t rows,
                               std::uint64_t cols, std::uint64_t row_stride_bytes,
                               std::uint32_t box_rows, std::uint32_t box_cols, TmaSwizzle swizzle) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  return encode(base, dtype, dims, strides, box, swizzle);
}

CUtensorMap make_tensor_map_3d(const void* base, CUtensorMapDataType dtype,
                               const std::uint64_t (&dims)[3],
                               const std::uint64_t (&strides_bytes)[2],
                               const std::uint32_t (&box)[3], TmaSwizzle swizzle) {
  const cuuint64_t global_dims[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t strides[2] = {strides_bytes[0], strides_bytes[1]};
  const cuuint32_t boxes[3] = {box[0], box[1], box[2]};
  return encode(base, dtype, global_dims, strides, boxes, swizzle);
}

CUtensorMap make_tensor_map_1d(const void* base, CUtensorMapDataType dtype, std::uint64_t count,
                               std::uint32_t box) {
  // Encoded as one row of a 2-D map: the row stride of a single row is never used, but must be
  // a multiple of 16 bytes.
  const std::uint64_t element_bytes = dtype == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 1;
  const cuuint64_t dims[2] = {count, 1};
  const cuuint64_t strides[1] = {(count * element_bytes + 15) / 16 * 16};
  const cuuint32_t boxes[2] = {box, 1};
  return encode(base, dtype, dims, strides, boxes, TmaSwizzle::kNone);
}

}  // namespace mqa_logits::cuda_backend
