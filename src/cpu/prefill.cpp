// CPU prefill: work items are (block of kRowBlock query rows, chunk of kChunkKeys keys of the
// block's key range), so that both short and long sequences spread over the threads. Every
// output element is computed by one item the same way, so the thread count never matters.
#include <algorithm>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernel.hpp"
#include "cpu/parallel.hpp"
#include "schedule.hpp"

namespace mqa_logits::cpu {
namespace {

constexpr std::int64_t kRowBlock = 4;
constexpr std::int64_t kChunkKeys = 256;  // a multiple of kKeyTile

// Keys [lo, hi) of a row that land in the output, at column key - col_offset.
struct RowKeys {
  std::int64_t lo;
  std::int64_t hi;
  std::int64_t col_offset;
  bool empty() const { return hi <= lo; }
};

RowKeys row_keys(const PrefillProblem& p, std::int64_t row) {
  const auto window = schedule::prefill_row_window(p.k_start[row], p.k_end[row], p.seq_len_kv);
  const std::int64_t offset = p.compressed ? p.k_start[row] : 0;
  // Compressed windows longer than the output lose their last keys (never written out of bounds).
  return {window.lo, std::min(window.hi, offset + p.out_cols), offset};
}

// Blocks of rows and the union of their key ranges, with each block's first work item.
struct BlockPlan {
  std::vector<std::int64_t> lo;
  std::vector<std::int64_t> first_item;  // one past the last block: the item count
};

BlockPlan plan_blocks(const PrefillProblem& p) {
  const std::int64_t blocks = schedule::ceil_div(p.seq_len, kRowBlock);
  BlockPlan plan;
  plan.first_item.push_back(0);
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::int64_t lo = p.seq_len_kv;
    std::int64_t hi = 0;
    for (std::int64_t i = b * kRowBlock; i < std::min(p.seq_len, (b + 1) * kRowBlock); ++i) {
      const RowKeys keys = row_keys(p, i);
      if (keys.empty()) continue;
      lo = std::min(lo, keys.lo);
      hi = std::max(hi, keys.hi);
    }
    plan.lo.push_back(lo);
    plan.first_item.push_back(plan.first_item.back() +
                              (hi > lo ? schedule::ceil_div(hi - lo, kChunkKeys) : 0));
  }
  return plan;
}

QueryLayout query_layout(const PrefillProblem& p) {
  return {p.format, p.num_heads, p.head_dim,     p.q,
          p.q_scales, p.weights, p.weights_dtype, p.weights_row_stride};
}

void compute_item(const PrefillProblem& p, const BlockPlan& plan, std::int64_t item,
                  const LogitsOut& out) {
  const auto block = static_cast<std::int64_t>(
      std::upper_bound(plan.first_item.begin(), plan.first_item.end(), item) -
      plan.first_item.begin() - 1);
  const std::int64_t row_begin = block * kRowBlock;
  const std::int64_t row_end = std::min(p.seq_len, row_begin + kRowBlock);
  const std::int64_t key_begin = plan.lo[block] + (item - plan.first_item[block]) * kChunkKeys;

  std::vector<QueryRow> queries;
  std::vector<RowKeys> keys;
  std::int64_t key_end = key_begin;
  for (std::int64_t i = row_begin; i < row_end; ++i) {
    queries.emplace_back(query_layout(p)).load(i);
    keys.push_back(row_keys(p, i));
    if (!keys.back().empty()) key_end = std::max(key_end, keys.back().hi);
  }
  key_end = std::min(key_end, key_begin + kChunkKeys);

  const std::int64_t token_bytes = p.format == Format::kMXFP4 ? p.head_dim / 2 : p.head_dim;
  const auto* kv = static_cast<const std::uint8_t*>(p.kv);
  const auto* kv_scales = static_cast<const std::uint8_t*>(p.kv_scales);
  KeyTile tile(p.format, p.head_dim);
  double logits[kKeyTile];
  for (std::int64_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
    const std::int64_t k1 = std::min(k0 + kKeyTile, key_end);
    for (std::int64_t j = k0; j < k1; ++j) {
      tile.load(static_cast<int>(j - k0), kv + j * token_bytes, kv_scales + j * 4);
    }
    for (std::size_t r = 0; r < queries.size(); ++r) {
      const std::int64_t lo = std::max(k0, keys[r].lo);
      const std::int64_t hi = std::min(k1, keys[r].hi);
      if (hi <= lo) continue;
      tile.logits(queries[r], logits);
      for (std::int64_t j = lo; j < hi; ++j) {
        out.store(row_begin + static_cast<std::int64_t>(r), j - keys[r].col_offset, logits[j - k0]);
      }
    }
  }
}

}  // namespace

void run_prefill(const PrefillProblem& p, int num_threads) {
  const LogitsOut out{p.logits, p.logits_dtype, p.logits_row_stride, p.out_cols};
  if (p.clean_logits) {
    parallel_for(p.seq_len, num_threads, [&](std::int64_t i) {
      const RowKeys keys = row_keys(p, i);
      out.fill_outside(i, keys.lo - keys.col_offset, keys.hi - keys.col_offset);
    });
  }
  const BlockPlan plan = plan_blocks(p);
  parallel_for(plan.first_item.back(), num_threads,
               [&](std::int64_t item) { compute_item(p, plan, item, out); });
}

}  // namespace mqa_logits::cpu
