// Top-k on the CPU backend (docs/contract.md, "Top-k"): topk_per_row against the brute-force
// oracle of support/topk_oracle.hpp on random and adversarial rows, and the fused operations
// against topk_per_row's oracle applied to the logits mqa_logits / paged_mqa_logits return for
// the same inputs. Outputs are poisoned before every call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "metadata.hpp"
#include "mqa_logits/formats.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/topk_oracle.hpp"
#include "support/workload.hpp"
#include "topk_rows.hpp"

namespace mqa_logits {
namespace {

using namespace topk_test;


TEST(TopkPerRow, RandomRowsMatchTheOracle) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const bool compressed : {false, true}) {
      for (const bool absolute : {false, true}) {
        for (const std::int64_t topk : {1, 7, 512, 2048}) {
          const auto seed = static_cast<std::uint64_t>(topk) * 4 + compressed * 2 + absolute;
          const Rows logits = random_rows(48, 6000, dtype, seed);
          PerRowCall call = random_windows(48, 6000, seed + 1);
          call.compressed = compressed;
          call.absolute = absolute;
          const Selection got = run_per_row(logits, call, topk);
          expect_per_row_oracle(logits, call, topk, got);
        }
      }
    }
  }
}

TEST(TopkPerRow, DecodeRowsWithoutStarts) {
  const Rows logits = random_rows(16, 3000, DType::kFloat32, 11);
  PerRowCall call;
  for (std::int32_t r = 0; r < 16; ++r) call.ends.push_back(r * 200 - 100);
  const Selection got = run_per_row(logits, call, 1024);
  expect_per_row_oracle(logits, call, 1024, got);
}

TEST(TopkPerRow, AllEqualLogitsOfAMillionKeys) {
  constexpr std::int64_t kCols = 1 << 20;
  Rows logits(1, kCols, DType::kFloat32, 0);
  for (std::int64_t c = 0; c < kCols; ++c) logits.set(0, c, 0.25f);
  for (const std::int64_t topk : {1, 2048}) {
    PerRowCall call{{}, {static_cast<std::int32_t>(kCols)}};
    const Selection got = run_per_row(logits, call, topk);
    for (std::int64_t i = 0; i < topk; ++i) ASSERT_EQ(got.indices[i], i);
  }
}

// Every key of the row in one bin of the first two digits: values differ in their 6 lowest
// bits only, with many exact ties among them.
TEST(TopkPerRow, ThresholdBinHoldsEveryKey) {
  constexpr std::int64_t kCols = 1 << 20;
  const Rows logits = one_bin_row(kCols, 5);
  PerRowCall call{{}, {static_cast<std::int32_t>(kCols)}};
  for (const std::int64_t topk : {1, 999, 2048}) {
    const Selection got = run_per_row(logits, call, topk);
    expect_per_row_oracle(logits, call, topk, got);
  }
}

TEST(TopkPerRow, TiesStraddleTheKthPlace) {
  const Rows logits = four_value_rows(8, 20000, 3);
  PerRowCall call;
  for (std::int64_t r = 0; r < 8; ++r) {
    call.starts.push_back(static_cast<std::int32_t>(r * 100));
    call.ends.push_back(20000);
  }
  for (const std::int64_t topk : {2048, 1999, 1}) {
    const Selection got = run_per_row(logits, call, topk);
    expect_per_row_oracle(logits, call, topk, got);
  }
}

TEST(TopkPerRow, SpecialValues) {
  const Rows logits = special_value_rows(64);
  PerRowCall call{{}, {64, 64, 64, 64}};
  const Selection got = run_per_row(logits, call, 16);
  expect_per_row_oracle(logits, call, 16, got);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(got.indices[i], -1);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(got.indices[32 + i], i);  // -0 and +0 tie: lower keys
}

TEST(TopkPerRow, RepeatedCallsAreBitwiseEqual) {
  expect_repeated_calls_bitwise_equal(run_per_row, 32);
}

template <class Call>
void expect_refused(const char* argument, const Call& call) {
  try {
    call();
    FAIL() << "expected InvalidArgument naming " << argument;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(TopkPerRow, RefusesBadArgumentsAndWritesNothing) {
  const Rows logits = random_rows(4, 100, DType::kFloat32, 1);
  std::vector<std::int32_t> ends(4, 100), starts(4, 0);
  Selection out = poisoned_selection(4, 8);
  const auto indices = int32_view(out.indices, {4, 8});
  const auto ends_view = int32_view(ends, {4});
  expect_refused("topk", [&] { topk_per_row(logits.view(), std::nullopt, ends_view, 0, indices); });
  expect_refused("topk", [&] { topk_per_row(logits.view(), std::nullopt, ends_view, 2049, indices); });
  expect_refused("topk_indices",
                 [&] { topk_per_row(logits.view(), std::nullopt, ends_view, 7, indices); });
  expect_refused("ends", [&] {
    topk_per_row(logits.view(), std::nullopt, int32_view(ends, {3}), 8, indices);
  });
  expect_refused("starts", [&] {
    TopkPerRowOptions options;
    options.compressed = true;
    topk_per_row(logits.view(), std::nullopt, ends_view, 8, indices, options);
  });
  expect_refused("values", [&] {
    TopkPerRowOptions options;
    options.values = TensorView::contiguous(out.values.data(), DType::kBFloat16, {4, 8});
    topk_per_row(logits.view(), int32_view(starts, {4}), ends_view, 8, indices, options);
  });
  expect_refused("topk_indices", [&] {  // the indices over the ends
    topk_per_row(logits.view(), std::nullopt, ends_view, 1,
                 TensorView::contiguous(ends.data(), DType::kInt32, {4, 1}));
  });
  expect_refused("logits", [&] {
    Rows wrong = logits;
    TensorView v = wrong.view();
    v.dtype = DType::kInt32;
    topk_per_row(v, std::nullopt, ends_view, 8, indices);
  });
  for (const std::int32_t v : out.indices) ASSERT_EQ(v, kIndexPoison);
  for (const std::int32_t v : ends) ASSERT_EQ(v, 100);
}

// ---- merge_topk: the shards' candidates merged equal the top-k over the whole rows ----

TEST(MergeTopk, ShardsMergeIntoTheWholeRowsTopk) {
  const Rows random = random_rows(12, 5000, DType::kFloat32, 31);
  const Rows ties = four_value_rows(6, 3000, 32);  // ties across the shards
  for (const Rows* logits : {&random, &ties}) {
    for (const std::int64_t ranks : {1, 2, 3, 4}) {
      for (const bool interleaved : {false, true}) {
        for (const std::int64_t topk : {1, 700, 2048}) {
          const Selection merged =
              run_merge(shard_candidates(*logits, ranks, interleaved, topk), logits->rows, topk, topk);
          PerRowCall call{{}, std::vector<std::int32_t>(static_cast<std::size_t>(logits->rows),
                                                        static_cast<std::int32_t>(logits->cols))};
          SCOPED_TRACE("ranks " + std::to_string(ranks) + (interleaved ? " interleaved" : ""));
          expect_per_row_oracle(*logits, call, topk, merged);
        }
      }
    }
  }
}

TEST(MergeTopk, FewerCandidatesThanTopkPadWithMinusOne) {
  std::vector<float> values = {3.0f, 1.0f, -kInf, 2.0f, 2.0f, -kInf};
  std::vector<std::int32_t> indices = {4, 9, -1, 2, 7, -1};  // 2 lists of 3 for one row
  Selection out = poisoned_selection(1, 5);
  MergeTopkOptions options;
  options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {1, 5});
  merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {2, 1, 3}),
             int32_view(indices, {2, 1, 3}), 5, int32_view(out.indices, {1, 5}), options);
  EXPECT_EQ(out.indices, (std::vector<std::int32_t>{2, 4, 7, 9, -1}));
  EXPECT_EQ(out.values, (std::vector<float>{2.0f, 3.0f, 2.0f, 1.0f, -kInf}));
  merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {2, 1, 3}),
             int32_view(indices, {2, 1, 3}), 2, int32_view(out.indices, {1, 2}));
  EXPECT_EQ(std::vector<std::int32_t>(out.indices.begin(), out.indices.begin() + 2),
            (std::vector<std::int32_t>{2, 4}));  // 3.0 at 4, then 2.0 at 2 before 2.0 at 7
}

TEST(MergeTopk, RefusesListsThatBreakTheRuleAndWritesNothing) {
  std::vector<float> values(6, 1.0f);
  Selection out = poisoned_selection(1, 4);
  for (const std::vector<std::int32_t>& bad :
       {std::vector<std::int32_t>{5, 3, -1, 1, 2, 4},     // descending
        std::vector<std::int32_t>{1, -1, 6, 2, 3, 4},     // a key after -1
        std::vector<std::int32_t>{1, 2, 3, 3, 4, -1},     // a key in two lists
        std::vector<std::int32_t>{1, -2, -1, 2, 3, 4}}) {  // below -1
    std::vector<std::int32_t> indices = bad;
    expect_refused("candidate_indices", [&] {
      merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {2, 1, 3}),
                 int32_view(indices, {2, 1, 3}), 4, int32_view(out.indices, {1, 4}));
    });
  }
  std::vector<std::int32_t> indices = {1, 2, 3, 4, 5, 6};
  expect_refused("candidate_indices", [&] {
    merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {2, 1, 3}),
               int32_view(indices, {1, 2, 3}), 4, int32_view(out.indices, {1, 4}));
  });
  expect_refused("topk", [&] {
    merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {2, 1, 3}),
               int32_view(indices, {2, 1, 3}), 0, int32_view(out.indices, {1, 4}));
  });
  for (const std::int32_t v : out.indices) ASSERT_EQ(v, kIndexPoison);
}

// ---- the fused operations against the oracle over their own logits ----

// The logits of a prefill workload as mqa_logits returns them (fp32, or bf16 for bf16 weights).
Rows prefill_logits(const support::PrefillWorkload& w) {
  const auto in = w.host_inputs();
  Rows logits(w.spec.seq_len, w.spec.seq_len_kv, w.spec.logits_dtype, 0);
  const OutputLayout layout = mqa_logits_output_layout(w.spec.seq_len, w.spec.seq_len_kv, 0,
                                                       w.spec.logits_dtype);
  logits.stride = layout.row_stride;
  logits.fp32.assign(static_cast<std::size_t>(std::max<std::int64_t>(layout.rows * layout.row_stride, 1)), 0.0f);
  logits.bf16.assign(logits.fp32.size(), 0);
  TensorView out;
  out.data = const_cast<void*>(logits.data());
  out.dtype = logits.dtype;
  out.rank = 2;
  out.shape = {layout.rows, layout.cols};
  out.strides = {layout.row_stride, 1};
  MqaLogitsOptions options;
  options.clean_logits = false;
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, out, options);
  return logits;
}

TEST(MqaTopk, MatchesTheOracleOverItsLogits) {
  for (const Format format : {Format::kFP8, Format::kMXFP4}) {
    for (const FusedCase& c : kFusedCases) {
      const support::PrefillSpec spec = fused_spec(c, format, 48, 4200, 8, 64, 17);
      const auto w = support::make_prefill_workload(spec);
      const Rows logits = prefill_logits(w);
      for (const bool absolute : {false, true}) {
        const auto in = w.host_inputs();
        Selection got = poisoned_selection(spec.seq_len, c.topk);
        std::vector<std::uint8_t> workspace(static_cast<std::size_t>(
            mqa_topk_workspace_bytes(spec.seq_len, spec.seq_len_kv, c.topk)));
        MqaTopkOptions options;
        options.absolute_indices = absolute;
        options.logits_dtype = c.logits;
        options.values =
            TensorView::contiguous(got.values.data(), DType::kFloat32, {spec.seq_len, c.topk});
        mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, c.topk,
                 int32_view(got.indices, {spec.seq_len, c.topk}),
                 TensorView::contiguous(workspace.data(), DType::kUInt8,
                                        {static_cast<std::int64_t>(workspace.size())}),
                 options);
        const PerRowCall call = prefill_rows(w, absolute);
        SCOPED_TRACE(std::string(format_name(format)) + " " + support::window_kind_name(c.windows));
        expect_per_row_oracle(logits, call, c.topk, got);
      }
    }
  }
}

TEST(MqaTopk, RefusesASmallWorkspaceAndWritesNothing) {
  support::PrefillSpec spec;
  spec.seq_len = 8;
  spec.seq_len_kv = 300;
  spec.num_heads = 8;
  spec.head_dim = 64;
  const auto w = support::make_prefill_workload(spec);
  const auto in = w.host_inputs();
  Selection got = poisoned_selection(8, 16);
  const std::int64_t bytes = mqa_topk_workspace_bytes(8, 300, 16);
  std::vector<std::uint8_t> workspace(static_cast<std::size_t>(bytes));
  expect_refused("workspace", [&] {
    mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, 16, int32_view(got.indices, {8, 16}),
             TensorView::contiguous(workspace.data(), DType::kUInt8, {bytes - 1}));
  });
  expect_refused("workspace", [&] {
    mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, 16, int32_view(got.indices, {8, 16}),
             TensorView::contiguous(workspace.data(), DType::kFloat32, {bytes / 4}));
  });
  expect_refused("topk", [&] {
    mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, 4096, int32_view(got.indices, {8, 16}),
             TensorView::contiguous(workspace.data(), DType::kUInt8, {bytes}));
  });
  expect_refused("logits_dtype", [&] {
    MqaTopkOptions options;
    options.logits_dtype = DType::kInt32;
    mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, 16, int32_view(got.indices, {8, 16}),
             TensorView::contiguous(workspace.data(), DType::kUInt8, {bytes}), options);
  });
  for (const std::int32_t v : got.indices) ASSERT_EQ(v, kIndexPoison);
}


TEST(PagedMqaTopk, MatchesTheOracleOverItsLogits) {
  for (PagedCase c : kPagedCases) {
    c.batch = 5;
    const support::PagedSpec spec = paged_spec(c, 8, 64, 2600);
    const auto w = support::make_paged_workload(spec);
    const auto in = w.host_inputs();
    const std::int64_t rows = w.num_rows;
    std::vector<std::int32_t> meta(2 * 5);
    const auto lens = w.context_lens();
    host::paged_metadata(lens.data(), spec.batch, c.lens_2d ? c.next_n : 1, c.lens_2d,
                         c.varlen ? w.indices().data() : nullptr, 4, meta.data());
    const TensorView meta_view = int32_view(meta, {5, 2});

    Rows logits(rows, w.max_context_len, c.weights, 0);
    logits.stride = w.layout.row_stride;
    logits.fp32.assign(static_cast<std::size_t>(rows * logits.stride), 0.0f);
    logits.bf16.assign(logits.fp32.size(), 0);
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                     w.max_context_len, w.logits_view(const_cast<void*>(logits.data())),
                     in.options);
    for (const bool slots : {false, true}) {
      for (const std::int64_t topk : {1, 2048}) {
        Selection got = poisoned_selection(rows, topk);
        std::vector<std::uint8_t> workspace(static_cast<std::size_t>(
            paged_mqa_topk_workspace_bytes(rows, w.max_context_len, topk)));
        PagedMqaTopkOptions options;
        options.cache_slots = slots;
        options.indices = in.options.indices;
        options.values = TensorView::contiguous(got.values.data(), DType::kFloat32, {rows, topk});
        paged_mqa_topk(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                       w.max_context_len, topk, int32_view(got.indices, {rows, topk}),
                       TensorView::contiguous(workspace.data(), DType::kUInt8,
                                              {static_cast<std::int64_t>(workspace.size())}),
                       options);
        expect_paged_rows(got, w, logits, topk, slots);
      }
    }
  }
}

}  // namespace
}  // namespace mqa_logits
