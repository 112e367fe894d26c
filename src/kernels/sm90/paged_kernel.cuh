// sm90 decode kernel: FP8 paged_mqa_logits (docs/contract.md, "Decode"), persistent, one CTA per
// worker of the schedule metadata, or a pair of CTAs per two workers for groups of 6-8 rows at
// H = 64. docs/design.md, "The decode kernel", describes the tiling, the stage ring and its
// barriers (and why a stage always serves one math warpgroup), the CTA pairs' protocol, the warp
// roles, registers and coverage; paged_plan.cuh the parameters and shared-memory layout.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/paged_epilogue.cuh"
#include "kernels/sm90/paged_plan.cuh"
#include "kernels/sm90/paged_primitives.cuh"
#include "kernels/sm90/paged_producer.cuh"
#include "kernels/sm90/paged_shared_state.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90::paged {

// Register budgets (setmaxnreg moves registers only within the CTA's pool: launch_registers).
inline constexpr int kProducerRegisters = 56;
__host__ __device__ constexpr int math_registers(int math_warpgroups) {
  // Below 224 the two-chunk instances serialize the wgmma pipeline.
  return math_warpgroups == 4 ? 104 : math_warpgroups == 3 ? 152 : 224;
}
__host__ __device__ constexpr bool registers_fit(int math_warpgroups) {
  const int threads = 128 * (1 + math_warpgroups);
  return 128 * kProducerRegisters + 128 * math_warpgroups * math_registers(math_warpgroups) <=
         threads * launch_registers(threads);
}
static_assert(registers_fit(2) && registers_fit(3) && registers_fit(4),
              "setmaxnreg.inc would wait forever for registers the CTA does not own");

// ---- math -----------------------------------------------------------------------------------

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

// ---- the kernel -----------------------------------------------------------------------------

template <int D, int H, int kMmaRows, bool kPaired>
__global__ void __launch_bounds__(kernel_threads(kMmaRows, H), 1)
    paged_logits_kernel(const __grid_constant__ PagedParams params) {
  static_assert(D == 32 || D == 64 || D == 128);
  static_assert(H == 8 || H == 16 || H == 32 || H == 64,
                "the decode kernel's chunks and epilogue are written for H = 8, 16, 32 and 64");
  static_assert(kMmaRows == mma_rows_for(kMmaRows, H), "not an instance mma_rows_for picks");
  static_assert(!kPaired || pair_instance(kMmaRows, H), "not an instance a pair runs");
  static_assert(!kPaired || loading_warps(math_warpgroups(kMmaRows, H)) == kProducerWarps,
                "every warp of warpgroup 0 loads, and so passes the pair's barrier in produce");
  extern __shared__ std::uint8_t smem_raw[];
  const std::uint32_t misalignment = smem_address(smem_raw) % 1024;
  const SharedState s(smem_raw + (misalignment == 0 ? 0 : 1024 - misalignment), params.smem);

  if (threadIdx.x / 32 == 1) {
    prefetch_launch_inputs<kPaired>(params, static_cast<int>(threadIdx.x % 32));
  }
  if (threadIdx.x == 0) {
    s.pipeline_ready()->init(1);
    fence_barrier_init();
    prefetch_tensor_map(&params.q_map);
    if (params.kv_tma) prefetch_tensor_map(&params.kv_map);
  }
  __syncthreads();
  // Programmatic dependent launch: everything above overlapped the previous kernel's tail; no
  // global memory is read before this point (warp 1 only prefetched into L2). The trigger lets a
  // kernel launched after this one the same way place its CTAs (and run its prologue) on SMs as
  // soon as ours leave them, instead of after the whole grid; it still waits for this grid's
  // completion before it reads anything.
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  // The pipeline's barriers: initialized by a math thread, idle until its group's q lands, while
  // the producers' first dependent reads are under way; each role waits for pipeline_ready
  // before its first barrier use. Before the wait (where a CTA that lands as the previous call's
  // last CTA leaves pays for them in full) they lengthened every call; one thread was faster than
  // one barrier a lane (docs/design.md, "Choices made by measurement").
  if (threadIdx.x == 128) {
    for (int stage = 0; stage < params.smem.stages; ++stage) {
      // The TMA thread (in a pair, both CTAs' TMA threads), or the copying warp.
      s.full(stage)->init(kPaired ? 2 : params.kv_tma ? 1 : 32);
      // The math warpgroup computing the stage, and in a pair the other CTA's (an arrival for 32
      // from each of its warps: release_stage).
      s.empty(stage)->init(kPaired ? 2 * 128 : 128);
    }
    for (int slot = 0; slot < kQSlots; ++slot) {
      s.q_full(slot)->init(1);
      s.q_empty(slot)->init(math_warpgroups(kMmaRows, H) * 128);
    }
    fence_barrier_init();
    s.pipeline_ready()->arrive();
  }
  // A pair's barriers are set up once every thread of both CTAs has arrived here (thread 128
  // after its inits); each thread waits for that before its first access to the other CTA.
  if constexpr (kPaired) pair_arrive();

  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  if (warpgroup == 0) {
    lower_register_budget<kProducerRegisters>();
    const int warp = static_cast<int>(threadIdx.x / 32);
    if (warp < loading_warps(math_warpgroups(kMmaRows, H))) {
      run_producer<D, H, kMmaRows, kPaired>(params, s, warp);  // waits for the pair's barrier
    }
    run_cleaner(params, warp);
  } else {
    raise_register_budget<math_registers(math_warpgroups(kMmaRows, H))>();
    // Broadcast from lane 0 so that the compiler knows it is warp-uniform: the stage ring and the
    // wgmma descriptors derived from it then live in uniform registers.
    run_math<D, H, kMmaRows, kPaired>(params, s, __shfl_sync(0xffffffffu, warpgroup - 1, 0));
  }
  // No CTA of a pair leaves while the other may still arrive on its barriers.
  if constexpr (kPaired) {
    pair_arrive_released();
    pair_wait();
  }
}

}  // namespace mqa_logits::sm90::paged
