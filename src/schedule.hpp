// Work decomposition shared by the schedule metadata (host and device) and the kernels that read
// it. Host and device code include this one file, so the two sides cannot disagree.
//
// Prefill: query rows are cut into blocks of prefill_block_q(H) rows. Block b's key range is
// [lo, hi) = [min start, max end) over its non-empty rows (clamped to [0, T)); its kPrefillTileKV-
// key tiles run from lo rounded down to a multiple of kPrefillTileAlign (none for a block whose
// rows are all empty). Its work items are prefill_block_own_items items that stand for what it
// costs besides its tiles (its query rows' load, their fold, the weights), then one item a tile.
// The item list takes the blocks in the folded order of prefill_block_at, so that CTAs drawing
// short blocks (square causal, packed requests) draw long ones as well.
// Decode: a group is one sequence (its next_n rows), or one row in the varlen form. Group g's
// length is the largest context length of its rows; its work items are its kPagedTileTokens-key
// tiles, at least one per group. The split cuts the item list only between parts of 4 tiles of a
// group, or of 2 or 1 where those fit the workers one each (paged_split_choice, made per call
// from the lengths), so that a small call's keys spread over more SMs and no worker of it holds
// two groups.
//
// Metadata, int32 [W + 1, 2] for W workers: row k = (group, or position of a block in the order
// of prefill_block_at, item within it) of the first item of worker k; row W = (number of groups
// or blocks, fingerprint), the fingerprint a digest of the number of groups and items
// (metadata_fingerprint) that tells metadata computed for other lengths or windows of other
// counts from the call's (inputs of the same counts share it). With I items in all, worker k
// gets items [k * (I / W) + min(k, I % W), ...) — contiguous segments whose sizes differ by at
// most one (decode: I counts parts of the chosen split, the rows give tiles: the part's first
// tile; the fingerprint digests parts of 4 tiles).
// For the call's own metadata the kernels' walk ends at row W's first column, the number of
// groups or blocks, before its second matters.
#pragma once

#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define MQA_HOST_DEVICE __host__ __device__
#else
#define MQA_HOST_DEVICE
#endif

namespace mqa_logits::schedule {

inline constexpr int kPrefillTileKV = 128;
// A prefill tile's first key is a multiple of this: its first logit column is then 16-byte
// aligned (fp32 and bf16; in compressed output, where the column is the key less the row's
// start, only for starts of the same alignment), as the kernel's TMA stores need.
inline constexpr int kPrefillTileAlign = 8;
inline constexpr int kPagedTileTokens = 64;
inline constexpr int kMetaCols = 2;

// A prefill block is what one CTA computes against each key tile: two groups of 128 / H query
// rows (128 (query, head) MMA columns each), one per math warpgroup.
MQA_HOST_DEVICE constexpr int prefill_block_q(int num_heads) { return 256 / num_heads; }

MQA_HOST_DEVICE constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// First key of the first tile of a prefill block whose key range starts at lo >= 0.
MQA_HOST_DEVICE constexpr std::int64_t prefill_tiles_start(std::int64_t lo) {
  return lo / kPrefillTileAlign * kPrefillTileAlign;
}

// The block at position `position` of the order in which the schedule lists a prefill call's
// `blocks` blocks: folded, position 2i being block i and position 2i + 1 block blocks - 1 - i.
// Windows grow along the rows (causal) or repeat (packed requests), so a run of positions pairs
// short blocks with long ones and any contiguous segment holds about as many blocks a tile as
// any other: the split is then even in blocks and tiles at once, whatever a block's own price.
template <typename Int>
MQA_HOST_DEVICE constexpr Int prefill_block_at(Int position, Int blocks) {
  return position % 2 == 0 ? position / 2 : blocks - 1 - position / 2;
}
// The block that follows block b in that order (b itself after the last position).
template <typename Int>
MQA_HOST_DEVICE constexpr Int prefill_block_after(Int b, Int blocks) {
  return b < blocks - blocks / 2 ? blocks - 1 - b : blocks - b;
}

// Key tiles of a prefill block with key range [lo, hi).
MQA_HOST_DEVICE constexpr std::int64_t prefill_block_tiles(std::int64_t lo, std::int64_t hi) {
  return hi > lo ? ceil_div(hi - prefill_tiles_start(lo), kPrefillTileKV) : 0;
}

// A prefill tile is two halves of kPrefillHalfKV keys, the M side of one math warpgroup's MMA.
inline constexpr int kPrefillHalfKV = kPrefillTileKV / 2;

// Tiles [begin, end) of a block.
struct TileRange {
  std::int32_t begin;
  std::int32_t end;
};

// Of a prefill block whose tiles start at key `tiles_start` (prefill_tiles_start), the tiles
// whose half `half` meets the keys [lo, hi) (lo >= tiles_start): the hull of the windows of one
// math warpgroup's query rows, so that its half of every other tile holds only -inf. Empty where
// lo >= hi.
MQA_HOST_DEVICE constexpr TileRange prefill_half_tiles(std::int64_t tiles_start, int half,
                                                       std::int64_t lo, std::int64_t hi) {
  if (lo >= hi) return {0, 0};
  const std::int64_t first = tiles_start + half * kPrefillHalfKV;  // tile 0's half
  // The first tile whose half ends past lo (lo - first >= -kPrefillHalfKV), and past the last
  // one that starts before hi.
  const auto begin = static_cast<std::int32_t>((lo - first + kPrefillHalfKV) / kPrefillTileKV);
  const auto end = static_cast<std::int32_t>(hi > first ? ceil_div(hi - first, kPrefillTileKV) : 0);
  return {begin, end > begin ? end : begin};
}

// Items a prefill block of `tiles` tiles costs besides them (one item each): what its query load,
// state and fold add on the critical path of short blocks. Chosen by measurement over the window
// patterns (docs/design.md, "Choices made by measurement"): at H = 64, 4; below, where no block
// folds, 3 for a block of at most 3 tiles, whose rows' load the tiles before it do not hide, and
// 1 for the others
// (against 4 everywhere, at H = 32, 16 and 8: square causal 8192^2 -3 to -11%, packed
// 8 x 2048 -7 to -10%).
MQA_HOST_DEVICE constexpr int prefill_block_own_items(int num_heads, std::int64_t tiles) {
  if (num_heads == 64) return 4;
  return tiles <= 3 ? 3 : 1;
}
MQA_HOST_DEVICE constexpr std::int64_t prefill_block_items(int num_heads, std::int64_t lo,
                                                           std::int64_t hi) {
  const std::int64_t tiles = prefill_block_tiles(lo, hi);
  return prefill_block_own_items(num_heads, tiles) + tiles;
}

// The items (tiles) of a decode group of length `len`.
MQA_HOST_DEVICE constexpr std::int64_t paged_group_items(std::int64_t len) {
  return len > 0 ? ceil_div(len, kPagedTileTokens) : 1;
}

// The decode split's parts: choice c cuts a group's tiles into parts of 4, 2 or 1 tiles (c = 0,
// 1, 2); a group of `tiles` tiles holds paged_split_parts(tiles, c) parts. Choice 0 is always
// counted (the fingerprint digests its parts); the finer ones only where choice 0's parts fit
// the workers (paged_split_counts_finer), and then both in one scan (paged_split_pack).
inline constexpr int kPagedSplitChoices = 3;
// log2 of a part's tiles: the metadata kernel's walk divides by shifts, not by a 64-bit division
// routine.
MQA_HOST_DEVICE constexpr int paged_split_shift(int choice) { return 2 - choice; }
MQA_HOST_DEVICE constexpr std::int64_t paged_split_parts(std::int64_t tiles, int choice) {
  return (tiles + (1 << paged_split_shift(choice)) - 1) >> paged_split_shift(choice);
}

// Whether a call whose groups hold `coarse` parts of 4 tiles counts the finer parts: where those
// fit the workers, and are few enough that the finer counts, at most 2 and 4 times as many, fit
// 32 bits each (the bound holds for any real worker count).
inline constexpr std::int64_t kPagedFinerCountLimit = std::int64_t{1} << 29;
MQA_HOST_DEVICE constexpr bool paged_split_counts_finer(std::int64_t coarse, int workers) {
  return coarse <= workers && coarse <= kPagedFinerCountLimit;
}

// The finer counts of a run of groups (or of all of them) as one scannable value: parts of 1
// tile in the low 32 bits, parts of 2 in the high; sums of such values stay exact where
// paged_split_counts_finer holds for the total. paged_split_unpack fills parts[1] and parts[2].
MQA_HOST_DEVICE constexpr std::int64_t paged_split_pack(
    const std::int64_t (&parts)[kPagedSplitChoices]) {
  return parts[2] | (parts[1] << 32);
}
MQA_HOST_DEVICE constexpr void paged_split_unpack(std::int64_t packed,
                                                  std::int64_t (&parts)[kPagedSplitChoices]) {
  parts[1] = packed >> 32;
  parts[2] = packed & 0xffffffff;
}

// The choice for a call whose groups hold parts[c] parts in all under choice c, over `workers`:
// where the finer parts are counted, the finest that fit the workers one each (the call's keys
// over more SMs, no worker holding two groups); else parts of 4. parts[1] and parts[2] are read
// only where they are counted. Cutting finer where nothing finer fits (the busiest worker's tiles
// fewer, but workers holding two groups) measured B = 8 slower, and each count's scan costs the
// metadata kernel time (docs/design.md, "Choices made by measurement").
MQA_HOST_DEVICE constexpr int paged_split_choice(const std::int64_t (&parts)[kPagedSplitChoices],
                                                 int workers) {
  if (!paged_split_counts_finer(parts[0], workers)) return 0;
  return parts[2] <= workers ? 2 : parts[1] <= workers ? 1 : 0;
}

// Row W's second column: a digest of the units and items the metadata splits, in [1, 2^31).
MQA_HOST_DEVICE constexpr std::int32_t metadata_fingerprint(std::int64_t units,
                                                            std::int64_t items) {
  std::uint64_t x = static_cast<std::uint64_t>(units) * 0x9E3779B97F4A7C15ull ^
                    static_cast<std::uint64_t>(items);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finalizer
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<std::int32_t>(x >> 33) | 1;
}

// The split of `total` items over `workers` workers, computed once: begin(k) is the first item
// of worker k.
struct SegmentSplit {
  std::int64_t base;
  std::int64_t rem;
  MQA_HOST_DEVICE constexpr SegmentSplit(std::int64_t total, int workers)
      : base(total / workers), rem(total % workers) {}
  MQA_HOST_DEVICE constexpr std::int64_t begin(int k) const { return k * base + (k < rem ? k : rem); }
};

// First item index of worker k among W workers sharing `total` items.
MQA_HOST_DEVICE constexpr std::int64_t segment_begin(std::int64_t total, int workers, int k) {
  return SegmentSplit(total, workers).begin(k);
}

// Key window of one prefill row, clamped to [0, T); empty when lo >= hi.
struct Window {
  std::int64_t lo;
  std::int64_t hi;
};
MQA_HOST_DEVICE constexpr Window prefill_row_window(std::int32_t start, std::int32_t end,
                                                    std::int64_t seq_len_kv) {
  const std::int64_t lo = start > 0 ? start : 0;
  const std::int64_t hi = end < seq_len_kv ? end : seq_len_kv;
  return {lo, hi};
}

// A block's key range as its rows' windows (start, end) widen it, computed in Key: std::int64_t,
// or std::int32_t with T clamped at INT32_MAX, which changes nothing (window ends are int32) and
// takes a third of the instructions a row (the metadata count's 16-byte path: docs/design.md,
// "Choices made by measurement"). A row whose clamped window is empty leaves it unchanged.
template <typename Key>
struct BlockWindow {
  static constexpr Key kNone = std::numeric_limits<Key>::max();
  std::int64_t seq_len_kv;
  Key keys;  // seq_len_kv clamped to Key
  Key lo = kNone;
  Key hi = std::numeric_limits<Key>::min();

  MQA_HOST_DEVICE constexpr explicit BlockWindow(std::int64_t seq_len_kv)
      : seq_len_kv(seq_len_kv), keys(seq_len_kv < kNone ? static_cast<Key>(seq_len_kv) : kNone) {}

  MQA_HOST_DEVICE constexpr void widen(std::int32_t start, std::int32_t end) {
    const Key row_lo = start > 0 ? start : 0;
    const Key row_hi = end < keys ? end : keys;
    const bool has_keys = row_lo < row_hi;  // selects, not a branch: no divergence on device
    const Key widened_lo = has_keys ? row_lo : kNone;
    const Key widened_hi = has_keys ? row_hi : std::numeric_limits<Key>::min();
    lo = widened_lo < lo ? widened_lo : lo;
    hi = widened_hi > hi ? widened_hi : hi;
  }
  // [min start, max end) over the non-empty rows, or the empty {seq_len_kv, 0} without any.
  MQA_HOST_DEVICE constexpr Window window() const {
    return lo < hi ? Window{lo, hi} : Window{seq_len_kv, 0};
  }
};

// Key range of the prefill block of rows [first, first + block_q) (clamped to S): [min start, max
// end) over its non-empty rows, empty (lo >= hi) when all of them are.
MQA_HOST_DEVICE constexpr Window prefill_block_window(const std::int32_t* k_start,
                                                      const std::int32_t* k_end,
                                                      std::int64_t seq_len,
                                                      std::int64_t seq_len_kv, std::int64_t first,
                                                      std::int64_t block_q) {
  BlockWindow<std::int64_t> block(seq_len_kv);
  const std::int64_t last = first + block_q < seq_len ? first + block_q : seq_len;
  for (std::int64_t row = first; row < last; ++row) {
    block.widen(k_start[row], k_end[row]);
  }
  return block.window();
}

// Context length of decode row t (of N) of sequence b.
MQA_HOST_DEVICE constexpr std::int64_t paged_row_length(const std::int32_t* context_lens,
                                                        bool lens_2d, std::int64_t b, int next_n,
                                                        int t) {
  const std::int64_t len = lens_2d ? context_lens[b * next_n + t]
                                   : static_cast<std::int64_t>(context_lens[b]) - next_n + t + 1;
  return len > 0 ? len : 0;
}

// Keys any decode row can have: its output width, and what its block-table row addresses.
MQA_HOST_DEVICE constexpr std::int64_t paged_key_cap(std::int64_t max_context_len,
                                                     std::int64_t max_blocks, int block_kv) {
  const std::int64_t addressed = max_blocks * block_kv;
  return max_context_len < addressed ? max_context_len : addressed;
}

// The length decode unit `unit` (a sequence, or a row in the varlen form) splits into items: its
// longest row. `lens_cols` is the column count of 2-D lengths (next_n); a 1-D length is already
// that of the sequence's last, longest row.
MQA_HOST_DEVICE constexpr std::int64_t paged_unit_length(const std::int32_t* context_lens,
                                                         bool lens_2d, std::int64_t lens_cols,
                                                         std::int64_t unit) {
  const int cols = lens_2d ? static_cast<int>(lens_cols) : 1;
  std::int64_t length = 0;
  for (int t = 0; t < cols; ++t) {
    const std::int64_t len = paged_row_length(context_lens, lens_2d, unit, cols, t);
    length = len > length ? len : length;
  }
  return length;
}

}  // namespace mqa_logits::schedule
