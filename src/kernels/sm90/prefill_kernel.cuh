// FP8 prefill logits (docs/contract.md, "Prefill") on sm_90a: persistent, one CTA an SM, a
// producer, two query warps and a store warp beside four math warpgroups. docs/design.md, "The
// prefill kernel", describes the tiling, the fold, the roles and the ring protocol;
// prefill_plan.cuh the parameters, constants and shared-memory carve-up; a file a role:
// prefill_producer.cuh, prefill_query_warps.cuh, prefill_store.cuh, prefill_math.cuh.
#pragma once

#include <cstdint>

#include "kernels/sm90/prefill_math.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "kernels/sm90/prefill_producer.cuh"
#include "kernels/sm90/prefill_query_warps.cuh"
#include "kernels/sm90/prefill_store.cuh"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

template <int kHeadDim, int kNumHeads>
__global__ void __launch_bounds__(PrefillTiling<kHeadDim, kNumHeads>::kThreads, 1)
    prefill_logits_kernel(const __grid_constant__ PrefillParams p) {
  using T = PrefillTiling<kHeadDim, kNumHeads>;
  extern __shared__ __align__(1024) std::uint8_t smem[];
  const PrefillShared<T> sh(smem);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&p.q_map);
    prefetch_tensor_map(&p.kv_map);
    prefetch_tensor_map(&p.kscale_map);
    prefetch_tensor_map(&p.logits_map);
    if (p.compressed) prefetch_tensor_map(&p.logits_inner_map);  // used by compressed rows only
    for (int s = 0; s < T::kStages; ++s) {
      sh.kv_full[s].init(1);
      sh.sums_full[s].init(T::kMathThreads);
      sh.kv_empty[s].init(32);  // the store warp's lanes
    }
    for (int s = 0; s < T::kQBuffers; ++s) {
      sh.q_full[s].init(1);
      sh.q_ready[s].init(32 * T::kQueryWarps);
      sh.q_empty[s].init(T::kMathThreads);
    }
    fence_barrier_init();
  }
  // Programmatic dependent launch: everything above overlapped the previous kernel's tail; no
  // global memory is read before this point.
  cudaGridDependencySynchronize();
  find_segment(p, sh);
  __syncthreads();
  // The clean_logits pass after this kernel may start its CTAs as this kernel's leave the SMs.
  cudaTriggerProgrammaticLaunchCompletion();

  if (warp < 4) {  // warpgroup 0: producer, query warps and store warp
    lower_register_budget<T::kProducerRegisters>();
    if (warp == 0) {
      produce_key_tiles<T>(p, sh, lane);
    } else if (warp == T::kStoreWarp) {
      if (!p.compressed) {
        store_block_tiles<T>(p, sh, lane);
      } else if (p.logits_bf16) {
        store_row_tiles<T, std::uint16_t>(p, sh, lane);
      } else {
        store_row_tiles<T, std::uint32_t>(p, sh, lane);
      }
    } else {
      run_query_warps<T, kHeadDim, kNumHeads>(p, sh, warp, lane);
    }
    return;
  }
  raise_register_budget<T::kMathRegisters>();
  run_math<T, kHeadDim, kNumHeads>(p, sh, warp, lane);
}

}  // namespace mqa_logits::sm90
