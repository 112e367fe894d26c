// Launch of the sm90 decode kernel for one (format, head dim, heads, MMA rows, paired) instance,
// and the pick of the instance for a call. Included by the generated instance files (one per
// (format, head dim, heads): src/kernels/sm90/paged_instance.cu.in), so the instances compile in
// parallel.
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

// Whether the kernel loads the keys by TMA: TMA needs 16-byte strides; other block strides
// (multiples of 4) take the cp.async path. With no blocks at all every block id is invalid and no
// key is ever loaded.
inline bool keys_by_tma(const PagedProblem& problem) {
  return problem.num_blocks > 0 && problem.block_stride_bytes % 16 == 0;
}

// The kernel parameters of `problem` for an instance of (D, H) whose shared memory `smem` says,
// TMA maps included.
template <int D, int H>
sm90::paged::PagedParams make_paged_params(const PagedProblem& problem,
                                           const sm90::paged::SmemLayout& smem) {
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
  params.kv_tma = keys_by_tma(problem);
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
  params.max_blocks = problem.max_blocks;
  params.indices = problem.indices;
  params.schedule_meta = problem.schedule_meta;
  params.logits = problem.logits;
  params.logits_row_stride = problem.logits_row_stride;
  params.max_context_len = problem.max_context_len;
  params.key_cap =
      schedule::paged_key_cap(problem.max_context_len, problem.max_blocks, problem.block_kv);
  params.workers = problem.schedule_workers;
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
  params.smem = smem;
  return params;
}

// Launches the instance (D, H, kMmaRows, kPaired): one CTA per worker of the metadata, or a pair
// of CTAs per two workers. A paired instance launches only if every pair of its grid runs at
// once (a pair takes two SMs of one GPC), and otherwise returns false.
template <int D, int H, int kMmaRows, bool kPaired>
bool launch_paged(const PagedProblem& problem, cudaStream_t stream) {
  namespace paged = sm90::paged;
  // 1024 bytes go to aligning the dynamic shared memory base for the swizzled tiles.
  constexpr std::uint32_t kAlignmentSlack = 1024;
  constexpr std::uint32_t kBudget = sm90::kCtaSharedOptinBytes - kAlignmentSlack;
  constexpr auto stages_with = [](int weight_bytes) {
    return paged::make_smem_layout(D, H, kMmaRows, weight_bytes, kBudget).stages;
  };
  static_assert(stages_with(4) >= paged::kProducerWarps && stages_with(2) >= paged::kProducerWarps,
                "every loading warp needs a stage of its own "
                "(docs/design.md, \"The decode kernel\", Ring)");
  static_assert(!kPaired || (stages_with(4) % paged::kProducerWarps == 0 &&
                             stages_with(2) % paged::kProducerWarps == 0),
                "in a pair one warp loads every tile of a stage "
                "(docs/design.md, \"The decode kernel\", CTA pairs)");
  constexpr auto kernel = &paged::paged_logits_kernel<D, H, kMmaRows, kPaired>;
  constexpr const char* kName = "paged_logits_kernel launch";
  const paged::SmemLayout smem = paged::make_smem_layout(
      D, H, kMmaRows, problem.weights_dtype == DType::kBFloat16 ? 2 : 4, kBudget);
  const auto smem_bytes = static_cast<int>(smem.total_bytes + kAlignmentSlack);
  allow_all_dynamic_smem<kernel>(problem.device.index, "cudaFuncSetAttribute(paged_logits_kernel)");

  constexpr int kCtas = kPaired ? 2 : 1;
  const int clusters = (problem.schedule_workers + kCtas - 1) / kCtas;
  const dim3 block(paged::kernel_threads(kMmaRows, H));
  if (kPaired && resident_clusters<kernel>(problem.device.index, block, smem_bytes, kCtas) <
                     clusters) {
    return false;
  }
  const paged::PagedParams params = make_paged_params<D, H>(problem, smem);
  // The prologue (barrier setup) overlaps the previous kernel, typically the metadata.
  launch_programmatic_clusters(kernel, dim3(static_cast<unsigned>(clusters * kCtas)), block,
                               static_cast<std::size_t>(smem_bytes), kCtas, stream, kName, params);
  return true;
}

// The instance of (format, D, H) for the call's groups: the MMA rows that mma_rows_for picks for
// the rows a CTA computes (each instance serves groups of up to its rows), on CTA pairs where
// pairs_groups says so, the keys come by TMA and the pairs fit. The row counts compiled are those
// mma_rows_for maps to themselves.
template <Format kFormat, int D, int H>
void launch_paged_group(const PagedProblem& problem, cudaStream_t stream) {
  static_assert(kFormat == Format::kFP8, "the sm90 decode kernel reads FP8 queries and keys");
  namespace paged = sm90::paged;
  const int group_rows = problem.indices != nullptr ? paged::varlen_group_rows(H)
                                                    : static_cast<int>(problem.next_n);
  const bool paired = problem.indices == nullptr && paged::pairs_groups(group_rows, H) &&
                      keys_by_tma(problem);
  const auto launch_rows = [&]<bool kPaired>(int rows) {
    const int mma_rows = paged::mma_rows_for(rows, H);
    const auto launch_if = [&]<int kMmaRows>() {
      if constexpr (paged::mma_rows_for(kMmaRows, H) == kMmaRows &&
                    (!kPaired || paged::pair_instance(kMmaRows, H))) {
        if (mma_rows == kMmaRows) return launch_paged<D, H, kMmaRows, kPaired>(problem, stream);
      }
      return false;
    };
    return [&]<int... kRows>(std::integer_sequence<int, kRows...>) {
      return (launch_if.template operator()<kRows + 1>() || ...);
    }(std::make_integer_sequence<int, paged::kMaxGroupRows>{});
  };
  if (paired && launch_rows.template operator()<true>(paged::pair_rows(group_rows))) return;
  if (!launch_rows.template operator()<false>(group_rows)) {
    throw InvalidArgument("q", "no decode kernel for " + std::to_string(group_rows) + " rows");
  }
}

}  // namespace mqa_logits::cuda_backend
