// Property tests of the schedule metadata: the item list is computed here independently of the
// library, and every worker split is checked against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "metadata.hpp"
#include "schedule.hpp"
#include "mqa_logits/capabilities.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace mqa_logits {
namespace {

constexpr std::int64_t kTileKV = 128;       // keys per prefill tile item
constexpr std::int64_t kTileAlign = 8;      // a block's first tile starts at a multiple of it
constexpr std::int64_t kTileKeys = 64;      // keys per decode item

std::int64_t div_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Prefill: items per block of 256 / H query rows (two groups of 128 (query, head) MMA columns),
// from its tiles over the union of its non-empty windows (from its lowest key rounded down to
// kTileAlign), one item each, after 4 items of the block's own at H = 64; at other H, 3 for a
// block of at most 3 tiles and 1 for a longer one.
std::int64_t prefill_price(std::int64_t tiles, int H) {
  const std::int64_t own = H == 64 ? 4 : tiles <= 3 ? 3 : 1;
  return own + tiles;
}

// The items of each block, listed in the schedule's order of blocks: first, last, second,
// second to last, and so on.
std::vector<std::int64_t> prefill_items(const std::vector<std::int32_t>& start,
                                        const std::vector<std::int32_t>& end, std::int64_t T,
                                        int H) {
  const std::int64_t block_q = 256 / H;
  std::vector<std::int64_t> by_block;
  for (std::size_t first = 0; first < start.size(); first += block_q) {
    std::int64_t lo = -1;
    std::int64_t hi = -1;
    for (std::size_t i = first; i < std::min(start.size(), first + block_q); ++i) {
      const std::int64_t row_lo = std::max<std::int64_t>(start[i], 0);
      const std::int64_t row_hi = std::min<std::int64_t>(end[i], T);
      if (row_lo >= row_hi) continue;
      lo = lo < 0 ? row_lo : std::min(lo, row_lo);
      hi = std::max(hi, row_hi);
    }
    by_block.push_back(
        prefill_price(lo < 0 ? 0 : div_up(hi - lo / kTileAlign * kTileAlign, kTileKV), H));
  }
  std::vector<std::int64_t> items;
  for (std::size_t low = 0, high = by_block.size(); low < high;) {
    items.push_back(by_block[low++]);
    if (low < high) items.push_back(by_block[--high]);
  }
  return items;
}

std::int64_t sum(const std::vector<std::int64_t>& values) {
  std::int64_t total = 0;
  for (const auto v : values) total += v;
  return total;
}

// Decode: one group per sequence (its longest row), one item per 64-key tile, at least one
// each; the split is of parts of 4 of a group's tiles, unless those fit the workers one each, and
// then of the finest parts (1 or 2 tiles) that still do.
struct PagedSplit {
  std::vector<std::int64_t> parts;  // per group
  std::int64_t part_tiles = 4;
  std::int64_t coarse_parts = 0;  // parts of 4 tiles in all: what the fingerprint digests
};

PagedSplit paged_split(const std::vector<std::int32_t>& lens, std::int64_t batch,
                       std::int64_t cols, int workers) {
  std::vector<std::int64_t> tiles;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t longest = 0;
    for (std::int64_t t = 0; t < cols; ++t) {
      longest = std::max<std::int64_t>(longest, lens[static_cast<std::size_t>(b * cols + t)]);
    }
    tiles.push_back(longest > 0 ? div_up(longest, kTileKeys) : 1);
  }
  const auto parts_of = [&](std::int64_t part_tiles) {
    std::vector<std::int64_t> parts;
    for (const std::int64_t t : tiles) parts.push_back(div_up(t, part_tiles));
    return parts;
  };
  PagedSplit split;
  split.coarse_parts = sum(parts_of(4));
  if (split.coarse_parts <= workers) {
    for (const std::int64_t part_tiles : {1, 2}) {
      if (sum(parts_of(part_tiles)) <= workers) {
        split.part_tiles = part_tiles;
        break;
      }
    }
  }
  split.parts = parts_of(split.part_tiles);
  return split;
}

// Checks `meta` ([workers + 1, 2]) against the per-group item counts (decode: of parts of
// `part_tiles` tiles, the rows giving each part's first tile; the fingerprint digests
// `fingerprint_items`, the parts of 4 tiles).
void expect_valid_split(const std::vector<std::int32_t>& meta,
                        const std::vector<std::int64_t>& items, int workers,
                        std::int64_t part_tiles = 1, std::int64_t fingerprint_items = -1) {
  ASSERT_EQ(meta.size(), static_cast<std::size_t>(2 * (workers + 1)));
  const auto groups = static_cast<std::int64_t>(items.size());
  std::vector<std::int64_t> first_item(items.size() + 1, 0);  // list index of (g, 0)
  for (std::size_t g = 0; g < items.size(); ++g) first_item[g + 1] = first_item[g] + items[g];
  const std::int64_t total = first_item.back();

  // List position of each row; (groups, 0) is the end of the list, (groups, fingerprint) in row
  // `workers`.
  std::vector<std::int64_t> position(workers + 1);
  for (int k = 0; k <= workers; ++k) {
    const std::int64_t group = meta[2 * k];
    const std::int64_t first_tile = k < workers ? meta[2 * k + 1] : 0;
    ASSERT_GE(group, 0);
    ASSERT_GE(first_tile, 0);
    ASSERT_EQ(first_tile % part_tiles, 0) << "row " << k;
    const std::int64_t item = first_tile / part_tiles;
    if (group == groups) {
      ASSERT_EQ(item, 0) << "row " << k;
    } else {
      ASSERT_LT(group, groups) << "row " << k;
      ASSERT_LT(item, items[group]) << "row " << k;
    }
    position[k] = first_item[group] + item;
  }
  EXPECT_EQ(meta[2 * workers], groups);
  EXPECT_EQ(meta[2 * workers + 1],
            schedule::metadata_fingerprint(groups,
                                           fingerprint_items < 0 ? total : fingerprint_items));
  // Contiguous segments from the first item to the last cover every item exactly once...
  EXPECT_EQ(position[0], 0);
  EXPECT_EQ(position[workers], total);
  // ...with sizes that differ by at most one, the larger ones first.
  for (int k = 0; k < workers; ++k) {
    const std::int64_t expected = total / workers + (k < total % workers ? 1 : 0);
    EXPECT_EQ(position[k + 1] - position[k], expected) << "worker " << k << " of " << workers;
  }
}

std::vector<int> worker_counts(std::int64_t total_items, std::mt19937& gen) {
  std::uniform_int_distribution<int> any(2, 300);
  return {1, 2, 3, any(gen), 132, static_cast<int>(total_items) + 5};
}

// ---- prefill ----

struct PrefillCase {
  std::vector<std::int32_t> start, end;
  std::int64_t T;
  int H;
};

PrefillCase random_prefill_case(std::mt19937& gen, int trial) {
  const auto& heads = capabilities::kHeadCounts;
  PrefillCase c;
  c.H = heads[static_cast<std::size_t>(trial) % std::size(heads)];
  c.T = std::uniform_int_distribution<std::int64_t>(0, 6000)(gen);
  const auto S = std::uniform_int_distribution<std::size_t>(0, 400)(gen);
  const int kind = trial % 5;
  std::uniform_int_distribution<std::int32_t> pos(-50, static_cast<std::int32_t>(c.T) + 50);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::size_t i = 0; i < S; ++i) {
    std::int32_t lo = pos(gen);
    std::int32_t hi = pos(gen);
    if (kind == 0) {  // causal over the tail of the keys
      lo = 0;
      hi = static_cast<std::int32_t>(c.T - static_cast<std::int64_t>(S) + i + 1);
    } else if (kind == 1) {  // all empty or inverted
      hi = std::min(lo, hi);
    } else if (kind == 2 && unit(gen) < 0.9) {  // mostly empty, a few wide rows
      hi = lo;
    }
    c.start.push_back(lo);
    c.end.push_back(hi);
  }
  return c;
}

TEST(PrefillMetadata, BlockOrderTakesEachBlockOnceAndKnowsItsSuccessor) {
  for (int blocks = 1; blocks <= 300; ++blocks) {
    std::vector<int> seen(blocks, 0);
    for (int position = 0; position < blocks; ++position) {
      const int block = schedule::prefill_block_at(position, blocks);
      ASSERT_GE(block, 0);
      ASSERT_LT(block, blocks);
      ++seen[block];
      const int expected_next =
          position + 1 < blocks ? schedule::prefill_block_at(position + 1, blocks) : block;
      EXPECT_EQ(schedule::prefill_block_after(block, blocks), expected_next)
          << "position " << position << " of " << blocks;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), blocks) << blocks << " blocks";
  }
}

// A tile half is skipped by the math warpgroup whose query rows it holds no key of: the tiles
// prefill_half_tiles keeps are exactly those whose half meets the rows' keys, for hulls at every
// offset from the block's first tile (8-aligned, as prefill_tiles_start makes it).
TEST(PrefillMetadata, HalfTilesAreThoseWhoseKeysMeetTheRows) {
  constexpr std::int64_t kHalf = kTileKV / 2;
  for (const std::int64_t tiles_start : {std::int64_t{0}, std::int64_t{8}, std::int64_t{4096}}) {
    for (int half = 0; half < 2; ++half) {
      for (std::int64_t lo = tiles_start; lo < tiles_start + 3 * kTileKV; ++lo) {
        for (std::int64_t hi = lo - 2; hi < tiles_start + 5 * kTileKV; ++hi) {
          const schedule::TileRange range = schedule::prefill_half_tiles(tiles_start, half, lo, hi);
          for (std::int32_t t = 0; t < 6; ++t) {
            const std::int64_t first = tiles_start + t * kTileKV + half * kHalf;
            const bool meets = lo < hi && first < hi && first + kHalf > lo;
            ASSERT_EQ(t >= range.begin && t < range.end, meets)
                << "tiles from " << tiles_start << ", half " << half << ", keys [" << lo << ", "
                << hi << "), tile " << t;
          }
          if (lo >= hi) EXPECT_EQ(range.begin, range.end);
        }
      }
    }
  }
}

TEST(PrefillMetadata, SplitsEveryBlockItemEvenly) {
  std::mt19937 gen(101);
  for (int trial = 0; trial < 300; ++trial) {
    const PrefillCase c = random_prefill_case(gen, trial);
    const auto items = prefill_items(c.start, c.end, c.T, c.H);
    for (const int workers : worker_counts(sum(items), gen)) {
      std::vector<std::int32_t> meta(2 * (workers + 1), -7);
      host::prefill_metadata(c.start.data(), c.end.data(),
                             static_cast<std::int64_t>(c.start.size()), c.T, c.H, workers,
                             meta.data());
      SCOPED_TRACE(testing::Message() << "trial " << trial << " S " << c.start.size() << " T "
                                      << c.T << " H " << c.H << " workers " << workers);
      expect_valid_split(meta, items, workers);
      std::vector<std::int32_t> again(meta.size(), 99);
      host::prefill_metadata(c.start.data(), c.end.data(),
                             static_cast<std::int64_t>(c.start.size()), c.T, c.H, workers,
                             again.data());
      EXPECT_EQ(again, meta);
    }
  }
}

// ---- decode ----

struct PagedCase {
  std::vector<std::int32_t> lens;
  std::int64_t batch;
  std::int64_t cols;  // 1 for 1-D lens
  bool lens_2d;
};

PagedCase random_paged_case(std::mt19937& gen, int trial) {
  PagedCase c;
  c.batch = std::uniform_int_distribution<std::int64_t>(0, 250)(gen);
  c.lens_2d = trial % 2 == 1;
  c.cols = c.lens_2d ? std::uniform_int_distribution<std::int64_t>(1, 8)(gen) : 1;
  std::uniform_int_distribution<std::int32_t> small(-3, 300);
  std::uniform_int_distribution<std::int32_t> huge(0, 200000);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const int kind = trial % 6;
  for (std::int64_t i = 0; i < c.batch * c.cols; ++i) {
    std::int32_t len = small(gen);
    if (kind == 2) len = 0;                                  // all empty
    if (kind == 3 && unit(gen) < 0.05) len = huge(gen);      // very uneven
    if (kind == 4) len = unit(gen) < 0.5 ? 0 : huge(gen);    // zeros and long sequences
    c.lens.push_back(len);
  }
  return c;
}

TEST(PagedMetadata, SplitsEveryGroupItemEvenly) {
  std::mt19937 gen(202);
  for (int trial = 0; trial < 300; ++trial) {
    const PagedCase c = random_paged_case(gen, trial);
    // Parts of one tile where the workers outnumber them: the tiles.
    const std::int64_t tiles = sum(paged_split(c.lens, c.batch, c.cols, INT_MAX).parts);
    for (const int workers : worker_counts(tiles, gen)) {
      std::vector<std::int32_t> meta(2 * (workers + 1), -7);
      host::paged_metadata(c.lens.data(), c.batch, c.cols, c.lens_2d, nullptr, workers,
                           meta.data());
      SCOPED_TRACE(testing::Message() << "trial " << trial << " B " << c.batch << " N "
                                      << c.cols << " workers " << workers);
      const PagedSplit split = paged_split(c.lens, c.batch, c.cols, workers);
      expect_valid_split(meta, split.parts, workers, split.part_tiles, split.coarse_parts);
      std::vector<std::int32_t> again(meta.size(), 99);
      host::paged_metadata(c.lens.data(), c.batch, c.cols, c.lens_2d, nullptr, workers,
                           again.data());
      EXPECT_EQ(again, meta);
    }
  }
}

// ---- through the public API ----

TEST(PagedMetadata, PublicApiVarlenFormGroupsEveryRow) {
  std::mt19937 gen(303);
  for (int trial = 0; trial < 50; ++trial) {
    PagedCase c = random_paged_case(gen, 2 * trial);  // 1-D lens: one row per group
    std::vector<std::int32_t> indices(static_cast<std::size_t>(c.batch));
    std::int32_t sequence = 0;
    for (auto& index : indices) {
      sequence += std::uniform_int_distribution<int>(0, 1)(gen);  // runs of equal indices
      index = sequence;
    }
    const int workers = std::uniform_int_distribution<int>(1, 200)(gen);
    const PagedSplit split = paged_split(c.lens, c.batch, 1, workers);
    std::vector<std::int32_t> meta(2 * (workers + 1), -7);
    const auto lens = TensorView::contiguous(c.lens.data(), DType::kInt32, {c.batch});
    const auto index_view = TensorView::contiguous(indices.data(), DType::kInt32, {c.batch});
    const auto out =
        TensorView::contiguous(meta.data(), DType::kInt32, {schedule_meta_rows(workers), 2});
    get_paged_mqa_logits_metadata(lens, 64, workers, out, index_view);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " workers " << workers);
    expect_valid_split(meta, split.parts, workers, split.part_tiles, split.coarse_parts);
  }
}

// The part length the split takes, read from worker rows that tell the choices apart (132
// workers): one sequence of 4096 keys (64 tiles: one a worker), one of 12800 (200 tiles, 100
// parts of 2), eight of 4096 (128 parts of 4, one a worker), one of 40000 (157 parts of 4, two
// for workers 0-24) and 32 of 4096 (512 parts of 4, 3 or 4 a worker).
TEST(PagedMetadata, PartLengthFitsTheWorkers) {
  using Row = std::pair<std::int32_t, std::int32_t>;  // (sequence, first tile)
  const auto rows = [](std::vector<std::int32_t> lens, std::vector<int> workers) {
    constexpr int kWorkers = 132;
    std::vector<std::int32_t> meta(2 * (kWorkers + 1), -7);
    host::paged_metadata(lens.data(), static_cast<std::int64_t>(lens.size()), 1, false, nullptr,
                         kWorkers, meta.data());
    std::vector<Row> out;
    for (const int k : workers) out.emplace_back(meta[2 * k], meta[2 * k + 1]);
    return out;
  };
  // 64 tiles fit the workers one tile each; worker 64 has nothing.
  EXPECT_EQ(rows({4096}, {1, 3, 64}), (std::vector<Row>{{0, 1}, {0, 3}, {1, 0}}));
  // 200 tiles do not, their 100 parts of 2 do; worker 100 has nothing.
  EXPECT_EQ(rows({12800}, {1, 99, 100}), (std::vector<Row>{{0, 2}, {0, 198}, {1, 0}}));
  // 512 tiles: 128 parts of 4 fit, workers 128-131 have nothing (parts of 1 would start
  // worker 128 at tile 500: sequence 7, tile 52).
  EXPECT_EQ(rows(std::vector<std::int32_t>(8, 4096), {1, 127, 128}),
            (std::vector<Row>{{0, 4}, {7, 60}, {8, 0}}));
  // 157 parts of 4 (parts of 1 would give tiles 5, 10, 15 here).
  EXPECT_EQ(rows({40000}, {1, 2, 3}), (std::vector<Row>{{0, 8}, {0, 16}, {0, 24}}));
  // 512 parts of 4: worker 131 starts at part 509, tile 2036 (parts of 1: tile 2033).
  EXPECT_EQ(rows(std::vector<std::int32_t>(32, 4096), {1, 131}),
            (std::vector<Row>{{0, 16}, {31, 52}}));
}

// The finer counts share one scan (schedule::paged_split_pack): sums of packed runs unpack to the
// sums of their counts wherever the parts of 4 are few enough to count them, up to the bound.
TEST(PagedMetadata, FinerCountsPackIntoOneScan) {
  std::mt19937 gen(404);
  for (int trial = 0; trial < 200; ++trial) {
    // Runs of groups whose parts of 4 add up to at most the bound, the last trials at it.
    const std::int64_t budget =
        trial < 190 ? std::uniform_int_distribution<std::int64_t>(1, 100000)(gen)
                    : schedule::kPagedFinerCountLimit;
    std::int64_t packed_sum = 0, sums[schedule::kPagedSplitChoices] = {};
    for (std::int64_t coarse_left = budget; coarse_left > 0;) {
      const std::int64_t coarse = std::uniform_int_distribution<std::int64_t>(
          1, std::min<std::int64_t>(coarse_left, 1 << 20))(gen);
      const std::int64_t tiles = 4 * coarse - std::uniform_int_distribution<int>(0, 3)(gen);
      std::int64_t run[schedule::kPagedSplitChoices];
      for (int c = 0; c < schedule::kPagedSplitChoices; ++c) {
        run[c] = schedule::paged_split_parts(tiles, c);
        sums[c] += run[c];
      }
      packed_sum += schedule::paged_split_pack(run);
      coarse_left -= run[0];
    }
    ASSERT_TRUE(schedule::paged_split_counts_finer(sums[0], INT_MAX));
    std::int64_t unpacked[schedule::kPagedSplitChoices] = {};
    schedule::paged_split_unpack(packed_sum, unpacked);
    EXPECT_EQ(unpacked[1], sums[1]) << "trial " << trial;
    EXPECT_EQ(unpacked[2], sums[2]) << "trial " << trial;
  }
  EXPECT_FALSE(schedule::paged_split_counts_finer(schedule::kPagedFinerCountLimit + 1, INT_MAX));
}

class PrefillMetadataApi : public testing::Test {
 protected:
  void SetUp() override { saved_ = get_num_sms(); }
  void TearDown() override { set_num_sms(saved_); }

 private:
  int saved_ = 1;
};

TEST_F(PrefillMetadataApi, UsesTheConfiguredWorkerCount) {
  std::mt19937 gen(404);
  for (int trial = 0; trial < 40; ++trial) {
    const PrefillCase c = random_prefill_case(gen, trial);
    const auto items = prefill_items(c.start, c.end, c.T, c.H);
    // At most 64: set_num_sms refuses more workers than the GPU has SMs.
    const int workers = std::uniform_int_distribution<int>(1, 64)(gen);
    set_num_sms(workers);
    ASSERT_EQ(get_num_sms(), workers);
    const auto S = static_cast<std::int64_t>(c.start.size());
    std::vector<std::int32_t> meta(2 * (workers + 1), -7);
    auto start = c.start;
    auto end = c.end;
    get_mqa_logits_metadata(TensorView::contiguous(start.data(), DType::kInt32, {S}),
                            TensorView::contiguous(end.data(), DType::kInt32, {S}), c.T, c.H,
                            TensorView::contiguous(meta.data(), DType::kInt32,
                                                   {schedule_meta_rows(workers), 2}));
    SCOPED_TRACE(testing::Message() << "trial " << trial << " workers " << workers);
    expect_valid_split(meta, items, workers);
  }
}

}  // namespace
}  // namespace mqa_logits
