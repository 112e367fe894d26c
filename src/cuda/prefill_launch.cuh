// Launch of the sm90 prefill kernel for one (format, head dim, heads) instance. Included by the
// generated instance files (one per triple: src/kernels/sm90/prefill_instance.cu.in), so the
// instances compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "kernels/sm90/prefill_kernel.cuh"
#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

// A logits map for the store warp: [S, out_cols] of their dtype, boxes of `box_rows` rows and
// `box_columns` columns. Rows are 16-byte aligned (validate.cpp); a single row's stride is never
// used, so it is rounded up to what the map needs.
inline CUtensorMap logits_tensor_map(const PrefillProblem& problem, std::uint32_t box_rows,
                                     std::uint32_t box_columns) {
  const bool bf16 = problem.logits_dtype == DType::kBFloat16;
  const auto element = static_cast<std::int64_t>(dtype_size(problem.logits_dtype));
  const std::int64_t row_bytes = problem.seq_len > 1
                                     ? problem.logits_row_stride * element
                                     : (problem.out_cols * element + 15) / 16 * 16;
  const auto dtype = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  return make_tensor_map_2d(problem.logits, dtype, problem.seq_len, problem.out_cols, row_bytes,
                            box_rows, box_columns, TmaSwizzle::kNone);
}

template <Format kFormat, int kHeadDim, int kNumHeads>
void launch_prefill(const PrefillProblem& problem, cudaStream_t stream) {
  static_assert(kFormat == Format::kFP8, "the sm90 prefill kernel reads FP8 queries and keys");
  using Tiling = sm90::PrefillTiling<kHeadDim, kNumHeads>;
  const std::int64_t keys = std::max<std::int64_t>(problem.seq_len_kv, 1);
  // With no keys nothing reads K: any valid address serves for its (unused) maps.
  const void* kv = problem.seq_len_kv > 0 ? problem.kv : problem.q;
  const void* kv_scales = problem.seq_len_kv > 0 ? problem.kv_scales : problem.q;
  const TmaSwizzle swizzle = swizzle_for_row_bytes(kHeadDim);

  sm90::PrefillParams params{};
  params.q_map = make_tensor_map_2d(problem.q, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                    problem.seq_len * kNumHeads, kHeadDim, kHeadDim,
                                    Tiling::kGroupN, kHeadDim, swizzle);
  params.kv_map = make_tensor_map_2d(kv, CU_TENSOR_MAP_DATA_TYPE_UINT8, keys, kHeadDim, kHeadDim,
                                     Tiling::kTileKV, kHeadDim, swizzle);
  params.kscale_map = make_tensor_map_1d(kv_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, keys,
                                         Tiling::kScaleBox);
  const auto element = static_cast<int>(dtype_size(problem.logits_dtype));
  params.logits_map =
      logits_tensor_map(problem, problem.compressed ? 1 : Tiling::kBlockQ, Tiling::kTileKV);
  params.logits_inner_map =
      logits_tensor_map(problem, 1, Tiling::kTileKV - sm90::kStoreAlignBytes / element);
  params.weights = problem.weights;
  params.weights_row_stride = problem.weights_row_stride;
  params.k_start = problem.k_start;
  params.k_end = problem.k_end;
  params.logits = problem.logits;
  params.logits_row_stride = problem.logits_row_stride;
  params.seq_len = problem.seq_len;
  params.seq_len_kv = problem.seq_len_kv;
  params.out_cols = problem.out_cols;
  params.schedule_meta = problem.schedule_meta;
  params.num_blocks = static_cast<int>(schedule::ceil_div(problem.seq_len, Tiling::kBlockQ));
  params.weights_bf16 = problem.weights_dtype == DType::kBFloat16;
  params.logits_bf16 = problem.logits_dtype == DType::kBFloat16;
  params.compressed = problem.compressed;

  // Without metadata each CTA computes its segment of the same even split (find_segment).
  const int grid =
      problem.schedule_meta != nullptr ? problem.schedule_workers : get_num_sms();
  constexpr auto kernel = &sm90::prefill_logits_kernel<kHeadDim, kNumHeads>;
  allow_all_dynamic_smem<kernel>(problem.device.index,
                                 "cudaFuncSetAttribute(prefill_logits_kernel)");
  launch_programmatic(kernel, dim3(grid), dim3(Tiling::kThreads), Tiling::kSmemBytes, stream,
                      "prefill_logits_kernel launch", params);
}

}  // namespace mqa_logits::cuda_backend
