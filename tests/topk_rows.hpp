// Logits rows and windows for the top-k tests on both backends, and their comparison with the
// brute-force oracle of support/topk_oracle.hpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "mqa_logits/mqa_logits.hpp"
#include "support/topk_oracle.hpp"
#include "support/workload.hpp"

namespace mqa_logits::topk_test {

constexpr std::int32_t kIndexPoison = 0x7f7f7f7f;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits rows in host memory, fp32 or bf16 (stored as the high half of each fp32 value).
struct Rows {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t stride = 0;
  DType dtype = DType::kFloat32;
  std::vector<float> fp32;
  std::vector<std::uint16_t> bf16;

  Rows(std::int64_t r, std::int64_t c, DType d, std::int64_t pad = 3)
      : rows(r), cols(c), stride(c + pad), dtype(d) {
    fp32.assign(static_cast<std::size_t>(std::max<std::int64_t>(rows * stride, 1)), 0.0f);
    bf16.assign(fp32.size(), 0);
  }
  void set(std::int64_t row, std::int64_t col, float v) {
    const auto k = static_cast<std::size_t>(row * stride + col);
    fp32[k] = v;
    bf16[k] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
  }
  const void* data() const {
    return dtype == DType::kBFloat16 ? static_cast<const void*>(bf16.data()) : fp32.data();
  }
  const void* row(std::int64_t r) const {
    return static_cast<const char*>(data()) + r * stride * (dtype == DType::kBFloat16 ? 2 : 4);
  }
  TensorView view() const {
    TensorView v;
    v.data = const_cast<void*>(data());
    v.dtype = dtype;
    v.rank = 2;
    v.shape = {rows, cols};
    v.strides = {stride, 1};
    return v;
  }
};

struct Selection {
  std::vector<std::int32_t> indices;
  std::vector<float> values;
};

inline Selection poisoned_selection(std::int64_t rows, std::int64_t topk) {
  const auto n = static_cast<std::size_t>(rows * topk);
  return {std::vector<std::int32_t>(n, kIndexPoison),
          std::vector<float>(n, std::numeric_limits<float>::quiet_NaN())};
}

inline TensorView int32_view(std::vector<std::int32_t>& v, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::kInt32, shape);
}

struct PerRowCall {
  std::vector<std::int32_t> starts;  // empty: none
  std::vector<std::int32_t> ends;
  bool compressed = false;
  bool absolute = false;
};

inline Selection run_per_row(const Rows& logits, PerRowCall& call, std::int64_t topk) {
  Selection out = poisoned_selection(logits.rows, topk);
  TopkPerRowOptions options;
  options.compressed = call.compressed;
  options.absolute_indices = call.absolute;
  options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {logits.rows, topk});
  std::optional<TensorView> starts;
  if (!call.starts.empty()) starts = int32_view(call.starts, {logits.rows});
  topk_per_row(logits.view(), starts, int32_view(call.ends, {logits.rows}), topk,
               int32_view(out.indices, {logits.rows, topk}), options);
  return out;
}

// The expected row, from the contract's windows written out here: (indices, values).
inline void expect_row(const Selection& got, std::int64_t row, std::int64_t topk,
                const std::vector<std::int64_t>& columns, const std::vector<std::int64_t>& index,
                const void* row_data, DType dtype) {
  for (std::int64_t i = 0; i < topk; ++i) {
    const auto k = static_cast<std::size_t>(row * topk + i);
    if (i < static_cast<std::int64_t>(columns.size())) {
      ASSERT_EQ(got.indices[k], index[static_cast<std::size_t>(i)]) << "row " << row << " place " << i;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got.values[k]),
                std::bit_cast<std::uint32_t>(
                    support::logit_value(row_data, dtype, columns[static_cast<std::size_t>(i)])))
          << "row " << row << " place " << i;
    } else {
      ASSERT_EQ(got.indices[k], -1) << "row " << row << " place " << i;
      ASSERT_EQ(got.values[k], -kInf) << "row " << row << " place " << i;
    }
  }
}

inline void expect_per_row_oracle(const Rows& logits, const PerRowCall& call, std::int64_t topk,
                           const Selection& got) {
  for (std::int64_t r = 0; r < logits.rows; ++r) {
    const std::int64_t start = call.starts.empty() ? 0 : call.starts[static_cast<std::size_t>(r)];
    const std::int64_t end = call.ends[static_cast<std::size_t>(r)];
    // Keys max(start, 0) <= j < end that have a column.
    const std::int64_t shift = call.compressed ? start : 0;
    const std::int64_t first = std::clamp<std::int64_t>(std::max<std::int64_t>(start, 0) - shift, 0,
                                                        logits.cols);
    const std::int64_t last = std::clamp<std::int64_t>(end - shift, first, logits.cols);
    const auto columns =
        support::oracle_topk_columns(logits.row(r), logits.dtype, first, last - first, topk);
    std::vector<std::int64_t> index;
    for (const std::int64_t c : columns) index.push_back(call.absolute ? c + shift : c + shift - start);
    expect_row(got, r, topk, columns, index, logits.row(r), logits.dtype);
  }
}

inline Rows random_rows(std::int64_t rows, std::int64_t cols, DType dtype, std::uint64_t seed) {
  Rows logits(rows, cols, dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < logits.stride; ++c) logits.set(r, c, normal(rng));
  }
  return logits;
}

// Windows of every kind: inside, empty, inverted, negative starts, ends past the columns.
inline PerRowCall random_windows(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  PerRowCall call;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> pick(-cols / 8, cols + cols / 8);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t a = pick(rng), b = pick(rng);
    if (r % 7 != 3) {
      if (a > b) std::swap(a, b);
    }
    call.starts.push_back(static_cast<std::int32_t>(a));
    call.ends.push_back(static_cast<std::int32_t>(b));
  }
  return call;
}

// Two calls of `run` (a backend's topk_per_row: logits, call, topk -> Selection) on the same
// random rows of 5000 columns and windows give the same indices and bitwise the same values.
template <class Run>
void expect_repeated_calls_bitwise_equal(Run run, std::int64_t rows) {
  const Rows logits = random_rows(rows, 5000, DType::kFloat32, 9);
  PerRowCall call = random_windows(rows, 5000, 10);
  const Selection a = run(logits, call, 2048);
  const Selection b = run(logits, call, 2048);
  ASSERT_EQ(a.indices, b.indices);
  for (std::size_t k = 0; k < a.values.size(); ++k) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a.values[k]), std::bit_cast<std::uint32_t>(b.values[k]));
  }
}

// A row whose every key lies in one bin of the first two digits: values differ in
// their 6 lowest bits only, with many exact ties.
inline Rows one_bin_row(std::int64_t cols, std::uint64_t seed) {
  Rows logits(1, cols, DType::kFloat32, 0);
  std::mt19937_64 rng(seed);
  for (std::int64_t c = 0; c < cols; ++c) {
    logits.set(0, c, std::bit_cast<float>(0x3f800000u + static_cast<std::uint32_t>(rng() % 64)));
  }
  return logits;
}

// Rows of four values (~cols / 4 keys each), so ties straddle any k-th place.
inline Rows four_value_rows(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Rows logits(rows, cols, DType::kFloat32);
  std::mt19937_64 rng(seed);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < logits.stride; ++c) logits.set(r, c, static_cast<float>(rng() % 4));
  }
  return logits;
}

// Rows of -inf; NaN, -inf and few selectable keys; -0 and +0; +inf among -1e30.
inline Rows special_value_rows(std::int64_t cols) {
  Rows logits(4, cols, DType::kFloat32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t c = 0; c < logits.stride; ++c) {
    logits.set(0, c, -kInf);
    logits.set(1, c, c % 3 == 0 ? nan : (c % 3 == 1 ? -kInf : 1.0f));
    logits.set(2, c, c % 2 == 0 ? -0.0f : 0.0f);
    logits.set(3, c, c == 40 ? kInf : (c == 10 ? -kInf : -1e30f));
  }
  return logits;
}

// A case of the fused prefill tests: windows, weights, k, and the logits' dtype.
struct FusedCase {
  support::WindowKind windows;
  DType weights;
  std::int64_t topk;
  DType logits = weights;  // bf16 logits of fp32 weights too
};

// The fused prefill tests' cases: every window kind, both weight dtypes, bf16 logits of fp32
// weights, k from 1 to 2048 (packed windows are shorter than 2048 keys).
inline const FusedCase kFusedCases[] = {
    {support::WindowKind::kCausal, DType::kFloat32, 2048},
    {support::WindowKind::kRandom, DType::kFloat32, 300},
    {support::WindowKind::kPacked, DType::kFloat32, 2048},
    {support::WindowKind::kSliding, DType::kBFloat16, 512},
    {support::WindowKind::kContextParallel, DType::kFloat32, 1},
    {support::WindowKind::kFull, DType::kBFloat16, 2048},
    {support::WindowKind::kCausal, DType::kFloat32, 700, DType::kBFloat16},
};

// Its workload spec at S queries over T keys (packed: four requests of S = T keys; sliding: T / 6
// keys a window).
inline support::PrefillSpec fused_spec(const FusedCase& c, Format format, std::int64_t seq_len,
                                       std::int64_t seq_len_kv, std::int64_t heads,
                                       std::int64_t dim, std::uint64_t seed) {
  support::PrefillSpec spec;
  spec.format = format;
  spec.seq_len = seq_len;
  spec.seq_len_kv = c.windows == support::WindowKind::kPacked ? seq_len : seq_len_kv;
  spec.num_heads = heads;
  spec.head_dim = dim;
  spec.weights_dtype = c.weights;
  spec.logits_dtype = c.logits;
  spec.windows = c.windows;
  spec.clean_logits = false;
  if (c.windows == support::WindowKind::kPacked) {
    spec.request_lengths = {seq_len / 8, seq_len / 2, 1, seq_len - seq_len / 8 - seq_len / 2 - 1};
  }
  if (c.windows == support::WindowKind::kSliding) spec.sliding_window = seq_len_kv / 6;
  spec.seed = seed;
  return spec;
}

// The rows the oracle reads of a prefill workload's logits: its windows, ends clamped to T.
inline PerRowCall prefill_rows(const support::PrefillWorkload& w, bool absolute) {
  PerRowCall call{std::vector<std::int32_t>(w.k_start().begin(), w.k_start().end()),
                  std::vector<std::int32_t>(w.k_end().begin(), w.k_end().end())};
  for (auto& e : call.ends) e = std::min<std::int32_t>(e, static_cast<std::int32_t>(w.spec.seq_len_kv));
  call.absolute = absolute;
  return call;
}

// A case of the fused decode tests.
struct PagedCase {
  std::int64_t batch;
  std::int64_t next_n;
  int block_kv;
  bool lens_2d;
  bool varlen;
  DType weights;
};

// The fused decode tests' cases: next_n 1, 2, 3, 4 and 8, block_kv 32 and 64, 1-D and 2-D lengths, the
// varlen form, bf16; the batches are the GPU tests' (the CPU tests take batch 5 throughout).
inline const PagedCase kPagedCases[] = {
    {1, 1, 64, false, false, DType::kFloat32},  {8, 2, 32, true, false, DType::kFloat32},
    {5, 3, 64, false, false, DType::kBFloat16}, {6, 4, 64, true, false, DType::kFloat32},
    {3, 8, 32, false, false, DType::kFloat32},  {12, 1, 64, false, true, DType::kFloat32},
};

inline support::PagedSpec paged_spec(const PagedCase& c, std::int64_t heads, std::int64_t dim,
                                     std::int64_t avg_context) {
  support::PagedSpec spec;
  spec.batch = c.batch;
  spec.next_n = c.next_n;
  spec.num_heads = heads;
  spec.head_dim = dim;
  spec.block_kv = c.block_kv;
  spec.avg_context = avg_context;
  spec.context_jitter = 0.9;
  spec.lens_2d = c.lens_2d;
  spec.varlen_indices = c.varlen;
  spec.weights_dtype = c.weights;
  spec.logits_dtype = c.weights;
  spec.seed = static_cast<std::uint64_t>(c.next_n * 100 + c.block_kv);
  return spec;
}

// Every row of a decode selection against the oracle over the workload's logits: a row's
// positions [0, its clamped length), those in blocks outside the cache excluded; indices the
// positions, or their cache slots.
inline void expect_paged_rows(const Selection& got, const support::PagedWorkload& w,
                              const Rows& logits, std::int64_t topk, bool slots) {
  const auto table = w.block_table();
  const int block_kv = w.spec.block_kv;
  for (std::int64_t r = 0; r < w.num_rows; ++r) {
    const std::int64_t table_row = w.table_row(r);
    const auto block = [&](std::int64_t p) {
      const std::int32_t id =
          table[static_cast<std::size_t>(table_row * w.max_blocks + p / block_kv)];
      return id >= 0 && id < w.num_blocks ? id : -1;
    };
    const std::int64_t length =
        std::min({w.context_length(r), w.max_context_len, w.max_blocks * block_kv});
    const auto columns = support::oracle_topk_columns(
        logits.row(r), logits.dtype, 0, std::max<std::int64_t>(length, 0), topk,
        [&](std::int64_t p) { return block(p) < 0; });
    std::vector<std::int64_t> index;
    for (const std::int64_t p : columns) {
      index.push_back(slots ? block(p) * block_kv + p % block_kv : p);
    }
    SCOPED_TRACE("B " + std::to_string(w.spec.batch) + " next_n " +
                 std::to_string(w.spec.next_n) + (slots ? " slots" : ""));
    expect_row(got, r, topk, columns, index, logits.row(r), logits.dtype);
  }
}

// Candidate lists of context parallelism: the rows' keys split over `ranks` shards (interleaved:
// key g on shard g % ranks; contiguous: equal runs of keys), each shard's top-k taken by
// topk_per_row on the CPU over its own keys, its indices mapped back to the row's keys. Returns
// values and indices [ranks, rows, topk] as the shards would send them.
struct Candidates {
  std::int64_t ranks = 0;
  std::vector<float> values;
  std::vector<std::int32_t> indices;
};

inline Candidates shard_candidates(const Rows& logits, std::int64_t ranks, bool interleaved,
                                   std::int64_t topk) {
  Candidates out{ranks, {}, {}};
  const std::int64_t run = (logits.cols + ranks - 1) / ranks;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const auto key_of = [&](std::int64_t j) { return interleaved ? r + ranks * j : r * run + j; };
    std::int64_t local_cols = 0;
    while (local_cols < logits.cols && key_of(local_cols) < logits.cols &&
           (interleaved || local_cols < run)) {
      ++local_cols;
    }
    Rows shard(logits.rows, local_cols, logits.dtype);
    for (std::int64_t i = 0; i < logits.rows; ++i) {
      for (std::int64_t j = 0; j < local_cols; ++j) {
        shard.set(i, j, support::logit_value(logits.row(i), logits.dtype, key_of(j)));
      }
    }
    PerRowCall call{{}, std::vector<std::int32_t>(static_cast<std::size_t>(logits.rows),
                                                  static_cast<std::int32_t>(local_cols))};
    const Selection local = run_per_row(shard, call, topk);
    for (std::size_t k = 0; k < local.indices.size(); ++k) {
      const std::int32_t j = local.indices[k];
      out.indices.push_back(j < 0 ? -1 : static_cast<std::int32_t>(key_of(j)));
      out.values.push_back(local.values[k]);
    }
  }
  return out;
}

// merge_topk of the candidates on the CPU, into poisoned outputs.
inline Selection run_merge(Candidates c, std::int64_t rows, std::int64_t lists_topk,
                           std::int64_t topk) {
  Selection out = poisoned_selection(rows, topk);
  MergeTopkOptions options;
  options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {rows, topk});
  merge_topk(TensorView::contiguous(c.values.data(), DType::kFloat32, {c.ranks, rows, lists_topk}),
             int32_view(c.indices, {c.ranks, rows, lists_topk}), topk,
             int32_view(out.indices, {rows, topk}), options);
  return out;
}

}  // namespace mqa_logits::topk_test
