// The prefill kernel's math warpgroups 1-4 (docs/design.md, "The prefill kernel", Roles): per
// tile, the MMA of their half against their query group, the relu * weight head sum, the quad
// reduction, key scale and window; the logits staged in shared memory for the store warp.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule.hpp"

namespace mqa_logits::sm90 {

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

// One math warpgroup's half of a tile: the MMA of its 64 keys against its query group, then per
// (key, query) the relu * weight sum over the heads (|x| plus the folded columns where the block
// folds), reduced over the quad: lane c keeps outputs p = 4i + c (quad_reduce_scatter).
template <typename T, int kNumHeads, bool kFold, int kHeadDim, int kAccumulators>
__device__ __forceinline__ void tile_half_sums(const std::uint8_t* keys,
                                               const std::uint8_t* q_group,
                                               float (&acc)[kAccumulators],
                                               const float4 (&lane_weights)[T::kLaneWeightFours],
                                               const float2* lane_multipliers,
                                               float (&sums)[T::kOutputsPerThread]) {
  wgmma_tile_e4m3_n<2 * kAccumulators, kHeadDim>(acc, keys, q_group);
  wgmma_wait<0>();
  fence_accumulators(acc);
  // The epilogue; the other three warpgroups' MMAs keep the tensor cores busy meanwhile.
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
          const float y = kFold ? fabsf(x) : fmaxf(x, 0.f);  // |x|: an FFMA modifier
          partial[r * T::kGroupQ + q] = fmaf(wj[jj][c], y, partial[r * T::kGroupQ + q]);
        }
      }
    }
  }
  if constexpr (kFold) {  // the folded columns: term lane % 4 of queries 2j, 2j + 1
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
  quad_reduce_scatter<T::kPartials>(partial, sums);
}

// Math warpgroups 1-4: per tile, the MMA, then the epilogue (relu * weight head sum, quad
// reduction, key scale, window), its logits staged in shared memory for the store warp.
template <typename T, int kHeadDim, int kNumHeads>
__device__ __forceinline__ void run_math(const PrefillParams& p, const PrefillShared<T>& sh,
                                         int warp, int lane) {
  // Broadcast from lane 0 so that the compiler knows it is warp-uniform: the wgmma descriptors
  // derived from it then live in uniform registers.
  const int math_wg = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
  const int group = math_wg / 2;                    // query group of the block
  const int half = math_wg % 2;                     // 64-key half of every tile
  const int quad_row = (warp % 4) * 16 + lane / 4;  // key row (r = 0) inside the half
  RingPosition<T::kStages> kv;
  RingPosition<T::kQBuffers> qb;
  float4 lane_weights[T::kLaneWeightFours];  // this lane's weights of the block (BlockState)

  for (;; qb.advance()) {
    sh.q_ready[qb.stage].wait(qb.phase);
    const BlockState<T> state = sh.block_state(qb.stage);
    const BlockSpan s = state.span();
    if (s.block == kEndOfBlocks) return;
    const float4* my_weights = reinterpret_cast<const float4*>(state.weights(group)) +
                               (lane % 4) * (T::kWeightRowFloats / 4);
#pragma unroll
    for (int i = 0; i < T::kLaneWeightFours; ++i) lane_weights[i] = my_weights[i];
    const int4* group_windows = state.windows(group);
    // The tiles whose half (this warpgroup's keys) meets the hull of the group's windows; the
    // others (a block's window edges, causal diagonals) hold only -inf for these rows and skip
    // the MMA. Uniform over the warpgroup, as its wgmma needs: every thread reads the same rows.
    int group_lo = INT_MAX, group_hi = INT_MIN;
#pragma unroll
    for (int q = 0; q < T::kGroupQ; ++q) {
      const int4 window = group_windows[q];
      if (window.x < window.y) {
        group_lo = min(group_lo, window.x);
        group_hi = max(group_hi, window.y);
      }
    }
    const schedule::TileRange mine = schedule::prefill_half_tiles(s.lo, half, group_lo, group_hi);
    const int computed_begin = min(max(mine.begin, s.first_tile), s.end_tile);
    const int computed_end = min(max(mine.end, computed_begin), s.end_tile);
    const std::uint8_t* q_group = sh.q_tiles + qb.stage * T::kQBytes + group * T::kGroupBytes;
    sh.q_full[qb.stage].wait(qb.phase);  // the rows (a folded block's landed before q_ready)
    // Folded blocks: the multipliers of the lane's folded columns (term lane % 4 of the group's
    // queries), read per tile: registers are short.
    const auto* lane_multipliers =
        reinterpret_cast<const float2*>(state.multipliers(group)) + (lane % 4) * (T::kGroupQ / 2);

    // The tile loop, compiled per logit type and output kind (a branch inside it costs
    // registers; full output stages its rows unrotated).
    const auto run_tiles = [&](auto logit, auto compressed, auto fold) {
      using Logit = decltype(logit);
      constexpr bool kFold = decltype(fold)::value;
      constexpr int kMmaN = kFold ? T::kMmaN : T::kGroupN;
      float acc[kMmaN / 2];
      // Full output: the key windows of the lane's outputs in registers for all the block's
      // tiles (output i is query (4 i + lane % 4) % kGroupQ, one of kLaneQueries). Read per tile
      // they waited behind the MMAs' operand reads (docs/design.md, "Choices made by
      // measurement"). Compressed output reads them per tile with their rotation: in registers
      // as well, its loops spilled.
      int2 lane_windows[T::kLaneQueries];  // lo, hi
#pragma unroll
      for (int k = 0; k < T::kLaneQueries; ++k) {
        const int4 window = group_windows[(4 * k + lane % 4) % T::kGroupQ];
        lane_windows[k] = make_int2(window.x, window.y);
      }
      // Register allocation, measured (docs/design.md): the H = 64 bf16 loop steps its
      // ring position as a tile count c (stage c % kStages, phase (c / kStages) % 2), with which
      // ptxas spills one value fewer a tile around the MMA there (and lays out the fp32 loop
      // shorter); every other loop steps the stage and phase, three instructions a tile fewer.
      constexpr bool kCounted = std::is_same_v<Logit, __nv_bfloat16> && kNumHeads == 64;
      unsigned count = kv.phase * T::kStages + kv.stage;
      // The next tile's stage, once its keys have landed (its staging is then free as well).
      const auto next_stage = [&] {
        const int stage = kCounted ? static_cast<int>(count % T::kStages) : kv.stage;
        sh.kv_full[stage].wait(kCounted ? (count / T::kStages) & 1 : kv.phase);
        if constexpr (kCounted) {
          ++count;
        } else {
          kv.advance();
        }
        return stage;
      };
      const int half_row = half * T::kKeysPerMma + quad_row;
      // Tile t's logits for the store warp: sums[i] times its key's scale inside its query's
      // window, -inf outside.
      const auto stage_logits = [&](int stage, int t, const float (&sums)[T::kOutputsPerThread],
                                    float kscale0, float kscale1) {
        const int tile_key0 = s.lo + t * T::kTileKV;
        std::uint8_t* staging = sh.staging + stage * T::kStagingBytes;
#pragma unroll
        for (int i = 0; i < T::kOutputsPerThread; ++i) {
          // Output p = 4i + lane % 4 is (key row r, query q) = divmod(p, kGroupQ).
          const int r = (4 * i + lane % 4) / T::kGroupQ;
          const int q = (4 * i + lane % 4) % T::kGroupQ;
          const int4 window = compressed ? group_windows[q]  // lo, hi, rotation
                                         : make_int4(lane_windows[i % T::kLaneQueries].x,
                                                     lane_windows[i % T::kLaneQueries].y, 0, 0);
          const int column = half_row + 8 * r;  // of the tile
          const int key = tile_key0 + column;
          const float v = key >= window.x && key < window.y ? sums[i] * (r ? kscale1 : kscale0)
                                                            : -INFINITY;
          std::uint8_t* staged_row =
              staging + (group * T::kGroupQ + q) * T::staging_row_bytes(sizeof(Logit));
          const int slot = compressed ? staged_slot(column, window.z) : column;
          reinterpret_cast<Logit*>(staged_row)[slot] = static_cast<Logit>(v);
        }
        fence_async_proxy_shared();  // the store warp's TMA reads them in the async proxy
        sh.sums_full[stage].arrive();  // every thread: each orders its own staged logits
      };
      const auto stage_outside = [&](int begin, int end) {  // every key outside the windows
        const float none[T::kOutputsPerThread] = {};
        for (int t = begin; t < end; ++t) stage_logits(next_stage(), t, none, 0.f, 0.f);
      };
      stage_outside(s.first_tile, computed_begin);
      for (int t = computed_begin; t < computed_end; ++t) {
        const int stage = next_stage();
        float sums[T::kOutputsPerThread];
        tile_half_sums<T, kNumHeads, kFold, kHeadDim>(
            sh.kv_tiles + stage * T::kKVBytes + half * T::kKeysPerMma * kHeadDim, q_group, acc,
            lane_weights, lane_multipliers, sums);
        const float* ks =
            reinterpret_cast<const float*>(sh.scale_tiles + stage * T::kScaleBytes) + half_row;
        stage_logits(stage, t, sums, ks[0], ks[8]);
      }
      stage_outside(computed_end, s.end_tile);
      if constexpr (kCounted) {
        kv.stage = static_cast<int>(count % T::kStages);
        kv.phase = (count / T::kStages) & 1;
      }
    };
    const auto run_tiles_folded = [&](auto logit, auto compressed) {
      // Only H = 64 folds, and only blocks of kFoldMinTiles tiles or more (prefill_plan.cuh).
      if constexpr (T::kFoldLinear) {
        if (s.tiles >= T::kFoldMinTiles) return run_tiles(logit, compressed, std::true_type{});
      }
      run_tiles(logit, compressed, std::false_type{});
    };
    const auto run_tiles_of = [&](auto logit) {
      if (p.compressed) {
        run_tiles_folded(logit, std::true_type{});
      } else {
        run_tiles_folded(logit, std::false_type{});
      }
    };
    if (p.logits_bf16) {
      run_tiles_of(__nv_bfloat16{});
    } else {
      run_tiles_of(float{});
    }
    sh.q_empty[qb.stage].arrive();  // every thread, once done with the Q buffer and its state
  }
}

}  // namespace mqa_logits::sm90
