// Building blocks that only the decode kernel uses: its dealt stage ring, L2 prefetches that
// keep a line, 3-D TMA and plain bulk loads (multicast to a CTA pair as well), the pair's
// barriers, and 4-byte asynchronous copies. What both kernels use is in primitives.cuh.
#pragma once

#include <cstdint>

#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

// One member's turns in a ring of `stages` stages (a run-time value: the shared-memory carve-up is
// decided at launch) whose slots are dealt round-robin over `Members` members: slot c of the
// sequence goes to member c % Members and lives in stage c % stages, phase (c / stages) % 2.
// Holds the member's next slot and its stage and phase, so that a member steps over only its own
// slots. Needs Members <= stages.
template <int Members>
struct DealtRingPosition {
  int next;
  int stage;
  std::uint32_t phase = 0;
  __device__ __forceinline__ explicit DealtRingPosition(int member) : next(member), stage(member) {}
  __device__ __forceinline__ void advance(int stages) {
    next += Members;
    stage += Members;
    if (stage >= stages) {
      stage -= stages;
      phase ^= 1;
    }
  }
};

// Hint: bring the line holding `ptr` into L2 and keep it in preference to others (evict_last):
// for small data needed only after a stream of other traffic has passed through L2.
__device__ __forceinline__ void prefetch_l2_evict_last(const void* ptr) {
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(ptr));
}

__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, std::int32_t x,
                                            std::int32_t y, std::int32_t z, Barrier* bar) {
  const std::int32_t coords[3] = {x, y, z};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, &bar->word);
}

// Plain bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) that completes
// transactions on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, std::uint32_t bytes,
                                          Barrier* bar) {
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, src, bytes, &bar->word);
}

// ---- CTA pairs (clusters of two along x: CTAs 2k and 2k + 1) ---------------------------------

// Both CTAs of the pair: the loads below write the same shared-memory offsets of each and
// complete bytes on the barrier at the same offset in each. (A value, not a constant: cuda::ptx
// takes the mask by reference, which device code cannot bind to a namespace-scope constant.)
__device__ __forceinline__ std::uint16_t pair_mask() { return 0b11; }

__device__ __forceinline__ void tma_load_3d_pair(void* dst, const CUtensorMap* map, std::int32_t x,
                                                 std::int32_t y, std::int32_t z, Barrier* bar) {
  const std::int32_t coords[3] = {x, y, z};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, &bar->word,
                            pair_mask());
}

__device__ __forceinline__ void bulk_load_pair(void* dst, const void* src, std::uint32_t bytes,
                                               Barrier* bar) {
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, src, bytes, &bar->word,
                     pair_mask());
}

// `count` arrivals on the barrier at the offset of `bar` in the cluster's CTA `rank` (mapa,
// which cuda::ptx lacks). Relaxed: it publishes no data, only that reads this thread waited for
// are done (docs/design.md, "The decode kernel", CTA pairs, says what it answers for).
__device__ __forceinline__ void arrive_on_cta(Barrier* bar, int rank, std::uint32_t count) {
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(smem_address(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0], %1;" ::"r"(remote),
               "r"(count)
               : "memory");
}

// Orders this thread's shared-memory accesses (and, after a __syncwarp, its warp's) before its
// next arrival on a barrier of the other CTA: a release at cluster scope restricted to shared
// memory (a MEMBAR.ALL.CTA; a released arrival at cluster scope is a MEMBAR.ALL.GPU).
__device__ __forceinline__ void fence_release_to_pair() {
  ptx::fence_sync_restrict(ptx::sem_release, ptx::space_shared, ptx::scope_cluster);
}
// After a wait on a barrier the other CTA arrives on: what its releases ordered happens before.
__device__ __forceinline__ void fence_acquire_from_pair() {
  ptx::fence_sync_restrict(ptx::sem_acquire, ptx::space_cluster, ptx::scope_cluster);
}

// The pair's barrier: every thread of both CTAs arrives once and waits once per phase; a thread
// waits for its phase before it arrives again. A relaxed arrival orders nothing before it (the
// mbarrier inits cross by fence_barrier_init, at cluster scope); a released one orders all the
// thread did before, its arrivals on the other CTA's barriers included.
__device__ __forceinline__ void pair_arrive() { ptx::barrier_cluster_arrive(ptx::sem_relaxed); }
__device__ __forceinline__ void pair_arrive_released() {
  ptx::barrier_cluster_arrive(ptx::sem_release);
}
__device__ __forceinline__ void pair_wait() { ptx::barrier_cluster_wait(ptx::sem_acquire); }

// 4-byte asynchronous copy global -> shared (any 4-byte aligned source), completed by
// cp_async_wait_all() in the issuing thread.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace mqa_logits::sm90
