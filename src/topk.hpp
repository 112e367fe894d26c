// The validated selection problem that every top-k entry point reduces to, and the rules of
// docs/contract.md, "Top-k", as host and device code share them: which columns a row selects
// among, the order of logits, and the index a selected column gets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "mqa_logits/capabilities.hpp"
#include "mqa_logits/tensor.hpp"
#include "schedule.hpp"

namespace mqa_logits {

// Rows of logits and how their windows are given.
struct TopkProblem {
  Device device{};
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const void* logits = nullptr;  // [rows, cols], rows logits_row_stride elements apart
  DType logits_dtype = DType::kFloat32;
  std::int64_t logits_row_stride = 0;

  // Windows of key spans (prefill, topk_per_row): row i's keys are max(starts[i], 0) <= j <
  // min(ends[i], key_limit); starts may be null (0). Compressed: column c is key starts[i] + c.
  const std::int32_t* starts = nullptr;
  const std::int32_t* ends = nullptr;
  std::int64_t key_limit = std::numeric_limits<std::int64_t>::max();
  bool compressed = false;
  bool absolute_indices = false;

  // Windows of decode rows (when context_lens is set): row r = b * N + t has the keys [0, L) of
  // schedule::paged_row_length, clamped to key_limit; a key in a block whose id is outside
  // [0, num_blocks) is never selected. cache_slots: the index of position p is its slot.
  const std::int32_t* context_lens = nullptr;
  bool lens_2d = false;
  int next_n = 1;
  const std::int32_t* block_table = nullptr;  // [rows / next_n, ...]
  std::int64_t block_table_row_stride = 0;
  int block_kv = 64;
  std::int64_t num_blocks = 0;
  bool cache_slots = false;

  std::int64_t topk = 0;
  std::int32_t* indices = nullptr;  // [rows, topk]
  float* values = nullptr;          // [rows, topk] or null
};

// R candidate lists per row (merge_topk): list r of row i is [r, i, 0..K) of values and indices.
struct MergeProblem {
  Device device{};
  std::int64_t lists = 0;       // R
  std::int64_t rows = 0;        // S
  std::int64_t candidates = 0;  // K
  const float* values = nullptr;            // [R, S, K]
  const std::int32_t* indices = nullptr;    // [R, S, K]
  std::int64_t topk = 0;
  std::int32_t* out_indices = nullptr;  // [S, topk]
  float* out_values = nullptr;          // [S, topk] or null
};

namespace topk {

// The columns [first, first + count) row `row` selects among, and what a column's index adds to
// the column (absent slots).
struct RowSpan {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t index_offset = 0;
};

MQA_HOST_DEVICE constexpr std::int64_t clamp_to(std::int64_t v, std::int64_t lo, std::int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

MQA_HOST_DEVICE constexpr RowSpan row_span(const TopkProblem& p, std::int64_t row) {
  if (p.context_lens != nullptr) {
    const std::int64_t len = schedule::paged_row_length(p.context_lens, p.lens_2d, row / p.next_n,
                                                        p.next_n, static_cast<int>(row % p.next_n));
    return {0, clamp_to(len, 0, p.key_limit < p.cols ? p.key_limit : p.cols), 0};
  }
  const std::int64_t start = p.starts != nullptr ? p.starts[row] : 0;
  const std::int64_t key_begin = start > 0 ? start : 0;
  const std::int64_t key_end = p.ends[row] < p.key_limit ? p.ends[row] : p.key_limit;
  const std::int64_t shift = p.compressed ? start : 0;  // column = key - shift
  const std::int64_t first = clamp_to(key_begin - shift, 0, p.cols);
  const std::int64_t last = clamp_to(key_end - shift, first, p.cols);
  // index = key - start (relative) or key (absolute) = column + shift - (relative ? start : 0)
  return {first, last - first, shift - (p.absolute_indices ? 0 : start)};
}

// The order of logits as unsigned integers: larger key, larger logit; -0 as +0. NaN and -inf map
// to 0, which marks a logit that is never selected (every other value maps above 0).
MQA_HOST_DEVICE constexpr std::uint32_t order_key(std::uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u || bits == 0xff800000u) return 0;
  if (bits == 0x80000000u) bits = 0;
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// The fp32 bits of a stored logit (bf16 widens exactly).
MQA_HOST_DEVICE constexpr std::uint32_t logit_bits(const void* row, std::int64_t col, bool bf16) {
  return bf16 ? static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(row)[col]) << 16
              : static_cast<const std::uint32_t*>(row)[col];
}

// Decode rows: a row's block-table row and how its key positions map to blocks and slots.
struct DecodeBlocks {
  const std::int32_t* table_row = nullptr;
  std::int64_t num_blocks = 0;
  int block_shift = 0;  // log2(block_kv)

  // The block id of position `pos`, -1 outside the cache.
  MQA_HOST_DEVICE constexpr std::int64_t block_of(std::int64_t pos) const {
    const std::int64_t id = table_row[pos >> block_shift];
    return id >= 0 && id < num_blocks ? id : -1;
  }
  // The cache slot of position `pos`.
  MQA_HOST_DEVICE constexpr std::int64_t slot_of(std::int64_t pos) const {
    return (block_of(pos) << block_shift) + (pos & ((std::int64_t{1} << block_shift) - 1));
  }
};

template <std::size_t N>
constexpr bool powers_of_two(const int (&values)[N]) {
  for (const int v : values) {
    if (v <= 0 || (v & (v - 1)) != 0) return false;
  }
  return true;
}
static_assert(powers_of_two(capabilities::kBlockKvs),
              "DecodeBlocks maps positions to blocks by shifts: block_kv must be a power of two");

// Row `row`'s blocks (decode rows; empty for rows of windows).
MQA_HOST_DEVICE constexpr DecodeBlocks decode_blocks(const TopkProblem& p, std::int64_t row) {
  if (p.context_lens == nullptr) return {};
  int shift = 0;
  while ((1 << shift) < p.block_kv) ++shift;
  return {p.block_table + row / p.next_n * p.block_table_row_stride, p.num_blocks, shift};
}

// The order key of column `col` of a row whose data starts at `row_data` and whose blocks (decode
// rows) are `blocks`.
MQA_HOST_DEVICE constexpr std::uint32_t column_key(const TopkProblem& p, const DecodeBlocks& blocks,
                                                   const void* row_data, std::int64_t col) {
  if (p.context_lens != nullptr && blocks.block_of(col) < 0) return 0;
  return order_key(logit_bits(row_data, col, p.logits_dtype == DType::kBFloat16));
}

// The index a selected column is given.
MQA_HOST_DEVICE constexpr std::int32_t column_index(const TopkProblem& p, const RowSpan& span,
                                                    const DecodeBlocks& blocks, std::int64_t col) {
  return static_cast<std::int32_t>(p.cache_slots ? blocks.slot_of(col) : col + span.index_offset);
}

}  // namespace topk
}  // namespace mqa_logits
