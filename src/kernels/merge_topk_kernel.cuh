// merge_topk on the GPU: one CTA a row. The row's R candidate lists (each in ascending key order,
// -1 after its last key, as the top-k operations return them) are merged into one list in
// ascending key order in shared memory: a candidate's place is its place in its own list plus,
// for every other list, the number of its keys below the candidate's (a binary search). Then the
// selection of topk_select.cuh runs over the merged list, whose order is the key order: ties go
// to the lower key and the output comes in ascending key order, as on the CPU. Lists that break
// the rule give a selection of some of the row's candidates, never an access out of bounds.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/topk_select.cuh"
#include "topk.hpp"

namespace mqa_logits::kernels {

// Shared memory a row takes: the lists' keys, then the merged order keys and sources.
__host__ __device__ constexpr std::int64_t merge_smem_bytes(std::int64_t candidates_per_row) {
  return candidates_per_row * 3 * 4;
}

// How many of the keys of a list of `length` (ascending, then -1) are below `key` (>= 0).
__device__ inline std::int64_t keys_below(const std::int32_t* list, std::int64_t length,
                                          std::int32_t key) {
  std::int64_t lo = 0, hi = length;  // the first -1
  while (lo < hi) {
    const std::int64_t mid = (lo + hi) / 2;
    if (list[mid] < 0) hi = mid; else lo = mid + 1;
  }
  std::int64_t end = lo;
  lo = 0;
  while (lo < end) {
    const std::int64_t mid = (lo + end) / 2;
    if (list[mid] < key) lo = mid + 1; else end = mid;
  }
  return lo;
}

// The merged list of a row: element i is the candidate at source[i] of the row's R * K.
struct MergedCandidates {
  const MergeProblem& p;
  std::int64_t row;
  const std::int32_t* staged;   // the row's keys, list r at [r * K, (r + 1) * K)
  const std::uint32_t* keys;    // order keys, merged
  const std::uint32_t* source;  // merged
  std::int64_t count;

  __device__ std::uint32_t load_word(std::int64_t i) const { return keys[i]; }
  __device__ std::uint32_t key_of(std::int64_t, std::uint32_t key) const { return key; }
  __device__ void keep(std::int64_t, std::uint32_t) const {}
  __device__ std::uint32_t key(std::int64_t i) const { return keys[i]; }
  __device__ std::int32_t index(std::int64_t i) const { return staged[source[i]]; }
  __device__ float value(std::int64_t i) const {
    const std::int64_t list = source[i] / p.candidates, j = source[i] % p.candidates;
    return p.values[(list * p.rows + row) * p.candidates + j];
  }
};

__global__ void __launch_bounds__(kTopkThreads, 1) merge_topk_kernel(const MergeProblem p) {
  __shared__ TopkShared shared;
  extern __shared__ __align__(16) std::uint32_t merge_smem[];
  const std::int64_t per_row = p.lists * p.candidates;
  auto* staged = reinterpret_cast<std::int32_t*>(merge_smem);
  std::uint32_t* keys = merge_smem + per_row;
  std::uint32_t* source = keys + per_row;
  auto cluster = cooperative_groups::this_cluster();  // of one CTA
  for (std::int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    unsigned valid = 0;
    for (std::int64_t e = threadIdx.x; e < per_row; e += kTopkThreads) {
      const std::int64_t list = e / p.candidates, j = e % p.candidates;
      staged[e] = p.indices[(list * p.rows + row) * p.candidates + j];
      valid += staged[e] >= 0;
      keys[e] = 0;  // a place no candidate takes (lists that break the rule) is never selected
      source[e] = 0;
    }
    unsigned count = 0;
    TopkScan(shared.scan).ExclusiveSum(valid, valid, count);
    __syncthreads();
    for (std::int64_t e = threadIdx.x; e < per_row; e += kTopkThreads) {
      const std::int32_t key_index = staged[e];
      if (key_index < 0) continue;
      const std::int64_t list = e / p.candidates;
      std::int64_t place = e % p.candidates;
      for (std::int64_t other = 0; other < p.lists; ++other) {
        if (other == list) continue;
        place += keys_below(staged + other * p.candidates, p.candidates, key_index);
      }
      if (place >= per_row) continue;
      const float value = p.values[(list * p.rows + row) * p.candidates + e % p.candidates];
      keys[place] = topk::order_key(__float_as_uint(value));
      source[place] = static_cast<std::uint32_t>(e);
    }
    __syncthreads();
    const MergedCandidates merged{p, row, staged, keys, source, count};
    const Threshold t = find_threshold(cluster, shared, merged, static_cast<unsigned>(p.topk));
    write_selection(cluster, shared, merged, t, p.out_indices + row * p.topk,
                    p.out_values != nullptr ? p.out_values + row * p.topk : nullptr, p.topk);
    __syncthreads();  // the staging is refilled by the next row
  }
}

}  // namespace mqa_logits::kernels
