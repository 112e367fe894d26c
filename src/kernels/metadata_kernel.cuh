// Schedule metadata on the device (schedule.hpp: the encoding; src/metadata.cpp: the same rules
// on the host, which this kernel matches bit for bit). One kernel serves both operations through
// a "units" policy: a unit is a prefill query block or a decode sequence (varlen: row), and each
// unit is one group of paged_group_items / prefill_block_items work items.
//
// One CTA of kMetadataThreads threads: thread i counts the items of a contiguous run of units, a
// block-wide exclusive scan gives every run its first item, and each thread writes the rows of
// the workers whose segments start inside its run (segment starts come from segment_begin and are
// found by binary search over the split). Workers whose segments start at the end of the list (more
// workers than items) and the final row get (number of units, 0). Every output row is written by
// exactly one thread; the cost is one pass over the inputs, a scan and O(workers) writes: a few
// microseconds, dominated by launch latency.
//
// The kernel is launched with programmatic dependent launch: it waits for the previous kernel
// (which may have produced its inputs) and immediately lets the next one (the logits kernel,
// which waits for this one's completion before reading the metadata) start its prologue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "schedule.hpp"

namespace mqa_logits::metadata_kernels {

inline constexpr int kMetadataThreads = 512;

// Prefill: unit b is query rows [b * BQ, min((b + 1) * BQ, S)); its key range spans its
// non-empty rows' windows.
struct PrefillUnits {
  const std::int32_t* k_start;
  const std::int32_t* k_end;
  std::int64_t seq_len;
  std::int64_t seq_len_kv;
  int block_q;

  __device__ std::int64_t count() const { return schedule::ceil_div(seq_len, block_q); }
  __device__ std::int64_t items(std::int64_t unit) const {
    std::int64_t lo = seq_len_kv;
    std::int64_t hi = 0;
    const std::int64_t first = unit * block_q;
    const std::int64_t last = first + block_q < seq_len ? first + block_q : seq_len;
    for (std::int64_t row = first; row < last; ++row) {
      const schedule::Window w = schedule::prefill_row_window(k_start[row], k_end[row], seq_len_kv);
      if (w.lo >= w.hi) continue;
      lo = w.lo < lo ? w.lo : lo;
      hi = w.hi > hi ? w.hi : hi;
    }
    return schedule::prefill_block_items(lo, hi);
  }
};

// Decode: unit b is sequence b (varlen: row b), split by its longest row.
struct PagedUnits {
  const std::int32_t* context_lens;
  std::int64_t batch;
  std::int64_t lens_cols;
  bool lens_2d;

  __device__ std::int64_t count() const { return batch; }
  __device__ std::int64_t items(std::int64_t unit) const {
    return schedule::paged_group_items(
        schedule::paged_unit_length(context_lens, lens_2d, lens_cols, unit));
  }
};

// The first worker k in [0, workers] whose segment starts at or after item `pos`.
__device__ inline int first_worker_at(const schedule::SegmentSplit& split, int workers,
                                      std::int64_t pos) {
  int lo = 0;
  int hi = workers;  // split.begin(workers) is the item count, >= pos
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (split.begin(mid) >= pos) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

template <typename Units>
__global__ void __launch_bounds__(kMetadataThreads)
    schedule_metadata_kernel(const Units units, int workers, std::int32_t* out) {
  using Scan = cub::BlockScan<std::int64_t, kMetadataThreads>;
  __shared__ typename Scan::TempStorage scan_storage;

  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();

  const std::int64_t count = units.count();
  const std::int64_t per_thread = schedule::ceil_div(count, kMetadataThreads);
  const std::int64_t begin = threadIdx.x * per_thread < count ? threadIdx.x * per_thread : count;
  const std::int64_t end = begin + per_thread < count ? begin + per_thread : count;

  std::int64_t my_items = 0;
  for (std::int64_t unit = begin; unit < end; ++unit) my_items += units.items(unit);
  std::int64_t first_item = 0;
  std::int64_t total = 0;
  Scan(scan_storage).ExclusiveSum(my_items, first_item, total);

  const schedule::SegmentSplit split(total, workers);
  for (std::int64_t unit = begin; unit < end; ++unit) {
    const std::int64_t items = units.items(unit);
    for (int k = first_worker_at(split, workers, first_item);
         k < workers && split.begin(k) < first_item + items; ++k) {
      out[k * schedule::kMetaCols] = static_cast<std::int32_t>(unit);
      out[k * schedule::kMetaCols + 1] = static_cast<std::int32_t>(split.begin(k) - first_item);
    }
    first_item += items;
  }
  for (int k = first_worker_at(split, workers, total) + static_cast<int>(threadIdx.x); k <= workers;
       k += kMetadataThreads) {
    out[k * schedule::kMetaCols] = static_cast<std::int32_t>(count);
    out[k * schedule::kMetaCols + 1] = 0;
  }
}

}  // namespace mqa_logits::metadata_kernels
