// The decode (paged_mqa_logits) kernel's plan, shared by its launcher and its device code: tile
// sizes, how a group's query rows are cut into wgmma chunks, the shared-memory carve-up, the
// kernel parameters, and the walk over one worker's segment of the schedule metadata.
//
// Work decomposition (see schedule.hpp for the metadata): the metadata gives worker k the items
// [(g0, i0), (g1, i1)) of a list of units (sequences; rows in the varlen form), an item being
// one 64-key tile of a unit (the metadata chooses the part lengths a segment is cut at). The
// kernel turns the segment into groups, rows of one sequence that load every key once, through
// the block-table row of the group's first row: the next_n rows of a sequence, or up to
// varlen_group_rows(H) consecutive varlen rows with equal indices (one sequence's tokens, whose
// block-table rows address the same blocks: problem.hpp). Each row of a group keeps its own
// range of 64-key tiles (its items inside the segment, cut at its length); a tile is loaded when
// any row of the group needs it, and written only for the rows that do. So every (row, tile) is
// owned by exactly one worker (of a pair of workers, by one of the pair's CTAs: "CTA pairs"),
// whatever the grouping.
#pragma once

#include <cuda.h>
#include <cuda/cmath>

#include <algorithm>
#include <cstdint>

#include "schedule.hpp"

namespace mqa_logits::sm90::paged {

inline constexpr int kTileKeys = 64;  // keys per tile: the M side of one wgmma
// Blocks of one 64-key tile: block_kv is 64 or 32 (a select, not a division, in the producer loop).
__host__ __device__ constexpr int tile_blocks(int block_kv) {
  return block_kv == kTileKeys ? 1 : 2;
}
static_assert(schedule::kPagedTileTokens == kTileKeys, "a metadata item is one tile");

inline constexpr int kMaxGroupRows = 8;        // next_n <= 8
inline constexpr int kMaxVarlenGroupRows = 4;  // varlen rows of one sequence decoded together
inline constexpr int kMaxMmaWidth = 256;       // wgmma N limit
inline constexpr int kWidthGranule = 64;       // chunk widths are multiples of this (wgmma shapes)
inline constexpr int kQBoxRows = 64;           // (row, head) pairs per q TMA box
inline constexpr int kKeyBoxRows = 32;         // key rows per TMA box (a block is one or two)
inline constexpr int kMaxStages = 32;
// Key bytes a CTA keeps in flight, at most (12 tiles at D = 128). More only lengthens the queue
// at HBM: the SMs' loads then complete less evenly, and a call ends later (docs/design.md,
// "Choices made by measurement").
inline constexpr std::uint32_t kMaxKeyBytesInFlight = 96 * 1024;
inline constexpr int kQSlots = 2;  // a group's q is loaded while the previous one runs
inline constexpr int kScaleBytes = 4;

inline constexpr int kWarpsPerWarpgroup = 4;
// The producer warpgroup: loading_warps of its warps split the key tiles (tile k by warp
// k % loading_warps), then all of them clean.
inline constexpr int kProducerWarps = kWarpsPerWarpgroup;
inline constexpr int kCleanerWarps = kWarpsPerWarpgroup;
inline constexpr std::int64_t kCleanChunkCols = 4096;         // columns per cleaning task

// ---- chunks: a group's rows times heads is the wgmma N side --------------------------------
// A kernel instance is compiled for groups of up to `mma_rows` rows (its MMA shapes are constants:
// a shape chosen at run time makes ptxas serialize the wgmma pipeline). Chunk c holds rows
// [c * R, min((c + 1) * R, mma_rows)) with R = chunk_rows(H); its width is rows * H rounded up
// to kWidthGranule (padding columns compute on whatever q rows follow, and are never read). Only
// H = 64 with more than 4 rows needs a second chunk.

__host__ __device__ constexpr int chunk_rows(int heads) {
  // Not std::min: it would bind a reference to kMaxGroupRows, which device code cannot address.
  const int by_width = kMaxMmaWidth / heads;
  return by_width < kMaxGroupRows ? by_width : kMaxGroupRows;
}
__host__ __device__ constexpr int chunk_count(int rows, int heads) {
  return cuda::ceil_div(rows, chunk_rows(heads));
}
__host__ __device__ constexpr int rows_in_chunk(int rows, int chunk, int heads) {
  return std::min(chunk_rows(heads), rows - chunk * chunk_rows(heads));
}
__host__ __device__ constexpr int chunk_width(int chunk_row_count, int heads) {
  return cuda::ceil_div(chunk_row_count * heads, kWidthGranule) * kWidthGranule;
}
// (row, head) pairs of a q slot of an instance for `mma_rows` rows: the last chunk's end.
__host__ __device__ constexpr int q_slot_pairs(int mma_rows, int heads) {
  const int last = chunk_count(mma_rows, heads) - 1;
  return last * chunk_rows(heads) * heads +
         chunk_width(rows_in_chunk(mma_rows, last, heads), heads);
}
static_assert(chunk_width(chunk_rows(64), 64) <= kMaxMmaWidth);
static_assert(chunk_width(chunk_rows(8), 8) <= kMaxMmaWidth);
static_assert(chunk_count(kMaxGroupRows, 64) == 2 && chunk_count(kMaxGroupRows, 32) == 1);
// A second chunk starts where the first one's columns end (no padding between chunks).
static_assert(chunk_rows(64) * 64 % kWidthGranule == 0);

// The instance (mma_rows) that serves groups of `rows` rows: the fewest rows with the same chunk
// widths, so that instances differ in their MMA shapes only.
__host__ __device__ constexpr int mma_rows_for(int rows, int heads) {
  if (rows > chunk_rows(heads)) return rows;
  return std::min(chunk_rows(heads), chunk_width(rows, heads) / heads);
}
static_assert(mma_rows_for(1, 64) == 1 && mma_rows_for(3, 32) == 4 && mma_rows_for(1, 16) == 4);
static_assert(mma_rows_for(2, 8) == 8 && mma_rows_for(7, 64) == 7);

// Math warpgroups of an instance (tiles go round-robin to them): as many as the register file
// holds with each one's accumulators and its lane's weights (weights_in_registers says where they
// live): four for at most 64 columns (32 accumulators a thread), three for at most 128 (64), else
// two (up to 128).
__host__ __device__ constexpr int math_warpgroups(int mma_rows, int heads) {
  if (chunk_count(mma_rows, heads) > 1 || chunk_width(mma_rows, heads) > 128) return 2;
  return chunk_width(mma_rows, heads) <= 64 ? 4 : 3;
}
// Producer warps that load key tiles beside `math_warpgroups` consumers: as many as there are math
// warpgroups where that is three or four (with a stage count their multiple, one warp then loads
// every tile of a stage), four beside two (docs/design.md, "The decode kernel", Ring, says why each
// keeps a stage's refills in the order its parity waits can tell apart).
__host__ __device__ constexpr int loading_warps(int math_warpgroups) {
  return math_warpgroups == 2 ? kProducerWarps : math_warpgroups;
}
// Whether the math warps keep their lane's weights of a group in registers (a quarter of its
// columns: 32 floats beside three or four math warpgroups; 64 beside two, for up to 4 rows of 256
// columns in all: more rows spill their store bookkeeping), and 16-byte weight loads, H >= 16.
__host__ __device__ constexpr bool weights_in_registers(int mma_rows, int heads) {
  return heads >= 16 &&
         (math_warpgroups(mma_rows, heads) > 2 || (mma_rows <= 4 && mma_rows * heads <= 256));
}
// Whether a one-chunk instance wider than 128 columns (two math warpgroups) issues its MMA in
// two parts, its first 128 columns and the rest, so that the epilogue starts on the first part's
// rows while the tensor cores compute the second. Those rows are the first 128 / H.
__host__ __device__ constexpr bool split_mma(int mma_rows, int heads) {
  return chunk_count(mma_rows, heads) == 1 && chunk_width(mma_rows, heads) > 128;
}
static_assert(split_mma(4, 64) && split_mma(3, 64) && split_mma(8, 32) && split_mma(6, 32) &&
              !split_mma(2, 64) && !split_mma(4, 32) && !split_mma(8, 64));
__host__ __device__ constexpr int kernel_threads(int mma_rows, int heads) {
  return 128 * (1 + math_warpgroups(mma_rows, heads));
}

// ---- CTA pairs --------------------------------------------------------------------------------
// A group at least 2 rows wider than one chunk (H = 64, next_n 6-8) runs on a pair of CTAs, a
// cluster of two on two SMs, where the call allows it (the launcher's choice: keys by TMA, not
// varlen, every pair of the grid resident at once). Pair k walks the union of the metadata's
// workers 2k and 2k + 1 (the metadata is the one of unpaired calls: rows 2k and min(2k + 2,
// workers)); each of its CTAs loads every key tile of it, issuing half the tile's boxes
// multicast to both, and computes its own rows of each group: CTA r rows [r * pair_rows, ...),
// in the instance for pair_rows rows, one chunk whose MMA is issued in two parts. Each SM then
// streams the keys of two workers for half the rows, the same work as before, but with the
// one-chunk instance's epilogue in place of two chunks a tile.
// Measured (docs/design.md, "Choices made by measurement"): groups of 6-8 rows gain, groups of
// 5 (the second CTA's 2 rows in the 3-row instance) lose; so the groups that pair are those at
// least 2 rows past one chunk.
__host__ __device__ constexpr bool pairs_groups(int group_rows, int heads) {
  return chunk_count(group_rows, heads) > 1 && group_rows - chunk_rows(heads) >= 2;
}
__host__ __device__ constexpr int pair_rows(int group_rows) { return (group_rows + 1) / 2; }
// The instances pairs run: those of the pair rows of the groups that pair (one chunk each).
__host__ __device__ constexpr bool pair_instance(int mma_rows, int heads) {
  for (int rows = 1; rows <= kMaxGroupRows; ++rows) {
    if (pairs_groups(rows, heads) && mma_rows_for(pair_rows(rows), heads) == mma_rows) return true;
  }
  return false;
}
static_assert(!pairs_groups(5, 64) && pairs_groups(6, 64) && !pairs_groups(8, 32));
static_assert(pair_instance(3, 64) && pair_instance(4, 64) && !pair_instance(2, 64) &&
              !pair_instance(8, 32) && chunk_count(pair_rows(kMaxGroupRows), 64) == 1);

// This CTA's rank in its pair: clusters of two along x hold CTAs 2k and 2k + 1.
__device__ __forceinline__ int pair_rank() { return static_cast<int>(blockIdx.x % 2); }

// Rows of a varlen group: up to 4, as long as they fit one 128-column chunk, so that a group of
// one row (no sharing to be had) still costs no more than the memory-bound minimum.
__host__ __device__ constexpr int varlen_group_rows(int heads) {
  const int by_width = 128 / heads;  // not std::min, for the reason chunk_rows gives
  return by_width < kMaxVarlenGroupRows ? by_width : kMaxVarlenGroupRows;
}
// The fewest rows of a group that an instance for `mma_rows` rows computes: the varlen form's
// groups from one row up in the instance of varlen_group_rows, else the smallest row count that
// mma_rows_for maps to it. Its epilogue sums the rows below that without checking the group's
// (a pair's CTA may hold fewer: the rows past its own are summed, and never stored).
__host__ __device__ constexpr int min_group_rows(int mma_rows, int heads) {
  if (mma_rows == mma_rows_for(varlen_group_rows(heads), heads)) return 1;
  int rows = mma_rows;
  while (rows > 1 && mma_rows_for(rows - 1, heads) == mma_rows) --rows;
  return rows;
}
static_assert(min_group_rows(1, 64) == 1 && min_group_rows(2, 64) == 1 &&
              min_group_rows(4, 64) == 4 && min_group_rows(8, 64) == 8 &&
              min_group_rows(4, 32) == 1 && min_group_rows(6, 32) == 5 &&
              min_group_rows(8, 32) == 7);
static_assert(math_warpgroups(1, 64) == 4 && math_warpgroups(2, 64) == 3 &&
              math_warpgroups(3, 64) == 2 && math_warpgroups(8, 16) == 3 &&
              math_warpgroups(8, 32) == 2 && math_warpgroups(varlen_group_rows(64), 64) == 3);

// ---- the math warpgroups' fp32 weight copies ------------------------------------------------
// Per row, four segments, one per quad lane (paged_epilogue.cuh, weight_index), each padded by
// 16 bytes where the segments would otherwise lie a multiple of 64 bytes apart: the four lanes'
// 16-byte loads then fall on distinct banks instead of colliding two by two (H = 64).
__host__ __device__ constexpr int weight_quad_floats(int heads) {
  return heads / 4 + (heads / 4 % 16 == 0 ? 4 : 0);
}
__host__ __device__ constexpr int weight_row_floats(int heads) {
  return 4 * weight_quad_floats(heads);
}
static_assert(weight_quad_floats(64) == 20 && weight_quad_floats(32) == 8);

// ---- shared memory --------------------------------------------------------------------------

struct SmemLayout {
  std::uint32_t q_slot_bytes = 0;        // q of one group: [pairs][D], swizzled by TMA
  std::uint32_t weight_slot_bytes = 0;   // weights of one group as stored: [pairs] fp32 or bf16
  std::uint32_t fp32_weights_bytes = 0;  // one math warpgroup's fp32 copy: [rows][row floats]
  std::uint32_t tile_bytes = 0;          // one stage of key values: [64][D], swizzled by TMA
  int stages = 0;
  std::uint32_t q_offset = 0;             // kQSlots q slots
  std::uint32_t tiles_offset = 0;         // `stages` key tiles
  std::uint32_t weights_offset = 0;       // kQSlots weight slots
  std::uint32_t fp32_weights_offset = 0;  // one fp32 copy per math warpgroup
  std::uint32_t scales_offset = 0;        // `stages` x kTileKeys fp32 key scales
  std::uint32_t info_offset = 0;          // `stages` x uint32: which blocks of the tile were loaded
  std::uint32_t barriers_offset = 0;      // full[stages], empty[stages], q_full[2], q_empty[2],
                                          // pipeline_ready
  std::uint32_t total_bytes = 0;          // from a 1024-byte aligned base
};

__host__ __device__ constexpr std::uint32_t align_up(std::uint32_t value, std::uint32_t to) {
  return (value + to - 1) / to * to;
}

// The carve-up of an instance for `mma_rows` rows, with as many stages (a multiple of its math
// warpgroups, at most kMaxStages and kMaxKeyBytesInFlight) as `budget_bytes` allows. stages == 0
// means the budget is too small.
constexpr SmemLayout make_smem_layout(int head_dim, int heads, int mma_rows, int weight_bytes,
                                      std::uint32_t budget_bytes) {
  SmemLayout s;
  const auto pairs = static_cast<std::uint32_t>(q_slot_pairs(mma_rows, heads));
  s.q_slot_bytes = pairs * static_cast<std::uint32_t>(head_dim);  // a multiple of 64 * D
  s.weight_slot_bytes = align_up(pairs * static_cast<std::uint32_t>(weight_bytes), 16);
  s.fp32_weights_bytes = static_cast<std::uint32_t>(mma_rows * weight_row_floats(heads) * 4);
  s.tile_bytes = static_cast<std::uint32_t>(kTileKeys * head_dim);
  const int warpgroups = math_warpgroups(mma_rows, heads);
  const std::uint32_t fixed = kQSlots * (s.q_slot_bytes + s.weight_slot_bytes + 2 * 8) +
                              warpgroups * s.fp32_weights_bytes + 8;  // + pipeline_ready
  const std::uint32_t per_stage = s.tile_bytes + kTileKeys * kScaleBytes + 4 + 2 * 8;
  const std::uint32_t room = budget_bytes > fixed + 64 ? budget_bytes - fixed - 64 : 0;
  // A multiple of the math warpgroups: stage s always holds tiles of math warpgroup s % warpgroups
  // (docs/design.md, "The decode kernel", Ring).
  const int most = std::min(kMaxStages, static_cast<int>(kMaxKeyBytesInFlight / s.tile_bytes));
  s.stages = std::min(most, static_cast<int>(room / per_stage)) / warpgroups * warpgroups;
  const auto stages = static_cast<std::uint32_t>(s.stages);
  s.q_offset = 0;
  s.tiles_offset = s.q_offset + kQSlots * s.q_slot_bytes;  // both multiples of 1024
  s.weights_offset = s.tiles_offset + stages * s.tile_bytes;
  s.fp32_weights_offset = s.weights_offset + kQSlots * s.weight_slot_bytes;
  s.scales_offset = s.fp32_weights_offset + warpgroups * s.fp32_weights_bytes;
  s.info_offset = s.scales_offset + stages * kTileKeys * kScaleBytes;
  s.barriers_offset = align_up(s.info_offset + stages * 4, 8);
  s.total_bytes = s.barriers_offset + (2 * stages + 2 * kQSlots + 1) * 8;
  return s;
}

// ---- kernel parameters ----------------------------------------------------------------------

struct PagedParams {
  CUtensorMap q_map;   // q as [rows * H][D] bytes, boxes of kQBoxRows x D, swizzled by D
  CUtensorMap kv_map;  // key values as [num_blocks][block_kv][D] bytes, one block per box
  const std::uint8_t* kv_cache;
  std::int64_t block_stride_bytes;
  std::int64_t num_blocks;
  const void* q;        // [rows][H][D] (read by TMA through q_map; prefetched through this)
  const void* weights;  // [rows][H]
  const std::int32_t* context_lens;
  const std::int32_t* block_table;
  std::int64_t table_row_stride;
  std::int64_t max_blocks;
  const std::int32_t* indices;  // varlen form, or null
  const std::int32_t* schedule_meta;
  void* logits;
  std::int64_t logits_row_stride;
  std::int64_t max_context_len;
  std::int64_t key_cap;  // keys any row can have: min(max_context_len, max_blocks * block_kv)
  int workers;           // of the schedule metadata (its rows less one)
  int units;             // sequences, or rows in the varlen form
  int next_n;            // rows per sequence (1 in the varlen form)
  int group_rows;        // rows of the largest group: next_n, or varlen_group_rows(H)
  int lens_cols;         // columns of 2-D context lengths (next_n), 1 for 1-D
  int block_kv;
  bool lens_2d;
  bool kv_tma;  // keys by TMA; else (block stride not a multiple of 16) by 4-byte cp.async
  bool weights_bf16;
  bool logits_bf16;
  bool clean_logits;
  SmemLayout smem;
};

// ---- rows, groups and the walk over a worker's segment --------------------------------------
// Indices are 32-bit: rows times heads of q are TMA coordinates (the launcher checks they fit),
// and lengths, items and tiles are bounded by int32 context lengths.

// Stored length of row `t` of `unit` (a varlen row is a unit of its own: t is 0).
__device__ __forceinline__ std::int64_t stored_row_length(const PagedParams& p, int unit, int t) {
  return p.indices != nullptr
             ? schedule::paged_row_length(p.context_lens, p.lens_2d, unit, 1, 0)
             : schedule::paged_row_length(p.context_lens, p.lens_2d, unit, p.next_n, t);
}

// Keys of a row of stored length `length` after the clamping rules of problem.hpp.
__device__ __forceinline__ int row_key_count(const PagedParams& p, std::int64_t length) {
  return static_cast<int>(std::min(length, p.key_cap));
}

// Keys of output row `row` (the cleaners' view of the same rule).
__device__ __forceinline__ int output_row_key_count(const PagedParams& p, int row) {
  return row_key_count(p, p.indices != nullptr
                              ? stored_row_length(p, row, 0)
                              : stored_row_length(p, row / p.next_n, row % p.next_n));
}

struct RowTiles {
  int keys = 0;     // the row's key count
  int tile_lo = 0;  // tiles [tile_lo, tile_hi) of the row belong to this worker
  int tile_hi = 0;
};

struct TileRange {
  int lo = 0;
  int hi = 0;
  __device__ __forceinline__ bool empty() const { return lo >= hi; }
  __device__ __forceinline__ void merge(const RowTiles& row) {
    if (row.tile_lo >= row.tile_hi) return;
    lo = lo < hi ? std::min(lo, row.tile_lo) : row.tile_lo;
    hi = row.tile_hi > hi ? row.tile_hi : hi;
  }
};

// The tiles a group loads, in increasing order, as slots [begin, end) of the CTA's tile sequence
// (every role walks the same groups, so all number them alike): slot c holds tile
// c + first_offset below `split`, c + second_offset from there on (the second of two ranges).
struct TileSlots {
  int begin = 0;
  int split = 0;
  int end = 0;
  int first_offset = 0;
  int second_offset = 0;
  __device__ __forceinline__ int tile(int slot) const {
    return slot + (slot < split ? first_offset : second_offset);
  }
};

// A group's rows of this CTA, at most kRows (the instance's mma_rows: a bound known at compile
// time keeps the per-row loops short; in a pair the group has up to kMaxGroupRows rows in all).
// With kKeepRows the rows' own tiles are kept (the math warpgroups store per row); without, only
// what loading needs (the producer runs on few registers).
template <int kRows, bool kKeepRows>
struct Group {
  int first_row = 0;  // of q, weights and logits
  int rows = 0;
  const std::int32_t* table = nullptr;  // the shared block-table row
  int key_limit = 0;                    // the longest row: keys at or past it are never loaded
  RowTiles row[kKeepRows ? kRows : 1];
  // The tiles some row needs, as two ranges: row 0's, and the union of the others'. Only the
  // segment's first unit starts past item 0, and it is row 0 of its group in the varlen form
  // (later rows are later units) while all rows of a sequence share it: so rows 1.. start at one
  // tile and their union is one range.
  TileRange lead;
  TileRange rest;

  __device__ __forceinline__ bool has_tiles() const { return !lead.empty() || !rest.empty(); }
  // The union of lead and rest (one range or two) as slots from `begin` on. Selected by value: a
  // reference to either range would put the group in local memory.
  __device__ __forceinline__ TileSlots slots(int begin) const {
    const bool lead_first = rest.empty() || (!lead.empty() && lead.lo <= rest.lo);
    const int a_lo = lead_first ? lead.lo : rest.lo;
    const int a_hi = lead_first ? lead.hi : rest.hi;
    const int b_lo = lead_first ? rest.lo : lead.lo;
    const int b_hi = lead_first ? rest.hi : lead.hi;
    const bool one_range = b_lo >= b_hi || b_lo <= a_hi;
    TileSlots s;
    s.begin = begin;
    s.first_offset = a_lo - begin;
    if (one_range) {
      s.end = begin + std::max(a_hi, b_lo < b_hi ? b_hi : a_hi) - a_lo;
      s.split = s.end;
    } else {
      s.split = begin + (a_hi - a_lo);
      s.end = s.split + (b_hi - b_lo);
      s.second_offset = b_lo - s.split;
    }
    return s;
  }
};

// The metadata rows that bound this CTA's segment: worker k's are rows k and k + 1, a pair's
// (CTAs 2k, 2k + 1) rows 2k and min(2k + 2, workers).
struct SegmentRows {
  int first;
  int end;
};

template <bool kPaired>
__device__ __forceinline__ SegmentRows segment_rows(const PagedParams& p) {
  const int cta = static_cast<int>(blockIdx.x);
  if constexpr (kPaired) {
    const int first = cta - pair_rank();
    return {first, std::min(first + 2, p.workers)};
  }
  return {cta, cta + 1};
}

// The items [(g0, i0), (g1, i1)) between two rows of the metadata.
struct Segment {
  int g0, i0, g1, i1;
};

__device__ __forceinline__ Segment read_segment(const std::int32_t* meta, SegmentRows rows) {
  const std::int32_t* first = meta + static_cast<std::int64_t>(rows.first) * schedule::kMetaCols;
  const std::int32_t* end = meta + static_cast<std::int64_t>(rows.end) * schedule::kMetaCols;
  return {first[0] > 0 ? first[0] : 0, first[1] > 0 ? first[1] : 0, end[0], end[1]};
}

// Tiles of a unit's row inside the segment: its items [ib, ie) cut at its key count.
__device__ __forceinline__ RowTiles row_tiles(const Segment& seg, int unit, int unit_items,
                                              int keys) {
  const int ib = unit == seg.g0 ? std::min(seg.i0, unit_items) : 0;
  const int ie = unit == seg.g1 ? std::min(seg.i1, unit_items) : unit_items;
  const int lo = ib;
  const int hi = std::min(ie, cuda::ceil_div(keys, kTileKeys));
  RowTiles r;
  r.keys = keys;
  if (lo < hi) {
    r.tile_lo = lo;
    r.tile_hi = hi;
  }
  return r;
}

// The group starting at `unit`; `*next` receives the unit after it. Units at or past `unit_end`
// belong to later workers. Every row's length is read once, all rows' reads issued together: at
// a call's start they are one link of the chain of dependent reads before the first keys load.
// In a pair (kPaired; never the varlen form) the group's tiles are those of all its rows, as the
// other CTA walks them too, and its rows (first_row, rows, row) are this CTA's.
template <int kRows, bool kKeepRows, bool kPaired>
__device__ __forceinline__ Group<kRows, kKeepRows> load_group(const PagedParams& p,
                                                              const Segment& seg, int unit,
                                                              int unit_end, int* next) {
  constexpr int kGroupRows = kPaired ? kMaxGroupRows : kRows;  // rows a group may have
  Group<kRows, kKeepRows> g;
  const bool varlen = !kPaired && p.indices != nullptr;
  // Row t's length as stored. The rows of a sequence share its unit; varlen rows are units of
  // their own, read before the indices that say which of them join this group (so that the two
  // reads overlap).
  const int rows_to_read = varlen ? std::min(kRows, p.units - unit) : p.next_n;
  int length[kGroupRows];  // int32 lengths, clamped at 0
  int longest = 0;
#pragma unroll
  for (int t = 0; t < kGroupRows; ++t) {
    length[t] = 0;
    if (t < rows_to_read) {
      length[t] = static_cast<int>(varlen ? stored_row_length(p, unit + t, 0)
                                          : stored_row_length(p, unit, t));
    }
    longest = std::max(longest, length[t]);
  }
  int group_rows = p.next_n;
  if (!varlen) {
    g.first_row = unit * p.next_n;
    *next = unit + 1;
  } else {
    const std::int32_t sequence = p.indices[unit];
    int end = unit + 1;
    while (end < unit_end && end - unit < p.group_rows && p.indices[end] == sequence) ++end;
    g.first_row = unit;
    group_rows = end - unit;
    *next = end;
  }
  const int own_first = kPaired ? pair_rank() * pair_rows(p.next_n) : 0;  // this CTA's rows
  g.first_row += own_first;
  g.rows = kPaired ? std::min(pair_rows(p.next_n), group_rows - own_first) : group_rows;
  g.table = p.block_table + static_cast<std::int64_t>(unit) * p.table_row_stride;  // unit's row

  // A sequence's items are those of its longest row (schedule::paged_unit_length).
  const int shared_items = static_cast<int>(schedule::paged_group_items(longest));
#pragma unroll
  for (int t = 0; t < kGroupRows; ++t) {
    if (t < group_rows) {
      const int items =
          varlen ? static_cast<int>(schedule::paged_group_items(length[t])) : shared_items;
      const RowTiles r =
          row_tiles(seg, varlen ? unit + t : unit, items, row_key_count(p, length[t]));
      if constexpr (kKeepRows) {
#pragma unroll
        for (int u = 0; u < kRows; ++u) {  // constant indices keep g in registers
          if (t == own_first + u) g.row[u] = r;
        }
      }
      g.key_limit = r.keys > g.key_limit ? r.keys : g.key_limit;
      if (t == 0) {
        g.lead.merge(r);
      } else {
        g.rest.merge(r);
      }
    }
  }
  return g;
}

// Calls fn(group) for every group of this CTA's segment that has tiles, in order; groups have at
// most kRows rows of this CTA (kRows >= p.group_rows, or >= pair_rows of it in a pair). Every
// role of the CTA (and of its pair) walks the same sequence; garbage metadata can only make the
// walk shorter (units are bounded by p.units), never read out of bounds.
template <int kRows, bool kKeepRows, bool kPaired, typename Fn>
__device__ __forceinline__ void for_each_group(const PagedParams& p, Fn&& fn) {
  const Segment seg = read_segment(p.schedule_meta, segment_rows<kPaired>(p));
  const int g1 = std::min(seg.g1, p.units);  // (g1 + 1 stays in range)
  const int unit_end = std::min(p.units, seg.i1 > 0 ? g1 + 1 : g1);
  for (int unit = seg.g0; unit < unit_end;) {
    int next = unit + 1;
    const Group<kRows, kKeepRows> group =
        load_group<kRows, kKeepRows, kPaired>(p, seg, unit, unit_end, &next);
    if (group.has_tiles()) fn(group);
    unit = next;
  }
}

}  // namespace mqa_logits::sm90::paged
