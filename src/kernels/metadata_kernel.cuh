// Schedule metadata on the device (schedule.hpp: the encoding; src/metadata.cpp: the same rules
// on the host, which this kernel matches bit for bit). One kernel serves both operations through
// a "units" policy: a unit is a prefill query block or a decode sequence (varlen: row), and each
// unit is one group of paged_group_items / prefill_block_items work items.
//
// One CTA of kMetadataThreads threads (schedule_rows; the prefill kernel runs it too, for its own
// two rows, when it is given no metadata): thread i counts the items of a contiguous run of units
// (decode: their parts under each split choice, of which the totals pick one:
// schedule::paged_split_choice) and a block-wide exclusive scan gives every run its first item
// (decode: one scan, and one more where the parts of 4 tiles fit the workers). Then thread i
// writes the rows of workers i, i + kMetadataThreads, ...: it finds the run holding the worker's
// first item by binary search over the runs' first items (every unit has at least one item, so
// non-empty runs start at increasing items) and walks that run's units to the one holding it
// (their counts kept in shared memory from the first pass where a run is short). Workers whose
// segments start at the end of the list (more workers than items) and the final row get (number
// of units, 0). The cost is one pass over the inputs, a scan or two and O(workers / threads) work
// per thread, whatever the batch: a few microseconds, dominated by launch latency.
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

// Prefill: unit u is the block at position u of the schedule's order (prefill_block_at), query
// rows [b * BQ, min((b + 1) * BQ, S)) of block b; its key range spans its non-empty rows' windows.
struct PrefillUnits {
  const std::int32_t* k_start;
  const std::int32_t* k_end;
  std::int64_t seq_len;
  std::int64_t seq_len_kv;
  int num_heads;
  int block_q;  // schedule::prefill_block_q(num_heads)

  __device__ std::int64_t count() const { return schedule::ceil_div(seq_len, block_q); }
  __device__ std::int64_t items(std::int64_t unit) const {
    const schedule::Window block = window(schedule::prefill_block_at(unit, count()) * block_q);
    return schedule::prefill_block_items(num_heads, block.lo, block.hi);
  }
  // The split is of the items themselves (one choice).
  static constexpr int kSplitChoices = 1;
  __device__ static std::int64_t parts(std::int64_t items, int) { return items; }
  __device__ static int part_shift(int) { return 0; }

  // schedule::prefill_block_window of the block from row `first`. A whole block's bounds are
  // read 16 bytes (4 rows) a load where both arrays are 16-byte aligned (block_q is a multiple
  // of 4): every CTA of the prefill kernel without metadata reads every row's bounds, and
  // 4-byte loads took a 32-byte sector each (docs/design.md, "Choices made by measurement").
  __device__ schedule::Window window(std::int64_t first) const {
    const auto address = reinterpret_cast<std::uintptr_t>(k_start) |
                         reinterpret_cast<std::uintptr_t>(k_end);
    if (address % 16 != 0 || first + block_q > seq_len) {
      return schedule::prefill_block_window(k_start, k_end, seq_len, seq_len_kv, first, block_q);
    }
    const auto* starts = reinterpret_cast<const int4*>(k_start + first);
    const auto* ends = reinterpret_cast<const int4*>(k_end + first);
    // In 32 bits: the metadata kernel 11-16% shorter from S = 8192 on at H >= 16.
    schedule::BlockWindow<std::int32_t> block(seq_len_kv);
    for (int i = 0; i < block_q / 4; i += 2) {  // two loads of each array in flight
      int4 start[2], end[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (4 * (i + j) < block_q) {
          start[j] = starts[i + j];
          end[j] = ends[i + j];
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (4 * (i + j) >= block_q) continue;
        block.widen(start[j].x, end[j].x);
        block.widen(start[j].y, end[j].y);
        block.widen(start[j].z, end[j].z);
        block.widen(start[j].w, end[j].w);
      }
    }
    return block.window();
  }
};

inline constexpr int kMaxLensCols = 8;  // next_n <= 8 (validate)

// The longest of the `cols` (1 to kMaxLensCols) lengths at `row`, read kWidth lengths a load:
// every load is issued before the first is used (one round trip to memory whatever next_n), and
// with kWidth = 4 a warp's lanes touch each 32-byte sector of their rows once, not next_n times
// (docs/design.md, "Choices made by measurement"). `row` is
// kWidth * 4-byte aligned and cols a multiple of kWidth. Equals schedule::paged_unit_length of
// 2-D lengths, negative lengths counting as 0.
template <int kWidth>
__device__ std::int64_t longest_length(const std::int32_t* row, int cols) {
  struct alignas(kWidth * sizeof(std::int32_t)) Load {
    std::int32_t lens[kWidth];
  };
  const auto* loads = reinterpret_cast<const Load*>(row);
  Load values[kMaxLensCols / kWidth];
#pragma unroll
  for (int i = 0; i < kMaxLensCols / kWidth; ++i) {
    if (i * kWidth < cols) values[i] = loads[i];
  }
  std::int32_t longest = 0;
#pragma unroll
  for (int i = 0; i < kMaxLensCols / kWidth; ++i) {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      if (i * kWidth < cols && values[i].lens[j] > longest) longest = values[i].lens[j];
    }
  }
  return longest;
}

// Decode: unit b is sequence b (varlen: row b), split by its longest row.
struct PagedUnits {
  const std::int32_t* context_lens;
  std::int64_t batch;
  std::int64_t lens_cols;
  bool lens_2d;

  __device__ std::int64_t count() const { return batch; }
  __device__ std::int64_t items(std::int64_t unit) const {
    return schedule::paged_group_items(length(unit));
  }
  // The split is of parts of 4, 2 or 1 tiles, chosen from the totals of each.
  static constexpr int kSplitChoices = schedule::kPagedSplitChoices;
  __device__ static std::int64_t parts(std::int64_t tiles, int choice) {
    return schedule::paged_split_parts(tiles, choice);
  }
  __device__ static bool counts_finer(std::int64_t coarse, int workers) {
    return schedule::paged_split_counts_finer(coarse, workers);
  }
  __device__ static std::int64_t pack(const std::int64_t (&parts)[kSplitChoices]) {
    return schedule::paged_split_pack(parts);
  }
  __device__ static void unpack(std::int64_t packed, std::int64_t (&parts)[kSplitChoices]) {
    schedule::paged_split_unpack(packed, parts);
  }
  __device__ static int choose(const std::int64_t (&parts)[kSplitChoices], int workers) {
    return schedule::paged_split_choice(parts, workers);
  }
  __device__ static int part_shift(int choice) { return schedule::paged_split_shift(choice); }
  // The widest loads the lengths' placement allows (longest_length).
  __device__ std::int64_t length(std::int64_t unit) const {
    if (!lens_2d) return schedule::paged_unit_length(context_lens, false, 1, unit);
    const int cols = static_cast<int>(lens_cols);
    const std::int32_t* row = context_lens + unit * lens_cols;
    const auto address = reinterpret_cast<std::uintptr_t>(context_lens);
    if (cols % 4 == 0 && address % 16 == 0) return longest_length<4>(row, cols);
    if (cols % 2 == 0 && address % 8 == 0) return longest_length<2>(row, cols);
    return longest_length<1>(row, cols);
  }
};

// Items of the first kCachedRunUnits units of each thread's run, kept from the count for the
// search: with up to that many units a thread (kThreads * kCachedRunUnits units in all) the
// search reads no global memory, which saves one dependent round trip to L2 per call.
inline constexpr int kCachedRunUnits = 4;

// Shared memory of schedule_rows for a CTA of kThreads threads.
template <int kThreads>
struct ScheduleScratch {
  typename cub::BlockScan<std::int64_t, kThreads>::TempStorage scan;
  std::int64_t run_first_item[kThreads];
  // A unit's items fit 32 bits: at most 2^31 keys (int32 windows and lengths) per 64 or more.
  std::int32_t run_unit_items[kThreads][kCachedRunUnits];
};

// Rows [first_row, last_row] of the metadata for `workers` workers (schedule.hpp), row k at
// out[2 * (k - first_row)]. Called by all kThreads threads of the CTA (it synchronizes them).
template <int kThreads, typename Units>
__device__ void schedule_rows(const Units& units, int workers, int first_row, int last_row,
                              ScheduleScratch<kThreads>& scratch, std::int32_t* out) {
  constexpr int kChoices = Units::kSplitChoices;
  const std::int64_t count = units.count();
  const std::int64_t per_thread = schedule::ceil_div(count, kThreads);
  const std::int64_t begin = threadIdx.x * per_thread < count ? threadIdx.x * per_thread : count;
  const std::int64_t end = begin + per_thread < count ? begin + per_thread : count;

  std::int64_t mine[kChoices] = {};  // the run's parts under each split choice
  for (std::int64_t unit = begin; unit < end; ++unit) {
    const std::int64_t items = units.items(unit);
    if (unit - begin < kCachedRunUnits) {
      scratch.run_unit_items[threadIdx.x][unit - begin] = static_cast<std::int32_t>(items);
    }
#pragma unroll
    for (int c = 0; c < kChoices; ++c) mine[c] += Units::parts(items, c);
  }
  // The split's parts: each run's first and their total, under the choice the totals make. The
  // coarsest parts are always scanned (the fingerprint digests them); the finer ones only where
  // Units counts them (a branch every thread takes alike: a small call pays one more scan), and
  // then all in one value. Arrays indexed by constants only, so that they stay in registers.
  using Scan = cub::BlockScan<std::int64_t, kThreads>;
  std::int64_t first_item = 0, total = 0;
  Scan(scratch.scan).ExclusiveSum(mine[0], first_item, total);
  const std::int64_t fingerprint_items = total;
  int choice = 0;
  if constexpr (kChoices > 1) {
    if (Units::counts_finer(total, workers)) {
      __syncthreads();  // the scan's storage, reused
      std::int64_t first_finer = 0, total_finer = 0;
      Scan(scratch.scan).ExclusiveSum(Units::pack(mine), first_finer, total_finer);
      std::int64_t firsts[kChoices] = {first_item}, totals[kChoices] = {total};
      Units::unpack(first_finer, firsts);
      Units::unpack(total_finer, totals);
      choice = Units::choose(totals, workers);
#pragma unroll
      for (int c = 1; c < kChoices; ++c) {
        if (c == choice) {
          first_item = firsts[c];
          total = totals[c];
        }
      }
    }
  }

  scratch.run_first_item[threadIdx.x] = first_item;
  __syncthreads();

  const schedule::SegmentSplit split(total, workers);
  for (int k = first_row + static_cast<int>(threadIdx.x); k <= last_row; k += kThreads) {
    const std::int64_t pos = split.begin(k);
    std::int64_t unit = count;
    std::int64_t offset = 0;
    if (pos < total) {
      int lo = 0;  // the last run whose first item is <= pos
      int hi = kThreads - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (scratch.run_first_item[mid] <= pos) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      // The walk stays inside run lo, which holds pos.
      const std::int64_t run_begin = lo * per_thread;
      const auto items_of = [&](std::int64_t u) -> std::int64_t {
        return Units::parts(u - run_begin < kCachedRunUnits
                               ? scratch.run_unit_items[lo][u - run_begin]
                               : units.items(u),
                           choice);
      };
      unit = run_begin;
      std::int64_t unit_first = scratch.run_first_item[lo];
      for (std::int64_t items = items_of(unit); unit_first + items <= pos; items = items_of(unit)) {
        unit_first += items;
        ++unit;
      }
      offset = (pos - unit_first) << Units::part_shift(choice);  // the part's first item
    }
    if (k == workers) offset = schedule::metadata_fingerprint(count, fingerprint_items);
    out[(k - first_row) * schedule::kMetaCols] = static_cast<std::int32_t>(unit);
    out[(k - first_row) * schedule::kMetaCols + 1] = static_cast<std::int32_t>(offset);
  }
}

template <typename Units>
__global__ void __launch_bounds__(kMetadataThreads)
    schedule_metadata_kernel(const Units units, int workers, std::int32_t* out) {
  __shared__ ScheduleScratch<kMetadataThreads> scratch;
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  schedule_rows<kMetadataThreads>(units, workers, 0, workers, scratch, out);
}

}  // namespace mqa_logits::metadata_kernels
