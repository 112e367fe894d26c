// The decode kernel's math warpgroups (docs/design.md, "The decode kernel", Roles): per tile of
// their stages, the MMA against each chunk of the group's rows and the epilogue
// (paged_epilogue.cuh), the stage released to its producer.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/sm90/paged_epilogue.cuh"
#include "kernels/sm90/paged_plan.cuh"
#include "kernels/sm90/paged_primitives.cuh"
#include "kernels/sm90/paged_shared_state.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90::paged {

// Hands stage `stage` back to its producer once this thread's MMAs have read it: every thread
// arrives (an arrival releases only its own reads). In a pair, whose producers refill both CTAs'
// stages, each warp's first lane also arrives for its 32 on the other CTA's barrier, after the
// warp's reads of the stage (its lanes' key scales, the MMA it waited for) and a release at
// cluster scope; the other producer acquires it after its wait.
template <bool kPaired>
__device__ __forceinline__ void release_stage(const SharedState& s, int stage) {
  s.empty(stage)->arrive();
  if constexpr (kPaired) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      fence_release_to_pair();
      arrive_on_cta(s.empty(stage), pair_rank() ^ 1, 32);
    }
  }
}

// Tile `tile` of group g against chunk C of the queries: the MMA, then the epilogue.
template <int D, int H, int kMmaRows, bool kPaired, int C, typename Logit>
__device__ __forceinline__ void compute_chunk(const SharedState& s, const Group<kMmaRows, true>& g,
                                              const StoreRows<H, kMmaRows>& rows_out,
                                              const std::uint8_t* q_slot,
                                              const LaneWeights<H, kMmaRows>& weights, int tile,
                                              int stage, const TileScales& scales, int lane) {
  constexpr int kWidth = chunk_width(rows_in_chunk(kMmaRows, C, H), H);
  // The accumulators live for one chunk only: no value flows from one tile (or chunk) to the
  // next, which keeps the register allocator free to overlap them with everything else.
  if constexpr (split_mma(kMmaRows, H)) {
    static_assert(C == 0, "split instances have one chunk: q starts at the slot");
    SplitAccumulators<kWidth> acc;
    define_registers(acc.first);
    define_registers(acc.second);
    const std::uint64_t keys = s.tile_descriptor<D>(stage);
    wgmma_tile_e4m3_n<128, D>(acc.first, keys, kmajor_descriptor<D>(q_slot));
    wgmma_tile_e4m3_n<kWidth - 128, D>(acc.second, keys, kmajor_descriptor<D>(q_slot + 128 * D));
    wgmma_wait<1>();
    fence_accumulators(acc.first);
    chunk_epilogue<H, kMmaRows, C, Logit>(g, rows_out, acc, weights, tile, scales, lane, [&] {
      wgmma_wait<0>();
      fence_accumulators(acc.second);
      release_stage<kPaired>(s, stage);  // keys fully read
    });
  } else {
    float acc[kWidth / 2];
    define_registers(acc);
    wgmma_tile_e4m3_n<kWidth, D>(acc, s.tile_descriptor<D>(stage),
                                 kmajor_descriptor<D>(q_slot + C * chunk_rows(H) * H * D));
    wgmma_wait<0>();
    fence_accumulators(acc);
    if constexpr (C == chunk_count(kMmaRows, H) - 1) {  // keys fully read
      release_stage<kPaired>(s, stage);
    }
    chunk_epilogue<H, kMmaRows, C, Logit>(g, rows_out, acc, weights, tile, scales, lane, [] {});
  }
}

// The thread's keys in every tile: key0 and key0 + 8 (the accumulator rows it holds), which lie
// in one block (block_kv >= 32) whose bit in a stage's word of loaded blocks is block_bit.
struct LaneKeys {
  int key0;
  std::uint32_t block_bit;
};

template <int D, int H, int kMmaRows, bool kPaired, typename Logit>
__device__ __forceinline__ void compute_tile(const PagedParams& p, const SharedState& s,
                                             const Group<kMmaRows, true>& g,
                                             const StoreRows<H, kMmaRows>& rows_out,
                                             const std::uint8_t* q_slot,
                                             const LaneWeights<H, kMmaRows>& weights, int tile,
                                             int stage, std::uint32_t phase,
                                             const LaneKeys& keys, int lane) {
  s.full(stage)->wait(phase);
  const std::uint32_t loaded = *s.info(stage);
  TileScales scales;
  scales.key0 = keys.key0;
  scales.first = s.scales(stage)[keys.key0];
  scales.second = s.scales(stage)[keys.key0 + 8];
  scales.in_block = (loaded & keys.block_bit) != 0;
  scales.stores = scales.in_block || p.clean_logits;
  compute_chunk<D, H, kMmaRows, kPaired, 0, Logit>(s, g, rows_out, q_slot, weights, tile, stage,
                                                   scales, lane);
  if constexpr (chunk_count(kMmaRows, H) > 1) {  // always run: it hands the stage back
    compute_chunk<D, H, kMmaRows, kPaired, 1, Logit>(s, g, rows_out, q_slot, weights, tile, stage,
                                                     scales, lane);
  }
}

// This warpgroup's fp32 copy of the group's `rows` rows of weights, in the order the epilogue
// reads them (weight_index), whatever the stored dtype. The first barrier keeps the previous
// group's copy until every thread of the warpgroup is done with it, the second publishes the new
// one.
template <int H>
__device__ void copy_weights_fp32(const PagedParams& p, const SharedState& s, int rows, int slot,
                                  float* out, int math_warpgroup) {
  const int barrier = 1 + math_warpgroup;  // named barriers 1 to 4
  const int thread = static_cast<int>(threadIdx.x % 128);
  named_barrier_sync(barrier, 128);
  const std::uint8_t* in = s.weight_slot(slot);
  for (int i = thread; i < rows * H; i += 128) {
    const float w = p.weights_bf16 ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(in)[i])
                                   : reinterpret_cast<const float*>(in)[i];
    out[i / H * weight_row_floats(H) + weight_index(i % H, H)] = w;
  }
  named_barrier_sync(barrier, 128);
}

template <int D, int H, int kMmaRows, bool kPaired>
__device__ void run_math(const PagedParams& p, const SharedState& s, int math_warpgroup) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int key0 = 16 * static_cast<int>((threadIdx.x / 32) % kWarpsPerWarpgroup) + lane / 4;
  const LaneKeys keys{key0, key0 >= p.block_kv ? 2u : 1u};  // key0 < 64 = kTileKeys
  float* fp32_weights = s.fp32_weights(math_warpgroup);
  s.pipeline_ready()->wait(0);
  if constexpr (kPaired) pair_wait();  // the other CTA's barriers, on which it arrives, are set up
  DealtRingPosition<math_warpgroups(kMmaRows, H)> turn(math_warpgroup);
  RingPosition<kQSlots> q_ring;
  int group_begin = 0;  // the group's first slot in the CTA's tile sequence
  for_each_group<kMmaRows, true, kPaired>(p, [&](const Group<kMmaRows, true>& g) {
    const StoreRows<H, kMmaRows> rows_out(p, g, lane % 4);
    // Every math warpgroup waits for every group's q, even one without tiles of its own, so that
    // its q_empty arrival never runs a phase ahead of the other warpgroups'.
    s.q_full(q_ring.stage)->wait(q_ring.phase);
    copy_weights_fp32<H>(p, s, g.rows, q_ring.stage, fp32_weights, math_warpgroup);
    const LaneWeights<H, kMmaRows> weights(fp32_weights, lane % 4);
    const std::uint8_t* q_slot = s.q_slot(q_ring.stage);
    const TileSlots tiles = g.slots(group_begin);
    // The tile loop, compiled per logit type: a per-store choice costs every tile instructions.
    const auto run_tiles = [&](auto logit) {
      for (; turn.next < tiles.end; turn.advance(p.smem.stages)) {
        compute_tile<D, H, kMmaRows, kPaired, decltype(logit)>(p, s, g, rows_out, q_slot, weights,
                                                               tiles.tile(turn.next), turn.stage,
                                                               turn.phase, keys, lane);
      }
    };
    if (p.logits_bf16) {
      run_tiles(__nv_bfloat16{});
    } else {
      run_tiles(float{});
    }
    group_begin = tiles.end;
    s.q_empty(q_ring.stage)->arrive();
    q_ring.advance();
  });
}

}  // namespace mqa_logits::sm90::paged
