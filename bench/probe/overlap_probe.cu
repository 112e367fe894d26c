// Overlap probe: does an SM run the FP8 tensor-core pipe (wgmma) and other warps' FP32 / ALU work
// at the same time, or one after the other? Every logits kernel's epilogue (relu, weight, head sum)
// runs beside the MMAs of other warpgroups, so the answer bounds what any tiling can reach.
//
// One persistent CTA per SM, four warpgroups: two MMA warpgroups (m64n128k32 e4m3 from shared
// memory, 4 k-steps a tile, waiting for each tile as the logits kernels do) and two ALU
// warpgroups (8 independent chains per thread of one instruction mix: AluWork). Each run enables
// the MMA side, the ALU side or both with the same work per side; each warpgroup times itself
// with clock64. If the pipes overlap, "both" takes as long as the longer side alone; if they
// serialize, as long as the two sides together.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/sm90/primitives.cuh"
#include "probe_common.cuh"

namespace {

using namespace mqa_logits::sm90;
using mqa_logits::probe::pattern_byte;

constexpr int kMmaWarpgroups = 2;
constexpr int kAluWarpgroups = 2;
constexpr int kWarpgroups = kMmaWarpgroups + kAluWarpgroups;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kRowBytes = 128;                 // K = 128 e4m3 values, one 128-byte swizzle row
constexpr int kATileBytes = 64 * kRowBytes;    // 64 keys
constexpr int kBTileBytes = 128 * kRowBytes;   // 128 (query, head) columns
constexpr int kSmemBytes = 1024 + kATileBytes + kBTileBytes;  // 1024: room to align the tiles
constexpr int kChains = 8;

enum Side : int { kMma = 1, kAlu = 2 };
// What the ALU warpgroups run per chain and step.
enum class AluWork : int {
  kMaxFma,  // fmaxf then fmaf (FMNMX + FFMA): the logits epilogue's pair
  kFma,     // fmaf (FFMA)
  kMax,     // fmaxf (FMNMX)
  kAdd,     // fadd (FADD)
  kInt,     // xor then add on integers (LOP3 + IADD3)
  kHalf2,   // half2 fma (HFMA2)
};
constexpr AluWork kAluWorks[] = {AluWork::kMaxFma, AluWork::kFma, AluWork::kMax,
                                 AluWork::kAdd, AluWork::kInt, AluWork::kHalf2};
const char* alu_work_name(AluWork work) {
  switch (work) {
    case AluWork::kMaxFma: return "max + fma";
    case AluWork::kFma: return "fma";
    case AluWork::kMax: return "max";
    case AluWork::kAdd: return "add";
    case AluWork::kInt: return "int xor + add";
    case AluWork::kHalf2: return "half2 fma";
  }
  return "?";
}

// kChains independent chains (chain c starts at init(c)) of `step`, `steps` times; returns the sum
// of their ends (to_float) so that none is dead code.
template <typename Init, typename Step, typename ToFloat>
__device__ float run_chains(int steps, Init init, Step step, ToFloat to_float) {
  decltype(init(0)) x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = init(c);
  for (int s = 0; s < steps; ++s) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) x[c] = step(x[c]);
  }
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) total += to_float(x[c]);
  return total;
}

__global__ void __launch_bounds__(kThreads, 1)
    overlap_probe(int sides, AluWork alu_work, int mma_tiles, int alu_steps, long long* cycles,
                  float* sink) {
  extern __shared__ std::uint8_t smem_raw[];
  const std::uint32_t misalignment = smem_address(smem_raw) % 1024;
  std::uint8_t* a_tile = smem_raw + (misalignment == 0 ? 0 : 1024 - misalignment);
  std::uint8_t* b_tile = a_tile + kATileBytes;
  for (int i = threadIdx.x; i < kATileBytes + kBTileBytes; i += kThreads) a_tile[i] = pattern_byte(i);
  fence_async_proxy_shared();
  __syncthreads();

  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  const bool mma_side = warpgroup < kMmaWarpgroups;
  const bool active = (sides & (mma_side ? kMma : kAlu)) != 0;
  float result = 0.0f;
  const long long start = clock64();
  if (active && mma_side) {
    float acc[64];
    for (int t = 0; t < mma_tiles; ++t) {
      wgmma_tile_e4m3_n<128, kRowBytes>(acc, a_tile, b_tile);
      wgmma_wait<0>();
      fence_accumulators(acc);
      result += acc[0];
    }
  } else if (active) {
    const float seed = 0.001f * static_cast<float>(threadIdx.x) - 0.2f;
    const float w = 0.5f, bias = -0.25f + 1e-7f * static_cast<float>(blockIdx.x);
    const auto from = [=](int c) { return seed + static_cast<float>(c); };
    const auto same = [](float x) { return x; };
    switch (alu_work) {
      case AluWork::kMaxFma:
        result = run_chains(alu_steps, from, [=](float x) { return fmaf(w, fmaxf(x, 0.0f), bias); }, same);
        break;
      case AluWork::kFma:
        result = run_chains(alu_steps, from, [=](float x) { return fmaf(w, x, bias); }, same);
        break;
      case AluWork::kMax:  // the negation (an operand modifier) keeps repeated maxima from folding
        result = run_chains(alu_steps, from, [=](float x) { return -fmaxf(x, bias); }, same);
        break;
      case AluWork::kAdd:
        result = run_chains(alu_steps, from, [=](float x) { return bias - x; }, same);
        break;
      case AluWork::kInt: {
        const unsigned mask = 0x5bd1e995u ^ blockIdx.x, step = 0x9e3779b9u;
        result = run_chains(
            alu_steps, [=](int c) { return threadIdx.x + static_cast<unsigned>(c); },
            [=](unsigned x) { return (x ^ mask) + step; },
            [](unsigned x) { return static_cast<float>(x); });
        break;
      }
      case AluWork::kHalf2: {
        const __half2 w2 = __floats2half2_rn(w, w), b2 = __floats2half2_rn(bias, bias);
        result = run_chains(
            alu_steps, [=](int c) { return __floats2half2_rn(from(c), -from(c)); },
            [=](__half2 x) { return __hfma2(w2, x, b2); },
            [](__half2 x) { return __low2float(x) + __high2float(x); });
        break;
      }
    }
  }
  const long long end = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * kWarpgroups + warpgroup] = active ? end - start : 0;
  if (result == 123.456f) sink[threadIdx.x] = result;  // keeps the work; never true in practice
}

void check(cudaError_t status, const char* what) { mqa_logits::probe::check(status, "overlap probe", what); }

struct Run {
  double mma_cycles = 0;  // median over SMs of the slower MMA warpgroup
  double alu_cycles = 0;
  double milliseconds = 0;
};

Run run(int sides, AluWork work, int mma_tiles, int alu_steps, int sms, long long* cycles, float* sink) {
  check(cudaMemset(cycles, 0, sizeof(long long) * sms * kWarpgroups), "cudaMemset");
  Run r;
  r.milliseconds = mqa_logits::probe::time_launch("overlap probe", [&] {
    overlap_probe<<<sms, kThreads, kSmemBytes>>>(sides, work, mma_tiles, alu_steps, cycles, sink);
  });
  const auto host = mqa_logits::probe::records_on_host(
      cycles, static_cast<std::size_t>(sms) * kWarpgroups, "overlap probe");
  auto median_of = [&](int first, int count) {
    auto per_sm = mqa_logits::probe::slowest_per_sm(host, kWarpgroups, first, count);
    std::nth_element(per_sm.begin(), per_sm.begin() + sms / 2, per_sm.end());
    return static_cast<double>(per_sm[sms / 2]);
  };
  r.mma_cycles = median_of(0, kMmaWarpgroups);
  r.alu_cycles = median_of(kMmaWarpgroups, kAluWarpgroups);
  return r;
}

}  // namespace

int main() {
  const int sms = mqa_logits::probe::hopper_sm_count("overlap probe");
  if (sms == 0) return 0;
  check(cudaFuncSetAttribute(overlap_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
        "cudaFuncSetAttribute");
  long long* cycles = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&cycles, sizeof(long long) * sms * kWarpgroups), "cudaMalloc");
  check(cudaMalloc(&sink, sizeof(float) * kThreads), "cudaMalloc");

  // Per SM scheduler: a tile is 4 x 64 = 256 tensor cycles per MMA warpgroup (2.0 M cycles in
  // all); an ALU step is 8 instructions of the mix per ALU warp, two ALU warps: 1.0 M of each
  // instruction per scheduler (about 1 M cycles at full rate, 2 M at half rate).
  constexpr int kMmaTiles = 4000;
  constexpr int kAluSteps = 62500;
  run(kMma | kAlu, AluWork::kMaxFma, 100, 1000, sms, cycles, sink);  // warm-up
  std::printf("%-14s %-10s %14s %14s %10s\n", "ALU work", "sides", "MMA cycles", "ALU cycles", "ms");
  const Run mma = run(kMma, AluWork::kFma, kMmaTiles, kAluSteps, sms, cycles, sink);
  std::printf("%-14s %-10s %14.0f %14s %10.3f\n", "-", "MMA", mma.mma_cycles, "-", mma.milliseconds);
  for (AluWork work : kAluWorks) {
    const char* name = alu_work_name(work);
    const Run alu = run(kAlu, work, kMmaTiles, kAluSteps, sms, cycles, sink);
    const Run both = run(kMma | kAlu, work, kMmaTiles, kAluSteps, sms, cycles, sink);
    std::printf("%-14s %-10s %14s %14.0f %10.3f\n", name, "ALU", "-", alu.alu_cycles, alu.milliseconds);
    std::printf("%-14s %-10s %14.0f %14.0f %10.3f\n", name, "both", both.mma_cycles, both.alu_cycles,
                both.milliseconds);
    const double longer = std::max(mma.mma_cycles, alu.alu_cycles);
    const double sum = mma.mma_cycles + alu.alu_cycles;
    const double slowest = std::max(both.mma_cycles, both.alu_cycles);
    std::printf("%-14s overlap: together %.2f x the longer side alone (1.00: full overlap, %.2f: "
                "none)\n", name, slowest / longer, sum / longer);
  }
  check(cudaFree(cycles), "cudaFree");
  check(cudaFree(sink), "cudaFree");
  return 0;
}
