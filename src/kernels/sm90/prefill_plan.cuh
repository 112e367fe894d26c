// The prefill kernel's plan (prefill_kernel.cuh), shared by its launcher and its roles: the
// parameters, the tiling constants and shared-memory budget, the shared-memory carve-up, and the
// walk over a CTA's block spans (its segment of the schedule, given or computed by the CTA).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "kernels/fold_terms.hpp"
#include "kernels/metadata_kernel.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule.hpp"

namespace mqa_logits::sm90 {

// The CTA's segment of the schedule (find_segment): its first and end (block, item), as two rows
// of the metadata. Static shared memory: its address is a constant, so the walk over the spans
// holds no pointer to it.
static __shared__ std::int32_t prefill_segment[2 * schedule::kMetaCols];

struct PrefillParams {
  CUtensorMap q_map;       // [S * H, D] bytes, box 128 x D (one query group)
  CUtensorMap kv_map;      // [T, D] bytes, box 128 x D
  CUtensorMap kscale_map;  // [T] fp32, box 128 (a tile's keys)
  // [S, out_cols] fp32 or bf16 (the logits' dtype), boxes of 128 columns and kBlockQ rows (full
  // output: a block's rows at once) or 1 row (compressed output, whose rows are shifted apart)
  CUtensorMap logits_map;
  CUtensorMap logits_inner_map;  // compressed output: box 1 x (128 - kStoreAlignBytes / element)
  const void* weights;     // [S, H] fp32 or bf16
  std::int64_t weights_row_stride;
  const std::int32_t* k_start;
  const std::int32_t* k_end;
  void* logits;
  std::int64_t logits_row_stride;
  std::int64_t seq_len;
  std::int64_t seq_len_kv;
  std::int64_t out_cols;
  const std::int32_t* schedule_meta;  // null: each CTA computes its segment (find_segment)
  int num_blocks;
  bool weights_bf16;
  bool logits_bf16;
  bool compressed;
};

// A block as one CTA walks it: the CTA computes its tiles [first_tile, end_tile) (none when its
// segment holds only the block's own items, schedule.hpp).
struct BlockSpan {
  int lo;     // first key of tile 0 (schedule::prefill_tiles_start; keys fit int32)
  int block;  // kEndOfBlocks: the query warps' last message to the math warps
  int tiles;  // the block's key tiles (0 for a block whose rows are all empty)
  int first_tile;
  int end_tile;
  __device__ bool has_tiles() const { return first_tile < end_tile; }
};
static_assert(sizeof(BlockSpan) == 20);
inline constexpr int kEndOfBlocks = -1;

template <int kHeadDim, int kNumHeads>
struct PrefillTiling {
  static constexpr int kHeads = kNumHeads;
  static constexpr int kBlockQ = schedule::prefill_block_q(kNumHeads);
  static constexpr int kBlockN = kBlockQ * kNumHeads;  // (query, head) rows of a block
  static constexpr int kGroupQ = kBlockQ / 2;           // query rows per query group
  static constexpr int kGroupN = kGroupQ * kNumHeads;   // (query, head) columns of a group
  // H = 64: relu as |x| plus a folded linear half (prefill_folded_query.cuh), kFoldTerms more
  // MMA columns per query. Below, a group has more queries: their folded columns would not fit
  // the registers beside the accumulators and weights (H = 32), or cost more tensor time than
  // the relu they save (H <= 16: 32 or 64 columns).
  static constexpr bool kFoldLinear = kNumHeads == 64;
  static constexpr int kFoldedColumns = kFoldLinear ? kernels::kFoldTerms * kGroupQ : 0;
  static constexpr int kMmaN = kGroupN + kFoldedColumns;  // MMA columns per math warpgroup
  static constexpr int kTileKV = schedule::kPrefillTileKV;
  static constexpr int kKeysPerMma = 64;  // keys per wgmma (M); a tile is two halves
  static constexpr int kMathWarpgroups = 4;  // (query group, key half) = divmod(warpgroup, 2)
  static constexpr int kMathThreads = 128 * kMathWarpgroups;
  static constexpr int kMathWarps = kMathThreads / 32;
  static constexpr int kThreads = 128 + kMathThreads;
  // Register budgets: the CTA starts with launch_registers(640) = 96 per thread; the producer
  // warpgroup gives back 64 per thread, which lifts the math warpgroups to 112 (at 104 the tile
  // loop of H = 32 spilled three values a tile).
  static constexpr int kProducerRegisters = 32;
  static constexpr int kMathRegisters = 112;
  static_assert(128 * kProducerRegisters + kMathThreads * kMathRegisters <=
                kThreads * launch_registers(kThreads));
  // Q buffers: a block's Q rows load (and fold) while the blocks before it compute. At H = 64
  // (4-row blocks, 1-3 tiles each near the diagonal of causal windows) the query warps' chain per
  // block (TMA, state, fold) outlasts a short block, so a third buffer lets it run two blocks
  // ahead, at the price of two K stages (8 -> 6 at D = 128).
  static constexpr int kQBuffers = kFoldLinear ? 3 : 2;
  static constexpr int kGroupBytes = kMmaN * kHeadDim;  // a group's Q tile, folded rows last
  static constexpr int kQBytes = 2 * kGroupBytes;
  static constexpr int kKVBytes = kTileKV * kHeadDim;
  // Key scales of a tile: its first key is a multiple of schedule::kPrefillTileAlign, so the box
  // starts 16-byte aligned, as TMA needs.
  static constexpr int kScaleBox = kTileKV;  // a tile's key scales
  static constexpr int kScaleBytes = kScaleBox * 4;  // per stage
  static constexpr int kPartials = 2 * kGroupQ;  // (row r, query q) sums per thread
  static constexpr int kOutputsPerThread = kPartials / 4;
  // Queries among a math thread's outputs (prefill_math.cuh): output i is query
  // (4 i + lane % 4) % kGroupQ.
  static constexpr int kLaneQueries = kGroupQ / 4 > 1 ? kGroupQ / 4 : 1;
  static_assert(kOutputsPerThread >= 1,
                "the prefill kernel needs H <= 64: the quad reduction spreads a thread's "
                "2 x (128 / H) sums over 4 lanes");
  // A stage's logits, staged by the math warps for the store warp's TMA: one row of kTileKV
  // values (staged_slot) per block row, rows packed as a TMA box of all of them lays them out
  // (staging_row_bytes: 512 bytes apart for fp32, 256 for bf16).
  static constexpr int staging_row_bytes(int element) { return kTileKV * element; }
  static constexpr int kStagingBytes = kBlockQ * staging_row_bytes(4);
  // A block needs this many tiles to take the fold (kFoldLinear): a fold's 32 KB of Q row reads
  // queue behind the MMAs' operand reads in the SM's shared-memory data path, which shorter
  // blocks do not hide; they take the relu form (N = 128, FMNMX and FFMA), slower a tile but
  // never waiting for a fold. Chosen on the window patterns (docs/design.md, "Choices made by
  // measurement").
  static constexpr int kFoldMinTiles = 12;
  // What the query warps stage for the math warps with each Q buffer (BlockState): the block's
  // span, then per query group its weights, laid out so that lane l of a math warp reads its 32
  // (16 column pairs) as 8 float4 at row l % 4 of 4 rows (padded to spread the banks), into
  // registers once per block; each of its query rows' key window; the multipliers of its folded
  // columns (term s of query q at [s * kGroupQ + q]).
  static constexpr int kWeightRowFloats = 36;
  static constexpr int kLaneWeightFours = 8;  // 32 weights: 16 column pairs
  static constexpr int kWeightBytes = 4 * kWeightRowFloats * 4;
  static constexpr int kWindowBytes = kGroupQ * 16;
  static constexpr int kMultiplierBytes = kFoldLinear ? kernels::kFoldTerms * kGroupQ * 4 : 0;
  static constexpr int kGroupStateBytes = kWeightBytes + kWindowBytes + kMultiplierBytes;
  static constexpr int kSpanBytes = 32;  // the span, padded to keep the group states aligned
  static constexpr int kBlockStateBytes = kSpanBytes + 2 * kGroupStateBytes;
  static constexpr int kQueryWarps = 2;  // warps 1-2 of warpgroup 0: Q loads, block states, folds
  static constexpr int kStoreWarp = 3;   // warp 3: the logits' TMA stores
  // Everything but the stages, then as many stages as fit (at most 8; D = 128: 6 at H = 64, with
  // its third Q buffer, 7 at H = 32, 6 at H = 16, 4 at H = 8, where the staged logits grow with
  // the block's rows).
  static constexpr int kFixedBytes =
      kQBuffers * kQBytes + kQBuffers * kBlockStateBytes + 8 * 3 * kQBuffers;
  static constexpr int kStageBytes = kKVBytes + kScaleBytes + kStagingBytes + 8 * 3;
  // Opt-in shared memory of a CTA, less the static prefill_segment.
  static constexpr int kSmemLimit =
      kCtaSharedOptinBytes - static_cast<int>(sizeof(prefill_segment));
  static constexpr int kStages = (kSmemLimit - kFixedBytes) / kStageBytes < 8
                                     ? (kSmemLimit - kFixedBytes) / kStageBytes
                                     : 8;
  static constexpr int kSmemBytes = kFixedBytes + kStages * kStageBytes;
  static_assert(kStages >= 2 && kSmemBytes <= kSmemLimit);
  // Without metadata the CTA computes its segment, before the pipeline starts, in the K stages.
  static_assert(sizeof(metadata_kernels::ScheduleScratch<kThreads>) <= kStages * kKVBytes);
  // TMA boxes start 128-byte aligned (staging, key scales); block states 16-byte, barriers 8.
  static_assert(kKVBytes % 128 == 0 && kScaleBytes % 128 == 0 && kStagingBytes % 128 == 0);
  static_assert(kGroupStateBytes % 16 == 0 && sizeof(BlockSpan) <= kSpanBytes);
  static_assert(kGroupN == 128, "a group is 128 (query, head) columns");
  static_assert(kGroupBytes % (8 * kHeadDim) == 0, "group tiles start on swizzle atoms");
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128);
};

// What the query warps hand the math warps with a Q buffer, T::kBlockStateBytes from `at`: the
// block's span, then per query group (T::kGroupStateBytes each) its weights, each of its rows' key
// window (lo, hi, and the rotation of its staged logits: staged_slot) and its multipliers.
template <typename T>
struct BlockState {
  std::uint8_t* at;
  __device__ BlockSpan& span() const { return *reinterpret_cast<BlockSpan*>(at); }
  __device__ std::uint8_t* group(int g) const {
    return at + T::kSpanBytes + g * T::kGroupStateBytes;
  }
  __device__ float* weights(int g) const { return reinterpret_cast<float*>(group(g)); }
  __device__ int4* windows(int g) const {
    return reinterpret_cast<int4*>(group(g) + T::kWeightBytes);
  }
  __device__ float* multipliers(int g) const {
    return reinterpret_cast<float*>(group(g) + T::kWeightBytes + T::kWindowBytes);
  }
};

// The shared memory of PrefillTiling (kSmemBytes, in this order) as the roles address it.
template <typename T>
struct PrefillShared {
  std::uint8_t* q_tiles;      // kQBuffers x 2 query groups x kMmaN rows x D, swizzled by TMA
  std::uint8_t* kv_tiles;     // kStages x kTileKV x D, swizzled by TMA
  std::uint8_t* scale_tiles;  // kStages x kScaleBytes bytes
  std::uint8_t* staging;      // kStages x kStagingBytes (the stage's logits)
  std::uint8_t* block_states;  // kQBuffers x kBlockStateBytes (BlockState)
  Barrier* kv_full;           // kStages each: keys loaded,
  Barrier* sums_full;         // logits staged,
  Barrier* kv_empty;          // and stored (the stage free)
  Barrier* q_full;   // kQBuffers each: TMA rows landed,
  Barrier* q_ready;  // and the block state staged, the rows folded (when the block folds),
  Barrier* q_empty;  // and consumed

  // `smem` 1024-byte aligned: the 128-byte swizzle atoms of the TMA tiles need it.
  __device__ explicit PrefillShared(std::uint8_t* smem)
      : q_tiles(smem),
        kv_tiles(q_tiles + T::kQBuffers * T::kQBytes),
        scale_tiles(kv_tiles + T::kStages * T::kKVBytes),
        staging(scale_tiles + T::kStages * T::kScaleBytes),
        block_states(staging + T::kStages * T::kStagingBytes),
        kv_full(reinterpret_cast<Barrier*>(block_states + T::kQBuffers * T::kBlockStateBytes)),
        sums_full(kv_full + T::kStages),
        kv_empty(sums_full + T::kStages),
        q_full(kv_empty + T::kStages),
        q_ready(q_full + T::kQBuffers),
        q_empty(q_ready + T::kQBuffers) {}

  __device__ BlockState<T> block_state(int buffer) const {
    return {block_states + buffer * T::kBlockStateBytes};
  }
};

// TMA stores need the first output column of a box 16-byte aligned.
inline constexpr int kStoreAlignBytes = 16;

// The first column c of a tile whose output column (the tile's first key, a multiple of
// schedule::kPrefillTileAlign, plus c, less `shift`) is 16-byte aligned, for logits of
// `element` bytes: shift mod the elements per 16 bytes.
__host__ __device__ constexpr int first_aligned_column(std::int64_t shift, int element) {
  return static_cast<int>(shift & (kStoreAlignBytes / element - 1));
}
static_assert(schedule::kPrefillTileAlign % (kStoreAlignBytes / 2) == 0,
              "a tile's first key keeps bf16 and fp32 output columns 16-byte aligned");

// Slot of tile column c in its staged row, where `rotation` = first_aligned_column: the row is
// rotated so that the aligned columns [rotation, rotation + 128 - A) (A columns per 16 bytes)
// fill slots [0, 128 - A), one TMA box from the start of the row (128-byte aligned, as TMA needs
// of shared memory), and the A columns before and after them slots [128 - A, 128). Rotation 0
// (every row of uncompressed output) is the identity: one box of all 128 columns.
__device__ __forceinline__ int staged_slot(int column, int rotation) {
  return (column - rotation) & (schedule::kPrefillTileKV - 1);
}

// Row `lane` of block b's window (start, end), or an empty one past S: what block_span reduces.
template <int kBlockQ>
__device__ __forceinline__ int2 block_row_bounds(const PrefillParams& p, int b) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = static_cast<std::int64_t>(b) * kBlockQ + lane;
  if (lane >= kBlockQ || row < 0 || row >= p.seq_len) return make_int2(0, 0);
  return make_int2(p.k_start[row], p.k_end[row]);
}

// Block b: its tiles from min start (rounded down to kPrefillTileAlign) to max end over its
// non-empty rows, from each lane's block_row_bounds. Called by a full warp.
__device__ __forceinline__ BlockSpan block_span(const PrefillParams& p, int b, int2 bounds) {
  const auto w = schedule::prefill_row_window(bounds.x, bounds.y, p.seq_len_kv);
  const bool rows = w.lo < w.hi;
  const int lo = __reduce_min_sync(0xffffffffu, rows ? static_cast<int>(w.lo) : INT_MAX);
  const int hi = __reduce_max_sync(0xffffffffu, rows ? static_cast<int>(w.hi) : INT_MIN);
  const int start = hi > lo ? static_cast<int>(schedule::prefill_tiles_start(lo)) : 0;
  const int tiles = static_cast<int>(schedule::prefill_block_tiles(lo, hi));
  return {start, b, tiles, 0, tiles};
}

// This CTA's segment of the schedule into prefill_segment: rows blockIdx.x and blockIdx.x + 1 of
// the metadata, read from it when given, else computed here as the metadata kernel would (so the
// items are split evenly over the CTAs either way), in the K stages' memory that no TMA has
// written yet. Called by every thread of the CTA before the roles start.
template <typename T>
__device__ __forceinline__ void find_segment(const PrefillParams& p, const PrefillShared<T>& sh) {
  constexpr int kRowInts = 2 * schedule::kMetaCols;
  if (p.schedule_meta != nullptr) {
    const int at = schedule::kMetaCols * blockIdx.x + threadIdx.x;
    if (threadIdx.x < kRowInts) prefill_segment[threadIdx.x] = p.schedule_meta[at];
    return;
  }
  const metadata_kernels::PrefillUnits units{p.k_start,    p.k_end,   p.seq_len,
                                             p.seq_len_kv, T::kHeads, T::kBlockQ};
  auto& scratch = *reinterpret_cast<metadata_kernels::ScheduleScratch<T::kThreads>*>(sh.kv_tiles);
  metadata_kernels::schedule_rows<T::kThreads>(units, gridDim.x, blockIdx.x, blockIdx.x + 1,
                                               scratch, prefill_segment);
  fence_async_proxy_shared();  // TMA (the async proxy) writes the scratch next
}

// Calls f(span) for every block span of this CTA's segment (prefill_segment: positions in the
// schedule's order of blocks, schedule::prefill_block_at), in order, its tiles those of the
// segment's items past the block's own (schedule::prefill_block_own_items). Each block's window
// bounds are loaded one block ahead, so that the walk adds no load latency between blocks.
// Called by full warps.
template <int kNumHeads, typename F>
__device__ __forceinline__ void for_each_block_span(const PrefillParams& p, F&& f) {
  constexpr int kBlockQ = schedule::prefill_block_q(kNumHeads);
  // Positions reach num_blocks (past the last) only where their block's bounds go unused.
  const auto block_at = [&](int position) {
    return schedule::prefill_block_at(position, p.num_blocks);
  };
  // Read where used (volatile): the bounds need no registers across the spans. The first
  // position is clamped to [0, num_blocks] and its item to >= 0, whatever the metadata holds
  // (another call's, or none of the metadata function's): positions there map to blocks in
  // [0, num_blocks), so no other value reads or writes outside the call's rows.
  const volatile std::int32_t* bounds = prefill_segment;
  int position = min(max(bounds[0], 0), p.num_blocks), item = max(bounds[1], 0);
  int2 next = block_row_bounds<kBlockQ>(p, block_at(position));
  for (;; ++position, item = 0) {
    const int end_position = min(bounds[2], p.num_blocks), end_item = bounds[3];
    if (position > end_position ||
        (position == end_position && (position == p.num_blocks || item >= end_item))) {
      return;
    }
    const int2 rows = next;
    next = block_row_bounds<kBlockQ>(p, block_at(position + 1));
    BlockSpan span = block_span(p, block_at(position), rows);
    const int own = schedule::prefill_block_own_items(kNumHeads, span.tiles);
    const int items = own + span.tiles;
    span.first_tile = max(item - own, 0);
    span.end_tile = max((position == end_position ? min(end_item, items) : items) - own, 0);
    f(span);
  }
}

// Weight of head `head` of query row `row`, as fp32; 0 past S.
__device__ __forceinline__ float query_weight(const PrefillParams& p, std::int64_t row, int head) {
  if (row >= p.seq_len) return 0.f;
  const std::int64_t at = row * p.weights_row_stride + head;
  return p.weights_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.weights)[at])
                        : static_cast<const float*>(p.weights)[at];
}

}  // namespace mqa_logits::sm90
