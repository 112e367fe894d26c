// Tile probe: the prefill kernel's math loop (prefill_kernel.cuh, H = 64) without its memory
// system, one part of the kernel at a time. One persistent CTA per SM; math warpgroup w takes
// query group w / 2 and key half w % 2 of every 128-key tile (m64nNk32 e4m3 from shared memory,
// D / 32 k-steps, one accumulator set, the MMA waited for before the epilogue), over the same
// shared-memory tiles again and again: no TMA, no global loads. The epilogues add the kernel's
// parts one by one (the |x| or relu FFMAs and the quad reduction, the store, the key scale and
// window reads); the layouts add its register budgets and its stage ring (a producer warpgroup
// handing out stages through full / empty mbarriers, without loading anything), or replace the
// four warpgroups by three or two.
//
// Prints cycles per tile and SM (clock64 of the slowest math warp; min / median / max over the
// SMs) against the tile's tensor cycles at the nominal FP8 rate (4096 MACs per SM and cycle),
// and the SM clock the run implies (cycles / elapsed time), which falls under tensor load.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/sm90/prefill_kernel.cuh"
#include "kernels/sm90/primitives.cuh"
#include "probe_common.cuh"

namespace {

using namespace mqa_logits::sm90;
using mqa_logits::probe::pattern_byte;

enum class Epilogue : int {
  kNone,          // read two accumulators (the MMA loop alone)
  kAbsFfma,       // |x| FFMA head sums, the folded columns (N = 136), the quad reduction
  kAbsFfmaStore,  // the same and one 4-byte global store per thread and tile (the kernel's
                  // output path before its logits were staged for a store warp)
  kReluFfma,      // max(x, 0) and FFMA head sums (H <= 32: no folded columns), the reduction
  kKernelLike,    // kAbsFfmaStore with the key scale and window bounds read from shared memory
                  // (the kernel's epilogue before its logits were staged)
};

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return "MMA only";
    case Epilogue::kAbsFfma: return "|x| FFMA + reduce";
    case Epilogue::kAbsFfmaStore: return "|x| FFMA + reduce + store";
    case Epilogue::kReluFfma: return "relu FFMA + reduce";
    case Epilogue::kKernelLike: return "+ store, scales, bounds";
  }
  return "?";
}

enum class Layout : int {
  kFour,           // four math warpgroups, all registers of a 512-thread CTA (128)
  kFourBudget,     // the kernel's register budgets: a fifth (producer) warpgroup, setmaxnreg
  kFourRelease,    // kFourBudget, each math warp releasing its stage per tile (nobody waits)
  kFourRing,       // the kernel's ring: the producer hands out stages, math warps wait and release
  kFourRingEarly,  // kFourRing, the next stage tested (non-blocking) while this tile's MMA runs
  kThreeItems,     // three warpgroups taking the four items of each tile round robin
  kTwoSets,        // two warpgroups (one per query group), both key halves into two accumulator
                   // sets, the second half's MMA running under the first half's epilogue
};

constexpr bool has_producer(Layout l) {
  return l == Layout::kFourBudget || l == Layout::kFourRelease || l == Layout::kFourRing ||
         l == Layout::kFourRingEarly;
}
constexpr int math_warpgroups(Layout l) {
  return l == Layout::kTwoSets ? 2 : l == Layout::kThreeItems ? 3 : 4;
}
constexpr int layout_threads(Layout l) { return 128 * (math_warpgroups(l) + (has_producer(l) ? 1 : 0)); }

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kFour: return "4 WG";
    case Layout::kFourBudget: return "4 WG, kernel registers";
    case Layout::kFourRelease: return "4 WG, kernel reg., release";
    case Layout::kFourRing: return "4 WG, kernel reg., ring";
    case Layout::kFourRingEarly: return "4 WG, kernel reg., ring +t";
    case Layout::kThreeItems: return "3 WG, items round robin";
    case Layout::kTwoSets: return "2 WG, 2 accumulator sets";
  }
  return "?";
}

// The kernel's H = 64 instance: its math warps, register budgets and ring depth (the same at
// every D) are the probe's.
using KernelTiling = PrefillTiling<128, 64>;
constexpr int kMaxWarps = KernelTiling::kMathWarps;  // per CTA, for the cycle records
constexpr int kRingStages = KernelTiling::kStages;
constexpr int kScaleStages = 8;  // key-scale rows the kernel-like epilogue cycles through

// What one warp's epilogue reads besides its accumulators.
struct EpilogueState {
  float weights[32];
  const float2* lane_multipliers;  // shared memory
  float* out_row;                  // global memory
  int key_in_half;                 // the key (of the 64-key half) of the thread's output
  const float* scales;             // shared memory, kScaleStages x 128
  const int2* bounds;              // shared memory, a window per quad lane
};

// One tile's epilogue on a warpgroup's accumulators; returns a value that keeps the work alive.
template <int N, Epilogue E>
__device__ __forceinline__ float epilogue(const float (&acc)[N / 2], const EpilogueState& st, int t,
                                          int half) {
  if constexpr (E == Epilogue::kNone) {
    return acc[0] + acc[N / 2 - 1];
  } else {
    float partial[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float x = acc[4 * j + 2 * r + c];
          const float y = E == Epilogue::kReluFfma ? fmaxf(x, 0.f) : fabsf(x);
          partial[2 * r + j / 8] = fmaf(st.weights[2 * j + c], y, partial[2 * r + j / 8]);
        }
      }
    }
    if constexpr (N == 136) {
      const float2 m = st.lane_multipliers[0];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        partial[2 * r] = fmaf(m.x, acc[64 + 2 * r], partial[2 * r]);
        partial[2 * r + 1] = fmaf(m.y, acc[64 + 2 * r + 1], partial[2 * r + 1]);
      }
    }
    float sums[1];
    quad_reduce_scatter<4>(partial, sums);
    const int key = t * 128 + half * 64 + st.key_in_half;
    if constexpr (E == Epilogue::kAbsFfmaStore) {
      st.out_row[key] = sums[0];
      return 0.f;
    } else if constexpr (E == Epilogue::kKernelLike) {
      const float scale = st.scales[(t % kScaleStages) * 128 + half * 64 + st.key_in_half];
      const int2 window = st.bounds[threadIdx.x % 4];
      st.out_row[key] = key >= window.x && key < window.y ? sums[0] * scale : -INFINITY;
      return 0.f;
    } else {
      return sums[0];
    }
  }
}

template <int D, int N, Epilogue E, Layout L>
__global__ void __launch_bounds__(layout_threads(L), 1)
    tile_probe(int tiles, long long* cycles, float* out, std::int64_t row_stride) {
  constexpr int kThreads = layout_threads(L);
  constexpr int kABytes = 128 * D, kBBytes = 2 * N * D;
  __shared__ Barrier full[kRingStages], empty[kRingStages];
  extern __shared__ std::uint8_t smem_raw[];
  const std::uint32_t misalignment = smem_address(smem_raw) % 1024;
  std::uint8_t* a_tile = smem_raw + (misalignment == 0 ? 0 : 1024 - misalignment);
  std::uint8_t* b_tile = a_tile + kABytes;
  float* multipliers = reinterpret_cast<float*>(b_tile + kBBytes);
  float* scales = multipliers + 8;
  int2* bounds = reinterpret_cast<int2*>(scales + kScaleStages * 128);
  for (int i = threadIdx.x; i < kABytes + kBBytes; i += kThreads) a_tile[i] = pattern_byte(i);
  for (int i = threadIdx.x; i < 8; i += kThreads) multipliers[i] = 1.f / static_cast<float>(i + 1);
  for (int i = threadIdx.x; i < kScaleStages * 128; i += kThreads) {
    scales[i] = 1.f + 1.f / static_cast<float>(i + 1);
  }
  if (threadIdx.x < 4) bounds[threadIdx.x] = make_int2(static_cast<int>(threadIdx.x), tiles * 128 - 1);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kRingStages; ++i) {
      full[i].init(1);
      empty[i].init(kMaxWarps);
    }
    fence_barrier_init();
  }
  fence_async_proxy_shared();
  __syncthreads();

  constexpr bool kWaits = L == Layout::kFourRing || L == Layout::kFourRingEarly;
  constexpr bool kReleases = kWaits || L == Layout::kFourRelease;
  if (has_producer(L) && threadIdx.x >= 512) {  // the producer warpgroup: stages, no loads
    lower_register_budget<KernelTiling::kProducerRegisters>();
    if (kWaits && threadIdx.x == 512) {
      RingPosition<kRingStages> ring;
      for (int t = 0; t < tiles; ++t) {
        empty[ring.stage].wait(ring.phase ^ 1);
        full[ring.stage].arrive();
        ring.advance();
      }
    }
    return;
  }
  if constexpr (has_producer(L)) raise_register_budget<KernelTiling::kMathRegisters>();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const auto state = [&](int group) {
    EpilogueState st;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      st.weights[i] = 0.01f * static_cast<float>((threadIdx.x + 7 * i + group) % 23) - 0.1f;
    }
    st.lane_multipliers = reinterpret_cast<const float2*>(multipliers) + lane % 4;
    st.out_row = out + (std::int64_t{blockIdx.x} * 4 + group * 2 + lane % 2) * row_stride;
    st.key_in_half = (warp % 4) * 16 + lane / 4 + 8 * ((lane % 4) / 2);
    st.scales = scales;
    st.bounds = bounds;
    return st;
  };
  const auto keys = [&](int half) { return a_tile + half * 64 * D; };
  const auto queries = [&](int group) { return b_tile + group * N * D; };

  float result = 0.f;
  const long long start = clock64();
  if constexpr (L == Layout::kTwoSets) {
    const EpilogueState st = state(wg);
    float acc0[N / 2], acc1[N / 2];
    for (int t = 0; t < tiles; ++t) {
      define_registers(acc0);
      define_registers(acc1);
      wgmma_tile_e4m3_n<N, D>(acc0, keys(0), queries(wg));
      wgmma_tile_e4m3_n<N, D>(acc1, keys(1), queries(wg));
      wgmma_wait<1>();
      fence_accumulators(acc0);
      result += epilogue<N, E>(acc0, st, t, 0);
      wgmma_wait<0>();
      fence_accumulators(acc1);
      result += epilogue<N, E>(acc1, st, t, 1);
    }
  } else if constexpr (L == Layout::kThreeItems) {
    const EpilogueState st0 = state(0), st1 = state(1);  // branches: register arrays stay static
    float acc[N / 2];
    for (int item = wg; item < 4 * tiles; item += 3) {
      const int t = item / 4, group = item % 4 / 2, half = item % 2;
      wgmma_tile_e4m3_n<N, D>(acc, keys(half), queries(group));
      wgmma_wait<0>();
      fence_accumulators(acc);
      result += group == 0 ? epilogue<N, E>(acc, st0, t, half) : epilogue<N, E>(acc, st1, t, half);
    }
  } else {
    const int group = wg / 2, half = wg % 2;
    const EpilogueState st = state(group);
    float acc[N / 2];
    RingPosition<kRingStages> ring;
    bool ready = false;  // kFourRingEarly: the stage of this tile was seen full
    for (int t = 0; t < tiles; ++t) {
      if (kWaits && !ready) full[ring.stage].wait(ring.phase);
      const int stage = ring.stage;
      ring.advance();
      wgmma_tile_e4m3_n<N, D>(acc, keys(half), queries(group));
      if constexpr (L == Layout::kFourRingEarly) {
        ready = ptx::mbarrier_test_wait_parity(&full[ring.stage].word, ring.phase);
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      if constexpr (kReleases) {
        __syncwarp();
        if (lane == 0) empty[stage].arrive();
      }
      result += epilogue<N, E>(acc, st, t, half);
    }
  }
  const long long end = clock64();
  if (lane == 0) cycles[blockIdx.x * kMaxWarps + warp] = end - start;
  if (result == 123.456f) out[threadIdx.x] = result;  // keeps the work; never true in practice
}

void check(cudaError_t status, const char* what) { mqa_logits::probe::check(status, "tile probe", what); }

template <int D, int N, Epilogue E, Layout L = Layout::kFour>
void measure(int sms, int tiles, long long* cycles, float* out, std::int64_t row_stride) {
  constexpr int kSmem = 1024 + 128 * D + 2 * N * D + 8 * 4 + kScaleStages * 128 * 4 + 4 * 8;
  constexpr int kThreads = layout_threads(L);
  const auto kernel = tile_probe<D, N, E, L>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "attribute");
  kernel<<<sms, kThreads, kSmem>>>(tiles / 10, cycles, out, row_stride);  // warm-up
  check(cudaGetLastError(), "launch");
  check(cudaMemset(cycles, 0, sizeof(long long) * sms * kMaxWarps), "cudaMemset");
  const float ms = mqa_logits::probe::time_launch("tile probe", [&] {
    kernel<<<sms, kThreads, kSmem>>>(tiles, cycles, out, row_stride);
  });
  const auto records = mqa_logits::probe::records_on_host(
      cycles, static_cast<std::size_t>(sms) * kMaxWarps, "tile probe");
  std::vector<double> per_sm;  // cycles per tile of each SM's slowest warp
  for (long long slowest : mqa_logits::probe::slowest_per_sm(records, kMaxWarps, 0, kMaxWarps)) {
    per_sm.push_back(static_cast<double>(slowest) / tiles);
  }
  std::sort(per_sm.begin(), per_sm.end());
  const double tensor = N * D / 16.0;  // 4 items x 64 x N x D MACs at 4096 a cycle
  const double median = per_sm[per_sm.size() / 2];
  std::printf("%-26s D=%-3d N=%-3d %-26s %6.0f %6.0f %6.0f %6.0f %6.1f%% %5.0f MHz\n", layout_name(L), D,
              N, epilogue_name(E), per_sm.front(), median, per_sm.back(), tensor, 100.0 * tensor / median,
              per_sm.back() * tiles / (ms * 1e3));
}

}  // namespace

int main() {
  const int sms = mqa_logits::probe::hopper_sm_count("tile probe");
  if (sms == 0) return 0;
  constexpr int kTiles = 40000;  // ~25 ms a run: long enough for the clock to settle under load
  const std::int64_t row_stride = std::int64_t{kTiles} * 128;
  long long* cycles = nullptr;
  float* out = nullptr;
  check(cudaMalloc(&cycles, sizeof(long long) * sms * kMaxWarps), "cudaMalloc");
  check(cudaMalloc(&out, sizeof(float) * sms * 4 * row_stride), "cudaMalloc");
  std::printf("cycles per 128-key tile and SM: min / median / max over the SMs; tensor cycles at the "
              "nominal rate; their share of the median; the SM clock of the run\n");
  std::printf("the kernel's registers: %d a thread in the producer warpgroup, %d in the math "
              "warpgroups; its ring: %d stages (+t: the next stage tested while the MMA runs)\n",
              KernelTiling::kProducerRegisters, KernelTiling::kMathRegisters, kRingStages);
  std::printf("%-26s %-11s %-26s %6s %6s %6s %6s %7s %9s\n", "layout", "shape", "epilogue", "min", "median",
              "max", "tensor", "share", "clock");
  using E = Epilogue;
  using L = Layout;
  measure<128, 136, E::kNone>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kAbsFfma>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kAbsFfmaStore>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike>(sms, kTiles, cycles, out, row_stride);
  measure<128, 128, E::kReluFfma>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kNone>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kAbsFfma>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kKernelLike>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kFourBudget>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kFourRelease>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kFourRing>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kFourRingEarly>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kKernelLike, L::kFourBudget>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kKernelLike, L::kFourRing>(sms, kTiles, cycles, out, row_stride);
  measure<64, 136, E::kKernelLike, L::kFourRingEarly>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kThreeItems>(sms, kTiles, cycles, out, row_stride);
  measure<128, 136, E::kKernelLike, L::kTwoSets>(sms, kTiles, cycles, out, row_stride);
  check(cudaFree(cycles), "cudaFree");
  check(cudaFree(out), "cudaFree");
  return 0;
}
