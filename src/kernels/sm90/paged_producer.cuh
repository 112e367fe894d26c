// The decode kernel's warpgroup 0 (docs/design.md, "The decode kernel", Roles): the loading warps
// (key tiles, each group's q and weights, and the L2 prefetch of what they read at later groups'
// start), and the cleaners that write -inf past the tiles' columns with clean_logits.
#pragma once

#include <cuda.h>
#include <cuda/cmath>

#include <algorithm>
#include <cstdint>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/paged_plan.cuh"
#include "kernels/sm90/paged_primitives.cuh"
#include "kernels/sm90/paged_shared_state.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90::paged {

// ---- producer -------------------------------------------------------------------------------

// The block ids of one own tile of a producer warp (its tile in slot `slot` of the CTA's tile
// sequence): -1 for a block past the group's longest row (`entries` blocks hold its keys) or past
// the group's slots. Ids outside [0, num_blocks) are caught where they are used.
template <int kBlocksPerTile>
struct TileBlocks {
  int id[kBlocksPerTile];
};

template <int kBlocksPerTile>
__device__ __forceinline__ TileBlocks<kBlocksPerTile> look_up_blocks(const TileSlots& tiles,
                                                                     const std::int32_t* table,
                                                                     int entries, int slot) {
  TileBlocks<kBlocksPerTile> blocks;
  const int first = slot < tiles.end ? tiles.tile(slot) * kBlocksPerTile : entries;
#pragma unroll
  for (int b = 0; b < kBlocksPerTile; ++b) {
    blocks.id[b] = first + b < entries ? __ldg(table + first + b) : -1;
  }
  return blocks;
}

// One group's q (TMA, kQBoxRows (row, head) pairs per box, the instance's chunk widths) and
// weights (bulk copy of the group's rows, as stored).
template <int D, int H, int kMmaRows>
__device__ void load_group_queries(const PagedParams& p, const SharedState& s,
                                   const Group<kMmaRows, false>& g, int slot) {
  constexpr int kPairs = q_slot_pairs(kMmaRows, H);
  Barrier* bar = s.q_full(slot);
  const int weight_size = p.weights_bf16 ? 2 : 4;
  const auto weight_bytes = static_cast<std::uint32_t>(g.rows * H * weight_size);
  bar->arrive_expect_bytes(kPairs * D + weight_bytes);
  for (int pair = 0; pair < kPairs; pair += kQBoxRows) {
    tma_load_2d(s.q_slot(slot) + pair * D, &p.q_map, 0, g.first_row * H + pair, bar);
  }
  bulk_load(s.weight_slot(slot),
            static_cast<const std::uint8_t*>(p.weights) +
                static_cast<std::int64_t>(g.first_row) * H * weight_size,
            weight_bytes, bar);
}

// Key tile of stage `stage` by cp.async: the block stride is not a multiple of 16 bytes, so TMA
// cannot address the blocks. Rows land where TMA's swizzle would put them.
template <int D, int kBlocksPerTile>
__device__ void copy_tile_async(const PagedParams& p, const SharedState& s, int stage,
                                const int (&ids)[kBlocksPerTile], std::uint32_t mask, int lane) {
  constexpr int kBlockKeys = kTileKeys / kBlocksPerTile;
  constexpr int kWordsPerRow = D / 4;
  for (int b = 0; b < kBlocksPerTile; ++b) {
    if (((mask >> b) & 1) == 0) continue;
    const std::uint8_t* block = p.kv_cache + ids[b] * p.block_stride_bytes;
    // Rolled: the producer runs on few registers, and cp.async is issued, not waited on.
#pragma unroll 1
    for (int word = lane; word < kBlockKeys * kWordsPerRow; word += 32) {
      const int row = word / kWordsPerRow;
      const int byte = (word % kWordsPerRow) * 4;
      const auto offset = static_cast<std::uint32_t>((b * kBlockKeys + row) * D + byte);
      cp_async_4(s.tile(stage) + swizzled_offset<D>(offset), block + row * D + byte);
    }
    const std::uint8_t* scales = block + kBlockKeys * D;
    for (int key = lane; key < kBlockKeys; key += 32) {
      cp_async_4(s.scales(stage) + b * kBlockKeys + key, scales + key * kScaleBytes);
    }
  }
  cp_async_wait_all();
  fence_async_proxy_shared();
}

// Loads the blocks of `mask` (ids[b] for bit b) into stage `stage` once its previous tile is
// consumed. kTma: lane 0 issues TMA boxes of kKeyBoxRows rows and one bulk copy of scales per
// block; else every lane copies by cp.async. In a pair (kPaired, by TMA only) both CTAs expect the
// whole tile, CTA r issues box r of it (kKeyBoxRows keys: the tile's two boxes) and its scales to
// both, and each producer arrives on both CTAs' full barriers.
template <int D, bool kTma, int kBlocksPerTile, bool kPaired>
__device__ __forceinline__ void load_tile(const PagedParams& p, const SharedState& s,
                                          const int (&ids)[kBlocksPerTile], std::uint32_t mask,
                                          int stage, std::uint32_t phase, int lane) {
  constexpr int kBlockKeys = kTileKeys / kBlocksPerTile;
  static_assert(kBlockKeys % kKeyBoxRows == 0);
  Barrier* full = s.full(stage);
  if constexpr (kTma) {
    if (lane == 0) {
      s.empty(stage)->wait(phase ^ 1);
      if constexpr (kPaired) fence_acquire_from_pair();  // the other CTA's reads of the stage
      *s.info(stage) = mask;
      full->arrive_expect_bytes(__popc(mask) * kBlockKeys * (D + kScaleBytes));
      // The other CTA's full barrier waits for this producer too, even where this CTA loads no
      // bytes of the tile (docs/design.md, "The decode kernel", CTA pairs).
      if constexpr (kPaired) arrive_on_cta(full, pair_rank() ^ 1, 1);
#pragma unroll
      for (int b = 0; b < kBlocksPerTile; ++b) {
        if (((mask >> b) & 1) == 0) continue;
        const std::uint8_t* scales = p.kv_cache + ids[b] * p.block_stride_bytes + kBlockKeys * D;
#pragma unroll
        for (int row = 0; row < kBlockKeys; row += kKeyBoxRows) {
          std::uint8_t* keys = s.tile(stage) + (b * kBlockKeys + row) * D;
          if constexpr (kPaired) {
            static_assert(kTileKeys == 2 * kKeyBoxRows, "a box for each CTA of the pair");
            if ((b * kBlockKeys + row) / kKeyBoxRows != pair_rank()) continue;
            tma_load_3d_pair(keys, &p.kv_map, 0, row, ids[b], full);
            bulk_load_pair(s.scales(stage) + b * kBlockKeys + row, scales + row * kScaleBytes,
                           kKeyBoxRows * kScaleBytes, full);
          } else {
            tma_load_3d(keys, &p.kv_map, 0, row, ids[b], full);
          }
        }
        if constexpr (!kPaired) {
          bulk_load(s.scales(stage) + b * kBlockKeys, scales, kBlockKeys * kScaleBytes, full);
        }
      }
    }
    __syncwarp();
  } else {
    static_assert(!kPaired, "a pair loads its keys by TMA");
    s.empty(stage)->wait(phase ^ 1);
    copy_tile_async<D, kBlocksPerTile>(p, s, stage, ids, mask, lane);
    if (lane == 0) *s.info(stage) = mask;
    full->arrive();  // every lane: an arrival releases only its own thread's writes
  }
}

// Warms L2 with what the producer reads at the start of each group of this CTA's segment after
// the first (whose reads are under way when this runs): the block-table entries of its tiles,
// its q rows and weights. The producer otherwise pays a DRAM round trip per group before its
// first key load can go out (short sequences at large batch).
// A later group starts after tens of megabytes of keys have passed through L2, so its table
// entries and weights (a few hundred bytes to a few kilobytes) are kept with evict_last. Its q
// rows (8 KB a row at H = 64, D = 128, megabytes a call) are not, for what that much evict_last
// data left behind might cost the kernels between two calls; their load then waits on HBM
// (docs/design.md, "Choices made by measurement").
template <int H, int kMmaRows, bool kPaired>
__device__ void prefetch_later_groups(const PagedParams& p, int head_dim, int lane) {
  constexpr int kLine = kL2LineBytes;
  bool first_group = true;
  for_each_group<kMmaRows, false, kPaired>(p, [&](const Group<kMmaRows, false>& g) {
    if (first_group) {
      first_group = false;
      return;
    }
    const TileSlots tiles = g.slots(0);
    const int blocks_per_tile = tile_blocks(p.block_kv);
    const int first = tiles.tile(tiles.begin) * blocks_per_tile;
    const int last = std::min((tiles.tile(tiles.end - 1) + 1) * blocks_per_tile,
                              cuda::ceil_div(g.key_limit, p.block_kv));
    constexpr int kEntriesPerLine = kLine / sizeof(*g.table);
    for (int entry = first + lane * kEntriesPerLine; entry < last; entry += 32 * kEntriesPerLine) {
      prefetch_l2_evict_last(g.table + entry);
    }
    const auto* q = static_cast<const std::uint8_t*>(p.q) +
                    static_cast<std::int64_t>(g.first_row) * H * head_dim;
    for (int byte = lane * kLine; byte < g.rows * H * head_dim; byte += 32 * kLine) {
      prefetch_l2(q + byte);
    }
    const int weight_size = p.weights_bf16 ? 2 : 4;
    const auto* w = static_cast<const std::uint8_t*>(p.weights) +
                    static_cast<std::int64_t>(g.first_row) * H * weight_size;
    for (int byte = lane * kLine; byte < g.rows * H * weight_size; byte += 32 * kLine) {
      prefetch_l2_evict_last(w + byte);
    }
  });
}

// A loading warp's loop: its own tiles (every kLoaders-th slot), their block ids looked up 32
// tiles at a time, one tile per lane, with the next 32 requested while these are issued. In a
// pair, the warp waits for the pair's barriers to be set up before its first load (pair_wait:
// its loads complete on the other CTA's barriers too), or at the end if it loads nothing.
template <int D, int H, int kMmaRows, bool kPaired, bool kTma, int kBlocksPerTile>
__device__ void produce(const PagedParams& p, const SharedState& s, int producer) {
  constexpr int kLoaders = loading_warps(math_warpgroups(kMmaRows, H));
  constexpr int kWindowSlots = 32 * kLoaders;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int block_limit = static_cast<int>(std::min<std::int64_t>(p.num_blocks, INT32_MAX));
  DealtRingPosition<kLoaders> turn(producer);
  RingPosition<kQSlots> q_ring;
  // The last loading warp warms L2 for the later groups once it has issued its tiles of the first
  // pass over the ring. Before that, the walk (a chain of dependent reads) would hold back its
  // first tiles, and with them the end of a short call (docs/design.md).
  bool later_groups_warmed = producer != kLoaders - 1;
  bool pair_ready = !kPaired;
  int group_begin = 0;  // the group's first slot in the CTA's tile sequence
  for_each_group<kMmaRows, false, kPaired>(p, [&](const Group<kMmaRows, false>& g) {
    const TileSlots tiles = g.slots(group_begin);
    const int entries = cuda::ceil_div(g.key_limit, kTileKeys / kBlocksPerTile);
    // Past the first group a completed phase: it returns at once.
    s.pipeline_ready()->wait(0);
    if (!pair_ready) {
      pair_wait();
      pair_ready = true;
    }
    if (producer == 0) {
      s.q_empty(q_ring.stage)->wait(q_ring.phase ^ 1);
      if (lane == 0) load_group_queries<D, H, kMmaRows>(p, s, g, q_ring.stage);
    }
    int window_start = turn.next;
    const int lane_slot = kLoaders * lane;
    auto window = look_up_blocks<kBlocksPerTile>(tiles, g.table, entries, window_start + lane_slot);
    auto next_window = look_up_blocks<kBlocksPerTile>(tiles, g.table, entries,
                                                      window_start + kWindowSlots + lane_slot);
    for (int i = 0; turn.next < tiles.end; turn.advance(p.smem.stages)) {
      int ids[kBlocksPerTile];
      std::uint32_t mask = 0;
#pragma unroll
      for (int b = 0; b < kBlocksPerTile; ++b) {
        ids[b] = __shfl_sync(0xffffffffu, window.id[b], i);
        if (ids[b] >= 0 && ids[b] < block_limit) mask |= 1u << b;
      }
      load_tile<D, kTma, kBlocksPerTile, kPaired>(p, s, ids, mask, turn.stage, turn.phase, lane);
      if (!later_groups_warmed && turn.next + kLoaders >= p.smem.stages) {
        prefetch_later_groups<H, kMmaRows, kPaired>(p, D, lane);
        later_groups_warmed = true;
      }
      if (++i == 32) {
        i = 0;
        window_start += kWindowSlots;
        window = next_window;
        next_window = look_up_blocks<kBlocksPerTile>(tiles, g.table, entries,
                                                     window_start + kWindowSlots + lane_slot);
      }
    }
    group_begin = tiles.end;
    q_ring.advance();
  });
  if (!pair_ready) pair_wait();
}

// The producer loop is compiled once per key path and block size, so that each copy carries only
// its own state and constants (a pair's keys come by TMA only: the launcher pairs no other call).
template <int D, int H, int kMmaRows, bool kPaired>
__device__ void run_producer(const PagedParams& p, const SharedState& s, int producer) {
  const bool one_block = tile_blocks(p.block_kv) == 1;
  if (kPaired || p.kv_tma) {
    if (one_block) {
      produce<D, H, kMmaRows, kPaired, true, 1>(p, s, producer);
    } else {
      produce<D, H, kMmaRows, kPaired, true, 2>(p, s, producer);
    }
  } else {
    if (one_block) {
      produce<D, H, kMmaRows, false, false, 1>(p, s, producer);
    } else {
      produce<D, H, kMmaRows, false, false, 2>(p, s, producer);
    }
  }
}

// ---- helpers: L2 prefetch and cleaning ------------------------------------------------------

// Before the wait for the previous kernel, which may still write what this one reads: L2
// prefetches by address alone (no value is read) of what the first dependent reads after the wait
// need, this CTA's two metadata rows and a 1/grid share of the context lengths. A CTA may start
// long before the wait returns (as the previous kernel's CTAs leave), with that kernel's stream
// of keys still passing through L2: evict_last keeps the lines there.
template <bool kPaired>
__device__ void prefetch_launch_inputs(const PagedParams& p, int lane) {
  constexpr int kLine = kL2LineBytes;
  const auto cta = static_cast<std::int64_t>(blockIdx.x);
  const auto grid = static_cast<std::int64_t>(gridDim.x);
  const SegmentRows rows = segment_rows<kPaired>(p);
  if (lane < 2) {
    const std::int64_t row = lane == 0 ? rows.first : rows.end;
    prefetch_l2_evict_last(p.schedule_meta + row * schedule::kMetaCols);
  }
  const std::int64_t lens_bytes =
      static_cast<std::int64_t>(p.units) * p.lens_cols * sizeof(*p.context_lens);
  const auto* lens = reinterpret_cast<const std::uint8_t*>(p.context_lens);
  for (std::int64_t line = cta + grid * lane; line * kLine < lens_bytes; line += 32 * grid) {
    prefetch_l2_evict_last(lens + line * kLine);
  }
}

__device__ inline void run_cleaner(const PagedParams& p, int cleaner) {
  if (!p.clean_logits || p.max_context_len == 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t rows = static_cast<std::int64_t>(p.units) * p.next_n;
  const std::int64_t per_row = schedule::ceil_div(p.max_context_len, kCleanChunkCols);
  const std::int64_t tasks = rows * per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kCleanerWarps;
  for (std::int64_t task = blockIdx.x * kCleanerWarps + cleaner; task < tasks; task += stride) {
    const std::int64_t row = task / per_row;
    const std::int64_t part = task % per_row;
    const std::int64_t written =  // by the tiles' owners
        schedule::ceil_div(output_row_key_count(p, static_cast<int>(row)), kTileKeys) * kTileKeys;
    const std::int64_t begin = std::max(written, part * kCleanChunkCols);
    const std::int64_t end = std::min((part + 1) * kCleanChunkCols, p.max_context_len);
    if (begin < end) {
      void* out = kernels::logits_row(p.logits, p.logits_row_stride, row, p.logits_bf16);
      kernels::fill_row_negative_infinity(out, p.logits_bf16, begin, end, lane, 32);
    }
  }
}

}  // namespace mqa_logits::sm90::paged
