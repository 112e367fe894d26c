// Schedule metadata on the host: the work items of each group (schedule.hpp says what a group
// and an item are), then one split of the item list shared by both operations.
#include "metadata.hpp"

#include <cstdint>
#include <vector>

#include "schedule.hpp"

namespace mqa_logits::host {
namespace {

// Writes row k = (group, item within the group) of the first item of worker k, and row
// `workers` = (number of groups, fingerprint). A worker whose segment starts at the end of the
// list (more workers than items) gets the end row too. Decode splits parts of `part_items` items
// (schedule::paged_split_shift) and digests `fingerprint_items`, its parts of 4 tiles.
void split_items(const std::vector<std::int64_t>& group_items, int workers, std::int32_t* out,
                 std::int64_t part_items = 1, std::int64_t fingerprint_items = -1) {
  std::int64_t total = 0;
  for (const std::int64_t items : group_items) total += items;

  const auto groups = static_cast<std::int64_t>(group_items.size());
  std::int64_t group = 0;
  std::int64_t group_first_item = 0;  // index, in the whole list, of group's first item
  for (int k = 0; k <= workers; ++k) {
    const std::int64_t begin = schedule::segment_begin(total, workers, k);
    // Segment starts never decrease, so the walk over groups only moves forward.
    while (group < groups && group_first_item + group_items[group] <= begin) {
      group_first_item += group_items[group];
      ++group;
    }
    const bool at_end = group == groups;
    out[k * schedule::kMetaCols] = static_cast<std::int32_t>(group);
    out[k * schedule::kMetaCols + 1] =
        static_cast<std::int32_t>(at_end ? 0 : (begin - group_first_item) * part_items);
  }
  out[workers * schedule::kMetaCols + 1] = schedule::metadata_fingerprint(
      groups, fingerprint_items < 0 ? total : fingerprint_items);
}

}  // namespace

void prefill_metadata(const std::int32_t* k_start, const std::int32_t* k_end,
                      std::int64_t seq_len, std::int64_t seq_len_kv, int num_heads, int workers,
                      std::int32_t* out) {
  const std::int64_t block_q = schedule::prefill_block_q(num_heads);
  const std::int64_t blocks = schedule::ceil_div(seq_len, block_q);
  std::vector<std::int64_t> block_items;  // in the schedule's order of blocks
  block_items.reserve(static_cast<std::size_t>(blocks));
  for (std::int64_t position = 0; position < blocks; ++position) {
    const schedule::Window block = schedule::prefill_block_window(
        k_start, k_end, seq_len, seq_len_kv,
        schedule::prefill_block_at(position, blocks) * block_q, block_q);
    block_items.push_back(schedule::prefill_block_items(num_heads, block.lo, block.hi));
  }
  split_items(block_items, workers, out);
}

void paged_metadata(const std::int32_t* context_lens, std::int64_t batch, std::int64_t lens_cols,
                    bool lens_2d, const std::int32_t* /*indices*/, int workers,
                    std::int32_t* out) {
  // In the varlen form (indices given, next_n 1) every row is its own group, exactly as the
  // sequences of next_n = 1 are: the indices only tell the kernel which rows share keys.
  std::vector<std::int64_t> group_items;  // each group's tiles, then its parts of the split
  group_items.reserve(static_cast<std::size_t>(batch));
  std::int64_t parts[schedule::kPagedSplitChoices] = {};
  for (std::int64_t b = 0; b < batch; ++b) {
    group_items.push_back(schedule::paged_group_items(
        schedule::paged_unit_length(context_lens, lens_2d, lens_cols, b)));
    for (int c = 0; c < schedule::kPagedSplitChoices; ++c) {
      parts[c] += schedule::paged_split_parts(group_items.back(), c);
    }
  }
  const int choice = schedule::paged_split_choice(parts, workers);
  for (std::int64_t& items : group_items) items = schedule::paged_split_parts(items, choice);
  split_items(group_items, workers, out, std::int64_t{1} << schedule::paged_split_shift(choice),
              parts[0]);
}

}  // namespace mqa_logits::host
