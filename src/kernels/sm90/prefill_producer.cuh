// The prefill kernel's warpgroup 0 (prefill_kernel.cuh, Warp roles): warp 0 loads the key tiles
// and their scales, warps 1-2 each block's Q rows, its state for the math warps and its folded
// rows (H = 64, blocks of kFoldMinTiles or more); warp 3 stores the logits.
#pragma once

#include <cstdint>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/prefill_folded_query.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"

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

// Warp 0: the key tiles and their scales of every block span of this CTA (lane 0 issues).
template <typename T>
__device__ __forceinline__ void produce_key_tiles(const PrefillParams& p,
                                                  const PrefillShared<T>& sh, int lane) {
  RingPosition<T::kStages> kv;
  for_each_block_span<T::kHeads>(p, [&](const BlockSpan& s) {
    for (int t = s.first_tile; t < s.end_tile; ++t) {
      if (lane == 0) {
        const int key0 = s.lo + t * T::kTileKV;
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

// Warp 3, full output: each tile's logits, once the math warps have staged them, as one TMA box
// of the block's rows (lane 0 issues; TMA drops the rows past S and the columns past out_cols).
// Every column of a tile is either in its row's window (a logit) or not (-inf, from the math
// warps): the tiles write exactly the columns they cover. The lanes free the stage (kv_empty
// counts 32 arrivals) once the box has been read.
template <typename T>
__device__ __forceinline__ void store_block_tiles(const PrefillParams& p,
                                                  const PrefillShared<T>& sh, int lane) {
  RingPosition<T::kStages> kv;
  for_each_block_span<T::kHeads>(p, [&](const BlockSpan& s) {
    for (int t = s.first_tile; t < s.end_tile; ++t) {
      sh.sums_full[kv.stage].wait(kv.phase);
      if (lane == 0) {
        tma_store_2d(&p.logits_map, s.lo + t * T::kTileKV,
                     s.block * T::kBlockQ, sh.staging + kv.stage * T::kStagingBytes);
        bulk_commit();
        bulk_wait<0, true>();
      }
      __syncwarp();
      sh.kv_empty[kv.stage].arrive();
      kv.advance();
    }
  });
  if (lane == 0) bulk_wait<0, false>();
}

// Elements [first, last) of a 16-byte chunk of staged logits (E: std::uint32_t for fp32,
// std::uint16_t for bf16) to columns column + i of `out`, those inside [0, out_cols): one 16-byte
// store when that is all of the chunk.
template <typename E>
__device__ __forceinline__ void store_chunk(E* out, int column, int out_cols, int4 chunk, int first,
                                            int last) {
  constexpr int kElements = kStoreAlignBytes / sizeof(E);
  if (first == 0 && last == kElements && column >= 0 && column + kElements <= out_cols) {
    *reinterpret_cast<int4*>(out + column) = chunk;
    return;
  }
  const std::uint32_t words[4] = {static_cast<std::uint32_t>(chunk.x),
                                  static_cast<std::uint32_t>(chunk.y),
                                  static_cast<std::uint32_t>(chunk.z),
                                  static_cast<std::uint32_t>(chunk.w)};
#pragma unroll
  for (int i = 0; i < kElements; ++i) {
    const int c = column + i;
    if (i >= first && i < last && c >= 0 && c < out_cols) {
      out[c] = static_cast<E>(words[i * sizeof(E) / 4] >> (8 * (i * sizeof(E) % 4)));
    }
  }
}

// Bytes [0, bytes) of `low`, the rest of `high`.
__device__ __forceinline__ int4 splice(int4 low, int4 high, int bytes) {
  const auto word = [&](int lo, int hi, int w) {
    const int keep = min(max(bytes - 4 * w, 0), 4);
    const std::uint32_t mask = keep == 4 ? ~0u : (1u << (8 * keep)) - 1;
    return static_cast<int>((static_cast<std::uint32_t>(lo) & mask) |
                            (static_cast<std::uint32_t>(hi) & ~mask));
  };
  return make_int4(word(low.x, high.x, 0), word(low.y, high.y, 1), word(low.z, high.z, 2),
                   word(low.w, high.w, 3));
}

// Warp 3, compressed output (a row's column is the key less the row's start): each tile's
// logits, lane r storing row r of the block. Its 128 columns go out as one TMA box, unless they
// are shifted off the 16-byte grid. Such a row is staged rotated (staged_slot): a box of its
// aligned 128 - A columns (A per 16 bytes), then its other A columns, the last A - R of the tile
// and the first R (R: the rotation), which end and start 16-byte chunks. The lane keeps the
// tile's last A - R in registers and writes them with the next tile's first R as one aligned
// 16-byte store; at the span's ends (or at out_cols) it writes a chunk's own columns only, one by
// one. A row whose box would start at a negative column (TMA faults on it; the row's first tile)
// the whole warp stores instead, columns lane + 32 c. TMA drops what lies past S or out_cols.
// Each lane frees the stage (kv_empty counts 32 arrivals) once its stores have read it.
template <typename T, typename E>
__device__ __forceinline__ void store_row_tiles(const PrefillParams& p, const PrefillShared<T>& sh,
                                                int lane) {
  constexpr int kElements = kStoreAlignBytes / sizeof(E);  // A
  constexpr int kRowBytes = T::staging_row_bytes(sizeof(E));
  constexpr int kEdgeOffset = kRowBytes - kStoreAlignBytes;  // of slot 128 - A
  const int out_cols = static_cast<int>(p.out_cols);  // columns and rows fit in int (TMA's)
  RingPosition<T::kStages> kv;
  for_each_block_span<T::kHeads>(p, [&](const BlockSpan& s) {
    const int row0 = s.block * T::kBlockQ;
    const bool has_row = lane < T::kBlockQ && row0 + lane < p.seq_len;
    const int shift = has_row ? p.k_start[row0 + lane] : 0;
    const int rotation = first_aligned_column(shift, sizeof(E));
    E* out = static_cast<E*>(kernels::logits_row(p.logits, p.logits_row_stride,
                                                 has_row ? row0 + lane : 0, sizeof(E) == 2));
    int4 carry{};  // slots 128 - A.. of the last tile stored, when `carried`
    bool carried = false;
    for (int t = s.first_tile; t < s.end_tile; ++t) {
      const int column = s.lo + t * T::kTileKV - shift;  // of column 0
      const int chunk_column = column + rotation - kElements;
      const bool writes = has_row && column > -T::kTileKV && column < out_cols;
      const bool by_tma = column + rotation >= 0;
      sh.sums_full[kv.stage].wait(kv.phase);
      const std::uint8_t* staged = sh.staging + kv.stage * T::kStagingBytes;
      const std::uint8_t* staged_row = staged + lane * kRowBytes;
      if (writes && by_tma) {
        tma_store_2d(rotation == 0 ? &p.logits_map : &p.logits_inner_map, column + rotation,
                     row0 + lane, staged_row);
      }
      bulk_commit();
      if (writes && by_tma && rotation != 0) {
        const int4 edge = *reinterpret_cast<const int4*>(staged_row + kEdgeOffset);
        const int tail = kElements - rotation;  // the last tile's columns in the chunk
        store_chunk(out, chunk_column, out_cols,
                    carried ? splice(carry, edge, tail * sizeof(E)) : edge, carried ? 0 : tail,
                    kElements);
        carry = edge;
        carried = true;
      } else if (carried) {
        store_chunk(out, chunk_column, out_cols, carry, 0, kElements - rotation);
        carried = false;
      }
      for (unsigned rows = __ballot_sync(0xffffffffu, writes && !by_tma); rows != 0;
           rows &= rows - 1) {
        const int r = __ffs(static_cast<int>(rows)) - 1;
        const int row_column = __shfl_sync(0xffffffffu, column, r);
        const int row_rotation = __shfl_sync(0xffffffffu, rotation, r);
        const auto* from = reinterpret_cast<const E*>(staged + r * kRowBytes);
        E* row_out = static_cast<E*>(kernels::logits_row(p.logits, p.logits_row_stride, row0 + r,
                                                         sizeof(E) == 2));
#pragma unroll
        for (int c = lane; c < T::kTileKV; c += 32) {
          const int to = row_column + c;
          if (to >= 0 && to < out_cols) row_out[to] = from[staged_slot(c, row_rotation)];
        }
      }
      bulk_wait<0, true>();
      sh.kv_empty[kv.stage].arrive();
      kv.advance();
    }
    if (carried) {  // the last tile's last A - R columns
      const int column = s.lo + s.end_tile * T::kTileKV - shift;
      store_chunk(out, column + rotation - kElements, out_cols, carry, 0, kElements - rotation);
    }
  });
  bulk_wait<0, false>();
}

}  // namespace mqa_logits::sm90
