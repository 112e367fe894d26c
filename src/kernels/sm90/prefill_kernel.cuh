// FP8 prefill logits (SPEC operation 1) on sm_90a.
//
// Tiling. Query rows are cut into blocks of kBlockQ = 256 / H rows (schedule.hpp): two groups of
// kGroupQ = 128 / H rows, i.e. kGroupN = 128 (query, head) columns each. Keys are the M side of
// the MMA. A work item is one 128-key tile of one block; the four math warpgroups share it, math
// warpgroup w taking query group w / 2 and 64-key half w % 2 of the tile:
//     acc[64 keys x 128 (q, h)] = K_half[64 x D] * Q_group[128 x D]^T   (wgmma m64n128k32 e4m3)
// then logit[q, key] = kscale[key] * sum_h w[q, h] * relu(acc[key, (q, h)]). At H = 64 the relu
// is |x| plus a linear half that the MMA computes in 8 more columns (m64n136k32; the folded query
// rows of prefill_folded_query.cuh, term s of query q with multiplier m[q, s]):
//     logit[q, key] = kscale[key] * (sum_h (w[q, h] / 2) |acc[key, (q, h)]|
//                                    + sum_s m[q, s] acc[key, (q, s)]).
//
// Warp roles (640 threads, one CTA per SM, persistent):
//   warpgroup 0, warp 0    producer: TMA loads of K tiles + key scales (kStages-deep ring).
//   warpgroup 0, warps 1-3 query warps: warp 1 loads each block's Q rows by TMA (2 buffers) as
//                          soon as a buffer is free; at H = 64 all three then fold the block's
//                          queries (folded rows and multipliers, then q_ready) while the previous
//                          block computes. Cleaners: with clean_logits, -inf to the columns of
//                          each row that no tile of its block covers (outside
//                          [lo, lo + 128 * tiles)), each block once the next one is folded, so
//                          the main loop never waits on it.
//   warpgroups 1-4         math + epilogue: MMA into one accumulator set, then the relu * weight
//                          head reduction, the quad shuffles, the key scale and the stores, while
//                          the other three warpgroups' MMAs keep the tensor cores busy.
// Registers (setmaxnreg): 56 for warpgroup 0 and 104 for the math warpgroups (64 accumulators
// and the lane's 32 weights of the block among them); at H = 64 32 and 112 (68 accumulators).
// Pipeline: kv_full / kv_empty mbarrier pairs per stage (expect-tx by the producer; each math
// warp arrives on kv_empty once its MMA has read the stage); per Q buffer q_full (TMA), q_ready
// (folded, H = 64) and q_empty.
// Shared memory (D = 128): Q 2 x 2 groups x (128 + 8 folded at H = 64) rows x 128 B, K 8 x
// 16 KiB, key scales 8 x 640 B, per-warp weights (staged once per block) and output rows
// 16 x (576 + 32 * kGroupQ) B, multipliers, barriers: 208-214 KiB; statically, the query
// warps' blocks awaiting cleaning (1 KiB as laid out: the dynamic region stays 1024-aligned).
//
// Scheduling: without metadata, CTA c takes blocks c, c + grid, ...; with metadata, CTA c takes
// its contiguous segment of (block, tile) items. Every output element is computed by the same
// instructions in the same order either way, so both give bitwise-identical logits.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/prefill_folded_query.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule.hpp"

namespace mqa_logits::sm90 {

struct PrefillParams {
  CUtensorMap q_map;       // [S * H, D] bytes, box 128 x D (one query group)
  CUtensorMap kv_map;      // [T, D] bytes, box 128 x D
  CUtensorMap kscale_map;  // [T] fp32, box 132 (from the 16-byte aligned key at or below a tile)
  const void* weights;     // [S, H] fp32 or bf16
  std::int64_t weights_row_stride;
  const std::int32_t* k_start;
  const std::int32_t* k_end;
  void* logits;
  std::int64_t logits_row_stride;
  std::int64_t seq_len;
  std::int64_t seq_len_kv;
  std::int64_t out_cols;
  const std::int32_t* schedule_meta;  // null: round-robin over blocks
  int num_blocks;
  bool weights_bf16;
  bool logits_bf16;
  bool compressed;
  bool clean_logits;
};

template <int kHeadDim, int kNumHeads>
struct PrefillTiling {
  static constexpr int kBlockQ = schedule::prefill_block_q(kNumHeads);
  static constexpr int kBlockN = kBlockQ * kNumHeads;  // (query, head) rows of a block
  static constexpr int kGroupQ = kBlockQ / 2;           // query rows per query group
  static constexpr int kGroupN = kGroupQ * kNumHeads;   // (query, head) columns of a group
  // H = 64: relu as |x| plus a folded linear half (prefill_folded_query.cuh), kFoldTerms more
  // MMA columns per query. Below, a group has more queries: their folded columns would not fit
  // the registers beside the accumulators and weights (H = 32), or cost more tensor time than
  // the relu they save (H <= 16: 32 or 64 columns).
  static constexpr bool kFoldLinear = kNumHeads == 64;
  static constexpr int kFoldedColumns = kFoldLinear ? kFoldTerms * kGroupQ : 0;
  static constexpr int kMmaN = kGroupN + kFoldedColumns;  // MMA columns per math warpgroup
  static constexpr int kTileKV = schedule::kPrefillTileKV;
  static constexpr int kKeysPerMma = 64;  // keys per wgmma (M); a tile is two halves
  static constexpr int kMathWarpgroups = 4;  // (query group, key half) = divmod(warpgroup, 2)
  static constexpr int kMathThreads = 128 * kMathWarpgroups;
  static constexpr int kMathWarps = kMathThreads / 32;
  static constexpr int kThreads = 128 + kMathThreads;
  // Register budgets: the CTA starts with launch_registers(640) = 96 per thread; the producer
  // warpgroup gives back 40 per thread, which lifts the math warpgroups to 104, or at H = 64
  // (4 more accumulators) 64, which lifts them to 112.
  static constexpr int kProducerRegisters = kFoldLinear ? 32 : 56;
  static constexpr int kMathRegisters = kFoldLinear ? 112 : 104;
  static_assert(128 * kProducerRegisters + kMathThreads * kMathRegisters <=
                kThreads * launch_registers(kThreads));
  static constexpr int kStages = 8;
  static constexpr int kQBuffers = 2;
  static constexpr int kGroupBytes = kMmaN * kHeadDim;  // a group's Q tile, folded rows last
  static constexpr int kQBytes = 2 * kGroupBytes;
  static constexpr int kMultiplierFloats = kFoldLinear ? kBlockQ * kFoldTerms : 0;  // per buffer
  static constexpr int kKVBytes = kTileKV * kHeadDim;
  // Key scales of a tile, loaded from the 16-byte aligned key at or below its first key (TMA
  // needs the inner box offset 16-byte aligned): up to 3 leading extra scales.
  static constexpr int kScaleAlign = 4;
  static constexpr int kScaleBox = kTileKV + kScaleAlign;
  static constexpr int kScaleBytes = kScaleBox * 4;
  static constexpr int kScaleStride = (kScaleBytes + 127) / 128 * 128;  // bytes per stage
  static constexpr int kPartials = 2 * kGroupQ;  // (row r, query q) sums per thread
  static constexpr int kOutputsPerThread = kPartials / 4;
  // Each math warp's state for its block's query group in shared memory: the weights, laid out
  // so that lane l reads its 32 (16 column pairs) as 8 float4 at row l % 4 (rows padded to spread
  // the banks) into registers once per block, then one OutputRow per query row.
  static constexpr int kWeightRowFloats = 36;
  static constexpr int kLaneWeightFours = 8;  // 32 weights: 16 column pairs
  static constexpr int kWeightBytes = 4 * kWeightRowFloats * 4;
  static constexpr int kWarpStateBytes = kWeightBytes + kGroupQ * 32;
  static constexpr int kQueryWarps = 3;  // warps 1-3 of warpgroup 0: Q loads, folds, cleaning
  static constexpr int kSmemBytes = kQBuffers * kQBytes +
                                    kStages * (kKVBytes + kScaleStride) +
                                    kMathWarps * kWarpStateBytes +
                                    kQBuffers * kMultiplierFloats * 4 +
                                    8 * (2 * kStages + 3 * kQBuffers);
  static_assert(kGroupN == 128, "a group is 128 (query, head) columns");
  static_assert(kGroupBytes % (8 * kHeadDim) == 0, "group tiles start on swizzle atoms");
  static constexpr int kStaticSmemBytes = 1024;  // the query warps' BlockSpans, as laid out
  static_assert(kSmemBytes + kStaticSmemBytes <= 227 * 1024);
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128);
};

struct BlockSpan {
  int block;
  int first_item;  // items [first_item, end_item) of this block belong to this CTA
  int end_item;
  std::int64_t lo;  // first key of tile 0
  int tiles;        // real tiles of the block (0 for an empty block)
  int items;
};

// Key range of block b: min start / max end over its non-empty rows. Called by a full warp.
template <int kBlockQ>
__device__ __forceinline__ BlockSpan block_span(const PrefillParams& p, int b) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = static_cast<std::int64_t>(b) * kBlockQ + lane;
  int lo = INT_MAX, hi = INT_MIN;
  if (lane < kBlockQ && row < p.seq_len) {
    const auto w = schedule::prefill_row_window(p.k_start[row], p.k_end[row], p.seq_len_kv);
    if (w.lo < w.hi) {
      lo = static_cast<int>(w.lo);
      hi = static_cast<int>(w.hi);
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  const int tiles = hi > lo ? static_cast<int>(schedule::ceil_div(hi - lo, schedule::kPrefillTileKV)) : 0;
  const int items = static_cast<int>(schedule::prefill_block_items(lo, hi));
  return {b, 0, items, hi > lo ? lo : 0, tiles, items};
}

// Calls f(span) for every block span of this CTA, in order. Called by full warps.
template <int kBlockQ, typename F>
__device__ __forceinline__ void for_each_block_span(const PrefillParams& p, F&& f) {
  if (p.schedule_meta == nullptr) {
    for (int b = blockIdx.x; b < p.num_blocks; b += gridDim.x) f(block_span<kBlockQ>(p, b));
    return;
  }
  const std::int32_t* meta = p.schedule_meta + 2 * blockIdx.x;
  int block = meta[0], item = meta[1];
  const int end_block = min(meta[2], p.num_blocks), end_item = meta[3];
  for (; block < end_block || (block == end_block && block < p.num_blocks && item < end_item);
       ++block, item = 0) {
    BlockSpan span = block_span<kBlockQ>(p, block);
    span.first_item = item;
    span.end_item = block == end_block ? min(end_item, span.items) : span.items;
    f(span);
  }
}

// Sums v[P] over the 4 lanes of a quad; lane c of the quad ends with the sums of p = 4i + c.
template <int P>
__device__ __forceinline__ void quad_reduce_scatter(const float (&v)[P], float (&out)[P / 4]) {
  const bool odd = threadIdx.x & 1, upper = threadIdx.x & 2;
  float half[P / 2];
#pragma unroll
  for (int i = 0; i < P / 2; ++i) {
    const float keep = odd ? v[2 * i + 1] : v[2 * i];
    const float send = odd ? v[2 * i] : v[2 * i + 1];
    half[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
#pragma unroll
  for (int i = 0; i < P / 4; ++i) {
    const float keep = upper ? half[2 * i + 1] : half[2 * i];
    const float send = upper ? half[2 * i] : half[2 * i + 1];
    out[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
  }
}

// Weight of head `head` of query row `row`, as fp32; 0 past S.
__device__ __forceinline__ float query_weight(const PrefillParams& p, std::int64_t row, int head) {
  if (row >= p.seq_len) return 0.f;
  const std::int64_t at = row * p.weights_row_stride + head;
  return p.weights_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.weights)[at])
                        : static_cast<const float*>(p.weights)[at];
}

// Columns of `row` that tiles [lo, lo + 128 * tiles) of its block write.
__device__ __forceinline__ void covered_columns(const PrefillParams& p, std::int64_t row,
                                                const BlockSpan& s, std::int64_t& first,
                                                std::int64_t& last) {
  const std::int64_t shift = p.compressed ? p.k_start[row] : 0;
  first = s.tiles > 0 ? s.lo - shift : 0;
  last = s.tiles > 0 ? s.lo + std::int64_t{schedule::kPrefillTileKV} * s.tiles - shift : 0;
  first = max(std::int64_t{0}, min(first, p.out_cols));
  last = max(first, min(last, p.out_cols));
}

// One output row as the math warps see it: the address of the logit of key 0 (the row's
// column 0 shifted by its compressed-output offset; an address only, never dereferenced
// outside [first_key, end_key)), its key window and the keys its columns hold. 32 bytes.
struct alignas(16) OutputRow {
  std::int64_t key0_address;
  int lo, hi;
  int first_key, end_key;  // keys of columns 0 and out_cols; empty past S
};

__device__ __forceinline__ OutputRow output_row(const PrefillParams& p, std::int64_t row) {
  if (row >= p.seq_len) return {0, 0, 0, 0, 0};
  const std::int32_t start = p.k_start[row];
  const auto win = schedule::prefill_row_window(start, p.k_end[row], p.seq_len_kv);
  const int shift = p.compressed ? start : 0;
  const int element = p.logits_bf16 ? 2 : 4;
  const auto base = reinterpret_cast<std::int64_t>(
      kernels::logits_row(p.logits, p.logits_row_stride, row, p.logits_bf16));
  const std::int64_t end_key = min(std::int64_t{shift} + p.out_cols, std::int64_t{INT_MAX});
  return {base - std::int64_t{shift} * element, static_cast<int>(win.lo), static_cast<int>(win.hi),
          shift, static_cast<int>(end_key)};
}

// Warps 1-3 (kFoldLinear): the folded rows and multipliers of block `block`'s queries into its Q
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

template <int kHeadDim, int kNumHeads>
__global__ void __launch_bounds__(PrefillTiling<kHeadDim, kNumHeads>::kThreads, 1)
    prefill_logits_kernel(const __grid_constant__ PrefillParams p) {
  using T = PrefillTiling<kHeadDim, kNumHeads>;
  constexpr int kBlockQ = T::kBlockQ;

  // 1024-byte aligned: the 128-byte swizzle atoms of the TMA tiles need it.
  extern __shared__ __align__(1024) std::uint8_t smem[];
  std::uint8_t* q_tiles = smem;
  std::uint8_t* kv_tiles = q_tiles + T::kQBuffers * T::kQBytes;
  std::uint8_t* scale_tiles = kv_tiles + T::kStages * T::kKVBytes;
  std::uint8_t* warp_states = scale_tiles + T::kStages * T::kScaleStride;
  auto* multipliers = reinterpret_cast<float*>(warp_states + T::kMathWarps * T::kWarpStateBytes);
  Barrier* kv_full = reinterpret_cast<Barrier*>(multipliers + T::kQBuffers * T::kMultiplierFloats);
  Barrier* kv_empty = kv_full + T::kStages;
  Barrier* q_full = kv_empty + T::kStages;   // TMA rows landed
  Barrier* q_ready = q_full + T::kQBuffers;  // and folded (kFoldLinear)
  Barrier* q_empty = q_ready + T::kQBuffers;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&p.q_map);
    prefetch_tensor_map(&p.kv_map);
    prefetch_tensor_map(&p.kscale_map);
    for (int s = 0; s < T::kStages; ++s) {
      kv_full[s].init(1);
      kv_empty[s].init(T::kMathWarps);
    }
    for (int s = 0; s < T::kQBuffers; ++s) {
      q_full[s].init(1);
      q_ready[s].init(T::kQueryWarps);
      q_empty[s].init(T::kMathWarps);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  __syncthreads();

  if (warp < 4) {
    // ======================== producer, query warps and cleaners ========================
    lower_register_budget<T::kProducerRegisters>();
    if (warp == 0) {
      RingPosition<T::kStages> kv;
      for_each_block_span<kBlockQ>(p, [&](const BlockSpan& s) {
        const int tile_end = min(s.end_item, s.tiles);
        for (int t = s.first_item; t < tile_end; ++t) {
          if (lane == 0) {
            const int key0 = static_cast<int>(s.lo) + t * T::kTileKV;
            kv_empty[kv.stage].wait(kv.phase ^ 1);
            kv_full[kv.stage].arrive_expect_bytes(T::kKVBytes + T::kScaleBytes);
            tma_load_2d(kv_tiles + kv.stage * T::kKVBytes, &p.kv_map, 0, key0, &kv_full[kv.stage]);
            tma_load_2d(scale_tiles + kv.stage * T::kScaleStride, &p.kscale_map,
                        key0 & ~(T::kScaleAlign - 1), 0, &kv_full[kv.stage]);
          }
          kv.advance();
        }
      });
    } else if (warp == 1 || T::kFoldLinear || p.clean_logits) {
      // Warps 1-3: a block's Q rows (warp 1, as soon as the buffer is free: the block before the
      // previous one is done), its folded rows once they land (kFoldLinear; meanwhile the
      // previous block computes), then the previous block's -inf columns (clean_logits): a
      // block is cleaned only once the next one's Q is loaded (and folded), the last one after
      // the loop, so that at a block boundary the math warps never wait for a fold queued
      // behind cleaning.
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
      __shared__ BlockSpan uncleaned[T::kQueryWarps];
      static_assert(sizeof(uncleaned) <= T::kStaticSmemBytes);
      bool cleaning = false;  // uncleaned holds a block
      for_each_block_span<kBlockQ>(p, [&](const BlockSpan& s) {
        if (s.first_item < min(s.end_item, s.tiles)) {  // the block has tiles here
          if (warp == 1 && lane == 0) {
            q_empty[qb.stage].wait(qb.phase ^ 1);
            q_full[qb.stage].arrive_expect_bytes(2 * T::kGroupN * kHeadDim);
            for (int g = 0; g < 2; ++g) {
              tma_load_2d(q_tiles + qb.stage * T::kQBytes + g * T::kGroupBytes, &p.q_map, 0,
                          s.block * T::kBlockN + g * T::kGroupN, &q_full[qb.stage]);
            }
          }
          if constexpr (T::kFoldLinear) {
            q_full[qb.stage].wait(qb.phase);
            fold_block<T, kHeadDim, kNumHeads>(p, s.block, q_tiles + qb.stage * T::kQBytes,
                                               multipliers + qb.stage * T::kMultiplierFloats,
                                               warp - 1, lane);
            __syncwarp();
            if (lane == 0) q_ready[qb.stage].arrive();
          }
          qb.advance();
        }
        if (!p.clean_logits) return;
        if (cleaning) clean(uncleaned[warp - 1]);
        __syncwarp();
        if (lane == 0) uncleaned[warp - 1] = s;
        __syncwarp();
        cleaning = true;
      });
      if (cleaning) clean(uncleaned[warp - 1]);
    }
    return;
  }

  // ==================================== math + epilogue ====================================
  raise_register_budget<T::kMathRegisters>();
  // Broadcast from lane 0 so that the compiler knows it is warp-uniform: the wgmma descriptors
  // derived from it then live in uniform registers.
  const int math_wg = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
  const int group = math_wg / 2;                    // query group of the block
  const int half = math_wg % 2;                     // 64-key half of every tile
  const int quad_row = (warp % 4) * 16 + lane / 4;  // key row (r = 0) inside the half
  std::uint8_t* warp_state = warp_states + (warp - 4) * T::kWarpStateBytes;
  auto* warp_weights = reinterpret_cast<float4*>(warp_state);
  const float4* my_weights = warp_weights + (lane % 4) * (T::kWeightRowFloats / 4);
  auto* group_rows = reinterpret_cast<OutputRow*>(warp_state + T::kWeightBytes);
  RingPosition<T::kStages> kv;
  RingPosition<T::kQBuffers> qb;
  float acc[T::kMmaN / 2];
  float4 lane_weights[T::kLaneWeightFours];  // this lane's weights of the block (see below)

  for_each_block_span<kBlockQ>(p, [&](const BlockSpan& s) {
    const int tile_end = min(s.end_item, s.tiles);
    if (s.first_item >= tile_end) return;
    const std::int64_t row0 = static_cast<std::int64_t>(s.block) * kBlockQ + group * T::kGroupQ;

    // Weights of MMA column n = 8j + 2(lane % 4) + c, (q, h) = divmod(n, H), stored as
    // warp_weights[lane % 4][j / 2] = {w[j][0], w[j][1], w[j + 1][0], w[j + 1][1]} (j even);
    // halved where the relu is |x| plus the folded half.
    __syncwarp();  // the previous block's state is no longer read
    {
      const int j0 = 2 * (lane / 4);
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = 8 * (j0 + i / 2) + 2 * (lane % 4) + i % 2;
        const float scale = T::kFoldLinear ? 0.5f : 1.f;
        v[i] = scale * query_weight(p, row0 + n / kNumHeads, n % kNumHeads);
      }
      warp_weights[(lane % 4) * (T::kWeightRowFloats / 4) + lane / 4] = make_float4(v[0], v[1], v[2], v[3]);
    }
    if (lane < T::kGroupQ) group_rows[lane] = output_row(p, row0 + lane);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < T::kLaneWeightFours; ++i) lane_weights[i] = my_weights[i];

    // One arrival per warp once all its lanes are done with the buffer.
    auto release = [&](Barrier& empty) {
      __syncwarp();
      if (lane == 0) empty.arrive();
    };
    const std::uint8_t* q_group = q_tiles + qb.stage * T::kQBytes + group * T::kGroupBytes;
    (T::kFoldLinear ? q_ready : q_full)[qb.stage].wait(qb.phase);
    // kFoldLinear: the multipliers of the lane's folded columns (term lane % 4 of the group's
    // queries), read per tile: registers are short.
    const auto* lane_multipliers = reinterpret_cast<const float2*>(
        multipliers + qb.stage * T::kMultiplierFloats + (lane % 4) * T::kBlockQ +
        group * T::kGroupQ);

    for (int t = s.first_item; t < tile_end; ++t) {
      const int stage = kv.stage;
      kv_full[stage].wait(kv.phase);
      kv.advance();
      const std::uint8_t* keys = kv_tiles + stage * T::kKVBytes + half * T::kKeysPerMma * kHeadDim;
      wgmma_tile_e4m3_n<T::kMmaN, kHeadDim>(acc, keys, q_group);
      wgmma_wait<0>();
      fence_accumulators(acc);

      // Epilogue; the other three warpgroups' MMAs keep the tensor cores busy meanwhile.
      const int tile_key0 = static_cast<int>(s.lo) + t * T::kTileKV;
      const int half_row = half * T::kKeysPerMma + quad_row;
      const float* ks = reinterpret_cast<const float*>(scale_tiles + stage * T::kScaleStride) +
                        (tile_key0 & (T::kScaleAlign - 1)) + half_row;
      const float kscale0 = ks[0], kscale1 = ks[8];
      release(kv_empty[stage]);
      float partial[T::kPartials];
#pragma unroll
      for (int i = 0; i < T::kPartials; ++i) partial[i] = 0.f;
#pragma unroll
      for (int j = 0; j < 16; j += 2) {
        const float4 w = lane_weights[j / 2];
        const float wj[2][2] = {{w.x, w.y}, {w.z, w.w}};
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int q = 8 * (j + jj) / kNumHeads;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float x = acc[4 * (j + jj) + 2 * r + c];
              const float y = T::kFoldLinear ? fabsf(x) : fmaxf(x, 0.f);  // |x|: an FFMA modifier
              partial[r * T::kGroupQ + q] = fmaf(wj[jj][c], y, partial[r * T::kGroupQ + q]);
            }
          }
        }
      }
      if constexpr (T::kFoldLinear) {  // the folded columns: term lane % 4 of queries 2j, 2j + 1
        constexpr int kFolded = T::kGroupN / 2;  // accumulator of the first folded column
#pragma unroll
        for (int j = 0; j < T::kGroupQ / 2; ++j) {
          const float2 m = lane_multipliers[j];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            partial[r * T::kGroupQ + 2 * j] =
                fmaf(m.x, acc[kFolded + 4 * j + 2 * r], partial[r * T::kGroupQ + 2 * j]);
            partial[r * T::kGroupQ + 2 * j + 1] =
                fmaf(m.y, acc[kFolded + 4 * j + 2 * r + 1], partial[r * T::kGroupQ + 2 * j + 1]);
          }
        }
      }
      float sums[T::kOutputsPerThread];
      quad_reduce_scatter<T::kPartials>(partial, sums);
#pragma unroll
      for (int i = 0; i < T::kOutputsPerThread; ++i) {
        // Output p = 4i + lane % 4 is (key row r, query q) = divmod(p, kGroupQ).
        const int r = (4 * i + lane % 4) / T::kGroupQ;
        const OutputRow out = group_rows[(4 * i + lane % 4) % T::kGroupQ];
        const int key = tile_key0 + half_row + 8 * r;
        if (key < out.first_key || key >= out.end_key) continue;  // not a column of the output
        const bool inside = key >= out.lo && key < out.hi;
        const float v = inside ? sums[i] * (r ? kscale1 : kscale0) : -INFINITY;
        if (p.logits_bf16) {
          reinterpret_cast<__nv_bfloat16*>(out.key0_address)[key] = __float2bfloat16_rn(v);
        } else {
          reinterpret_cast<float*>(out.key0_address)[key] = v;
        }
      }
    }
    release(q_empty[qb.stage]);
    qb.advance();
  });
}

}  // namespace mqa_logits::sm90
