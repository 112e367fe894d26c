// Exact top-k of logits rows (topk.hpp's rules): one CTA a row, radix select on the order keys.
//
// 1. Threshold: three histogram levels over the key's digits (11, 11, 10 bits from the top) find
//    the prefix of the topk-th best key; a level stops early when its bin holds exactly the keys
//    still needed. A row with at most topk selectable keys takes them all.
// 2. Output: one ordered pass. Keys above the prefix are taken; keys equal to it are taken in
//    column order until the count is reached (ties to the lower key). A block-wide scan of the
//    (above, equal) counts gives each taken column its place, so a row's indices come out in
//    ascending column order, as on the CPU.
// A row of at most `cache_keys` columns is read once into shared memory and every later pass reads
// it there; a longer row is read again from global memory on each pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "topk.hpp"

namespace mqa_logits::kernels {

inline constexpr int kTopkThreads = 1024;
inline constexpr int kTopkItems = 4;  // consecutive columns a thread takes in the ordered pass
inline constexpr int kTopkTile = kTopkThreads * kTopkItems;
inline constexpr int kTopkLevels = 3;
// Level l's digit: bits [shift, shift + bits) of the key, 11, 11 and 10 bits from the top.
__host__ __device__ constexpr int topk_digit_bits(int level) { return level < 2 ? 11 : 10; }
__host__ __device__ constexpr int topk_digit_shift(int level) {
  return level == 0 ? 21 : (level == 1 ? 10 : 0);
}
inline constexpr int kTopkBins = 1 << 11;

struct TopkShared {
  unsigned histogram[kTopkBins];
  typename cub::BlockScan<unsigned, kTopkThreads>::TempStorage scan;
  unsigned bin;        // the bin the topk-th key lies in
  unsigned above;      // keys of higher bins
};

// The order key of window element `i` of the row (column span.first + i).
struct RowKeys {
  const TopkProblem& p;
  const void* row_data;
  std::int64_t row;
  std::int64_t first;
  const std::uint32_t* cached;  // the row's keys in shared memory, or null

  __device__ std::uint32_t operator()(std::int64_t i) const {
    return cached != nullptr ? cached[i] : topk::column_key(p, row_data, row, first + i);
  }
};

// The prefix of the topk-th best key, and how many keys with that prefix the row still takes.
struct Threshold {
  std::uint32_t prefix = 0;
  int shift = 32;      // keys compare as key >> shift against prefix; 32: every valid key
  unsigned need = 0;   // keys equal to the prefix that are taken, the first in column order
};

// Finds the bin (of `bins`, highest first) that holds the need-th key, given the histogram.
__device__ inline void find_bin(TopkShared& shared, int bins, unsigned need) {
  const int hi = bins - 1 - 2 * static_cast<int>(threadIdx.x);
  const unsigned count_hi = hi >= 0 ? shared.histogram[hi] : 0;
  const unsigned count_lo = hi >= 1 ? shared.histogram[hi - 1] : 0;
  unsigned above = 0;
  cub::BlockScan<unsigned, kTopkThreads>(shared.scan).ExclusiveSum(count_hi + count_lo, above);
  if (above < need && need <= above + count_hi) {
    shared.bin = static_cast<unsigned>(hi);
    shared.above = above;
  } else if (above + count_hi < need && need <= above + count_hi + count_lo) {
    shared.bin = static_cast<unsigned>(hi - 1);
    shared.above = above + count_hi;
  }
  __syncthreads();
}

__device__ inline Threshold find_threshold(TopkShared& shared, const RowKeys& keys,
                                           std::int64_t count, unsigned topk) {
  Threshold t;
  t.need = topk;
  for (int level = 0; level < kTopkLevels; ++level) {
    const int shift = topk_digit_shift(level);
    const int bins = 1 << topk_digit_bits(level);
    for (int b = threadIdx.x; b < bins; b += kTopkThreads) shared.histogram[b] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < count; i += kTopkThreads) {
      const std::uint32_t key = keys(i);
      if (key == 0 || (t.shift < 32 && (key >> t.shift) != t.prefix)) continue;
      atomicAdd(&shared.histogram[(key >> shift) & (bins - 1)], 1u);
    }
    __syncthreads();
    if (level == 0) {
      unsigned valid = 0, total = 0;
      for (int b = threadIdx.x; b < bins; b += kTopkThreads) valid += shared.histogram[b];
      cub::BlockScan<unsigned, kTopkThreads>(shared.scan).ExclusiveSum(valid, valid, total);
      __syncthreads();
      if (total <= topk) {  // every selectable key
        t.need = 0;
        return t;
      }
    }
    find_bin(shared, bins, t.need);
    const unsigned bin = shared.bin;
    t.need -= shared.above;
    t.prefix = (t.prefix << topk_digit_bits(level)) | bin;
    t.shift = shift;
    const bool exact = shared.histogram[bin] == t.need;
    __syncthreads();  // every thread has read the histogram before the next level clears it
    if (exact) break;
  }
  return t;
}

// Writes the row's selection in column order, then -1 (values -inf) up to topk.
__device__ inline void write_selection(TopkShared& shared, const TopkProblem& p,
                                       const topk::RowSpan& span, const RowKeys& keys,
                                       const Threshold& t, std::int64_t row) {
  std::int32_t* indices = p.indices + row * p.topk;
  float* values = p.values != nullptr ? p.values + row * p.topk : nullptr;
  const bool bf16 = p.logits_dtype == DType::kBFloat16;
  unsigned above_before = 0, equal_before = 0;  // over earlier tiles
  for (std::int64_t tile = 0; tile < span.count; tile += kTopkTile) {
    const std::int64_t base = tile + static_cast<std::int64_t>(threadIdx.x) * kTopkItems;
    std::uint32_t key[kTopkItems];
    unsigned counts = 0;  // above in the low half, equal in the high half
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      key[j] = base + j < span.count ? keys(base + j) : 0;
      if (key[j] == 0) continue;
      if (t.shift == 32 || (key[j] >> t.shift) > t.prefix) {
        counts += 1;
      } else if ((key[j] >> t.shift) == t.prefix) {
        counts += 1u << 16;
      }
    }
    unsigned aggregate = 0;
    cub::BlockScan<unsigned, kTopkThreads>(shared.scan).ExclusiveSum(counts, counts, aggregate);
    unsigned above = above_before + (counts & 0xffffu);
    unsigned equal = equal_before + (counts >> 16);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      if (key[j] == 0) continue;
      bool take = false;
      if (t.shift == 32 || (key[j] >> t.shift) > t.prefix) {
        take = true;
      } else if ((key[j] >> t.shift) == t.prefix) {
        take = equal < t.need;
      }
      if (take) {
        const std::int64_t place = above + (equal < t.need ? equal : t.need);
        const std::int64_t col = span.first + base + j;
        indices[place] = topk::column_index(p, span, row, col);
        if (values != nullptr) {
          values[place] = __uint_as_float(topk::logit_bits(keys.row_data, col, bf16));
        }
      }
      if (t.shift == 32 || (key[j] >> t.shift) > t.prefix) {
        ++above;
      } else if ((key[j] >> t.shift) == t.prefix) {
        ++equal;
      }
    }
    above_before += aggregate & 0xffffu;
    equal_before += aggregate >> 16;
    __syncthreads();  // the scan's storage is reused by the next tile
  }
  const unsigned taken = above_before + (equal_before < t.need ? equal_before : t.need);
  for (std::int64_t i = taken + threadIdx.x; i < p.topk; i += kTopkThreads) {
    indices[i] = -1;
    if (values != nullptr) values[i] = __uint_as_float(0xff800000u);
  }
}

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...; `cache_keys` keys of dynamic shared memory.
__global__ void __launch_bounds__(kTopkThreads, 1)
    topk_rows_kernel(const TopkProblem p, std::int64_t cache_keys) {
  __shared__ TopkShared shared;
  extern __shared__ __align__(16) std::uint32_t cache[];
  const std::int64_t element_bytes = p.logits_dtype == DType::kBFloat16 ? 2 : 4;
  for (std::int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const topk::RowSpan span = topk::row_span(p, row);
    const void* row_data =
        static_cast<const char*>(p.logits) + row * p.logits_row_stride * element_bytes;
    const bool cached = span.count <= cache_keys;
    RowKeys keys{p, row_data, row, span.first, nullptr};
    if (cached) {
      for (std::int64_t i = threadIdx.x; i < span.count; i += kTopkThreads) cache[i] = keys(i);
      keys.cached = cache;
      __syncthreads();
    }
    const Threshold t = find_threshold(shared, keys, span.count, static_cast<unsigned>(p.topk));
    write_selection(shared, p, span, keys, t, row);
    __syncthreads();  // the cache is refilled by the next row
  }
}

}  // namespace mqa_logits::kernels
