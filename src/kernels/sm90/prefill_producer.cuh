// The prefill kernel's warpgroup 0 (prefill_kernel.cuh, Warp roles): warp 0 loads the key tiles
// and their scales, warps 1-2 each block's Q rows, its folded rows (H = 64) and, with
// clean_logits, the -inf columns that no tile of the block covers; warp 3 stores the logits.
#pragma once

#include <cstdint>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/prefill_folded_query.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

// Warps 1-2 (kFoldLinear): the folded rows and multipliers of block `block`'s queries into its Q
// buffer `q_tile` and `multipliers` (term s of block query q at [s * kBlockQ + q]), once the
// buffer's TMA rows have landed.
template <typename T, int kHeadDim, int kNumHeads>
__device__ void fold_block(const PrefillParams& p, int block, std::uint8_t* q_tile,
                           float* multipliers, int fold_warp, int lane) {
  for (int query = fold_warp; query < T::kBlockQ; query += T::kQueryWarps) {
    const std::int64_t row = static_cast<std::int64_t>(block) * T::kBlockQ + query;
    float half_w[kNumHeads / 32];
#pragma unroll
    for (int i = 0; i < kNumHeads / 32; ++i) half_w[i] = 0.5f * query_weight(p, row, lane + 32 * i);
    fold_query<kHeadDim, kNumHeads, T::kGroupN>(q_tile + query / T::kGroupQ * T::kGroupBytes,
                                                query % T::kGroupQ, half_w, multipliers + query,
                                                T::kBlockQ, lane);
  }
  fence_async_proxy_shared();  // the folded rows are read by wgmma, in the async proxy
}

// Warp 0: the key tiles and their scales of every block span of this CTA (lane 0 issues).
template <typename T>
__device__ __forceinline__ void produce_key_tiles(const PrefillParams& p,
                                                  const PrefillShared<T>& sh, int lane) {
  constexpr int kBlockQ = T::kBlockQ;
  RingPosition<T::kStages> kv;
  for_each_block_span<kBlockQ>(p, [&](const BlockSpan& s) {
    for (int t = s.first_item; t < s.tile_end(); ++t) {
      if (lane == 0) {
        const int key0 = static_cast<int>(s.lo) + t * T::kTileKV;
        sh.kv_empty[kv.stage].wait(kv.phase ^ 1);
        sh.kv_full[kv.stage].arrive_expect_bytes(T::kKVBytes + T::kScaleBytes);
        tma_load_2d(sh.kv_tiles + kv.stage * T::kKVBytes, &p.kv_map, 0, key0,
                    &sh.kv_full[kv.stage]);
        tma_load_2d(sh.scale_tiles + kv.stage * T::kScaleBytes, &p.kscale_map, key0, 0,
                    &sh.kv_full[kv.stage]);
      }
      kv.advance();
    }
  });
}

// Warps 1-2: a block's Q rows (warp 1, as soon as the buffer is free: the block before the
// previous one is done), its folded rows once they land (kFoldLinear; meanwhile the previous
// block computes), then the previous block's -inf columns (clean_logits): a block is cleaned
// only once the next one's Q is loaded (and folded), the last one after the loop, so that at a
// block boundary the math warps never wait for a fold queued behind cleaning.
template <typename T, int kHeadDim, int kNumHeads>
__device__ __forceinline__ void run_query_warps(const PrefillParams& p, const PrefillShared<T>& sh,
                                                int warp, int lane) {
  constexpr int kBlockQ = T::kBlockQ;
  RingPosition<T::kQBuffers> qb;
  const int thread = threadIdx.x - 32, threads = 32 * T::kQueryWarps;
  const auto clean = [&](const BlockSpan& s) {
    for (int q = 0; q < kBlockQ; ++q) {
      const std::int64_t row = static_cast<std::int64_t>(s.block) * kBlockQ + q;
      if (row >= p.seq_len) break;
      std::int64_t first, last;
      covered_columns(p, row, s, first, last);
      void* out = kernels::logits_row(p.logits, p.logits_row_stride, row, p.logits_bf16);
      if (s.first_item == 0) {
        kernels::fill_row_negative_infinity(out, p.logits_bf16, 0, first, thread, threads);
      }
      if (s.end_item == s.items) {
        kernels::fill_row_negative_infinity(out, p.logits_bf16, last, p.out_cols, thread,
                                            threads);
      }
    }
  };
  // The block this warp has still to clean, in shared memory: registers are short beside
  // the fold.
  BlockSpan& uncleaned = sh.uncleaned[warp - 1];
  bool cleaning = false;  // uncleaned holds a block
  for_each_block_span<kBlockQ>(p, [&](const BlockSpan& s) {
    if (s.first_item < s.tile_end()) {  // the block has tiles here
      if (warp == 1 && lane == 0) {
        sh.q_empty[qb.stage].wait(qb.phase ^ 1);
        sh.q_full[qb.stage].arrive_expect_bytes(2 * T::kGroupN * kHeadDim);
        for (int g = 0; g < 2; ++g) {
          tma_load_2d(sh.q_tiles + qb.stage * T::kQBytes + g * T::kGroupBytes, &p.q_map, 0,
                      s.block * T::kBlockN + g * T::kGroupN, &sh.q_full[qb.stage]);
        }
      }
      if constexpr (T::kFoldLinear) {
        sh.q_full[qb.stage].wait(qb.phase);
        fold_block<T, kHeadDim, kNumHeads>(p, s.block, sh.q_tiles + qb.stage * T::kQBytes,
                                           sh.multipliers + qb.stage * T::kMultiplierFloats,
                                           warp - 1, lane);
        __syncwarp();
        if (lane == 0) sh.q_ready[qb.stage].arrive();
      }
      qb.advance();
    }
    if (!p.clean_logits) return;
    if (cleaning) clean(uncleaned);
    __syncwarp();
    if (lane == 0) uncleaned = s;
    __syncwarp();
    cleaning = true;
  });
  if (cleaning) clean(uncleaned);
}

// Warp 3: each tile's logits, once the math warps have staged them. Lane r stores row r of the
// block as one TMA box of the tile's kTileKV columns (TMA drops what lies past S or out_cols); a
// row whose first column is negative or not 16-byte aligned (compressed output, where the column
// is the key less the row's start; TMA faults on either) the whole warp stores instead, columns
// lane + 32 c. Each lane frees the stage (kv_empty counts 32 arrivals) once its stores have read it.
// Every column of a tile is either in its row's window (a logit) or not (-inf, from the math
// warps): the tiles write exactly the columns they cover.
template <typename T>
__device__ __forceinline__ void store_logit_tiles(const PrefillParams& p,
                                                  const PrefillShared<T>& sh, int lane) {
  constexpr int kStoresPerLane = T::kTileKV / 32;
  const int element = p.logits_bf16 ? 2 : 4;
  RingPosition<T::kStages> kv;
  for_each_block_span<T::kBlockQ>(p, [&](const BlockSpan& s) {
    const std::int64_t row = static_cast<std::int64_t>(s.block) * T::kBlockQ + lane;
    const bool has_row = lane < T::kBlockQ && row < p.seq_len;
    const std::int64_t shift = has_row && p.compressed ? p.k_start[row] : 0;
    for (int t = s.first_item; t < s.tile_end(); ++t) {
      const std::int64_t column = s.lo + std::int64_t{t} * T::kTileKV - shift;
      const bool writes = has_row && column > -T::kTileKV && column < p.out_cols;
      const bool by_tma = column >= 0 && column * element % 16 == 0;
      sh.sums_full[kv.stage].wait(kv.phase);
      const std::uint8_t* staged = sh.staging + kv.stage * T::kStagingBytes;
      if (writes && by_tma) {
        tma_store_2d(&p.logits_map, static_cast<int>(column), static_cast<int>(row),
                     staged + lane * T::kStagingRowBytes);
      }
      bulk_commit();
      for (unsigned rows = __ballot_sync(0xffffffffu, writes && !by_tma); rows != 0;
           rows &= rows - 1) {
        const int r = __ffs(static_cast<int>(rows)) - 1;
        const std::int64_t first = __shfl_sync(0xffffffffu, column, r) + lane;
        const std::uint8_t* from = staged + r * T::kStagingRowBytes;
        void* out = kernels::logits_row(p.logits, p.logits_row_stride,
                                        static_cast<std::int64_t>(s.block) * T::kBlockQ + r,
                                        p.logits_bf16);
#pragma unroll
        for (int c = 0; c < kStoresPerLane; ++c) {
          const std::int64_t to = first + 32 * c;
          if (to < 0 || to >= p.out_cols) continue;
          const int at = lane + 32 * c;
          if (p.logits_bf16) {
            static_cast<std::uint16_t*>(out)[to] = reinterpret_cast<const std::uint16_t*>(from)[at];
          } else {
            static_cast<std::uint32_t*>(out)[to] = reinterpret_cast<const std::uint32_t*>(from)[at];
          }
        }
      }
      bulk_wait<0, true>();
      sh.kv_empty[kv.stage].arrive();
      kv.advance();
    }
  });
  bulk_wait<0, false>();
}

}  // namespace mqa_logits::sm90
