// clean_logits of prefill as a pass of its own: -inf into every output element outside its row's
// window, at copy speed.
//
// The logits kernel writes the tiles its blocks cover, -inf included for the columns of a tile
// outside a row's window; this pass writes every column outside the row's window, so the two
// overlap only where both write -inf and may run in either order, or at once. It runs after the
// logits kernel on the same stream, launched with programmatic dependent launch, so that its
// CTAs start while the logits kernel runs: one beside each logits CTA (kCleanRegisters a thread
// fit the registers that CTA leaves free; it leaves the shared memory of one more CTA too), then
// on the SMs that the logits CTAs leave. The grid's last CTA waits for the logits kernel's
// completion (or the clean grid's before it) before it exits, so that this grid completes after
// it and whatever the stream runs next sees the whole output; the other CTAs exit as soon as
// their stores are issued.
// Beside the logits kernel the stores share the memory system with it. Where windows are short
// that kernel streams Q rows at a high rate (a block's Q, 32 KiB at D = 128, every tile or two),
// and stores beside it slowed it by more than they saved (docs/design.md, "Choices made by
// measurement"). So the CTAs first take the mean window of kWindowSampleRows rows spread over S,
// the same rows for all of them: below kBesideLogitsMinWindow keys they wait for the logits
// kernel before they store.
//
// Tiling: one warp a (row, chunk of kCleanColumns columns), kCleanRowsPerCta rows a CTA; lanes
// write 16-byte vectors of -inf over the aligned body of each masked range (fill_row.cuh), so a
// warp's stores cover 512 contiguous bytes. Grid: (row groups, chunks from first_chunk), at most
// kMaxGridChunks chunks (CUDA's limit on gridDim.y): wider outputs take several grids, each
// after the one before. No shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fill_row.cuh"
#include "schedule.hpp"

namespace mqa_logits::kernels {

inline constexpr int kCleanRowsPerCta = 4;  // a warp a row
inline constexpr int kCleanThreads = 32 * kCleanRowsPerCta;
inline constexpr std::int64_t kCleanColumns = 4096;  // a warp's chunk of a row
inline constexpr std::int64_t kMaxGridChunks = 65535;  // chunks of one grid (gridDim.y)
// Registers a thread, so that a CTA fits the 4096 that a prefill logits CTA (640 threads of 96)
// leaves of an SM's 65536.
inline constexpr int kCleanRegisters = 32;
inline constexpr int kCleanMinCtasPerSm = 65536 / (kCleanThreads * kCleanRegisters);
inline constexpr int kWindowSampleRows = 32;  // a lane each
inline constexpr int kBesideLogitsMinWindow = 512;

struct PrefillCleanParams {
  void* logits;
  std::int64_t logits_row_stride;
  const std::int32_t* k_start;
  const std::int32_t* k_end;
  std::int64_t seq_len;
  std::int64_t seq_len_kv;
  std::int64_t out_cols;
  bool logits_bf16;
  bool compressed;  // column c of row i is key k_start[i] + c
  unsigned first_chunk;  // of this grid's blockIdx.y = 0 (chunks fit 32 bits: columns do)
};

// Whether the sampled rows' windows are kBesideLogitsMinWindow keys long on average: rows at
// odd multiples of S / (2 kWindowSampleRows), so that request boundaries at powers of two do not
// line up with them; each window counted up to kWindowCap keys, so that the sum fits 32 bits.
// Called by full warps.
__device__ inline bool windows_long_on_average(const PrefillCleanParams& p) {
  constexpr std::int64_t kWindowCap = 1 << 20;
  const std::int64_t slot = 2 * (threadIdx.x % 32) + 1;
  const std::int64_t row = slot * p.seq_len / (2 * kWindowSampleRows);
  const auto window = schedule::prefill_row_window(p.k_start[row], p.k_end[row], p.seq_len_kv);
  const auto length =
      static_cast<unsigned>(window.hi > window.lo ? min(window.hi - window.lo, kWindowCap) : 0);
  return __reduce_add_sync(0xffffffffu, length) >= kWindowSampleRows * kBesideLogitsMinWindow;
}

__global__ void __launch_bounds__(kCleanThreads, kCleanMinCtasPerSm)
    prefill_clean_kernel(const __grid_constant__ PrefillCleanParams p) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kCleanRowsPerCta + threadIdx.x / 32;
  const std::int64_t chunk_begin =
      static_cast<std::int64_t>(p.first_chunk + blockIdx.y) * kCleanColumns;
  const std::int64_t chunk_end = min(chunk_begin + kCleanColumns, p.out_cols);
  const bool fills = row < p.seq_len && chunk_begin < chunk_end;
  // The row's window, loaded before the sample's so that the two loads overlap.
  const std::int32_t start = fills ? p.k_start[row] : 0;
  const std::int32_t end = fills ? p.k_end[row] : 0;
  if (!windows_long_on_average(p)) cudaGridDependencySynchronize();
  if (fills) {
    // The row's window as output columns [first, last), clamped to the output.
    const auto window = schedule::prefill_row_window(start, end, p.seq_len_kv);
    const std::int64_t shift = p.compressed ? start : 0;
    std::int64_t first = 0, last = 0;
    if (window.lo < window.hi) {
      first = min(max(window.lo - shift, std::int64_t{0}), p.out_cols);
      last = min(max(window.hi - shift, first), p.out_cols);
    }
    void* out = logits_row(p.logits, p.logits_row_stride, row, p.logits_bf16);
    const int lane = threadIdx.x % 32;
    fill_row_negative_infinity(out, p.logits_bf16, chunk_begin,
                               max(chunk_begin, min(first, chunk_end)), lane, 32);
    fill_row_negative_infinity(out, p.logits_bf16, min(max(last, chunk_begin), chunk_end),
                               chunk_end, lane, 32);
  }
  // The grid completes only after the logits kernel before it (see the top of this file).
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) cudaGridDependencySynchronize();
}

}  // namespace mqa_logits::kernels
