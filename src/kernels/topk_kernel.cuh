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

// Element i of this CTA's chunk: column chunk_first + i of the row, whose blocks (decode rows)
// drop keys of absent blocks and give cache slots. The logits' type, the rows' kind and whether
// chunks fit shared memory are the launch's, so that a pass's loads carry no branches and all of
// them are in flight at once.
template <bool kBf16, bool kDecodeRows, bool kCached>
struct ChunkKeys {
  const TopkProblem& p;
  const topk::RowSpan& span;
  const topk::DecodeBlocks& blocks;
  const void* row_data;
  std::int64_t chunk_first;
  std::int64_t count;
  std::uint32_t* cache;  // kCached: the chunk's keys in shared memory, filled by keep

  __device__ std::uint32_t load_word(std::int64_t i) const {
    return topk::logit_bits(row_data, chunk_first + i, kBf16);
  }
  __device__ std::uint32_t key_of(std::int64_t i, std::uint32_t bits) const {
    if constexpr (kDecodeRows) {
      if (blocks.block_of(chunk_first + i) < 0) return 0;
    }
    return topk::order_key(bits);
  }
  __device__ void keep(std::int64_t i, std::uint32_t key) const {
    if constexpr (kCached) cache[i] = key;
  }
  __device__ std::uint32_t key(std::int64_t i) const {
    if constexpr (kCached) return cache[i];
    return key_of(i, load_word(i));
  }
  __device__ std::int32_t index(std::int64_t i) const {
    return topk::column_index(p, span, blocks, chunk_first + i);
  }
  __device__ float value(std::int64_t i) const {
    return __uint_as_float(topk::logit_bits(row_data, chunk_first + i, kBf16));
  }
};

// Clusters of c CTAs (the launch's cluster size) take rows cluster_id, cluster_id + clusters, ...;
// kCached: each CTA's chunk fits its dynamic shared memory.
template <bool kBf16, bool kDecodeRows, bool kCached>
__global__ void __launch_bounds__(kTopkThreads, 2) topk_rows_kernel(const TopkProblem p) {
  __shared__ TopkShared shared;
  extern __shared__ __align__(16) std::uint32_t cache[];
  auto cluster = cooperative_groups::this_cluster();
  const unsigned ranks = cluster.num_blocks(), rank = cluster.block_rank();
  const std::int64_t clusters = gridDim.x / ranks;
  cudaGridDependencySynchronize();  // the logits are written
  cudaTriggerProgrammaticLaunchCompletion();
  for (std::int64_t row = blockIdx.x / ranks; row < p.rows; row += clusters) {
    const topk::RowSpan span = topk::row_span(p, row);
    // Chunks of a multiple of kTopkItems columns, in rank order.
    const std::int64_t chunk =
        (span.count + ranks * kTopkItems - 1) / (ranks * kTopkItems) * kTopkItems;
    const std::int64_t first = chunk * rank < span.count ? chunk * rank : span.count;
    const std::int64_t count = span.count - first < chunk ? span.count - first : chunk;
    const void* row_data =
        static_cast<const char*>(p.logits) + row * p.logits_row_stride * (kBf16 ? 2 : 4);
    const topk::DecodeBlocks blocks =
        kDecodeRows ? topk::decode_blocks(p, row) : topk::DecodeBlocks{};
    const ChunkKeys<kBf16, kDecodeRows, kCached> keys{p, span, blocks, row_data, span.first + first,
                                                      count, cache};
    const Threshold t = find_threshold(cluster, shared, keys, static_cast<unsigned>(p.topk));
    write_selection(cluster, shared, keys, t, p.indices + row * p.topk,
                    p.values != nullptr ? p.values + row * p.topk : nullptr, p.topk);
    cluster.sync();  // no CTA reads another's shared state of this row any more
  }
}

}  // namespace mqa_logits::kernels
