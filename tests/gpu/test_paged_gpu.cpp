// GPU decode (paged_mqa_logits) against the CPU backend: the option matrix (every head count,
// head dim, next_n 1-8, block_kv, dtypes, 1-D / 2-D lengths, varlen indices, block strides TMA
// can and cannot address, clean_logits), edge cases, repeatability, device metadata == host
// metadata, and nothing written outside the output. Skipped where no sm_90 GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mqa_logits/capabilities.hpp"
#include "gpu/gpu_test_support.hpp"

namespace mqa_logits {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuTest;
using gpu_test::kGpu;
using support::PagedSpec;
using support::PagedWorkload;

// What a case changes in the inputs besides the workload (both backends see the same inputs).
struct Variation {
  std::int64_t extra_table_stride = 0;  // block-table rows this many entries further apart
  int invalid_every = 0;  // every k-th used block-table entry made invalid (-5 or >= num_blocks)
  int workers = 0;        // metadata workers; 0: get_num_sms()
};

// The workload with every k-th used block-table entry made invalid (-5 or >= num_blocks), in
// its own table too, so that the float64 oracle sees the table both backends see. The rows of a
// varlen sequence stay alike: each copies the row before it in the sequence.
PagedWorkload with_invalid_blocks(PagedWorkload w, int invalid_every) {
  if (invalid_every == 0) return w;
  auto* entries = reinterpret_cast<std::int32_t*>(w.buffers[PagedWorkload::kBlockTable].bytes.data());
  std::int64_t used = 0;
  for (std::int64_t row = 0; row < w.table_rows; ++row) {
    std::int32_t* row_entries = entries + row * w.max_blocks;
    if (w.spec.varlen_indices && row > 0 && w.sequence(row) == w.sequence(row - 1)) {
      std::copy_n(row_entries - w.max_blocks, w.max_blocks, row_entries);
      continue;
    }
    for (std::int64_t k = 0; k < w.max_blocks; ++k) {
      if (row_entries[k] >= 0 && ++used % invalid_every == 0) {
        row_entries[k] = (used / invalid_every) % 2 == 0 ? -5 : static_cast<std::int32_t>(w.num_blocks + 3);
      }
    }
  }
  return w;
}

// The block table of a case as int32 [table_rows, stride].
struct Table {
  std::vector<std::int32_t> entries;
  std::int64_t stride = 0;
};

Table make_table(const PagedWorkload& w, const Variation& v) {
  Table t;
  t.stride = w.max_blocks + v.extra_table_stride;
  t.entries.assign(static_cast<std::size_t>(w.table_rows * t.stride), -1);
  const auto source = w.block_table();
  for (std::int64_t row = 0; row < w.table_rows; ++row) {
    std::copy_n(source.begin() + row * w.max_blocks, w.max_blocks, t.entries.begin() + row * t.stride);
  }
  return t;
}

TensorView table_view(void* data, const PagedWorkload& w, const Table& t, Device device) {
  TensorView view =
      TensorView::contiguous(data, DType::kInt32, {w.table_rows, w.max_blocks}, device);
  view.strides[0] = t.stride;
  return view;
}

TensorView meta_view(void* data, int workers, Device device) {
  return TensorView::contiguous(data, DType::kInt32, {schedule_meta_rows(workers), 2}, device);
}

// One case on both backends. The CPU runs with clean_logits so that -inf marks the windows, and
// without its input checks: what the GPU gives for inputs it does not check (invalid block ids,
// lengths past the table or max_context_len).
class PagedCase {
 public:
  PagedCase(const PagedSpec& spec, const Variation& variation)
      : workload_(with_invalid_blocks(support::make_paged_workload(spec), variation.invalid_every)),
        variation_(variation),
        workers_(variation.workers > 0 ? variation.workers : get_num_sms()),
        table_(make_table(workload_, variation)),
        device_(gpu_test::upload(workload_.buffers)),
        device_table_(gpu_test::upload_values(table_.entries)),
        device_meta_(static_cast<std::size_t>(schedule_meta_rows(workers_)) * 2 *
                     sizeof(std::int32_t)),
        out_(workload_.logits_bytes()) {}

  const PagedWorkload& workload() const { return workload_; }

  std::vector<std::byte> cpu_logits() {
    auto in = workload_.host_inputs();
    in.options.clean_logits = true;
    in.options.check_inputs = false;
    in.block_table = table_view(table_.entries.data(), workload_, table_, {});
    host_meta_.assign(static_cast<std::size_t>(schedule_meta_rows(workers_)) * 2, -7);
    const TensorView meta = meta_view(host_meta_.data(), workers_, {});
    get_paged_mqa_logits_metadata(in.context_lens, workload_.spec.block_kv, workers_, meta,
                                  in.options.indices);
    std::vector<std::byte> out(workload_.logits_bytes());
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                     workload_.max_context_len, workload_.logits_view(out.data()), in.options);
    return out;
  }

  // Device metadata, then the kernel on a poisoned (NaN) output.
  std::vector<std::byte> gpu_logits(std::optional<bool> check_inputs = {}) {
    run_gpu(check_inputs);
    return out_.download();
  }

  // The first `cols` logits of row `row` of the output gpu_logits / run_gpu wrote.
  std::vector<std::byte> gpu_row(std::int64_t row, std::int64_t cols) const {
    const std::size_t element = dtype_size(workload_.spec.logits_dtype);
    return out_.download(static_cast<std::size_t>(row * workload_.layout.row_stride) * element,
                         static_cast<std::size_t>(cols) * element);
  }

  // gpu_logits, the output left on the device.
  void run_gpu(std::optional<bool> check_inputs = {}) {
    out_.poison();
    auto in = workload_.inputs(device_.pointers, kGpu);
    in.options.check_inputs = check_inputs;
    in.block_table = table_view(device_table_.data(), workload_, table_, kGpu);
    const TensorView meta = meta_view(device_meta_.data(), workers_, kGpu);
    get_paged_mqa_logits_metadata(in.context_lens, workload_.spec.block_kv, workers_, meta,
                                  in.options.indices);
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                     workload_.max_context_len, workload_.logits_view(out_.data(), kGpu),
                     in.options);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // The kernel with metadata that is not the call's (`meta`, rows for this case's workers): the
  // output is unspecified, but the call completes and writes nothing outside the logits.
  void expect_stays_inside_with(const std::vector<std::int32_t>& meta) {
    gpu_test::GuardedOutput out(workload_.logits_bytes());
    const DeviceBuffer device_meta = gpu_test::upload_values(meta);
    auto in = workload_.inputs(device_.pointers, kGpu);
    in.block_table = table_view(device_table_.data(), workload_, table_, kGpu);
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table,
                     meta_view(device_meta.data(), workers_, kGpu), workload_.max_context_len,
                     workload_.logits_view(out.data(), kGpu), in.options);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_TRUE(out.guards_untouched()) << "written outside the logits";
  }
  int workers() const { return workers_; }

  // Gives each varlen sequence another label (label -> relabelled(label)), on both backends'
  // inputs; the metadata does not depend on the labels.
  template <typename F>
  void relabel(F relabelled) {
    auto& bytes = workload_.buffers[PagedWorkload::kIndices].bytes;
    auto* labels = reinterpret_cast<std::int32_t*>(bytes.data());
    for (std::size_t r = 0; r < bytes.size() / sizeof(std::int32_t); ++r) {
      labels[r] = relabelled(labels[r]);
    }
    check_cuda(cudaMemcpy(device_.buffers[PagedWorkload::kIndices].data(), bytes.data(),
                          bytes.size(), cudaMemcpyHostToDevice),
               "cudaMemcpy indices");
  }

  std::vector<std::int32_t> device_metadata() const {
    const auto bytes = device_meta_.download();
    std::vector<std::int32_t> meta(bytes.size() / sizeof(std::int32_t));
    std::memcpy(meta.data(), bytes.data(), bytes.size());
    return meta;
  }
  const std::vector<std::int32_t>& host_metadata() const { return host_meta_; }
  bool output_untouched() const { return out_.untouched(); }

 private:
  PagedWorkload workload_;
  Variation variation_;
  int workers_;
  Table table_;
  gpu_test::DeviceInputs device_;
  DeviceBuffer device_table_;
  DeviceBuffer device_meta_;
  DeviceBuffer out_;
  std::vector<std::int32_t> host_meta_;
};

std::string describe(const PagedSpec& s) {
  return "B" + std::to_string(s.batch) + "_N" + std::to_string(s.next_n) + "_H" +
         std::to_string(s.num_heads) + "_D" + std::to_string(s.head_dim) + "_bk" +
         std::to_string(s.block_kv) + "_w" + dtype_name(s.weights_dtype) + "_out" +
         dtype_name(s.logits_dtype) + (s.clean_logits ? "_clean" : "_unclean") +
         (s.lens_2d ? "_lens2d" : "_lens1d") + (s.varlen_indices ? "_varlen" : "") + "_pad" +
         std::to_string(s.extra_block_stride_bytes);
}

// Runs the spec on both backends and compares them; a failure names the spec.
void run_and_compare(const PagedSpec& spec, const Variation& variation = {}) {
  SCOPED_TRACE(describe(spec));
  PagedCase c(spec, variation);
  const auto cpu = c.cpu_logits();
  const auto gpu = c.gpu_logits();
  EXPECT_EQ(c.device_metadata(), c.host_metadata()) << "device metadata differs from host";
  gpu_test::expect_matches_cpu(c.workload(), gpu, cpu);
  gpu_test::expect_padding_untouched(c.workload(), gpu);
}

// ---- the option matrix ----------------------------------------------------------------------

// Every (D, H, next_n) (so every kernel instance), plus the varlen form per (D, H); dtypes,
// block_kv, clean, 1-D / 2-D lengths and block padding (multiples of 16 for TMA, and 4 / 12 for
// the cp.async path) cycle so that each value meets the others.
std::vector<PagedSpec> option_matrix() {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kFloat32, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kBFloat16}};
  const std::int64_t paddings[] = {0, 16, 4, 0, 12, 64};
  std::vector<PagedSpec> specs;
  int index = 0;
  for (int dim : capabilities::kHeadDims) {
    for (int heads : capabilities::kHeadCounts) {
      for (int next_n = 0; next_n <= capabilities::kMaxNextN; ++next_n) {  // 0: the varlen form
        PagedSpec s;
        s.varlen_indices = next_n == 0;
        s.batch = s.varlen_indices ? 11 : 2 + index % 4;
        s.next_n = s.varlen_indices ? 1 : next_n;
        s.num_heads = heads;
        s.head_dim = dim;
        s.block_kv = index % 2 == 0 ? 64 : 32;
        s.avg_context = 150 + 131 * (index % 5);
        s.context_jitter = 0.6;
        s.lens_2d = index % 3 == 1;
        s.weights_dtype = dtypes[index % 3].first;
        s.logits_dtype = dtypes[index % 3].second;
        s.clean_logits = index % 4 < 2;
        s.extra_block_stride_bytes = paddings[index % 6];
        s.seed = 2000 + index;
        specs.push_back(s);
        ++index;
      }
    }
  }
  return specs;
}

class PagedOptionMatrix : public gpu_test::GpuParamTest<PagedSpec> {};

TEST_P(PagedOptionMatrix, MatchesCpuBackend) { run_and_compare(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Gpu, PagedOptionMatrix, ::testing::ValuesIn(option_matrix()),
                         [](const auto& info) { return describe(info.param); });

// ---- edge cases -----------------------------------------------------------------------------

class PagedGpu : public GpuTest {};

PagedSpec base_spec(std::uint64_t seed) {
  PagedSpec s;
  s.batch = 4;
  s.next_n = 1;
  s.avg_context = 700;
  s.context_jitter = 0.5;
  s.clean_logits = true;
  s.seed = seed;
  return s;
}

TEST_F(PagedGpu, ContextLengthsAroundBlockEdges) {
  for (int block_kv : {32, 64}) {
    // 0, 1, one block, one block plus one, and around one tile (64) and a part of four (256).
    const std::vector<std::int32_t> lens = {0,  1,  block_kv, block_kv + 1, 63,
                                            64, 65, 255,      256,          257};
    for (bool clean : {true, false}) {
      PagedSpec s = base_spec(11);
      s.batch = static_cast<std::int64_t>(lens.size());
      s.block_kv = block_kv;
      s.clean_logits = clean;
      s.explicit_context_lens = lens;
      run_and_compare(s);
    }
  }
}

TEST_F(PagedGpu, AllContextsEmpty) {
  PagedSpec s = base_spec(12);
  s.batch = 3;
  s.next_n = 2;
  s.lens_2d = true;
  s.explicit_context_lens = {0, 0, 0, 0, 0, 0};
  s.max_context_len = 100;  // every column is outside every window
  run_and_compare(s);
}

TEST_F(PagedGpu, OneLongSequence) {
  PagedSpec s = base_spec(13);
  s.batch = 1;
  s.avg_context = 20000;
  s.context_jitter = 0.0;
  run_and_compare(s);
}

TEST_F(PagedGpu, VeryUnevenBatch) {
  PagedSpec s = base_spec(14);
  s.batch = 7;
  s.explicit_context_lens = {1, 30000, 3, 0, 70, 9000, 257};
  run_and_compare(s);
}

TEST_F(PagedGpu, MaxContextLenPastEveryContext) {
  PagedSpec s = base_spec(15);
  s.max_context_len = 3001;  // contexts are at most 1050
  run_and_compare(s);
  s.clean_logits = false;
  run_and_compare(s);
}

TEST_F(PagedGpu, MaxContextLenCutsContexts) {
  PagedSpec s = base_spec(16);
  s.next_n = 3;
  s.max_context_len = 333;  // contexts are at least 350: every row is cut
  run_and_compare(s);
}

// An output of more than 2^31 elements (bf16, ~8.6 GB; the contexts short, max_context_len
// wide): its second half of rows start past 2^31 elements (2^32 bytes) and must hold, bitwise,
// what the same inputs give in an output as wide as the longest context.
TEST_F(PagedGpu, RowsPastTwoToThe31Elements) {
  PagedSpec s = base_spec(17);
  s.batch = 48;
  s.next_n = 2;
  s.logits_dtype = DType::kBFloat16;
  s.clean_logits = false;
  PagedCase narrow(s, {});
  const auto narrow_out = narrow.gpu_logits();
  gpu_test::expect_matches_cpu(narrow.workload(), narrow_out, narrow.cpu_logits());
  const PagedWorkload& w = narrow.workload();
  s.max_context_len = (std::int64_t{1} << 31) / (w.num_rows / 2) + 4096;
  PagedCase wide(s, {});
  ASSERT_GT(w.num_rows / 2 * wide.workload().layout.row_stride, std::int64_t{1} << 31);
  wide.run_gpu();
  const std::size_t element = dtype_size(s.logits_dtype);
  for (std::int64_t row = 0; row < w.num_rows; ++row) {
    const std::int64_t len = std::max<std::int64_t>(0, w.context_length(row));
    const auto got = wide.gpu_row(row, len);
    EXPECT_EQ(std::memcmp(got.data(), narrow_out.data() + row * w.layout.row_stride * element,
                          got.size()),
              0)
        << "row " << row << " (offset " << row * wide.workload().layout.row_stride
        << " elements)";
  }
}

// next_n 3, 5, 6 and 8 with 1-D lengths (the rows of a sequence see L - N + t + 1 keys, some of
// them negative for short contexts) and with 2-D lengths.
TEST_F(PagedGpu, OddAndLargeNextN) {
  for (int next_n : {3, 5, 6, 8}) {
    for (bool lens_2d : {false, true}) {
      PagedSpec s = base_spec(17 + next_n);
      s.next_n = next_n;
      s.lens_2d = lens_2d;
      s.batch = 3;
      s.explicit_context_lens.clear();
      if (!lens_2d) s.explicit_context_lens = {2, 900, 0};  // rows of the first go negative
      run_and_compare(s);
    }
  }
}

TEST_F(PagedGpu, BlockTableWithWideRowStride) {
  PagedSpec s = base_spec(30);
  s.next_n = 2;
  s.block_kv = 32;
  run_and_compare(s, {.extra_table_stride = 37});
}

TEST_F(PagedGpu, InvalidBlockIdsAreOutsideTheWindow) {
  for (int block_kv : {32, 64}) {
    for (std::int64_t padding : {0, 4}) {  // TMA and cp.async paths
      PagedSpec s = base_spec(31);
      s.block_kv = block_kv;
      s.next_n = 2;
      s.extra_block_stride_bytes = padding;
      run_and_compare(s, {.invalid_every = 3});
    }
  }
}

// The varlen form as the reference's tests build it: a block-table row per token (its sequence's
// blocks), the indices sequence labels whose values do not matter, only which consecutive rows
// share one.
TEST_F(PagedGpu, VarlenRunsShareKeys) {
  for (int heads : {64, 16}) {
    PagedSpec s = base_spec(32);
    s.varlen_indices = true;
    s.batch = 61;
    s.num_heads = heads;
    s.avg_context = 1500;
    run_and_compare(s);
    run_and_compare(s, {.workers = 5});  // segments start and end inside runs
    PagedCase labelled(s, {.workers = 5});
    const auto first = labelled.gpu_logits();
    labelled.relabel([](std::int32_t label) { return -3 * label + 1000; });
    EXPECT_EQ(labelled.gpu_logits(), first) << "other labels of the same runs";
  }
}

// Metadata that is not the call's: another call's lengths (its own worker count), or values no
// metadata function gives; with CTA pairs (next_n 8), the varlen form and one CTA a worker.
void expect_foreign_metadata_stays_inside(PagedSpec s, const Variation& variation) {
  PagedCase c(s, variation);
  PagedSpec longer = s;
  longer.avg_context = 3 * s.avg_context;
  longer.seed = s.seed + 1;
  PagedCase other(longer, variation);
  other.gpu_logits();  // computes its device metadata
  const auto units = static_cast<std::int32_t>(s.batch);
  c.expect_stays_inside_with(other.device_metadata());
  c.expect_stays_inside_with(gpu_test::garbage_metadata(c.workers(), units, s.seed));
  c.expect_stays_inside_with(gpu_test::garbage_metadata(c.workers(), units, s.seed + 7));
}

TEST_F(PagedGpu, ForeignMetadataStaysInsideTheOutput) {
  PagedSpec s = base_spec(70);
  s.batch = 5;
  for (const std::int64_t next_n : {8, 2}) {
    s.next_n = next_n;
    SCOPED_TRACE("next_n " + std::to_string(next_n));
    expect_foreign_metadata_stays_inside(s, {.workers = 7});
    expect_foreign_metadata_stays_inside(s, {});
  }
  s.next_n = 1;
  s.varlen_indices = true;
  s.batch = 13;
  expect_foreign_metadata_stays_inside(s, {.workers = 4});
}

// Segments of every shape: one worker, a few (segments spanning sequences and splitting them),
// more workers than items. Outside varlen the result does not depend on the split at all.
TEST_F(PagedGpu, AnyWorkerCountGivesTheSameLogits) {
  PagedSpec s = base_spec(33);
  s.next_n = 3;
  s.lens_2d = true;
  s.batch = 5;
  std::vector<std::byte> first;
  for (int workers : {1, 3, 7, 132, 400}) {
    PagedCase c(s, {.workers = workers});
    const auto gpu = c.gpu_logits();
    if (workers == 1) {
      gpu_test::expect_matches_cpu(c.workload(), gpu, c.cpu_logits());
      first = gpu;
    } else {
      EXPECT_EQ(gpu, first) << workers << " workers";
    }
  }
}

// CTA pairs (paged_plan.cuh, "CTA pairs"): groups of 6-8 rows at H = 64 whose keys come by TMA
// run on clusters of two CTAs (next_n = 5, which stays on one CTA a worker, beside them). Odd next_n (the second CTA's rows fewer than its instance's), a
// batch that is not a multiple of two, odd worker counts (the last pair alone on one worker's
// segment), one worker (one pair on one segment), block_kv 32 and 64 (where one CTA's half of a
// tile is an invalid block, that CTA loads nothing of it), invalid block ids, 1-D and 2-D
// lengths; every worker count gives the same logits, and the cp.async path (block strides TMA
// cannot address: one CTA a worker) agrees with the float64 oracle on the same values. With the
// SM count as workers every pair must be resident at once, else the launcher takes one CTA a
// worker; the other worker counts are pairs on any sm_90 part.
TEST_F(PagedGpu, PairedCtas) {
  for (int next_n : {5, 6, 7, 8}) {
    for (int block_kv : {32, 64}) {
      PagedSpec s = base_spec(50 + next_n);
      s.next_n = next_n;
      s.block_kv = block_kv;
      s.batch = 3;
      s.lens_2d = next_n % 2 == 0;
      s.clean_logits = block_kv == 32;
      std::vector<std::byte> first;
      for (int workers : {1, 3, 7, 0}) {  // 0: get_num_sms()
        SCOPED_TRACE(describe(s) + " workers " + std::to_string(workers));
        PagedCase c(s, {.invalid_every = 5, .workers = workers});
        const auto gpu = c.gpu_logits();
        if (first.empty()) {
          gpu_test::expect_matches_cpu(c.workload(), gpu, c.cpu_logits());
          gpu_test::expect_padding_untouched(c.workload(), gpu);
          first = gpu;
        } else {
          EXPECT_EQ(gpu, first);
        }
      }
      s.extra_block_stride_bytes = 4;
      run_and_compare(s, {.invalid_every = 5, .workers = 7});
    }
  }
  // Head dims 64 and 32, and 1-D lengths whose first sequence's rows are all empty or negative
  // (the first CTA of its pair holds no keys of that group).
  for (int dim : {64, 32}) {
    PagedSpec s = base_spec(60 + dim);
    s.head_dim = dim;
    s.next_n = 7;
    s.batch = 3;
    s.explicit_context_lens = {2, 900, 0};
    run_and_compare(s, {.invalid_every = 6, .workers = 3});
  }
}

TEST_F(PagedGpu, DeepSeekDecodeShape) {
  PagedSpec s = base_spec(34);
  s.batch = 16;
  s.next_n = 2;
  s.avg_context = 8192;
  s.context_jitter = 0.3;
  s.clean_logits = false;
  run_and_compare(s);
}

TEST_F(PagedGpu, RepeatedCallsAreBitwiseIdentical) {
  PagedSpec s = base_spec(35);
  s.batch = 9;
  s.next_n = 4;
  s.lens_2d = true;
  s.block_kv = 32;
  PagedCase c(s, {});
  const auto first = c.gpu_logits();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(c.gpu_logits(), first) << "call " << i;
}

// ---- device metadata ------------------------------------------------------------------------

std::vector<std::int32_t> download_meta(const DeviceBuffer& buffer) {
  const auto bytes = buffer.download();
  std::vector<std::int32_t> meta(bytes.size() / sizeof(std::int32_t));
  std::memcpy(meta.data(), bytes.data(), bytes.size());
  return meta;
}

TEST_F(PagedGpu, DeviceMetadataEqualsHostMetadata) {
  std::mt19937 gen(36);
  // Every third trial takes 2-D lengths; over 72 trials those meet every next_n (1-8) at every
  // placement below. Every fourth has few, short sequences, whose parts of 4 tiles fit the
  // workers, so that the device scans and takes the finer parts too (single tiles in 14 trials,
  // parts of 2 in 2); the others mostly split parts of 4.
  for (int trial = 0; trial < 72; ++trial) {
    const bool short_lens = trial % 4 == 1;
    const std::int64_t batch = std::uniform_int_distribution<std::int64_t>(
        0, short_lens ? 40 : trial % 5 == 0 ? 5000 : 300)(gen);
    const bool lens_2d = trial % 3 == 0;
    const std::int64_t cols = lens_2d ? 1 + (trial / 3) % 8 : 1;
    std::vector<std::int32_t> lens(static_cast<std::size_t>(batch * cols));
    for (auto& len : lens) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(gen);
      len = kind == 0   ? 0
            : kind == 1 ? -3
            : kind == 2 && !short_lens ? 200000
                        : std::uniform_int_distribution<int>(1, short_lens ? 600 : 9000)(gen);
    }
    const int workers = std::uniform_int_distribution<int>(1, 300)(gen);
    const auto rows = schedule_meta_rows(workers);
    const TensorView host_lens =
        lens_2d ? TensorView::contiguous(lens.data(), DType::kInt32, {batch, cols})
                : TensorView::contiguous(lens.data(), DType::kInt32, {batch});
    std::vector<std::int32_t> host(static_cast<std::size_t>(rows * 2), -7);
    get_paged_mqa_logits_metadata(host_lens, 64, workers,
                                  TensorView::contiguous(host.data(), DType::kInt32, {rows, 2}));

    // The lengths start 0, 4 or 8 bytes past a 16-byte boundary: int32 lengths need only their
    // own alignment, and the kernel reads them 16, 8 or 4 bytes a load by where they start.
    const std::size_t shift = (trial / 3) % 3;
    DeviceBuffer device_lens((lens.size() + 2) * sizeof(std::int32_t));
    auto* lens_at = static_cast<std::int32_t*>(device_lens.data()) + shift;
    if (!lens.empty()) {
      check_cuda(cudaMemcpy(lens_at, lens.data(), lens.size() * sizeof(std::int32_t),
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy lens");
    }
    TensorView dev_lens = host_lens;
    dev_lens.data = lens_at;
    dev_lens.device = kGpu;
    DeviceBuffer device_meta(host.size() * sizeof(std::int32_t));
    get_paged_mqa_logits_metadata(dev_lens, 64, workers,
                                  meta_view(device_meta.data(), workers, kGpu));
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ASSERT_EQ(download_meta(device_meta), host)
        << "trial " << trial << " batch " << batch << " cols " << cols << " workers " << workers
        << " shift " << shift;
  }
}

TEST_F(PagedGpu, DevicePrefillMetadataEqualsHostMetadata) {
  const int saved = get_num_sms();
  struct RestoreSms {  // also when an assertion ends the test early
    int sms;
    ~RestoreSms() { set_num_sms(sms); }
  } restore{saved};
  std::mt19937 gen(37);
  for (int trial = 0; trial < 40; ++trial) {
    // Every eighth trial up to 40000 rows, the last 200000 at H = 64: a thread of the kernel then
    // counts runs of up to ~100 blocks, longer than the runs whose counts it keeps for its search.
    const bool longest = trial == 39;
    const std::int64_t most_rows = trial % 8 == 0 ? 40000 : trial % 4 == 0 ? 6000 : 700;
    const std::int64_t s =
        longest ? 200000 : std::uniform_int_distribution<std::int64_t>(0, most_rows)(gen);
    // One trial's T is the largest the metadata functions take (2^31 - 1), its windows near it:
    // their ends then clamp at T, in 64 bits on the host and 32 on the GPU.
    const bool largest_t = trial == 37;
    const std::int64_t t = largest_t ? std::numeric_limits<std::int32_t>::max()
                                     : std::uniform_int_distribution<std::int64_t>(0, 20000)(gen);
    const auto top = static_cast<std::int32_t>(
        std::min<std::int64_t>(t, std::numeric_limits<std::int32_t>::max() - 300));
    const std::int32_t bottom = largest_t ? top - 100000 : 0;
    const int heads = longest ? 64 : 8 << std::uniform_int_distribution<int>(0, 3)(gen);
    std::vector<std::int32_t> start(static_cast<std::size_t>(s)), end(static_cast<std::size_t>(s));
    for (std::int64_t i = 0; i < s; ++i) {
      start[i] = std::uniform_int_distribution<std::int32_t>(bottom - 100, top + 50)(gen);
      end[i] = std::uniform_int_distribution<std::int32_t>(bottom - 50, top + 300)(gen);
      if (trial % 2 == 0) {  // causal-like: growing windows
        start[i] = 0;
        end[i] = static_cast<std::int32_t>(std::max<std::int64_t>(0, t - s + i + 1));
      }
    }
    const int workers = std::uniform_int_distribution<int>(1, std::min(saved, 132))(gen);
    set_num_sms(workers);
    const auto rows = schedule_meta_rows(workers);
    std::vector<std::int32_t> host(static_cast<std::size_t>(rows * 2), -7);
    get_mqa_logits_metadata(TensorView::contiguous(start.data(), DType::kInt32, {s}),
                            TensorView::contiguous(end.data(), DType::kInt32, {s}), t, heads,
                            TensorView::contiguous(host.data(), DType::kInt32, {rows, 2}));

    // Every other pair of trials places the windows 4 bytes past a 16-byte boundary: the kernel
    // reads them 16 bytes a load where both arrays allow it, else 4.
    const std::size_t shift = (trial / 2) % 2;
    const std::size_t bytes = (start.size() + 1) * sizeof(std::int32_t);
    DeviceBuffer device_start(bytes), device_end(bytes);
    auto* start_at = static_cast<std::int32_t*>(device_start.data()) + shift;
    auto* end_at = static_cast<std::int32_t*>(device_end.data()) + shift;
    if (s > 0) {
      check_cuda(cudaMemcpy(start_at, start.data(), s * 4, cudaMemcpyHostToDevice), "start");
      check_cuda(cudaMemcpy(end_at, end.data(), s * 4, cudaMemcpyHostToDevice), "end");
    }
    DeviceBuffer device_meta(host.size() * sizeof(std::int32_t));
    get_mqa_logits_metadata(TensorView::contiguous(start_at, DType::kInt32, {s}, kGpu),
                            TensorView::contiguous(end_at, DType::kInt32, {s}, kGpu), t, heads,
                            meta_view(device_meta.data(), workers, kGpu));
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ASSERT_EQ(download_meta(device_meta), host) << "trial " << trial << " S " << s << " T " << t
                                                << " H " << heads << " workers " << workers
                                                << " shift " << shift;
  }
}

// ---- compact cases for compute-sanitizer (memcheck, racecheck, synccheck) ------------------

// The checking mode refuses what the CPU backend refuses, naming the argument, before any kernel
// writes (the poisoned output stays as it was), and passes valid inputs to the same logits.
TEST_F(PagedGpu, CheckingModeRefusesWhatTheCpuRefuses) {
  const auto expect_refusal = [&](PagedCase& c, const std::string& argument) {
    try {
      c.gpu_logits(true);
      ADD_FAILURE() << "accepted; expected a refusal naming " << argument;
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), argument) << error.what();
    }
    EXPECT_TRUE(c.output_untouched());
  };
  PagedSpec s = base_spec(41);
  s.next_n = 2;
  PagedCase invalid_blocks(s, {.invalid_every = 3});
  expect_refusal(invalid_blocks, "block_table");
  s.batch = 2;
  s.lens_2d = true;
  s.explicit_context_lens = {70, 10, -3, 50};
  PagedCase negative_length(s, {});
  expect_refusal(negative_length, "context_lens");

  PagedCase valid(base_spec(42), {});
  EXPECT_EQ(valid.gpu_logits(true), valid.gpu_logits());
}

// Every code path once, small: TMA and cp.async keys, block_kv 32 and 64, one and two MMA chunks,
// a chunk's MMA in two parts, CTA pairs, varlen groups, invalid block ids, clean and unclean, bf16
// output.
TEST_F(PagedGpu, CompactForSanitizer) {
  PagedSpec s = base_spec(40);
  s.batch = 3;
  s.avg_context = 300;
  s.next_n = 6;  // two chunks: cp.async keys keep the group on one CTA
  s.lens_2d = true;
  s.block_kv = 32;
  s.extra_block_stride_bytes = 12;
  run_and_compare(s, {.invalid_every = 4, .workers = 4});
  s.next_n = 7;  // CTA pairs, the last pair alone on one worker's segment
  s.lens_2d = false;
  s.extra_block_stride_bytes = 0;
  run_and_compare(s, {.invalid_every = 4, .workers = 3});
  s.next_n = 4;  // one chunk, its MMA in two parts
  s.lens_2d = true;
  s.block_kv = 64;
  run_and_compare(s, {.workers = 5});
  s.next_n = 1;
  s.varlen_indices = true;
  s.batch = 9;
  s.block_kv = 64;
  s.extra_block_stride_bytes = 4;
  s.clean_logits = false;
  s.weights_dtype = DType::kBFloat16;
  s.logits_dtype = DType::kBFloat16;
  run_and_compare(s, {.workers = 3});
  PagedSpec paired = base_spec(41);  // metadata not this call's, on CTA pairs (keys by TMA)
  paired.batch = 3;
  paired.avg_context = 300;
  paired.next_n = 7;
  expect_foreign_metadata_stays_inside(paired, {.workers = 3});
}

}  // namespace
}  // namespace mqa_logits
