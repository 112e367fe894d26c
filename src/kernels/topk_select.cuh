// The exact selection of one row's keys by a cluster of CTAs (1 to 16), each holding a chunk of
// the row's elements in order: the threshold by three histogram levels over the order keys'
// digits, added up over the cluster through distributed shared memory, then the ordered output.
// docs/design.md, "Top-k", says why. A Source gives its chunk's `count` elements, in order:
// key(i) (topk::order_key, 0 never selected), and index(i) and value(i), what the output holds.
// The first pass reads key(i) from its origin, load_word(i) then key_of(i, word), and hands it
// to keep(i, key), where a Source may cache it for the passes after.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace mqa_logits::kernels {

inline constexpr int kTopkThreads = 512;
inline constexpr int kTopkItems = 4;  // consecutive columns a thread takes in the ordered pass
inline constexpr int kTopkTile = kTopkThreads * kTopkItems;
inline constexpr int kTopkLevels = 3;
inline constexpr int kTopkBins = 1 << 11;
inline constexpr int kTopkBinsPerThread = kTopkBins / kTopkThreads;
inline constexpr int kTopkMaxCluster = 16;  // non-portable past 8
inline constexpr int kTopkBatch = 16;  // keys a thread has in flight in a counting pass

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

// Level `level`'s histogram of the chunk's keys that match the threshold so far, in
// shared.local: each thread reads kTopkBatch words (read(i), nothing but a load) before it turns
// any into a key (to_key(i, word)), so that as many loads are in flight; keep(i, key) then has it.
template <class Read, class ToKey, class Keep>
__device__ void count_level(TopkShared& shared, std::int64_t count, const Threshold& t, int level,
                            const Read& read, const ToKey& to_key, const Keep& keep) {
  const int shift = topk_digit_shift(level);
  const unsigned mask = (1u << topk_digit_bits(level)) - 1;
  for (std::int64_t first = 0; first < count; first += kTopkThreads * kTopkBatch) {
    std::uint32_t words[kTopkBatch];
#pragma unroll
    for (int j = 0; j < kTopkBatch; ++j) {
      const std::int64_t i = first + j * kTopkThreads + threadIdx.x;
      words[j] = i < count ? read(i) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kTopkBatch; ++j) {
      const std::int64_t i = first + j * kTopkThreads + threadIdx.x;
      if (i >= count) continue;
      const std::uint32_t key = to_key(i, words[j]);
      keep(i, key);
      if (key != 0 && (t.shift == 32 || (key >> t.shift) == t.prefix)) {
        atomicAdd(&shared.local[(key >> shift) & mask], 1u);
      }
    }
  }
}

template <class Source>
__device__ Threshold find_threshold(cooperative_groups::cluster_group& cluster,
                                    TopkShared& shared, const Source& src, unsigned topk) {
  Threshold t;
  t.need = topk;
  for (int level = 0; level < kTopkLevels; ++level) {
    const int bins = 1 << topk_digit_bits(level);
    for (int b = threadIdx.x; b < bins; b += kTopkThreads) shared.local[b] = 0;
    __syncthreads();
    if (level == 0) {  // from the Source's origin, into its cache
      count_level(
          shared, src.count, t, level, [&](std::int64_t i) { return src.load_word(i); },
          [&](std::int64_t i, std::uint32_t word) { return src.key_of(i, word); },
          [&](std::int64_t i, std::uint32_t key) { src.keep(i, key); });
    } else {
      count_level(
          shared, src.count, t, level, [&](std::int64_t i) { return src.key(i); },
          [](std::int64_t, std::uint32_t key) { return key; },
          [](std::int64_t, std::uint32_t) {});
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
    t.shift = topk_digit_shift(level);
    const bool exact = shared.total[bin] == t.need;
    __syncthreads();  // every thread has read the bin before the next level writes it
    if (exact) break;
  }
  return t;
}

// This chunk's keys above and equal to the threshold, into shared.chunk_above / chunk_equal.
template <class Source>
__device__ void count_chunk(TopkShared& shared, const Source& src, const Threshold& t) {
  unsigned above = 0, equal = 0, total = 0;
  for (std::int64_t i = threadIdx.x; i < src.count; i += kTopkThreads) {
    const int rank = t.rank(src.key(i));
    above += rank == 2;
    equal += rank == 1;
  }
  TopkScan(shared.scan).ExclusiveSum(above, above, total);
  __syncthreads();
  if (threadIdx.x == 0) shared.chunk_above = total;
  TopkScan(shared.scan).ExclusiveSum(equal, equal, total);
  if (threadIdx.x == 0) shared.chunk_equal = total;
}

// Writes this chunk's part of the row's selection in its order to indices / values ([topk]
// each; values may be null); the cluster's last CTA then writes -1 (values -inf) after the row's
// last taken key, up to topk.
template <class Source>
__device__ void write_selection(cooperative_groups::cluster_group& cluster, TopkShared& shared,
                                const Source& src, const Threshold& t, std::int32_t* indices,
                                float* values, std::int64_t topk) {
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  unsigned above_before = 0, equal_before = 0;  // over earlier chunks, then earlier tiles
  if (ranks > 1) {
    count_chunk(shared, src, t);
    cluster.sync();
    above_before = cluster_sum(cluster, shared, &shared.chunk_above, 0, rank);
    equal_before = cluster_sum(cluster, shared, &shared.chunk_equal, 0, rank);
  }
  for (std::int64_t tile = 0; tile < src.count; tile += kTopkTile) {
    const std::int64_t base = tile + static_cast<std::int64_t>(threadIdx.x) * kTopkItems;
    int ranked[kTopkItems];
    unsigned counts = 0;  // above in the low half, equal in the high half
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      ranked[j] = base + j < src.count ? t.rank(src.key(base + j)) : 0;
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
        indices[place] = src.index(base + j);
        if (values != nullptr) values[place] = src.value(base + j);
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
  for (std::int64_t i = taken + threadIdx.x; i < topk; i += kTopkThreads) {
    indices[i] = -1;
    if (values != nullptr) values[i] = __uint_as_float(0xff800000u);
  }
}

}  // namespace mqa_logits::kernels
