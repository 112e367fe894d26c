// Launch of the sm90 decode kernel for one (format, head dim, heads, MMA rows) instance, and the
// pick of the MMA rows for a call. Included by the generated instance files (one per (format,
// head dim, heads): src/kernels/sm90/paged_instance.cu.in), so the instances compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "cuda/launch.hpp"
#include "cuda/tensor_map.hpp"
#include "kernels/sm90/paged_kernel.cuh"
#include "mqa_logits/errors.hpp"
#include "problem.hpp"
#include "schedule.hpp"

namespace mqa_logits::cuda_backend {

// The kernel parameters of `problem` for the instance (D, H, mma_rows), TMA maps included.
template <int D, int H>
sm90::paged::PagedParams make_paged_params(const PagedProblem& problem, int mma_rows,
                                           std::uint32_t smem_budget) {
  namespace paged = sm90::paged;
  paged::PagedParams params{};
  // q rows times heads (plus one q slot of padding) are TMA coordinates (int32), and so bound
  // every row index of the kernel.
  const std::int64_t pairs = problem.batch * problem.next_n * H;
  if (pairs >
      std::numeric_limits<std::int32_t>::max() - paged::kMaxGroupRows * paged::kMaxMmaWidth) {
    throw InvalidArgument(
        "q", "expected fewer than 2^31 - 2048 (row, head) pairs, got " + std::to_string(pairs));
  }
  const TmaSwizzle swizzle = swizzle_for_row_bytes(D);
  params.q_map =
      make_tensor_map_2d(problem.q, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                         static_cast<std::uint64_t>(pairs), D, D, paged::kQBoxRows, D, swizzle);
  // TMA needs 16-byte strides; other block strides (multiples of 4) take the cp.async path. With
  // no blocks at all every block id is invalid and no key is ever loaded.
  params.kv_tma = problem.num_blocks > 0 && problem.block_stride_bytes % 16 == 0;
  if (params.kv_tma) {
    const auto bk = static_cast<std::uint64_t>(problem.block_kv);
    params.kv_map = make_tensor_map_3d(problem.kv_cache, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                       {D, bk, static_cast<std::uint64_t>(problem.num_blocks)},
                                       {D, static_cast<std::uint64_t>(problem.block_stride_bytes)},
                                       {D, static_cast<std::uint32_t>(paged::kKeyBoxRows), 1},
                                       swizzle);
  }
  params.kv_cache = problem.kv_cache;
  params.block_stride_bytes = problem.block_stride_bytes;
  params.num_blocks = problem.num_blocks;
  params.q = problem.q;
  params.weights = problem.weights;
  params.context_lens = problem.context_lens;
  params.block_table = problem.block_table;
  params.table_row_stride = problem.block_table_row_stride;
  params.table_rows = problem.table_rows;
  params.max_blocks = problem.max_blocks;
  params.indices = problem.indices;
  params.schedule_meta = problem.schedule_meta;
  params.logits = problem.logits;
  params.logits_row_stride = problem.logits_row_stride;
  params.max_context_len = problem.max_context_len;
  params.key_cap =
      schedule::paged_key_cap(problem.max_context_len, problem.max_blocks, problem.block_kv);
  params.units = static_cast<int>(problem.batch);
  params.next_n = static_cast<int>(problem.next_n);
  params.lens_cols = problem.context_lens_2d ? static_cast<int>(problem.next_n) : 1;
  params.block_kv = problem.block_kv;
  params.lens_2d = problem.context_lens_2d;
  params.weights_bf16 = problem.weights_dtype == DType::kBFloat16;
  params.logits_bf16 = problem.logits_dtype == DType::kBFloat16;
  params.clean_logits = problem.clean_logits;
  params.group_rows =
      problem.indices != nullptr ? paged::varlen_group_rows(H) : static_cast<int>(problem.next_n);
  params.smem = paged::make_smem_layout(D, H, mma_rows, params.weights_bf16 ? 2 : 4, smem_budget);
  return params;
}

template <int D, int H, int kMmaRows>
void launch_paged(const PagedProblem& problem, cudaStream_t stream) {
  namespace paged = sm90::paged;
  // 1024 bytes go to aligning the dynamic shared memory base for the swizzled tiles.
  constexpr std::uint32_t kAlignmentSlack = 1024;
  constexpr std::uint32_t kBudget = sm90::kCtaSharedOptinBytes - kAlignmentSlack;
  constexpr auto stages_with = [](int weight_bytes) {
    return paged::make_smem_layout(D, H, kMmaRows, weight_bytes, kBudget).stages;
  };
  static_assert(stages_with(4) >= paged::kProducerWarps && stages_with(2) >= paged::kProducerWarps,
                "every loading warp needs a stage of its own (paged_kernel.cuh, Pipeline)");
  const paged::PagedParams params = make_paged_params<D, H>(problem, kMmaRows, kBudget);
  constexpr auto kernel = &paged::paged_logits_kernel<D, H, kMmaRows>;
  const auto smem_bytes = static_cast<int>(params.smem.total_bytes + kAlignmentSlack);
  allow_all_dynamic_smem<kernel>(problem.device.index, "cudaFuncSetAttribute(paged_logits_kernel)");

  // The prologue (barrier setup) overlaps the previous kernel, typically the metadata.
  launch_programmatic(kernel, dim3(static_cast<unsigned>(problem.schedule_workers)),
                      dim3(paged::kernel_threads(kMmaRows, H)),
                      static_cast<std::size_t>(smem_bytes), stream, "paged_logits_kernel launch",
                      params);
}

// The instance of (format, D, H) for the call's groups: the MMA rows that mma_rows_for picks for
// its group rows (each instance serves groups of up to its rows). The row counts compiled are
// those mma_rows_for maps to themselves.
template <Format kFormat, int D, int H>
void launch_paged_group(const PagedProblem& problem, cudaStream_t stream) {
  static_assert(kFormat == Format::kFP8, "the sm90 decode kernel reads FP8 queries and keys");
  namespace paged = sm90::paged;
  const int group_rows = problem.indices != nullptr ? paged::varlen_group_rows(H)
                                                    : static_cast<int>(problem.next_n);
  const int mma_rows = paged::mma_rows_for(group_rows, H);
  const auto launch_if = [&]<int kMmaRows>() {
    if constexpr (paged::mma_rows_for(kMmaRows, H) == kMmaRows) {
      if (mma_rows == kMmaRows) {
        launch_paged<D, H, kMmaRows>(problem, stream);
        return true;
      }
    }
    return false;
  };
  const bool launched = [&]<int... kRows>(std::integer_sequence<int, kRows...>) {
    return (launch_if.template operator()<kRows + 1>() || ...);
  }(std::make_integer_sequence<int, paged::kMaxGroupRows>{});
  if (!launched) {
    throw InvalidArgument("q", "no decode kernel for " + std::to_string(mma_rows) + " rows");
  }
}

}  // namespace mqa_logits::cuda_backend
