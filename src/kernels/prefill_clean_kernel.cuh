// clean_logits of prefill as a pass of its own: -inf into every output element outside its row's
// window, at copy speed.
//
// The logits kernel writes the tiles its blocks cover, -inf included for the columns of a tile
// outside a row's window; this pass writes every column outside the row's window, so the two
// overlap only where both write -inf and may run in either order, or at once. It runs after the
// logits kernel on the same stream, launched with programmatic dependent launch: its CTAs take
// the SMs that the logits kernel's CTAs leave as they finish (the tail of an uneven split), and
// each waits for that kernel's completion before it exits, so that whatever the stream runs next
// sees the whole output.
//
// Tiling: one warp a (row, chunk of kCleanColumns columns), kCleanRowsPerCta rows a CTA; lanes
// write 16-byte vectors of -inf over the aligned body of each masked range (fill_row.cuh), so a
// warp's stores cover 512 contiguous bytes. No shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fill_row.cuh"
#include "schedule.hpp"

namespace mqa_logits::kernels {

inline constexpr int kCleanRowsPerCta = 4;  // a warp a row
inline constexpr int kCleanThreads = 32 * kCleanRowsPerCta;
inline constexpr std::int64_t kCleanColumns = 4096;  // a warp's chunk of a row

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
};

__global__ void __launch_bounds__(kCleanThreads)
    prefill_clean_kernel(const __grid_constant__ PrefillCleanParams p) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kCleanRowsPerCta + threadIdx.x / 32;
  const std::int64_t chunk_begin = static_cast<std::int64_t>(blockIdx.y) * kCleanColumns;
  const std::int64_t chunk_end = min(chunk_begin + kCleanColumns, p.out_cols);
  if (row < p.seq_len && chunk_begin < chunk_end) {
    // The row's window as output columns [first, last), clamped to the output.
    const std::int32_t start = p.k_start[row];
    const auto window = schedule::prefill_row_window(start, p.k_end[row], p.seq_len_kv);
    const std::int64_t shift = p.compressed ? start : 0;
    std::int64_t first = 0, last = 0;
    if (window.lo < window.hi) {
      first = min(max(window.lo - shift, std::int64_t{0}), p.out_cols);
      last = min(max(window.hi - shift, first), p.out_cols);
    }
    void* out = logits_row(p.logits, p.logits_row_stride, row, p.logits_bf16);
    const int lane = threadIdx.x % 32;
    fill_row_negative_infinity(out, p.logits_bf16, chunk_begin, max(chunk_begin, min(first, chunk_end)),
                               lane, 32);
    fill_row_negative_infinity(out, p.logits_bf16, min(max(last, chunk_begin), chunk_end), chunk_end,
                               lane, 32);
  }
  // Completes only after the logits kernel before it (see the top of this file).
  cudaGridDependencySynchronize();
}

}  // namespace mqa_logits::kernels
