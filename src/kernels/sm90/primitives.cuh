// Small Hopper (sm_90a) building blocks shared by the kernels: mbarrier pipeline stages, TMA tile
// loads and stores, warpgroup MMA (wgmma) on FP8 operands in shared memory, and register-budget
// control.
// CCCL's cuda::ptx wraps TMA, mbarrier and the proxy fences; what it lacks (wgmma, setmaxnreg,
// named barriers, tensor-map prefetch) is written here by hand.
#pragma once

#include <cuda.h>
#include <cuda/ptx>

#include <cstdint>

namespace mqa_logits::sm90 {

namespace ptx = cuda::ptx;

__device__ __forceinline__ std::uint32_t smem_address(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---- mbarrier --------------------------------------------------------------------------------

struct Barrier {
  std::uint64_t word;

  __device__ __forceinline__ void init(std::uint32_t arrivals) { ptx::mbarrier_init(&word, arrivals); }
  __device__ __forceinline__ void arrive() { ptx::mbarrier_arrive(&word); }
  // Arrive and announce `bytes` of asynchronous (TMA) transactions for the current phase.
  __device__ __forceinline__ void arrive_expect_bytes(std::uint32_t bytes) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &word, bytes);
  }
  __device__ __forceinline__ void wait(std::uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(&word, parity)) {
    }
  }
};

// Position in a ring of `Stages` pipeline stages: the stage index and the parity of the phase a
// consumer waits for (flips each time the ring wraps).
template <int Stages>
struct RingPosition {
  int stage = 0;
  std::uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// ---- TMA (1-D maps are one row of a 2-D map: load them with y = 0) ---------------------

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, std::int32_t x,
                                            std::int32_t y, Barrier* bar) {
  const std::int32_t coords[2] = {x, y};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, &bar->word);
}

// Stores the box at (x, y) of `map` from shared memory `src` (16-byte aligned); the parts of the
// box outside the tensor are not written. Tracked by this thread's bulk async-groups.
// Prefetch of a 2-D box into L2 (cp.async.bulk.prefetch.tensor, which cuda::ptx lacks): the
// box a later tma_load_2d of the same coordinates reads. Boxes past the tensor are dropped.
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap* map, std::int32_t x,
                                                std::int32_t y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(x), "r"(y)
               : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, std::int32_t x, std::int32_t y,
                                             const void* src) {
  const std::int32_t coords[2] = {x, y};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, src);
}

// Closes this thread's bulk async-group of the stores issued since the last one.
__device__ __forceinline__ void bulk_commit() { ptx::cp_async_bulk_commit_group(); }

// Waits until at most `Pending` of this thread's bulk async-groups have still to read their
// shared-memory sources (ReadOnly) or to complete.
template <int Pending, bool ReadOnly>
__device__ __forceinline__ void bulk_wait() {
  if constexpr (ReadOnly) {
    ptx::cp_async_bulk_wait_group_read(ptx::n32_t<Pending>{});
  } else {
    ptx::cp_async_bulk_wait_group(ptx::n32_t<Pending>{});
  }
}

// ---- warp-group control ----------------------------------------------------------------------

// An SM's registers and shared memory, of which the SM reserves 1 KiB for each resident CTA.
inline constexpr int kSmRegisters = 65536;
inline constexpr int kSmSharedBytes = 228 * 1024;
inline constexpr int kCtaReservedSharedBytes = 1024;
// The most shared memory one CTA may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin on every
// sm_90 part): both kernels carve their shared memory from it at compile time.
inline constexpr int kCtaSharedOptinBytes = kSmSharedBytes - kCtaReservedSharedBytes;

// Registers per thread a CTA of `threads` threads (one CTA per SM) is launched with: 64K over the
// threads, in steps of 8. setmaxnreg moves registers only within the CTA's pool of threads times
// this many, and an increase the pool cannot cover waits forever.
__host__ __device__ constexpr int launch_registers(int threads) {
  return kSmRegisters / threads / 8 * 8;
}

template <int Registers>
__device__ __forceinline__ void raise_register_budget() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void lower_register_budget() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma -----------------------------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major operand whose rows are `RowBytes` (32, 64 or 128)
// long and swizzled at that width, as TMA writes them: 8-row atoms of 8 * RowBytes bytes.
template <int RowBytes>
__device__ __forceinline__ std::uint64_t kmajor_descriptor(const void* tile) {
  static_assert(RowBytes == 32 || RowBytes == 64 || RowBytes == 128);
  constexpr std::uint64_t kSwizzleMode = RowBytes == 128 ? 1 : RowBytes == 64 ? 2 : 3;
  constexpr std::uint64_t kStrideBytes = 8 * RowBytes;  // between consecutive 8-row atoms
  const std::uint64_t address = smem_address(tile);
  return ((address & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) | ((kStrideBytes >> 4) << 32) |
         (kSwizzleMode << 62);
}

// Advance a K-major descriptor by `bytes` along K (inside one swizzle atom). The start address
// (bits 0-13) of a shared-memory operand cannot carry into bit 32, so a 32-bit add does.
__device__ __forceinline__ std::uint64_t advance_descriptor(std::uint64_t desc, int bytes) {
  const auto low = static_cast<std::uint32_t>(desc) + static_cast<std::uint32_t>(bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// Keeps the compiler from moving accesses of accumulator registers across wgmma boundaries.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// ---- further building blocks ----------------------------------------------------------------

// Hint: bring the kL2LineBytes-byte line holding `ptr` (global memory) into L2.
inline constexpr int kL2LineBytes = 128;
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}

// Makes barrier initialization visible to the async proxy (TMA) before any use.
__device__ __forceinline__ void fence_barrier_init() {
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma)
// accesses of the same bytes.
__device__ __forceinline__ void fence_async_proxy_shared() { ptx::fence_proxy_async(ptx::space_shared); }

// Byte offset at which TMA stores byte `offset` of a tile of `RowBytes`-byte rows under the
// matching swizzle (the tile 1024-byte aligned): the 16-byte chunk index (bits 4..6) is XORed
// with the row index within the swizzle atom (bits 7..9), over as many bits as a row has chunks.
template <int RowBytes>
__device__ __forceinline__ std::uint32_t swizzled_offset(std::uint32_t offset) {
  static_assert(RowBytes == 32 || RowBytes == 64 || RowBytes == 128);
  constexpr std::uint32_t kChunkMask = RowBytes / 16 - 1;
  return offset ^ (((offset >> 7) & kChunkMask) << 4);
}

// Gives registers an unspecified but defined value at no cost: accumulators that the first wgmma
// overwrites (scale-d = 0) need no zeroing, yet the asm operands read them.
template <int N>
__device__ __forceinline__ void define_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "=f"(r[i]));
}

// D[64 x N] (+)= A[64 x 32] * B[N x 32]^T, e4m3 x e4m3 -> f32, both K-major in shared memory, for
// N in {64, 128, 136, 192, 256}; `d` may be longer than the N / 2 registers the instruction writes.
// Thread layout of D (per warp w of the warpgroup, lane l): d[4j + 2r + c] is row 16w + l/4 + 8r,
// column 8j + 2(l % 4) + c.
//
// An inline-asm operand list is not a context where a template parameter pack can expand, so the
// accumulator operands are spelled by macros, 16 at a time. The accumulators come first (%0 on);
// the descriptors and the accumulate flag are read-only inputs after them, numbered per shape.
#define MQA_SM90_ACC16(d, i)                                                                      \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),                \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7]), "+f"(d[i + 8]), "+f"(d[i + 9]),            \
      "+f"(d[i + 10]), "+f"(d[i + 11]), "+f"(d[i + 12]), "+f"(d[i + 13]), "+f"(d[i + 14]),       \
      "+f"(d[i + 15])
#define MQA_SM90_ACC4(d, i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MQA_SM90_ACC_PLACEHOLDERS_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MQA_SM90_ACC_PLACEHOLDERS_1 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MQA_SM90_ACC_PLACEHOLDERS_2 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define MQA_SM90_ACC_PLACEHOLDERS_3 ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MQA_SM90_ACC_PLACEHOLDERS_4 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define MQA_SM90_ACC_PLACEHOLDERS_4_FIRST4 ", %64, %65, %66, %67"
#define MQA_SM90_ACC_PLACEHOLDERS_5 ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MQA_SM90_ACC_PLACEHOLDERS_6 ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define MQA_SM90_ACC_PLACEHOLDERS_7 ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MQA_SM90_WGMMA_E4M3(shape, placeholders, desc_a_op, desc_b_op, scale_op, ...)            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " scale_op ", 0;\n"                              \
               "wgmma.mma_async.sync.aligned." shape ".f32.e4m3.e4m3 {" placeholders "}, "      \
               desc_a_op ", " desc_b_op ", p, 1, 1;\n}\n"                                        \
               : __VA_ARGS__                                                                     \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

template <int N, int Size>
__device__ __forceinline__ void wgmma_m64nNk32_e4m3(float (&d)[Size], std::uint64_t desc_a,
                                                    std::uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 136 || N == 192 || N == 256,
                "N must be 64, 128, 136, 192 or 256");
  static_assert(2 * Size >= N, "the accumulator holds N / 2 registers per thread");
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (N == 64) {
    MQA_SM90_WGMMA_E4M3("m64n64k32", MQA_SM90_ACC_PLACEHOLDERS_0 MQA_SM90_ACC_PLACEHOLDERS_1,
                        "%32", "%33", "%34", MQA_SM90_ACC16(d, 0), MQA_SM90_ACC16(d, 16));
  } else if constexpr (N == 128) {
    MQA_SM90_WGMMA_E4M3("m64n128k32",
                        MQA_SM90_ACC_PLACEHOLDERS_0 MQA_SM90_ACC_PLACEHOLDERS_1
                            MQA_SM90_ACC_PLACEHOLDERS_2 MQA_SM90_ACC_PLACEHOLDERS_3,
                        "%64", "%65", "%66",
                        MQA_SM90_ACC16(d, 0), MQA_SM90_ACC16(d, 16), MQA_SM90_ACC16(d, 32),
                        MQA_SM90_ACC16(d, 48));
  } else if constexpr (N == 136) {
    MQA_SM90_WGMMA_E4M3("m64n136k32",
                        MQA_SM90_ACC_PLACEHOLDERS_0 MQA_SM90_ACC_PLACEHOLDERS_1
                            MQA_SM90_ACC_PLACEHOLDERS_2 MQA_SM90_ACC_PLACEHOLDERS_3
                                MQA_SM90_ACC_PLACEHOLDERS_4_FIRST4,
                        "%68", "%69", "%70",
                        MQA_SM90_ACC16(d, 0), MQA_SM90_ACC16(d, 16), MQA_SM90_ACC16(d, 32),
                        MQA_SM90_ACC16(d, 48), MQA_SM90_ACC4(d, 64));
  } else if constexpr (N == 192) {
    MQA_SM90_WGMMA_E4M3("m64n192k32",
                        MQA_SM90_ACC_PLACEHOLDERS_0 MQA_SM90_ACC_PLACEHOLDERS_1
                            MQA_SM90_ACC_PLACEHOLDERS_2 MQA_SM90_ACC_PLACEHOLDERS_3
                                MQA_SM90_ACC_PLACEHOLDERS_4 MQA_SM90_ACC_PLACEHOLDERS_5,
                        "%96", "%97", "%98",
                        MQA_SM90_ACC16(d, 0), MQA_SM90_ACC16(d, 16), MQA_SM90_ACC16(d, 32),
                        MQA_SM90_ACC16(d, 48), MQA_SM90_ACC16(d, 64), MQA_SM90_ACC16(d, 80));
  } else {
    MQA_SM90_WGMMA_E4M3("m64n256k32",
                        MQA_SM90_ACC_PLACEHOLDERS_0 MQA_SM90_ACC_PLACEHOLDERS_1
                            MQA_SM90_ACC_PLACEHOLDERS_2 MQA_SM90_ACC_PLACEHOLDERS_3
                                MQA_SM90_ACC_PLACEHOLDERS_4 MQA_SM90_ACC_PLACEHOLDERS_5
                                    MQA_SM90_ACC_PLACEHOLDERS_6 MQA_SM90_ACC_PLACEHOLDERS_7,
                        "%128", "%129", "%130",
                        MQA_SM90_ACC16(d, 0), MQA_SM90_ACC16(d, 16), MQA_SM90_ACC16(d, 32),
                        MQA_SM90_ACC16(d, 48), MQA_SM90_ACC16(d, 64), MQA_SM90_ACC16(d, 80),
                        MQA_SM90_ACC16(d, 96), MQA_SM90_ACC16(d, 112));
  }
}

#undef MQA_SM90_WGMMA_E4M3
#undef MQA_SM90_ACC16
#undef MQA_SM90_ACC4
#undef MQA_SM90_ACC_PLACEHOLDERS_4_FIRST4
#undef MQA_SM90_ACC_PLACEHOLDERS_0
#undef MQA_SM90_ACC_PLACEHOLDERS_1
#undef MQA_SM90_ACC_PLACEHOLDERS_2
#undef MQA_SM90_ACC_PLACEHOLDERS_3
#undef MQA_SM90_ACC_PLACEHOLDERS_4
#undef MQA_SM90_ACC_PLACEHOLDERS_5
#undef MQA_SM90_ACC_PLACEHOLDERS_6
#undef MQA_SM90_ACC_PLACEHOLDERS_7

// The full K = RowBytes product of one K-major A tile (64 rows) and B tile (N rows), given by
// their descriptors (kmajor_descriptor) or addresses, into the first N / 2 registers of `d`
// (overwritten), committed as one group. The caller waits for the group (wgmma_wait) and fences
// `d` (fence_accumulators) before reading it; touching `d` earlier would make the compiler
// serialize the wgmma pipeline.
template <int N, int RowBytes, int Size>
__device__ __forceinline__ void wgmma_tile_e4m3_n(float (&d)[Size], std::uint64_t desc_a,
                                                  std::uint64_t desc_b) {
  fence_accumulators(d);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < RowBytes / 32; ++k) {
    wgmma_m64nNk32_e4m3<N>(d, advance_descriptor(desc_a, 32 * k),
                           advance_descriptor(desc_b, 32 * k), k > 0);
  }
  wgmma_commit();
}

template <int N, int RowBytes, int Size>
__device__ __forceinline__ void wgmma_tile_e4m3_n(float (&d)[Size], const void* a_tile,
                                                  const void* b_tile) {
  wgmma_tile_e4m3_n<N, RowBytes>(d, kmajor_descriptor<RowBytes>(a_tile),
                                 kmajor_descriptor<RowBytes>(b_tile));
}

}  // namespace mqa_logits::sm90
