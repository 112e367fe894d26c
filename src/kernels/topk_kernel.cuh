// Exact top-k of logits rows (topk.hpp's rules): a cluster of CTAs a row, radix select on the
// order keys. docs/design.md, "Top-k", says why it is built this way.
//
// Rank r of a cluster of c CTAs takes chunk r of the row's columns (chunks of equal length, in
// column order), read once into its shared memory where it fits (else read again on each pass).
// 1. Threshold: three histogram levels over the key's digits (11, 11, 10 bits from the top). Each
//    CTA counts its chunk; every CTA adds up the cluster's counts (distributed shared memory) and
//    finds the bin of the topk-th key. A level stops early when that bin holds exactly the keys
//    still needed; a row with at most topk selectable keys takes them all.
// 2. Output: keys above the prefix are taken, keys equal to it in column order until the count
//    is reached. Each CTA's place in the row is the counts of the chunks before it; within a chunk
//    a block scan of (above, equal) counts places every taken column, so a row's indices come out
//    in ascending column order, as on the CPU.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "topk.hpp"

namespace mqa_logits::kernels {

inline constexpr int kTopkThreads = 512;
inline constexpr int kTopkItems = 4;  // consecutive columns a thread takes in the ordered pass
inline constexpr int kTopkTile = kTopkThreads * kTopkItems;
inline constexpr int kTopkLevels = 3;
inline constexpr int kTopkBins = 1 << 11;
inline constexpr int kTopkBinsPerThread = kTopkBins / kTopkThreads;
inline constexpr int kTopkMaxCluster = 8;

// Level l's digit: bits [shift, shift + bits) of the key, 11, 11 and 10 bits from the top.
__host__ __device__ constexpr int topk_digit_bits(int level) { return level < 2 ? 11 : 10; }
__host__ __device__ constexpr int topk_digit_shift(int level) {
  return level == 0 ? 21 : (level == 1 ? 10 : 0);
}

using TopkScan = cub::BlockScan<unsigned, kTopkThreads>;

struct TopkShared {
  unsigned local[kTopkBins];  // this CTA's counts, read by the cluster
  unsigned total[kTopkBins];  // the cluster's
  TopkScan::TempStorage scan;
  unsigned bin;        // the bin the topk-th key lies in
  unsigned above;      // keys of higher bins
  unsigned chunk_above;  // this chunk's keys above the threshold, read by the cluster
  unsigned chunk_equal;  // and equal to it
};

// The order key of element i of this CTA's chunk (column chunk_first + i of the row).
struct ChunkKeys {
  const TopkProblem& p;
  const void* row_data;
  std::int64_t row;
  std::int64_t chunk_first;
  std::int64_t count;
  const std::uint32_t* cached;  // the chunk's keys in shared memory, or null

  __device__ std::uint32_t operator()(std::int64_t i) const {
    return cached != nullptr ? cached[i] : topk::column_key(p, row_data, row, chunk_first + i);
  }
};

// The prefix of the topk-th best key, and how many keys with that prefix the row still takes.
struct Threshold {
  std::uint32_t prefix = 0;
  int shift = 32;     // keys compare as key >> shift against prefix; 32: every valid key
  unsigned need = 0;  // keys equal to the prefix that are taken, the first in column order

  // 2: above the threshold (taken), 1: equal (taken in column order up to need), 0: below.
  __device__ int rank(std::uint32_t key) const {
    if (key == 0) return 0;
    if (shift == 32) return 2;
    const std::uint32_t digits = key >> shift;
    return digits > prefix ? 2 : (digits == prefix ? 1 : 0);
  }
};

// The sum over the cluster's CTAs of `value` at `field` of their shared state.
__device__ inline unsigned cluster_sum(cooperative_groups::cluster_group& cluster,
                                       TopkShared& shared, const unsigned* field,
                                       unsigned first_rank, unsigned end_rank) {
  unsigned sum = 0;
  const auto offset = field - reinterpret_cast<const unsigned*>(&shared);
  for (unsigned r = first_rank; r < end_rank; ++r) {
    sum += cluster.map_shared_rank(reinterpret_cast<unsigned*>(&shared), r)[offset];
  }
  return sum;
}

// The bin (of `bins`, highest first) that holds the need-th key of shared.total.
__device__ inline void find_bin(TopkShared& shared, int bins, unsigned need) {
  const int hi = bins - 1 - kTopkBinsPerThread * static_cast<int>(threadIdx.x);
  unsigned mine = 0;
  for (int j = 0; j < kTopkBinsPerThread; ++j) mine += hi - j >= 0 ? shared.total[hi - j] : 0;
  unsigned above = 0;
  TopkScan(shared.scan).ExclusiveSum(mine, above);
  for (int j = 0; j < kTopkBinsPerThread && hi - j >= 0; ++j) {
    const unsigned count = shared.total[hi - j];
    if (above < need && need <= above + count) {
      shared.bin = static_cast<unsigned>(hi - j);
      shared.above = above;
    }
    above += count;
  }
  __syncthreads();
}

__device__ inline Threshold find_threshold(cooperative_groups::cluster_group& cluster,
                                           TopkShared& shared, const ChunkKeys& keys,
                                           unsigned topk) {
  Threshold t;
  t.need = topk;
  for (int level = 0; level < kTopkLevels; ++level) {
    const int shift = topk_digit_shift(level);
    const int bins = 1 << topk_digit_bits(level);
    for (int b = threadIdx.x; b < bins; b += kTopkThreads) shared.local[b] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < keys.count; i += kTopkThreads) {
      const std::uint32_t key = keys(i);
      if (key == 0 || (t.shift < 32 && (key >> t.shift) != t.prefix)) continue;
      atomicAdd(&shared.local[(key >> shift) & (bins - 1)], 1u);
    }
    cluster.sync();  // every chunk counted
    unsigned valid = 0;
    for (int b = threadIdx.x; b < bins; b += kTopkThreads) {
      shared.total[b] = cluster_sum(cluster, shared, &shared.local[b], 0, cluster.num_blocks());
      valid += shared.total[b];
    }
    cluster.sync();  // every CTA has read the others' counts: they may be cleared
    if (level == 0) {
      unsigned total = 0;
      TopkScan(shared.scan).ExclusiveSum(valid, valid, total);
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
    const bool exact = shared.total[bin] == t.need;
    __syncthreads();  // every thread has read the bin before the next level writes it
    if (exact) break;
  }
  return t;
}

// This chunk's keys above and equal to the threshold, into shared.chunk_above / chunk_equal.
__device__ inline void count_chunk(TopkShared& shared, const ChunkKeys& keys, const Threshold& t) {
  unsigned above = 0, equal = 0, total = 0;
  for (std::int64_t i = threadIdx.x; i < keys.count; i += kTopkThreads) {
    const int rank = t.rank(keys(i));
    above += rank == 2;
    equal += rank == 1;
  }
  TopkScan(shared.scan).ExclusiveSum(above, above, total);
  __syncthreads();
  if (threadIdx.x == 0) shared.chunk_above = total;
  TopkScan(shared.scan).ExclusiveSum(equal, equal, total);
  if (threadIdx.x == 0) shared.chunk_equal = total;
}

// Writes this chunk's part of the row's selection in column order; the cluster's last CTA then
// writes -1 (values -inf) after the row's last taken key, up to topk.
__device__ inline void write_selection(cooperative_groups::cluster_group& cluster,
                                       TopkShared& shared, const TopkProblem& p,
                                       const topk::RowSpan& span, const ChunkKeys& keys,
                                       const Threshold& t) {
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  unsigned above_before = 0, equal_before = 0;  // over earlier chunks, then earlier tiles
  if (ranks > 1) {
    count_chunk(shared, keys, t);
    cluster.sync();
    above_before = cluster_sum(cluster, shared, &shared.chunk_above, 0, rank);
    equal_before = cluster_sum(cluster, shared, &shared.chunk_equal, 0, rank);
  }
  std::int32_t* indices = p.indices + keys.row * p.topk;
  float* values = p.values != nullptr ? p.values + keys.row * p.topk : nullptr;
  const bool bf16 = p.logits_dtype == DType::kBFloat16;
  for (std::int64_t tile = 0; tile < keys.count; tile += kTopkTile) {
    const std::int64_t base = tile + static_cast<std::int64_t>(threadIdx.x) * kTopkItems;
    int ranked[kTopkItems];
    unsigned counts = 0;  // above in the low half, equal in the high half
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      ranked[j] = base + j < keys.count ? t.rank(keys(base + j)) : 0;
      counts += ranked[j] == 2 ? 1u : (ranked[j] == 1 ? 1u << 16 : 0u);
    }
    unsigned aggregate = 0;
    TopkScan(shared.scan).ExclusiveSum(counts, counts, aggregate);
    unsigned above = above_before + (counts & 0xffffu);
    unsigned equal = equal_before + (counts >> 16);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      if (ranked[j] == 2 || (ranked[j] == 1 && equal < t.need)) {
        const std::int64_t place = above + (equal < t.need ? equal : t.need);
        const std::int64_t col = keys.chunk_first + base + j;
        indices[place] = topk::column_index(p, span, keys.row, col);
        if (values != nullptr) {
          values[place] = __uint_as_float(topk::logit_bits(keys.row_data, col, bf16));
        }
      }
      above += ranked[j] == 2;
      equal += ranked[j] == 1;
    }
    above_before += aggregate & 0xffffu;
    equal_before += aggregate >> 16;
    __syncthreads();  // the scan's storage is reused by the next tile
  }
  if (rank + 1 != ranks) return;
  const unsigned taken = above_before + (equal_before < t.need ? equal_before : t.need);
  for (std::int64_t i = taken + threadIdx.x; i < p.topk; i += kTopkThreads) {
    indices[i] = -1;
    if (values != nullptr) values[i] = __uint_as_float(0xff800000u);
  }
}

// Clusters of c CTAs (the launch's cluster size) take rows cluster_id, cluster_id + clusters, ...;
// each CTA has `cache_keys` keys of dynamic shared memory for its chunk.
__global__ void __launch_bounds__(kTopkThreads, 2)
    topk_rows_kernel(const TopkProblem p, std::int64_t cache_keys) {
  __shared__ TopkShared shared;
  extern __shared__ __align__(16) std::uint32_t cache[];
  auto cluster = cooperative_groups::this_cluster();
  const unsigned ranks = cluster.num_blocks(), rank = cluster.block_rank();
  const std::int64_t clusters = gridDim.x / ranks;
  const std::int64_t element_bytes = p.logits_dtype == DType::kBFloat16 ? 2 : 4;
  for (std::int64_t row = blockIdx.x / ranks; row < p.rows; row += clusters) {
    const topk::RowSpan span = topk::row_span(p, row);
    // Chunks of a multiple of kTopkItems columns, in rank order.
    const std::int64_t chunk =
        (span.count + ranks * kTopkItems - 1) / (ranks * kTopkItems) * kTopkItems;
    const std::int64_t first = chunk * rank < span.count ? chunk * rank : span.count;
    const std::int64_t count = span.count - first < chunk ? span.count - first : chunk;
    const void* row_data =
        static_cast<const char*>(p.logits) + row * p.logits_row_stride * element_bytes;
    ChunkKeys keys{p, row_data, row, span.first + first, count, nullptr};
    if (count <= cache_keys) {
      for (std::int64_t i = threadIdx.x; i < count; i += kTopkThreads) cache[i] = keys(i);
      keys.cached = cache;
      __syncthreads();
    }
    const Threshold t = find_threshold(cluster, shared, keys, static_cast<unsigned>(p.topk));
    write_selection(cluster, shared, p, span, keys, t);
    cluster.sync();  // no CTA reads another's shared state of this row any more
  }
}

}  // namespace mqa_logits::kernels
