// Exact top-k of logits rows (topk.hpp's rules): a cluster of CTAs a row, rank r of c taking
// chunk r of the row's columns (chunks of equal length, in column order), read once into its
// shared memory where it fits (else read again on each pass), selected by topk_select.cuh.
// docs/design.md, "Top-k", says why it is built this way.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/topk_select.cuh"
#include "topk.hpp"

namespace mqa_logits::kernels {

// The order key of element i of this CTA's chunk (column chunk_first + i of the row).
struct ChunkKeys {
  const TopkProblem& p;
  const topk::RowSpan& span;
  const void* row_data;
  std::int64_t row;
  std::int64_t chunk_first;
  std::int64_t count;
  const std::uint32_t* cached;  // the chunk's keys in shared memory, or null

  __device__ std::uint32_t key(std::int64_t i) const {
    return cached != nullptr ? cached[i] : topk::column_key(p, row_data, row, chunk_first + i);
  }
  __device__ std::int32_t index(std::int64_t i) const {
    return topk::column_index(p, span, row, chunk_first + i);
  }
  __device__ float value(std::int64_t i) const {
    return __uint_as_float(
        topk::logit_bits(row_data, chunk_first + i, p.logits_dtype == DType::kBFloat16));
  }
};

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
    ChunkKeys keys{p, span, row_data, row, span.first + first, count, nullptr};
    if (count <= cache_keys) {
      for (std::int64_t i = threadIdx.x; i < count; i += kTopkThreads) cache[i] = keys.key(i);
      keys.cached = cache;
      __syncthreads();
    }
    const Threshold t = find_threshold(cluster, shared, keys, static_cast<unsigned>(p.topk));
    write_selection(cluster, shared, keys, t, p.indices + row * p.topk,
                    p.values != nullptr ? p.values + row * p.topk : nullptr, p.topk);
    cluster.sync();  // no CTA reads another's shared state of this row any more
  }
}

}  // namespace mqa_logits::kernels
