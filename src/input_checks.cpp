#include "input_checks.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "metadata.hpp"
#include "mqa_logits/formats.hpp"
#include "schedule.hpp"
#include "validate_checks.hpp"

namespace mqa_logits::input_checks {
namespace {

using checks::refuse;

std::string at(std::int64_t index) { return " at [" + std::to_string(index) + "]"; }
std::string at(std::int64_t row, std::int64_t col) {
  return " at [" + std::to_string(row) + ", " + std::to_string(col) + "]";
}

// Metadata given for a call must be the metadata of that call, row for row: `expected` is what
// the metadata function gives for the call's inputs and worker count. The fingerprint (row W,
// column 1) is compared first, so that metadata of other inputs is named as such even where an
// earlier row differs too (docs/contract.md).
void expect_same_metadata(const std::int32_t* given, const std::vector<std::int32_t>& expected,
                          const std::string& function, const std::string& inputs) {
  const auto rows = static_cast<std::int64_t>(expected.size()) / schedule::kMetaCols;
  const auto refuse_cell = [&](std::int64_t i, const std::string& what) {
    refuse("schedule_meta", "expected " + function + " of this call's " + inputs + " for " +
                                std::to_string(rows - 1) + " workers (its shape, [" +
                                std::to_string(rows) + ", 2], gives the worker count: a cut-off "
                                "buffer reads as fewer), got " + what +
                                at(i / schedule::kMetaCols, i % schedule::kMetaCols) + " (" +
                                std::to_string(given[i]) + ", expected " +
                                std::to_string(expected[static_cast<std::size_t>(i)]) + ")");
  };
  const std::int64_t fingerprint = rows * schedule::kMetaCols - 1;
  if (given[fingerprint] != expected[static_cast<std::size_t>(fingerprint)]) {
    refuse_cell(fingerprint, "the fingerprint of other inputs");
  }
  for (std::int64_t i = 0; i < fingerprint; ++i) {
    if (given[i] != expected[static_cast<std::size_t>(i)]) {
      refuse_cell(i, "another split, or other inputs of the same counts,");
    }
  }
}

void check_paged_lengths(const PagedProblem& p) {
  const std::int64_t lens_count = p.context_lens_2d ? p.batch * p.next_n : p.batch;
  const std::int64_t capacity = p.max_blocks * p.block_kv;
  for (std::int64_t i = 0; i < lens_count; ++i) {
    const std::int64_t len = p.context_lens[i];
    const std::string where =
        p.context_lens_2d ? at(i / p.next_n, i % p.next_n) : at(i);
    if (len < 0) {
      refuse("context_lens", "expected lengths >= 0, got " + std::to_string(len) + where);
    }
    if (len > p.max_context_len) {
      refuse("context_lens", "expected lengths <= max_context_len (" +
                                 std::to_string(p.max_context_len) + "), got " +
                                 std::to_string(len) + where);
    }
    if (len > capacity) {
      refuse("context_lens", "expected lengths <= the keys the block table addresses "
                             "(max_blocks * block_kv = " + std::to_string(capacity) + "), got " +
                                 std::to_string(len) + where);
    }
  }
}

// Varlen rows of one sequence (a run of equal indices) share key loads, through the block-table
// row of an earlier row of the run (problem.hpp): every row of a run must address the blocks of
// the run's first row, over the keys of the run's longest row.
void check_varlen_runs(const PagedProblem& p) {
  for (std::int64_t first = 0, end = 0; first < p.batch; first = end) {
    std::int64_t longest = 0;
    for (end = first; end < p.batch && p.indices[end] == p.indices[first]; ++end) {
      longest = std::max<std::int64_t>(longest, p.context_lens[end]);
    }
    const std::int32_t* first_row = p.block_table + first * p.block_table_row_stride;
    const std::int64_t blocks = schedule::ceil_div(longest, p.block_kv);
    for (std::int64_t row = first + 1; row < end; ++row) {
      const std::int32_t* entries = p.block_table + row * p.block_table_row_stride;
      for (std::int64_t block = 0; block < blocks; ++block) {
        if (entries[block] == first_row[block]) continue;
        refuse("block_table", "expected the rows of one varlen sequence (equal indices, rows " +
                                  std::to_string(first) + " to " + std::to_string(end - 1) +
                                  ") to hold the same block ids, got " +
                                  std::to_string(entries[block]) + at(row, block) + " and " +
                                  std::to_string(first_row[block]) + at(first, block));
      }
    }
  }
}

// MX formats: the used bytes (a block of 32 elements each) of every packed UE8M0 scale word of
// `count` are not 255, which is NaN (docs/contract.md); `what(i)` names word i.
template <typename Where>
void expect_finite_scales(const char* argument, const std::int32_t* words, std::int64_t count,
                          std::int64_t head_dim, Where what) {
  for (std::int64_t i = 0; i < count; ++i) {
    for (int block = 0; block < head_dim / kMxBlock; ++block) {
      if (packed_scale_byte(words[i], block) != 0xff) continue;
      refuse(argument, "expected UE8M0 scales below 255 (255 is NaN), got 255 in block " +
                           std::to_string(block) + " of " + what(i));
    }
  }
}

}  // namespace

PagedScales host_paged_scales(const PagedProblem& p) {
  const std::uint8_t* first = p.kv_cache + p.block_kv * p.token_bytes;
  return {reinterpret_cast<const float*>(first), p.block_stride_bytes / 4};
}

void check_paged(const PagedProblem& p, const PagedScales& scales) {
  check_paged_lengths(p);
  const bool fp8 = p.format == Format::kFP8;
  if (!fp8) {
    expect_finite_scales("q_scales", p.q_scales, p.batch * p.next_n * p.num_heads, p.head_dim,
                         [&](std::int64_t i) {
                           return "the scales at [" + std::to_string(i / (p.next_n * p.num_heads)) +
                                  ", " + std::to_string(i / p.num_heads % p.next_n) + ", " +
                                  std::to_string(i % p.num_heads) + "]";
                         });
  }
  // Per block-table row (a sequence's, or a varlen row's), the blocks of its longest row: its other
  // rows read a prefix of them.
  for (std::int64_t row = 0; row < p.batch; ++row) {
    const std::int64_t len =
        schedule::paged_unit_length(p.context_lens, p.context_lens_2d, p.next_n, row);
    for (std::int64_t block = 0; block < schedule::ceil_div(len, p.block_kv); ++block) {
      const std::int64_t id = p.block_table[row * p.block_table_row_stride + block];
      if (id < 0 || id >= p.num_blocks) {
        refuse("block_table", "expected block ids in [0, " + std::to_string(p.num_blocks) +
                                  ") (the blocks of kv_cache), got " + std::to_string(id) +
                                  at(row, block));
      }
      const std::int64_t tokens = std::min<std::int64_t>(p.block_kv, len - block * p.block_kv);
      const float* block_scales = scales.scales + id * scales.block_stride;
      if (!fp8) {
        expect_finite_scales("kv_cache", reinterpret_cast<const std::int32_t*>(block_scales),
                             tokens, p.head_dim, [&](std::int64_t token) {
                               return "the scales of token " + std::to_string(token) +
                                      " of block " + std::to_string(id);
                             });
        continue;
      }
      for (std::int64_t token = 0; token < tokens; ++token) {
        const float scale = block_scales[token];
        if (!(scale >= 0.f)) {
          refuse("kv_cache", "expected key scales >= 0, got " + std::to_string(scale) +
                                 " for token " + std::to_string(token) + " of block " +
                                 std::to_string(id));
        }
      }
    }
  }
  if (p.indices != nullptr) check_varlen_runs(p);
  std::vector<std::int32_t> expected(
      static_cast<std::size_t>((p.schedule_workers + 1) * schedule::kMetaCols));
  host::paged_metadata(p.context_lens, p.batch, p.context_lens_2d ? p.next_n : 1,
                       p.context_lens_2d, p.indices, p.schedule_workers, expected.data());
  expect_same_metadata(p.schedule_meta, expected, "get_paged_mqa_logits_metadata",
                       "context lengths");
}

void check_prefill(const PrefillProblem& p) {
  if (p.compressed) {
    for (std::int64_t row = 0; row < p.seq_len; ++row) {
      const schedule::Window w = schedule::prefill_row_window(p.k_start[row], p.k_end[row],
                                                              p.seq_len_kv);
      // Key j lands in column j - start: a window needs its last key's column, which a
      // negative start moves past the window's own width.
      const std::int64_t columns = w.lo < w.hi ? w.hi - p.k_start[row] : 0;
      if (columns <= p.out_cols) continue;
      refuse("max_seqlen_k", "expected at least the widest window (" +
                                 std::to_string(columns) + " columns from start " +
                                 std::to_string(p.k_start[row]) + at(row) + "), got " +
                                 std::to_string(p.out_cols));
    }
  }
  if (p.format == Format::kFP8) {
    const auto* scales = static_cast<const float*>(p.kv_scales);
    for (std::int64_t key = 0; key < p.seq_len_kv; ++key) {
      if (!(scales[key] >= 0.f)) {
        refuse("kv_scales",
               "expected key scales >= 0, got " + std::to_string(scales[key]) + at(key));
      }
    }
  } else {
    expect_finite_scales("q_scales", p.q_scales, p.seq_len * p.num_heads, p.head_dim,
                         [&](std::int64_t i) {
                           return "the scales" + at(i / p.num_heads, i % p.num_heads);
                         });
    expect_finite_scales("kv_scales", static_cast<const std::int32_t*>(p.kv_scales),
                         p.seq_len_kv, p.head_dim,
                         [&](std::int64_t key) { return "the scales" + at(key); });
  }
  if (p.schedule_meta == nullptr) return;
  std::vector<std::int32_t> expected(
      static_cast<std::size_t>((p.schedule_workers + 1) * schedule::kMetaCols));
  host::prefill_metadata(p.k_start, p.k_end, p.seq_len, p.seq_len_kv,
                         static_cast<int>(p.num_heads), p.schedule_workers, expected.data());
  expect_same_metadata(p.schedule_meta, expected, "get_mqa_logits_metadata",
                       "windows, T and H");
}

void check_merge(const MergeProblem& p, const std::int32_t* indices) {
  std::vector<std::int32_t> row_keys;
  for (std::int64_t row = 0; row < p.rows; ++row) {
    row_keys.clear();
    for (std::int64_t r = 0; r < p.lists; ++r) {
      const std::int32_t* list = indices + (r * p.rows + row) * p.candidates;
      for (std::int64_t j = 0; j < p.candidates; ++j) {
        const bool after_last = j > 0 && list[j - 1] < 0;
        const bool in_order = list[j] == -1 || (list[j] >= 0 && (j == 0 || list[j] > list[j - 1]));
        if (in_order && (!after_last || list[j] == -1)) {
          if (list[j] >= 0) row_keys.push_back(list[j]);
          continue;
        }
        checks::refuse("candidate_indices",
                       "expected each list in ascending order, -1 after its last key, got " +
                           std::to_string(list[j]) + " at [" + std::to_string(r) + ", " +
                           std::to_string(row) + ", " + std::to_string(j) + "] after " +
                           (j > 0 ? std::to_string(list[j - 1]) : std::string("nothing")));
      }
    }
    std::sort(row_keys.begin(), row_keys.end());
    const auto repeated = std::adjacent_find(row_keys.begin(), row_keys.end());
    if (repeated != row_keys.end()) {
      checks::refuse("candidate_indices", "expected a row's keys distinct across the lists, got " +
                                              std::to_string(*repeated) + " twice in row " +
                                              std::to_string(row));
    }
  }
}

}  // namespace mqa_logits::input_checks
