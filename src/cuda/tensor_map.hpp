// Host-side TMA tensor maps (CUtensorMap), encoded through the driver entry point fetched at run
// time so the library needs no link-time dependency on the driver library.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mqa_logits::cuda_backend {

enum class TmaSwizzle { kNone, k32B, k64B, k128B };

// The swizzle that matches K-major rows of `row_bytes` (32, 64 or 128) bytes.
TmaSwizzle swizzle_for_row_bytes(std::int64_t row_bytes);

// A 2-D tile map over a row-major matrix of `rows` x `cols` elements (cols innermost) with rows
// `row_stride_bytes` apart; boxes of box_rows x box_cols. Out-of-bounds box elements read as 0
// and are not written by stores.
CUtensorMap make_tensor_map_2d(const void* base, CUtensorMapDataType dtype, std::uint64_t rows,
                               std::uint64_t cols, std::uint64_t row_stride_bytes,
                               std::uint32_t box_rows, std::uint32_t box_cols, TmaSwizzle swizzle);

// A 3-D tile map: `dims` and `box` innermost first, `strides_bytes` those of dims 1 and 2 (each a
// multiple of 16). Out-of-bounds box elements read as 0.
CUtensorMap make_tensor_map_3d(const void* base, CUtensorMapDataType dtype,
                               const std::uint64_t (&dims)[3],
                               const std::uint64_t (&strides_bytes)[2],
                               const std::uint32_t (&box)[3], TmaSwizzle swizzle);

// A 1-D map over `count` elements with boxes of `box` elements, encoded as a 2-D map of one row
// (load with coordinates (x, 0)).
CUtensorMap make_tensor_map_1d(const void* base, CUtensorMapDataType dtype, std::uint64_t count,
                               std::uint32_t box);

}  // namespace mqa_logits::cuda_backend
