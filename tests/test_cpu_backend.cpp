// The CPU reference backend over the whole option matrix, on poisoned outputs, with guard bytes,
// at several thread counts, against support/reference: its windows (derived from the workload as
// the contract defines them), clamping, compressed output and stores. The oracle's arithmetic is
// this backend's own core, so the hand-derived logits of "the arithmetic anchor" below check it.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernel.hpp"
#include "cpu/parallel.hpp"
#include "metadata.hpp"
#include "mqa_logits/capabilities.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"
#include "support/workload.hpp"
#include "validate.hpp"

namespace mqa_logits {
namespace {

using support::Operands;
using support::PagedSpec;
using support::PagedWorkload;
using support::PrefillSpec;
using support::PrefillWorkload;
using support::WindowKind;

constexpr std::byte kPoison{0xff};  // NaN in fp32 and bf16
constexpr std::size_t kGuardBytes = 256;
constexpr int kMetadataWorkers = 4;

constexpr Format kFormats[] = {Format::kFP8, Format::kMXFP8, Format::kMXFP4};
constexpr WindowKind kWindowKinds[] = {WindowKind::kCausal, WindowKind::kRandom,
                                       WindowKind::kFull, WindowKind::kContextParallel};

// Weights and logits dtypes the contract allows together (bf16 weights need bf16 logits).
struct Dtypes {
  DType weights;
  DType logits;
};
constexpr Dtypes kDtypes[] = {{DType::kFloat32, DType::kFloat32},
                              {DType::kFloat32, DType::kBFloat16},
                              {DType::kBFloat16, DType::kBFloat16}};

// A poisoned logits buffer followed by poisoned guard bytes.
struct Output {
  std::vector<std::byte> bytes;
  std::size_t logits_bytes = 0;
  void* data() { return bytes.data(); }
};

Output poisoned_output(std::size_t logits_bytes) {
  return {std::vector<std::byte>(logits_bytes + kGuardBytes, kPoison), logits_bytes};
}

// Nothing written past the buffer, nor into the padding between a row's last column and the next
// row.
void expect_untouched_padding(const Output& out, const OutputLayout& layout, DType dtype) {
  const std::size_t element = dtype_size(dtype);
  for (std::size_t k = out.logits_bytes; k < out.bytes.size(); ++k) {
    ASSERT_EQ(out.bytes[k], kPoison) << "guard byte " << k - out.logits_bytes << " written";
  }
  for (std::int64_t row = 0; row < layout.rows; ++row) {
    const auto begin = static_cast<std::size_t>(row * layout.row_stride + layout.cols) * element;
    const auto end = static_cast<std::size_t>((row + 1) * layout.row_stride) * element;
    for (std::size_t k = begin; k < end; ++k) {
      ASSERT_EQ(out.bytes[k], kPoison) << "row " << row << " padding written";
    }
  }
}

Output run_prefill(const PrefillWorkload& w, int threads) {
  Output out = poisoned_output(w.logits_bytes());
  const auto in = w.host_inputs();
  const PrefillProblem problem = validate_prefill(in.q, in.kv, in.weights, in.k_start, in.k_end,
                                                  w.logits_view(out.data()), in.options);
  cpu::run_prefill(problem, threads);
  expect_untouched_padding(out, w.layout, w.spec.logits_dtype);
  return out;
}

struct PagedCall {
  std::vector<std::int32_t> schedule_meta;
  support::PagedInputs inputs;
};

PagedCall paged_call(const PagedWorkload& w) {
  PagedCall call{std::vector<std::int32_t>((kMetadataWorkers + 1) * 2), w.host_inputs()};
  const auto lens = w.context_lens();
  const bool lens_2d = w.spec.lens_2d && !w.spec.varlen_indices;
  host::paged_metadata(lens.data(), w.spec.batch, lens_2d ? w.spec.next_n : 1, lens_2d,
                       w.spec.varlen_indices ? w.indices().data() : nullptr, kMetadataWorkers,
                       call.schedule_meta.data());
  return call;
}

Output run_paged(const PagedWorkload& w, int threads, const PagedCall& call) {
  Output out = poisoned_output(w.logits_bytes());
  const auto& in = call.inputs;
  const TensorView meta = TensorView::contiguous(const_cast<std::int32_t*>(call.schedule_meta.data()),
                                                 DType::kInt32, {kMetadataWorkers + 1, 2});
  const PagedProblem problem =
      validate_paged(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                     w.max_context_len, w.logits_view(out.data()), in.options);
  cpu::run_paged(problem, threads);
  expect_untouched_padding(out, w.layout, w.spec.logits_dtype);
  return out;
}

Output run_paged(const PagedWorkload& w, int threads) { return run_paged(w, threads, paged_call(w)); }

// Per element against the quantized reference: the largest |out - ref| / |ref| inside the
// windows (ignoring references below 1e-9 of the row's largest, where relative error says
// nothing), and how many elements outside the windows no longer hold the poison.
struct ElementStats {
  double max_relative_error = 0.0;
  std::int64_t written_outside = 0;
};

template <class Workload>
ElementStats element_stats(const Workload& w, const Output& out) {
  ElementStats stats;
  const DType dtype = w.spec.logits_dtype;
  const std::size_t element = dtype_size(dtype);
  for (std::int64_t row = 0; row < w.layout.rows; ++row) {
    const auto ref = support::reference_row(w, row, Operands::kQuantized);
    double scale = 0.0;
    for (const double x : ref) {
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
    }
    for (std::int64_t col = 0; col < w.layout.cols; ++col) {
      if (!std::isfinite(ref[col])) {
        const std::byte* bytes = out.bytes.data() + (row * w.layout.row_stride + col) * element;
        stats.written_outside += std::any_of(bytes, bytes + element,
                                             [](std::byte b) { return b != kPoison; });
        continue;
      }
      if (std::fabs(ref[col]) <= 1e-9 * scale) continue;
      const double got = support::read_logit(out.bytes.data(), dtype, w.layout, row, col);
      stats.max_relative_error =
          std::max(stats.max_relative_error, std::fabs(got - ref[col]) / std::fabs(ref[col]));
    }
  }
  return stats;
}

// The contract's bound against the unquantized formula is a statement about the quantization error
// of realistic workloads (about 7e-4 for FP8 / MXFP8 and 1.25e-2 for MXFP4 on large ones, with
// single rows up to twice that): the metric over a handful of rows or elements is noise. It is
// asserted where the sample is large enough.
constexpr std::int64_t kStatisticalRows = 32;
constexpr std::int64_t kStatisticalElements = 4096;

template <class Workload>
void expect_within_spec_of_unquantized(const Workload& w, const Output& out,
                                       const std::string& label) {
  const auto result = support::verify_rows(w, out.bytes.data(), support::all_rows(w.layout.rows),
                                           Operands::kUnquantized);
  EXPECT_TRUE(result.ok) << label << ": " << result.first_failure;
}

// The backend equals the oracle (its own core evaluated per row) up to the final rounding (at most
// half an ulp of the logits dtype), writes nothing outside the windows without clean_logits (as
// cpu_backend.hpp documents), and, on large enough samples, matches the unquantized formula
// within the contract's tolerance.
template <class Workload>
void expect_matches_reference(const Workload& w, const Output& out, const std::string& label) {
  const bool bf16 = w.spec.logits_dtype == DType::kBFloat16;
  const auto rows = support::all_rows(w.layout.rows);
  const auto quantized = support::verify_rows(w, out.bytes.data(), rows, Operands::kQuantized,
                                              bf16 ? 0.0 : 1e-12);
  EXPECT_TRUE(quantized.ok) << label << ": " << quantized.first_failure;
  const double half_ulp = bf16 ? 0x1p-8 : 0x1p-24;  // relative to the value
  const ElementStats stats = element_stats(w, out);
  EXPECT_LE(stats.max_relative_error, half_ulp * (1 + 1e-9)) << label;
  if (!w.spec.clean_logits) EXPECT_EQ(stats.written_outside, 0) << label;

  if (quantized.rows_checked >= kStatisticalRows &&
      quantized.elements_checked >= kStatisticalElements) {
    expect_within_spec_of_unquantized(w, out, label);
  }
}

std::string describe(const PrefillSpec& s) {
  return std::string(format_name(s.format)) + " S=" + std::to_string(s.seq_len) +
         " T=" + std::to_string(s.seq_len_kv) + " H=" + std::to_string(s.num_heads) +
         " D=" + std::to_string(s.head_dim) + " w=" + dtype_name(s.weights_dtype) +
         " logits=" + dtype_name(s.logits_dtype) + " clean=" + std::to_string(s.clean_logits) +
         " max_seqlen_k=" + std::to_string(s.max_seqlen_k) +
         " windows=" + support::window_kind_name(s.windows) + " seed=" + std::to_string(s.seed);
}

std::string describe(const PagedSpec& s) {
  return std::string(format_name(s.format)) + " B=" + std::to_string(s.batch) +
         " N=" + std::to_string(s.next_n) + " H=" + std::to_string(s.num_heads) +
         " D=" + std::to_string(s.head_dim) + " block_kv=" + std::to_string(s.block_kv) +
         " avg=" + std::to_string(s.avg_context) + " lens_2d=" + std::to_string(s.lens_2d) +
         " varlen=" + std::to_string(s.varlen_indices) +
         " extra_stride=" + std::to_string(s.extra_block_stride_bytes) +
         " w=" + dtype_name(s.weights_dtype) + " logits=" + dtype_name(s.logits_dtype) +
         " clean=" + std::to_string(s.clean_logits) +
         " max_context_len=" + std::to_string(s.max_context_len) + " seed=" + std::to_string(s.seed);
}

std::int64_t pick(std::span<const int> values, std::size_t k) {
  return values[k % values.size()];
}

// ---- prefill -----------------------------------------------------------------------------------

TEST(CpuPrefill, MatchesReferenceOverOptionMatrix) {
  // Every head count but the largest (the slowest on the CPU), every head dim.
  const std::span kHeads(capabilities::kHeadCounts, std::size(capabilities::kHeadCounts) - 1);
  const auto& kDims = capabilities::kHeadDims;
  const auto& kMxfp4Dims = capabilities::kMxfp4HeadDims;
  std::size_t k = 0;
  for (const Format format : kFormats) {
    for (const Dtypes dtypes : kDtypes) {
      for (const bool clean : {true, false}) {
        for (const bool compressed : {false, true}) {
          for (const WindowKind windows : kWindowKinds) {
            ++k;
            PrefillSpec spec;
            spec.format = format;
            spec.seq_len = 9 + static_cast<std::int64_t>(k % 7) * 5;
            spec.seq_len_kv = 33 + static_cast<std::int64_t>(k % 5) * 29;
            spec.num_heads = pick(kHeads, k);
            spec.head_dim = format == Format::kMXFP4 ? pick(kMxfp4Dims, k) : pick(kDims, k / 3);
            spec.weights_dtype = dtypes.weights;
            spec.logits_dtype = dtypes.logits;
            spec.clean_logits = clean;
            spec.max_seqlen_k = compressed ? 1 + static_cast<std::int64_t>(k % 3) * 40 : 0;
            spec.windows = windows;
            spec.weights_row_stride = k % 4 == 0 ? spec.num_heads + 3 : 0;
            spec.seed = 1000 + k;
            const PrefillWorkload w = support::make_prefill_workload(spec);
            const Output out = run_prefill(w, 2);
            expect_matches_reference(w, out, describe(spec));
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

TEST(CpuPrefill, EmptyShapes) {
  for (const auto& [s, t] : {std::pair{0, 17}, std::pair{5, 0}, std::pair{0, 0}}) {
    for (const bool clean : {true, false}) {
      PrefillSpec spec{.format = Format::kMXFP8, .seq_len = s, .seq_len_kv = t, .num_heads = 8,
                       .head_dim = 64, .clean_logits = clean, .windows = WindowKind::kRandom,
                       .seed = 7};
      const PrefillWorkload w = support::make_prefill_workload(spec);
      const Output out = run_prefill(w, 2);
      expect_matches_reference(w, out, describe(spec));
    }
  }
}

TEST(CpuPrefill, ThreadCountDoesNotChangeBits) {
  for (const Format format : kFormats) {
    PrefillSpec spec{.format = format, .seq_len = 67, .seq_len_kv = 700, .num_heads = 16,
                     .head_dim = 128, .logits_dtype = DType::kBFloat16,
                     .windows = WindowKind::kRandom, .seed = 42};
    const PrefillWorkload w = support::make_prefill_workload(spec);
    const Output one = run_prefill(w, 1);
    for (const int threads : {2, 3, 8}) {
      EXPECT_EQ(one.bytes, run_prefill(w, threads).bytes) << describe(spec) << " threads=" << threads;
    }
  }
}

TEST(CpuPrefill, PublicApiMatchesBackend) {
  PrefillSpec spec{.format = Format::kFP8, .seq_len = 40, .seq_len_kv = 300, .num_heads = 32,
                   .head_dim = 64, .clean_logits = true, .max_seqlen_k = 0,
                   .windows = WindowKind::kCausal, .seed = 3};
  const PrefillWorkload w = support::make_prefill_workload(spec);
  Output out = poisoned_output(w.logits_bytes());
  const auto in = w.host_inputs();
  mqa_logits::mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, w.logits_view(out.data()),
                         in.options);
  EXPECT_EQ(out.bytes, run_prefill(w, 2).bytes);
}

// The DeepSeek V3.2 indexer's prefill shape: timed, not asserted; a few rows checked.
TEST(CpuPrefill, DeepSeekShapeTiming) {
  PrefillSpec spec{.format = Format::kFP8, .seq_len = 512, .seq_len_kv = 8192, .num_heads = 64,
                   .head_dim = 128, .windows = WindowKind::kCausal, .seed = 11};
  const PrefillWorkload w = support::make_prefill_workload(spec);
  const int threads = cpu::hardware_threads();
  const auto begin = std::chrono::steady_clock::now();
  const Output out = run_prefill(w, threads);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - begin;
  std::printf("[ timing   ] %s: %.2f s on %d threads\n", describe(spec).c_str(), seconds.count(),
              threads);
  const auto rows = support::sample_rows(spec.seq_len, 3, spec.seed);
  const auto check =
      support::verify_rows(w, out.bytes.data(), rows, Operands::kQuantized, 1e-12);
  EXPECT_TRUE(check.ok) << check.first_failure;
}

// Quantization error against the unquantized inputs, on samples large enough for the metric.
TEST(CpuPrefill, WithinSpecOfUnquantizedInputs) {
  std::uint64_t seed = 100;
  for (const Format format : kFormats) {
    for (const Dtypes dtypes : kDtypes) {
      PrefillSpec spec{.format = format, .seq_len = 48, .seq_len_kv = 400, .num_heads = 16,
                       .head_dim = 128, .weights_dtype = dtypes.weights,
                       .logits_dtype = dtypes.logits, .windows = WindowKind::kFull,
                       .seed = ++seed};
      const PrefillWorkload w = support::make_prefill_workload(spec);
      expect_within_spec_of_unquantized(w, run_prefill(w, 2), describe(spec));
    }
  }
}

// ---- prefill window patterns -------------------------------------------------------------------

// The windows engines send, at sizes that show their structure against the GPU kernels' query
// blocks of 256 / H rows (4 at H = 64, 32 at H = 8): packed requests shorter than a block, blocks
// straddling requests, single-token requests, sliding windows starting at any key.
struct PatternCase {
  std::string name;
  PrefillSpec spec;
};

PrefillSpec pattern_spec(std::int64_t s, std::int64_t t, std::int64_t heads, std::int64_t dim,
                         WindowKind windows) {
  return {.seq_len = s, .seq_len_kv = t, .num_heads = heads, .head_dim = dim, .windows = windows};
}

PrefillSpec packed_spec(std::vector<std::int64_t> lengths, std::int64_t heads, std::int64_t dim) {
  std::int64_t total = 0;
  for (const std::int64_t length : lengths) total += length;
  PrefillSpec spec = pattern_spec(total, total, heads, dim, WindowKind::kPacked);
  spec.request_lengths = std::move(lengths);
  return spec;
}

PrefillSpec sliding_spec(std::int64_t s, std::int64_t t, std::int64_t window, std::int64_t heads,
                         std::int64_t dim) {
  PrefillSpec spec = pattern_spec(s, t, heads, dim, WindowKind::kSliding);
  spec.sliding_window = window;
  return spec;
}

std::vector<PatternCase> pattern_cases() {
  return {
      {"square causal", pattern_spec(45, 45, 8, 64, WindowKind::kCausal)},
      {"packed 12 x 5 (blocks of 32 rows hold 6-7 requests)",
       packed_spec(std::vector<std::int64_t>(12, 5), 8, 128)},
      {"packed 16 x 4 (one block each)", packed_spec(std::vector<std::int64_t>(16, 4), 64, 128)},
      {"packed uneven with single tokens",
       packed_spec({1, 3, 1, 1, 7, 2, 33, 1, 5, 60}, 64, 64)},
      {"packed uneven drawn", packed_spec(support::uneven_request_lengths(9, 200, 5, 1, 64), 16, 32)},
      {"packed one request", packed_spec({50}, 32, 128)},
      {"sliding 1 key", sliding_spec(40, 300, 1, 32, 64)},
      {"sliding 7 keys", sliding_spec(40, 300, 7, 8, 128)},
      {"sliding 64 keys (S = T)", sliding_spec(90, 90, 64, 16, 128)},
      {"sliding wider than T", sliding_spec(40, 300, 1000, 64, 32)},
      {"sliding, S > T (early rows empty)", sliding_spec(50, 30, 10, 16, 64)},
      {"context parallel", pattern_spec(48, 400, 32, 64, WindowKind::kContextParallel)},
      {"random with empty rows", pattern_spec(60, 200, 8, 128, WindowKind::kRandom)},
  };
}

// The windows of each pattern written out independently of workload.cpp: the oracle reads the
// workload's k_start / k_end, so it cannot catch a wrong window there.
std::pair<std::int64_t, std::int64_t> expected_window(const PrefillSpec& spec, std::int64_t row) {
  const std::int64_t causal_end = spec.seq_len_kv - spec.seq_len + row + 1;
  switch (spec.windows) {
    case WindowKind::kCausal:
      return {0, causal_end};
    case WindowKind::kSliding:
      return {std::max<std::int64_t>(causal_end - spec.sliding_window, 0), causal_end};
    case WindowKind::kPacked: {
      std::int64_t first = 0;
      for (const std::int64_t length : spec.request_lengths) {
        if (row < first + length) return {first, row + 1};
        first += length;
      }
      break;
    }
    default:
      break;
  }
  ADD_FAILURE() << "no expected window for " << support::window_kind_name(spec.windows);
  return {0, 0};
}

TEST(CpuPrefill, PatternWindowsAreTheDefinedOnes) {
  for (const auto& [name, spec] : pattern_cases()) {
    const WindowKind kind = spec.windows;
    if (kind != WindowKind::kCausal && kind != WindowKind::kSliding && kind != WindowKind::kPacked) {
      continue;
    }
    const PrefillWorkload w = support::make_prefill_workload(spec);
    for (std::int64_t row = 0; row < spec.seq_len; ++row) {
      const auto [start, end] = expected_window(spec, row);
      ASSERT_EQ(w.k_start()[row], start) << name << " row " << row;
      ASSERT_EQ(w.k_end()[row], end) << name << " row " << row;
    }
  }
}

// Every pattern in every format against the oracle, each with and without clean_logits and
// with full and compressed output (max_seqlen_k cutting the longer windows).
TEST(CpuPrefill, PatternsMatchReference) {
  std::size_t k = 0;
  for (const auto& [name, base] : pattern_cases()) {
    for (const bool clean : {true, false}) {
      for (const bool compressed : {false, true}) {
        ++k;
        PrefillSpec spec = base;
        spec.format = kFormats[k % 3];
        if (spec.format == Format::kMXFP4 && spec.head_dim == 32) spec.head_dim = 64;
        spec.weights_dtype = kDtypes[k % 3].weights;
        spec.logits_dtype = kDtypes[k % 3].logits;
        spec.clean_logits = clean;
        spec.max_seqlen_k = compressed ? 20 : 0;
        spec.seed = 8000 + k;
        const PrefillWorkload w = support::make_prefill_workload(spec);
        const Output out = run_prefill(w, 2);
        expect_matches_reference(w, out, name + ": " + describe(spec));
        if (HasFailure()) return;
      }
    }
  }
}

// The random pattern really has the rows it is meant to test.
TEST(CpuPrefill, RandomWindowsHaveEmptyAndInvertedRows) {
  const PrefillWorkload w =
      support::make_prefill_workload(pattern_spec(60, 200, 8, 128, WindowKind::kRandom));
  std::int64_t empty = 0, inverted = 0;
  for (std::int64_t row = 0; row < 60; ++row) {
    empty += w.k_start()[row] == w.k_end()[row];
    inverted += w.k_start()[row] > w.k_end()[row];
  }
  EXPECT_GT(empty, 0);
  EXPECT_GT(inverted, 0);
}

TEST(CpuPrefill, PatternSpecsRefuseWhatDoesNotFit) {
  const auto refused = [](PrefillSpec spec) {
    EXPECT_THROW(support::make_prefill_workload(spec), std::invalid_argument)
        << describe(spec);
  };
  PrefillSpec packed = packed_spec({3, 4}, 8, 64);
  ++packed.seq_len;  // sum below S
  refused(packed);
  packed = packed_spec({3, 4}, 8, 64);
  --packed.seq_len_kv;  // sum above T
  refused(packed);
  refused(packed_spec({3, 0, 4}, 8, 64));
  refused(pattern_spec(5, 5, 8, 64, WindowKind::kPacked));  // tokens but no requests
  PrefillSpec causal = pattern_spec(7, 7, 8, 64, WindowKind::kCausal);
  causal.request_lengths = {3, 4};
  refused(causal);
  causal.request_lengths.clear();
  causal.sliding_window = 4;
  refused(causal);
  refused(sliding_spec(7, 7, 0, 8, 64));
  refused(sliding_spec(7, 7, -3, 8, 64));
  // No requests and no tokens is a valid (empty) packed call.
  const PrefillWorkload empty = support::make_prefill_workload(packed_spec({}, 8, 64));
  EXPECT_EQ(empty.layout.rows, 0);
}

// Patterns of one shape share queries and keys: rewriting a workload's windows gives exactly
// the workload made for the new windows.
TEST(CpuPrefill, RewrittenWindowsEqualAFreshWorkload) {
  PrefillSpec spec = pattern_spec(64, 64, 16, 64, WindowKind::kCausal);
  spec.seed = 9;
  PrefillWorkload w = support::make_prefill_workload(spec);
  spec.windows = WindowKind::kPacked;
  spec.request_lengths = support::uneven_request_lengths(5, 64, 9, 1, 32);
  w.spec = spec;
  support::rewrite_windows(w);
  const PrefillWorkload fresh = support::make_prefill_workload(spec);
  for (std::size_t slot = 0; slot < PrefillWorkload::kNumSlots; ++slot) {
    EXPECT_EQ(w.buffers[slot].bytes, fresh.buffers[slot].bytes) << w.buffers[slot].name;
  }
  w.spec.sliding_window = 3;  // does not fit packed windows: refused, windows left as they were
  EXPECT_THROW(support::rewrite_windows(w), std::invalid_argument);
  EXPECT_EQ(w.buffers[PrefillWorkload::kEnd].bytes, fresh.buffers[PrefillWorkload::kEnd].bytes);
}

TEST(CpuPrefill, UnevenRequestLengths) {
  for (const auto [count, total, min_length, max_length] :
       {std::array<std::int64_t, 4>{12, 32768, 256, 16384}, {2, 16384, 256, 16384},
        {64, 32768, 256, 16384}, {40, 1000, 1, 100}, {3, 3, 1, 1}, {0, 0, 1, 8}}) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      const auto lengths =
          support::uneven_request_lengths(count, total, seed, min_length, max_length);
      ASSERT_EQ(static_cast<std::int64_t>(lengths.size()), count);
      std::int64_t sum = 0;
      for (const std::int64_t length : lengths) {
        EXPECT_GE(length, min_length);
        EXPECT_LE(length, max_length);
        sum += length;
      }
      EXPECT_EQ(sum, total);
      EXPECT_EQ(lengths,
                support::uneven_request_lengths(count, total, seed, min_length, max_length));
    }
  }
  // Uneven indeed: 12 requests of 32768 tokens span more than an octave.
  const auto lengths = support::uneven_request_lengths(12, 32768, 1, 256, 16384);
  EXPECT_GT(*std::max_element(lengths.begin(), lengths.end()),
            4 * *std::min_element(lengths.begin(), lengths.end()));
  EXPECT_THROW(support::uneven_request_lengths(3, 2, 1, 1, 8), std::invalid_argument);
  EXPECT_THROW(support::uneven_request_lengths(3, 25, 1, 1, 8), std::invalid_argument);
  EXPECT_THROW(support::uneven_request_lengths(3, 9, 1, 0, 8), std::invalid_argument);
}

// ---- paged -------------------------------------------------------------------------------------

TEST(CpuPaged, MatchesReferenceOverOptionMatrix) {
  constexpr int kHeads[] = {8, 16, 64};   // a subset for the CPU's time, in an order that
  constexpr int kDims[] = {64, 128, 32};  // meets every format and next_n
  std::size_t k = 0;
  for (const Format format : kFormats) {
    for (std::int64_t next_n = 1; next_n <= capabilities::kMaxNextN; ++next_n) {
      for (const bool lens_2d : {false, true}) {
        ++k;
        const Dtypes dtypes = kDtypes[k % 3];
        PagedSpec spec;
        spec.format = format;
        spec.batch = 1 + static_cast<std::int64_t>(k % 4);
        spec.next_n = next_n;
        spec.num_heads = pick(kHeads, k);
        spec.head_dim = format == Format::kMXFP4 ? 64 + 64 * (k % 2) : pick(kDims, k / 2);
        spec.block_kv = k % 2 == 0 ? 32 : 64;
        spec.avg_context = 60 + static_cast<std::int64_t>(k % 5) * 37;
        spec.context_jitter = 0.9;
        spec.lens_2d = lens_2d;
        spec.extra_block_stride_bytes = k % 3 == 0 ? 4 * static_cast<std::int64_t>(k % 7 + 1) : 0;
        spec.weights_dtype = dtypes.weights;
        spec.logits_dtype = dtypes.logits;
        spec.clean_logits = k % 2 == 1;
        spec.max_context_len = k % 5 == 0 ? spec.avg_context / 2 : 0;  // clamps long rows
        spec.seed = 2000 + k;
        const PagedWorkload w = support::make_paged_workload(spec);
        expect_matches_reference(w, run_paged(w, 2), describe(spec));
        if (HasFailure()) return;
      }
    }
  }
}

TEST(CpuPaged, VarlenIndices) {
  std::size_t k = 0;
  for (const Format format : kFormats) {
    for (const int block_kv : {32, 64}) {
      for (const bool clean : {false, true}) {
        ++k;
        PagedSpec spec{.format = format, .batch = 11, .num_heads = 16, .head_dim = 128,
                       .block_kv = block_kv, .avg_context = 150, .context_jitter = 0.8,
                       .varlen_indices = true, .extra_block_stride_bytes = 16,
                       .logits_dtype = k % 2 ? DType::kBFloat16 : DType::kFloat32,
                       .clean_logits = clean, .seed = 3000 + k};
        const PagedWorkload w = support::make_paged_workload(spec);
        expect_matches_reference(w, run_paged(w, 2), describe(spec));
      }
    }
  }
}

// Contexts 0, 1, one block and one block + 1, in both length forms.
TEST(CpuPaged, EdgeContextLengths) {
  for (const int block_kv : {32, 64}) {
    for (const bool lens_2d : {false, true}) {
      const std::int32_t bkv = block_kv;
      PagedSpec spec{.format = Format::kMXFP8, .batch = 4, .next_n = 2, .num_heads = 8,
                     .head_dim = 64, .block_kv = block_kv, .lens_2d = lens_2d,
                     .clean_logits = true, .seed = 4000};
      spec.explicit_context_lens = lens_2d ? std::vector<std::int32_t>{0, 0, 0, 1, bkv, bkv,
                                                                       bkv + 1, -3}
                                           : std::vector<std::int32_t>{0, 1, bkv, bkv + 1};
      const PagedWorkload w = support::make_paged_workload(spec);
      expect_matches_reference(w, run_paged(w, 2), describe(spec));
    }
  }
}

// Sets block-table entry (row, column) of a varlen workload in every row of the row's sequence,
// whose rows must hold the same blocks.
void set_sequence_entry(PagedWorkload& w, std::int64_t row, std::int64_t column, std::int32_t id) {
  auto* table = reinterpret_cast<std::int32_t*>(w.buffers[PagedWorkload::kBlockTable].bytes.data());
  for (std::int64_t r = 0; r < w.num_rows; ++r) {
    if (w.sequence(r) == w.sequence(row)) table[r * w.max_blocks + column] = id;
  }
}

// The clamping rules of problem.hpp: invalid block ids, and a block table narrower than the
// contexts (varlen form: a sequence's rows alike).
TEST(CpuPaged, ClampingRules) {
  PagedSpec spec{.format = Format::kFP8, .batch = 9, .num_heads = 8, .head_dim = 64,
                 .block_kv = 32, .avg_context = 200, .context_jitter = 0.5,
                 .varlen_indices = true, .clean_logits = true, .seed = 5000};
  PagedWorkload w = support::make_paged_workload(spec);
  set_sequence_entry(w, 0, 1, -1);
  set_sequence_entry(w, w.num_rows - 1, 2, static_cast<std::int32_t>(w.num_blocks));
  const Output full = run_paged(w, 2);
  expect_matches_reference(w, full, describe(spec));

  // Only the first block-table column visible: every row stops at block_kv keys.
  PagedCall call = paged_call(w);
  call.inputs.block_table.shape[1] = 1;
  const Output narrow = run_paged(w, 2, call);
  for (std::int64_t row = 0; row < w.num_rows; ++row) {
    for (std::int64_t col = 0; col < w.layout.cols; ++col) {
      const double wide = support::read_logit(full.bytes.data(), DType::kFloat32, w.layout, row, col);
      const double got = support::read_logit(narrow.bytes.data(), DType::kFloat32, w.layout, row, col);
      const double want = col < spec.block_kv ? wide : -std::numeric_limits<double>::infinity();
      ASSERT_EQ(got, want) << "row " << row << " column " << col;
    }
  }
}

// Unchecked inputs (check_inputs false, as the GPU takes them): a varlen sequence whose rows hold
// different blocks. A row may read its keys through another row of its sequence, but with
// clean_logits every element of every row is still written (-inf where that row's block is
// invalid), never left as it was.
TEST(CpuPaged, CleanWritesEveryElementWhereASequencesRowsDisagree) {
  PagedSpec spec{.format = Format::kFP8, .batch = 12, .num_heads = 8, .head_dim = 64,
                 .block_kv = 32, .avg_context = 150, .varlen_indices = true,
                 .clean_logits = true, .seed = 5100};
  PagedWorkload w = support::make_paged_workload(spec);
  std::int64_t first = 0;  // the first row of a sequence of two rows or more
  while (first + 1 < w.num_rows && w.sequence(first + 1) != w.sequence(first)) ++first;
  ASSERT_LT(first + 1, w.num_rows) << "no sequence of two rows";
  auto* table = reinterpret_cast<std::int32_t*>(w.buffers[PagedWorkload::kBlockTable].bytes.data());
  table[first * w.max_blocks] = -1;  // the sequence's first row: block 0 invalid, the others' valid
  const Output out = run_paged(w, 2);
  std::int64_t unwritten = 0;
  for (std::int64_t row = 0; row < w.num_rows; ++row) {
    for (std::int64_t col = 0; col < w.layout.cols; ++col) {
      unwritten += std::isnan(
          support::read_logit(out.bytes.data(), DType::kFloat32, w.layout, row, col));
    }
  }
  EXPECT_EQ(unwritten, 0);
}

TEST(CpuPaged, WithinSpecOfUnquantizedInputs) {
  std::uint64_t seed = 200;
  for (const Format format : kFormats) {
    for (const Dtypes dtypes : kDtypes) {
      PagedSpec spec{.format = format, .batch = 12, .next_n = 3, .num_heads = 16,
                     .head_dim = 128, .block_kv = 64, .avg_context = 300, .context_jitter = 0.3,
                     .weights_dtype = dtypes.weights, .logits_dtype = dtypes.logits,
                     .seed = ++seed};
      const PagedWorkload w = support::make_paged_workload(spec);
      expect_within_spec_of_unquantized(w, run_paged(w, 2), describe(spec));
    }
  }
}

TEST(CpuPaged, ThreadCountDoesNotChangeBits) {
  for (const Format format : kFormats) {
    PagedSpec spec{.format = format, .batch = 3, .next_n = 4, .num_heads = 16, .head_dim = 128,
                   .block_kv = 64, .avg_context = 900, .context_jitter = 0.5,
                   .logits_dtype = DType::kBFloat16, .clean_logits = true, .seed = 6000};
    const PagedWorkload w = support::make_paged_workload(spec);
    const Output one = run_paged(w, 1);
    for (const int threads : {2, 5}) {
      EXPECT_EQ(one.bytes, run_paged(w, threads).bytes) << describe(spec) << " threads=" << threads;
    }
  }
}

TEST(CpuPaged, PublicApiMatchesBackend) {
  PagedSpec spec{.format = Format::kMXFP4, .batch = 5, .next_n = 3, .num_heads = 32,
                 .head_dim = 128, .block_kv = 64, .avg_context = 300, .context_jitter = 0.5,
                 .clean_logits = true, .seed = 7000};
  const PagedWorkload w = support::make_paged_workload(spec);
  const PagedCall call = paged_call(w);
  const TensorView meta = TensorView::contiguous(const_cast<std::int32_t*>(call.schedule_meta.data()),
                                                 DType::kInt32, {kMetadataWorkers + 1, 2});
  Output out = poisoned_output(w.logits_bytes());
  const auto& in = call.inputs;
  paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                   w.max_context_len, w.logits_view(out.data()), in.options);
  EXPECT_EQ(out.bytes, run_paged(w, 2).bytes);
}

// ---- the arithmetic anchor ---------------------------------------------------------------------
//
// support::reference_row computes the logits of the stored operands with this backend's own
// float64 core (the library's one C++ oracle), so the comparisons above check the windows,
// clamping, compressed output, stores and threading, but no longer the arithmetic. These tests
// anchor it: tiny calls through the public entry point against values derived by hand. The
// Python tests keep an independent numpy formula on purpose (tests/python/reference.py).

constexpr std::int64_t kTinyHeads = 8;  // the smallest head count the library accepts

// e4m3 codes, and UE8M0 scale bytes (2^(code - 127)), of easy values.
constexpr std::uint8_t kE4m3Zero = 0x00;
constexpr std::uint8_t kE4m3One = 0x38;
constexpr std::uint8_t kE4m3Two = 0x40;
constexpr std::uint8_t kE4m3MinusOne = 0xb8;
constexpr std::int32_t kUe8m0Half = 126;
constexpr std::int32_t kUe8m0One = 127;
constexpr std::int32_t kUe8m0Two = 128;

// Packed UE8M0 scales of a two-block (D = 64) MX vector: block b in byte b.
constexpr std::int32_t packed_scales(std::int32_t block0, std::int32_t block1) {
  return block0 | block1 << 8;
}

// `count` codes: the first half `first`, the second half `second` (for MX at D = 64: one per
// block).
std::vector<std::uint8_t> halves(std::int64_t count, std::uint8_t first, std::uint8_t second) {
  std::vector<std::uint8_t> codes(count, first);
  std::fill(codes.begin() + count / 2, codes.end(), second);
  return codes;
}

// e2m1 pairs, one byte each (element 2k in the low nibble): both 1.0, both 2.0, both -1.0, and
// 1.0 below 3.0 or 6.0.
constexpr std::uint8_t kE2m1Ones = 0x22;
constexpr std::uint8_t kE2m1Twos = 0x44;
constexpr std::uint8_t kE2m1MinusOnes = 0xaa;
constexpr std::uint8_t kE2m1OneThree = 0x52;
constexpr std::uint8_t kE2m1OneSix = 0x72;

// One query row (S = 1) against keys 0 and 1 (T = 2): heads 0 and 1 as given; heads 2 to 7 have
// zero queries with unit scales and weight 0.5, so they add 0.5 * relu(0) = 0.
struct TinyPrefill {
  Format format = Format::kFP8;
  std::int64_t head_dim = 0;
  std::array<std::vector<std::uint8_t>, 2> heads;  // stored codes of query heads 0 and 1
  std::array<std::int32_t, 2> head_scales{};       // their packed UE8M0 scales (MX)
  std::array<float, 2> weights{};                  // of heads 0 and 1
  std::array<std::vector<std::uint8_t>, 2> keys;   // stored codes of keys 0 and 1
  std::array<std::uint32_t, 2> key_scales{};       // fp32 bits (FP8) or packed UE8M0 (MX)
};

// The call's logits (fp32), through mqa_logits() on host tensors: the CPU backend.
std::array<float, 2> tiny_prefill_logits(TinyPrefill p) {
  const bool fp4 = p.format == Format::kMXFP4;
  const std::int64_t dim = fp4 ? p.head_dim / 2 : p.head_dim;  // stored bytes a vector
  const DType codes = fp4 ? DType::kUInt8 : DType::kFloat8E4M3;
  std::vector<std::uint8_t> q(kTinyHeads * dim, kE4m3Zero);  // zero in e2m1 too
  std::vector<std::int32_t> q_scales(kTinyHeads, packed_scales(kUe8m0One, kUe8m0One));
  std::vector<float> weights(kTinyHeads, 0.5f);
  std::vector<std::uint8_t> kv;
  for (std::size_t k = 0; k < 2; ++k) {
    std::copy(p.heads[k].begin(), p.heads[k].end(), q.begin() + static_cast<std::int64_t>(k) * dim);
    q_scales[k] = p.head_scales[k];
    weights[k] = p.weights[k];
    kv.insert(kv.end(), p.keys[k].begin(), p.keys[k].end());
  }
  const bool mx = p.format != Format::kFP8;
  QuantizedTensor q_view{
      TensorView::contiguous(q.data(), codes, {1, kTinyHeads, dim})};
  if (mx) q_view.scales = TensorView::contiguous(q_scales.data(), DType::kInt32, {1, kTinyHeads});
  const QuantizedTensor kv_view{
      TensorView::contiguous(kv.data(), codes, {2, dim}),
      TensorView::contiguous(p.key_scales.data(), mx ? DType::kInt32 : DType::kFloat32, {2})};
  std::int32_t start = 0;
  std::int32_t end = 2;
  const OutputLayout layout = mqa_logits_output_layout(1, 2, 0, DType::kFloat32);
  std::vector<float> out(layout.row_stride, std::numeric_limits<float>::quiet_NaN());
  TensorView logits = TensorView::contiguous(out.data(), DType::kFloat32, {1, 2});
  logits.strides[0] = layout.row_stride;
  mqa_logits::mqa_logits(q_view, kv_view,
                         TensorView::contiguous(weights.data(), DType::kFloat32, {1, kTinyHeads}),
                         TensorView::contiguous(&start, DType::kInt32, {1}),
                         TensorView::contiguous(&end, DType::kInt32, {1}), logits);
  return {out[0], out[1]};
}

// Each case's logits as derived by hand in its comment.
TEST(CpuArithmetic, LogitsAreTheHandDerivedValues) {
  struct Case {
    TinyPrefill call;
    std::array<float, 2> logits;
  };
  const Case cases[] = {
      // FP8, D = 32: s = kscale * q.k, the key scale applied per key.
      //   q0 = 32 x 1             q1 = 16 x -1, 16 x 2        w = (0.25, -1)
      //   k0 = 32 x 1, scale 0.5: q0.k0 = 32, q1.k0 = -16 + 32 = 16
      //     s = (16, 8): logit = 0.25 * 16 - 1 * 8 = -4
      //   k1 = 16 x 2, 16 x -1, scale 2: q0.k1 = 32 - 16 = 16, q1.k1 = -32 - 32 = -64
      //     s = (32, -128): the relu drops head 1, logit = 0.25 * 32 = 8
      {{.format = Format::kFP8,
        .head_dim = 32,
        .heads = {halves(32, kE4m3One, kE4m3One), halves(32, kE4m3MinusOne, kE4m3Two)},
        .weights = {0.25f, -1.0f},
        .keys = {halves(32, kE4m3One, kE4m3One), halves(32, kE4m3Two, kE4m3MinusOne)},
        .key_scales = {std::bit_cast<std::uint32_t>(0.5f), std::bit_cast<std::uint32_t>(2.0f)}},
       {-4.0f, 8.0f}},
      // MXFP8, D = 64 (two blocks): s = the sum over blocks of qscale * kscale * block dot
      // (written in that order below), the relu on the sum, not per block.
      //   q0 = 64 x 1, scales (1, 2)      q1 = 32 x 1, 32 x -1, scales (2, 1)      w = (0.25, -1)
      //   k0 = 64 x 1, scales (1, 0.5):
      //     s0 = 1 * 1 * 32 + 2 * 0.5 * 32 = 64, s1 = 2 * 1 * 32 + 1 * 0.5 * -32 = 48
      //     logit = 0.25 * 64 - 1 * 48 = -32
      //   k1 = 32 x 1, 32 x 2, scales (1, 2):
      //     s0 = 1 * 1 * 32 + 2 * 2 * 64 = 288, s1 = 2 * 1 * 32 + 1 * 2 * -64 = -64
      //     logit = 0.25 * 288 = 72 (a relu per block would keep head 1's 64 of block 0: 8)
      {{.format = Format::kMXFP8,
        .head_dim = 64,
        .heads = {halves(64, kE4m3One, kE4m3One), halves(64, kE4m3One, kE4m3MinusOne)},
        .head_scales = {packed_scales(kUe8m0One, kUe8m0Two), packed_scales(kUe8m0Two, kUe8m0One)},
        .weights = {0.25f, -1.0f},
        .keys = {halves(64, kE4m3One, kE4m3One), halves(64, kE4m3One, kE4m3Two)},
        .key_scales = {packed_scales(kUe8m0One, kUe8m0Half), packed_scales(kUe8m0One, kUe8m0Two)}},
       {-32.0f, 72.0f}},
      // MXFP4, D = 64 (two blocks of 16 bytes), e2m1 values decoded from their nibbles:
      //   q0 = 32 x 1 | 16 x (1, 3), scales (1, 1)    q1 = 32 x -1 | 32 x 2, scales (2, 0.5)
      //   w = (0.25, -1)
      //   k0 = 32 x 1 | 16 x (1, 6), scales (1, 1):
      //     s0 = 32 + (16 * 1 + 16 * 18) = 336, s1 = 2 * -32 + 0.5 * (16 * 2 + 16 * 12) = 48
      //     logit = 0.25 * 336 - 1 * 48 = 36
      //   k1 = 32 x 2 | 32 x 2, scales (0.5, 2):
      //     s0 = 0.5 * 64 + 2 * (16 * 2 + 16 * 6) = 288, s1 = 2 * 0.5 * -64 + 0.5 * 2 * 128 = 64
      //     logit = 0.25 * 288 - 1 * 64 = 8
      {{.format = Format::kMXFP4,
        .head_dim = 64,
        .heads = {halves(32, kE2m1Ones, kE2m1OneThree), halves(32, kE2m1MinusOnes, kE2m1Twos)},
        .head_scales = {packed_scales(kUe8m0One, kUe8m0One), packed_scales(kUe8m0Two, kUe8m0Half)},
        .weights = {0.25f, -1.0f},
        .keys = {halves(32, kE2m1Ones, kE2m1OneSix), halves(32, kE2m1Twos, kE2m1Twos)},
        .key_scales = {packed_scales(kUe8m0One, kUe8m0One), packed_scales(kUe8m0Half, kUe8m0Two)}},
       {36.0f, 8.0f}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(tiny_prefill_logits(c.call), c.logits) << format_name(c.call.format);
  }
}

// double_to_bf16 rounds once: values just above a bf16 tie must round up although their float
// rounding lands exactly on the tie.
TEST(CpuKernel, DoubleToBf16RoundsOnce) {
  const double tie = 1.0 + 0x1p-8;  // halfway between bf16 1.0 and 1.0078125
  EXPECT_EQ(cpu::double_to_bf16(tie + 0x1p-40), 0x3f81);
  EXPECT_EQ(cpu::double_to_bf16(tie), 0x3f80);  // ties to even
  EXPECT_EQ(cpu::double_to_bf16(-(tie + 0x1p-40)), 0xbf81);
  EXPECT_EQ(cpu::double_to_bf16(1e39), 0x7f80);
  EXPECT_EQ(cpu::double_to_bf16(-1e-50), 0x8000);
}

}  // namespace
}  // namespace mqa_logits
