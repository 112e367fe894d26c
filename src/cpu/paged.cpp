// CPU decode: the rows of one sequence (its next_n tokens, or a run of varlen tokens with one
// index) form groups of at most kMaxGroupRows rows that decode each key once, through the
// block-table row of the group's first row. Work items are (group, chunk of kChunkKeys
// positions). Every output element is computed by one item the same way, so the thread count
// never matters.
#include <algorithm>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernel.hpp"
#include "cpu/parallel.hpp"
#include "schedule.hpp"

namespace mqa_logits::cpu {
namespace {

constexpr std::int64_t kMaxGroupRows = 8;
constexpr std::int64_t kChunkKeys = 256;  // a multiple of every block_kv (32, 64)

std::int64_t table_row(const PagedProblem& p, std::int64_t row) {
  return p.indices != nullptr ? row : row / p.next_n;
}

// Whether rows a and b are of one sequence.
bool same_sequence(const PagedProblem& p, std::int64_t a, std::int64_t b) {
  return p.indices != nullptr ? p.indices[a] == p.indices[b] : a / p.next_n == b / p.next_n;
}

// Row r's keys are positions [0, length): the clamping rules of problem.hpp.
std::int64_t row_length(const PagedProblem& p, std::int64_t row) {
  const std::int64_t len =
      p.indices != nullptr
          ? schedule::paged_row_length(p.context_lens, p.context_lens_2d, row, 1, 0)
          : schedule::paged_row_length(p.context_lens, p.context_lens_2d, row / p.next_n,
                                       static_cast<int>(p.next_n),
                                       static_cast<int>(row % p.next_n));
  return std::min(len, schedule::paged_key_cap(p.max_context_len, p.max_blocks, p.block_kv));
}

// Id of the block holding position `pos` of block-table row `table`, or -1 if outside the cache.
std::int64_t block_of(const PagedProblem& p, std::int64_t table, std::int64_t pos) {
  const std::int64_t id = p.block_table[table * p.block_table_row_stride + pos / p.block_kv];
  return id >= 0 && id < p.num_blocks ? id : -1;
}

struct Group {
  std::int64_t row_begin;
  std::int64_t row_end;
  std::int64_t length;      // the longest row
  std::int64_t first_item;  // its first work item
};

std::vector<Group> plan_groups(const PagedProblem& p, const std::vector<std::int64_t>& lengths) {
  std::vector<Group> groups;
  std::int64_t items = 0;
  const std::int64_t rows = p.batch * p.next_n;
  for (std::int64_t begin = 0; begin < rows;) {
    std::int64_t end = begin + 1;
    while (end < rows && end - begin < kMaxGroupRows && same_sequence(p, begin, end)) {
      ++end;
    }
    const std::int64_t length =
        *std::max_element(lengths.begin() + begin, lengths.begin() + end);
    groups.push_back({begin, end, length, items});
    items += schedule::ceil_div(length, kChunkKeys);
    begin = end;
  }
  groups.push_back({rows, rows, 0, items});  // sentinel: the item count
  return groups;
}

QueryLayout query_layout(const PagedProblem& p) {
  return {p.format, p.num_heads, p.head_dim, p.q, p.q_scales, p.weights, p.weights_dtype,
          p.num_heads};
}

void compute_item(const PagedProblem& p, const std::vector<Group>& groups,
                  const std::vector<std::int64_t>& lengths, std::int64_t item,
                  const LogitsOut& out) {
  const auto g = std::upper_bound(groups.begin(), groups.end(), item,
                                  [](std::int64_t i, const Group& group) {
                                    return i < group.first_item;
                                  }) - 1;
  const std::int64_t pos_begin = (item - g->first_item) * kChunkKeys;
  const std::int64_t pos_end = std::min(g->length, pos_begin + kChunkKeys);
  const std::int64_t table = table_row(p, g->row_begin);

  std::vector<QueryRow> queries;
  for (std::int64_t r = g->row_begin; r < g->row_end; ++r) queries.emplace_back(query_layout(p)).load(r);

  KeyTile tile(p.format, p.head_dim);
  double logits[kKeyTile];
  for (std::int64_t p0 = pos_begin; p0 < pos_end; p0 += kKeyTile) {
    const std::int64_t block = block_of(p, table, p0);  // tiles never straddle blocks
    const std::int64_t p1 = std::min(p0 + kKeyTile, pos_end);
    if (block < 0) {  // keys outside the window: -inf with clean_logits, for every row it reads
      if (!p.clean_logits) continue;
      for (std::int64_t r = g->row_begin; r < g->row_end; ++r) {
        out.fill(r, p0, std::max(p0, std::min(p1, lengths[r])));
      }
      continue;
    }
    const std::uint8_t* base = p.kv_cache + block * p.block_stride_bytes;
    for (std::int64_t pos = p0; pos < p1; ++pos) {
      const std::int64_t slot = pos % p.block_kv;
      tile.load(static_cast<int>(pos - p0), base + slot * p.token_bytes,
                base + p.block_kv * p.token_bytes + slot * 4);
    }
    for (std::int64_t r = g->row_begin; r < g->row_end; ++r) {
      const std::int64_t hi = std::min(p1, lengths[r]);
      if (hi <= p0) continue;
      tile.logits(queries[r - g->row_begin], logits);
      for (std::int64_t pos = p0; pos < hi; ++pos) out.store(r, pos, logits[pos - p0]);
    }
  }
}

}  // namespace

void run_paged(const PagedProblem& p, int num_threads) {
  const LogitsOut out{p.logits, p.logits_dtype, p.logits_row_stride, p.max_context_len};
  const std::int64_t rows = p.batch * p.next_n;
  std::vector<std::int64_t> lengths(rows);
  for (std::int64_t r = 0; r < rows; ++r) lengths[r] = row_length(p, r);
  if (p.clean_logits) {  // past each row's keys (compute_item cleans the keys of invalid blocks)
    parallel_for(rows, num_threads,
                 [&](std::int64_t r) { out.fill(r, lengths[r], p.max_context_len); });
  }
  const std::vector<Group> groups = plan_groups(p, lengths);
  parallel_for(groups.back().first_item, num_threads, [&](std::int64_t item) {
    compute_item(p, groups, lengths, item, out);
  });
}

}  // namespace mqa_logits::cpu
