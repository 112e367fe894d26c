// The prefill kernel's store warp, warp 3 of warpgroup 0 (docs/design.md, "The prefill kernel",
// Roles): each tile's staged logits to the output, full or compressed rows.
#pragma once

#include <cstdint>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

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
