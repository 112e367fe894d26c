// sm90 decode kernel: FP8 paged_mqa_logits (docs/contract.md, "Decode"), persistent, one CTA per
// worker of the schedule metadata, or a pair of CTAs per two workers for groups of 6-8 rows at
// H = 64. docs/design.md, "The decode kernel", describes the tiling, the stage ring and its
// barriers (and why a stage always serves one math warpgroup), the CTA pairs' protocol, the warp
// roles, registers and coverage; paged_plan.cuh the parameters and shared-memory layout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/paged_math.cuh"
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
