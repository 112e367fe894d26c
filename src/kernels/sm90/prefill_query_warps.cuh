// The prefill kernel's query warps, warps 1-2 of warpgroup 0 (docs/design.md, "The prefill
// kernel", Roles): each block's Q rows, its state for the math warps and its folded rows (H = 64,
// blocks of kFoldMinTiles or more).
#pragma once

#include <cstdint>

#include "kernels/sm90/prefill_folded_query.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule.hpp"

namespace mqa_logits::sm90 {

// Warps 1-2 (kFoldLinear): the folded rows and multipliers of block `block`'s queries into its Q
// buffer `q_tile` and its block state, once the buffer's TMA rows have landed.
template <typename T, int kHeadDim, int kNumHeads>
__device__ void fold_block(const PrefillParams& p, int block, std::uint8_t* q_tile,
                           const BlockState<T>& state, int fold_warp, int lane) {
  for (int query = fold_warp; query < T::kBlockQ; query += T::kQueryWarps) {
    const std::int64_t row = static_cast<std::int64_t>(block) * T::kBlockQ + query;
    float half_w[kNumHeads / 32];
#pragma unroll
    for (int i = 0; i < kNumHeads / 32; ++i) half_w[i] = 0.5f * query_weight(p, row, lane + 32 * i);
    const int group = query / T::kGroupQ, q = query % T::kGroupQ;
    fold_query<kHeadDim, kNumHeads, T::kGroupN>(q_tile + group * T::kGroupBytes, q, half_w,
                                                state.multipliers(group) + q, T::kGroupQ, lane);
  }
  fence_async_proxy_shared();  // the folded rows are read by wgmma, in the async proxy
}

// What the math warps need of query row `row`: its key window (empty past S) and the rotation
// of its staged logits (prefill_plan.cuh, staged_slot).
__device__ __forceinline__ int4 row_window(const PrefillParams& p, std::int64_t row) {
  if (row >= p.seq_len) return make_int4(0, 0, 0, 0);
  const std::int32_t start = p.k_start[row];
  const auto win = schedule::prefill_row_window(start, p.k_end[row], p.seq_len_kv);
  const int rotation = p.compressed ? first_aligned_column(start, p.logits_bf16 ? 2 : 4) : 0;
  return make_int4(static_cast<int>(win.lo), static_cast<int>(win.hi), rotation, 0);
}

// Warps 1-2: for each block with tiles in this CTA, as soon as a Q buffer is free (the block
// kQBuffers back is done): its Q rows by TMA (warp 1), its state for the math warps
// (warp w - 1 the weights and windows of query group w - 1, warp 1 the span), and when the block
// folds (T::kFoldLinear and kFoldMinTiles tiles or more) once the rows land, their fold; then
// q_ready. The fold of a block thus runs under the previous blocks' tiles, and a block that does
// not fold costs these warps no wait for its rows (the math warps wait for them on q_full).
// After the last block, a span of kEndOfBlocks tells the math warps to stop.
template <typename T, int kHeadDim, int kNumHeads>
__device__ __forceinline__ void run_query_warps(const PrefillParams& p, const PrefillShared<T>& sh,
                                                int warp, int lane) {
  const int group = warp - 1;  // the query group whose weights this warp stages
  RingPosition<T::kQBuffers> qb;
  for_each_block_span<T::kHeads>(p, [&](const BlockSpan& s) {
    if (!s.has_tiles()) return;
    const bool fold = T::kFoldLinear && s.tiles >= T::kFoldMinTiles;
    // The block's state, read before the wait for its buffer. Weights of MMA column
    // n = 8j + 2(lane % 4) + c, (q, h) = divmod(n, H), halved where the relu is |x| plus the
    // folded half, stored as weights[lane % 4][j / 2] = {w[j][0], w[j][1], w[j + 1][0],
    // w[j + 1][1]} (j even).
    const std::int64_t row0 = static_cast<std::int64_t>(s.block) * T::kBlockQ;
    const int next_block = schedule::prefill_block_after(s.block, p.num_blocks);
    float4 weights;
    {
      const int j0 = 2 * (lane / 4);
      const float scale = fold ? 0.5f : 1.f;
      const auto weight = [&](int i) {
        const int n = 8 * (j0 + i / 2) + 2 * (lane % 4) + i % 2;
        return scale * query_weight(p, row0 + group * T::kGroupQ + n / kNumHeads, n % kNumHeads);
      };
      weights = make_float4(weight(0), weight(1), weight(2), weight(3));
    }
    const int4 window =
        lane < T::kGroupQ ? row_window(p, row0 + group * T::kGroupQ + lane) : int4{};

    sh.q_empty[qb.stage].wait(qb.phase ^ 1);
    if (warp == 1 && lane == 0) {
      sh.q_full[qb.stage].arrive_expect_bytes(2 * T::kGroupN * kHeadDim);
      for (int g = 0; g < 2; ++g) {
        tma_load_2d(sh.q_tiles + qb.stage * T::kQBytes + g * T::kGroupBytes, &p.q_map, 0,
                    s.block * T::kBlockN + g * T::kGroupN, &sh.q_full[qb.stage]);
      }
      // The next block's Q rows into L2, so that its load waits on L2 rather than HBM.
      for (int g = 0; g < 2; ++g) {
        tma_prefetch_2d(&p.q_map, 0, next_block * T::kBlockN + g * T::kGroupN);
      }
    }
    const std::int64_t next_row0 = static_cast<std::int64_t>(next_block) * T::kBlockQ;
    if (warp == 2 && lane < T::kBlockQ && next_row0 + lane < p.seq_len) {
      // And its weight rows (each of H weights, one or two 128-byte lines).
      const auto* next_row = static_cast<const std::uint8_t*>(p.weights) +
                             (next_row0 + lane) * p.weights_row_stride * (p.weights_bf16 ? 2 : 4);
      prefetch_l2(next_row);
      if (kNumHeads * (p.weights_bf16 ? 2 : 4) > 128) prefetch_l2(next_row + 128);
    }
    const BlockState<T> state = sh.block_state(qb.stage);
    reinterpret_cast<float4*>(
        state.weights(group))[(lane % 4) * (T::kWeightRowFloats / 4) + lane / 4] = weights;
    if (lane < T::kGroupQ) state.windows(group)[lane] = window;
    if (warp == 1 && lane == 0) state.span() = s;
    if constexpr (T::kFoldLinear) {
      if (fold) {  // the math warps wait for the TMA rows themselves otherwise
        sh.q_full[qb.stage].wait(qb.phase);
        fold_block<T, kHeadDim, kNumHeads>(p, s.block, sh.q_tiles + qb.stage * T::kQBytes, state,
                                           group, lane);
      }
    }
    sh.q_ready[qb.stage].arrive();  // every lane: each orders its own writes
    qb.advance();
  });
  sh.q_empty[qb.stage].wait(qb.phase ^ 1);
  if (warp == 1 && lane == 0) sh.block_state(qb.stage).span().block = kEndOfBlocks;
  sh.q_ready[qb.stage].arrive();
}

}  // namespace mqa_logits::sm90
