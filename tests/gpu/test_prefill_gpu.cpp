// GPU prefill (mqa_logits) against the CPU backend: the option matrix, the window patterns
// engines send, edge cases, repeatability and scheduled == unscheduled. Skipped where no sm_90
// GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mqa_logits/capabilities.hpp"
#include "gpu/gpu_test_support.hpp"
#include "validation_inputs.hpp"

namespace mqa_logits {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuTest;
using gpu_test::kGpu;
using support::PrefillSpec;
using support::PrefillWorkload;
using support::WindowKind;

// The CPU backend's logits, always with clean_logits so that -inf marks the windows exactly, and
// without its input checks: what the GPU gives for inputs it does not check (a compressed output
// narrower than a window).
std::vector<std::byte> cpu_logits(const PrefillWorkload& workload) {
  std::vector<std::byte> out(workload.logits_bytes());
  auto in = workload.host_inputs();
  in.options.clean_logits = true;
  in.options.check_inputs = false;
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, workload.logits_view(out.data()), in.options);
  return out;
}

// Runs the GPU on poisoned output; `schedule_meta` (device, optional) is passed through.
std::vector<std::byte> gpu_logits(const PrefillWorkload& workload, const gpu_test::DeviceInputs& device,
                                  DeviceBuffer& out, const std::optional<TensorView>& schedule_meta = {}) {
  out.poison();
  auto in = workload.inputs(device.pointers, kGpu);
  in.options.schedule_meta = schedule_meta;
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, workload.logits_view(out.data(), kGpu), in.options);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return out.download();
}

// Runs the GPU on poisoned output, leaving the logits on the device (outputs too large to copy).
void gpu_logits_in_place(const PrefillWorkload& workload, const gpu_test::DeviceInputs& device,
                         DeviceBuffer& out) {
  out.poison();
  auto in = workload.inputs(device.pointers, kGpu);
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, workload.logits_view(out.data(), kGpu),
             in.options);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void run_and_compare(const PrefillSpec& spec) {
  const auto workload = support::make_prefill_workload(spec);
  const auto device = gpu_test::upload(workload.buffers);
  DeviceBuffer out(workload.logits_bytes());
  const auto gpu = gpu_logits(workload, device, out);
  gpu_test::expect_matches_cpu(workload, gpu, cpu_logits(workload));
  gpu_test::expect_padding_untouched(workload, gpu);
}

// The schedule metadata of the workload's windows for get_num_sms() workers, computed on the GPU.
struct DeviceMetadata {
  DeviceBuffer buffer;
  TensorView view;
};
DeviceMetadata device_metadata(const PrefillWorkload& workload, const gpu_test::DeviceInputs& device) {
  const auto rows = schedule_meta_rows(get_num_sms());
  DeviceMetadata meta{DeviceBuffer(rows * 2 * sizeof(std::int32_t)), {}};
  meta.view = TensorView::contiguous(meta.buffer.data(), DType::kInt32, {rows, 2}, kGpu);
  const auto in = workload.inputs(device.pointers, kGpu);
  get_mqa_logits_metadata(in.k_start, in.k_end, workload.spec.seq_len_kv,
                          static_cast<int>(workload.spec.num_heads), meta.view);
  return meta;
}

// Host metadata of a workload's windows for get_num_sms() workers, with `num_heads` heads.
std::vector<std::int32_t> host_metadata(const PrefillWorkload& workload, std::int64_t num_heads) {
  std::vector<std::int32_t> meta(static_cast<std::size_t>(schedule_meta_rows(get_num_sms())) * 2);
  const auto in = workload.host_inputs();
  get_mqa_logits_metadata(in.k_start, in.k_end, workload.spec.seq_len_kv,
                          static_cast<int>(num_heads),
                          TensorView::contiguous(meta.data(), DType::kInt32,
                                                 {schedule_meta_rows(get_num_sms()), 2}));
  return meta;
}

std::string describe(const PrefillSpec& s) {
  return "S" + std::to_string(s.seq_len) + "_T" + std::to_string(s.seq_len_kv) + "_H" +
         std::to_string(s.num_heads) + "_D" + std::to_string(s.head_dim) + "_w" +
         dtype_name(s.weights_dtype) + "_out" + dtype_name(s.logits_dtype) + (s.clean_logits ? "_clean" : "_unclean") +
         "_msk" + std::to_string(s.max_seqlen_k) + "_" + support::window_kind_name(s.windows);
}

// The option matrix: every (H, D, weights/logits dtype) with clean, compressed and the window
// kinds cycled through so that each value meets every other dimension's values.
std::vector<PrefillSpec> option_matrix() {
  std::vector<PrefillSpec> specs;
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kFloat32, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kBFloat16}};
  const WindowKind windows[] = {WindowKind::kCausal, WindowKind::kRandom, WindowKind::kFull,
                                WindowKind::kContextParallel};
  int index = 0;
  for (int heads : capabilities::kHeadCounts) {
    for (int dim : capabilities::kHeadDims) {
      for (const auto& [weights, logits] : dtypes) {
        PrefillSpec s;
        s.seq_len = 37 + 11 * (index % 5);
        s.seq_len_kv = 300 + 97 * (index % 7);
        s.num_heads = heads;
        s.head_dim = dim;
        s.weights_dtype = weights;
        s.logits_dtype = logits;
        s.clean_logits = index % 2 == 0;
        s.max_seqlen_k = index % 3 == 0 ? 173 : 0;
        s.windows = windows[index % 4];
        s.weights_row_stride = index % 5 == 0 ? heads + 8 : 0;
        s.seed = 1000 + index;
        specs.push_back(s);
        ++index;
      }
    }
  }
  return specs;
}

class PrefillOptionMatrix : public gpu_test::GpuParamTest<PrefillSpec> {};

TEST_P(PrefillOptionMatrix, MatchesCpuBackend) { run_and_compare(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Gpu, PrefillOptionMatrix, ::testing::ValuesIn(option_matrix()),
                         [](const auto& info) { return describe(info.param); });

class PrefillGpu : public GpuTest {};

PrefillSpec edge(std::int64_t s, std::int64_t t, WindowKind windows, std::uint64_t seed) {
  PrefillSpec spec;
  spec.seq_len = s;
  spec.seq_len_kv = t;
  spec.windows = windows;
  spec.seed = seed;
  return spec;
}

TEST_F(PrefillGpu, SingleQuerySingleKey) { run_and_compare(edge(1, 1, WindowKind::kFull, 1)); }
TEST_F(PrefillGpu, NonMultiplesOfEveryTile) { run_and_compare(edge(129, 4100, WindowKind::kCausal, 2)); }
TEST_F(PrefillGpu, EmptyInvertedNegativeAndPastEndWindows) {
  run_and_compare(edge(129, 4100, WindowKind::kRandom, 3));
}
TEST_F(PrefillGpu, ContextParallelSplitWindows) {
  run_and_compare(edge(256, 2048, WindowKind::kContextParallel, 4));
}
TEST_F(PrefillGpu, CompressedOutputDropsColumnsPastWidth) {
  auto spec = edge(129, 4100, WindowKind::kRandom, 5);
  spec.max_seqlen_k = 1000;
  run_and_compare(spec);
  spec.clean_logits = false;
  run_and_compare(spec);
}
TEST_F(PrefillGpu, NoKeysCompressedStillCleans) {
  auto spec = edge(33, 0, WindowKind::kCausal, 6);
  spec.max_seqlen_k = 64;
  run_and_compare(spec);
}
// One block of a few queries against a long context, without metadata: its tiles are still
// split over every CTA (each computes its own segment).
TEST_F(PrefillGpu, FewQueriesSplitOverCtas) {
  run_and_compare(edge(3, 20000, WindowKind::kFull, 13));
  auto spec = edge(5, 20000, WindowKind::kRandom, 14);
  spec.max_seqlen_k = 9000;
  spec.clean_logits = false;
  run_and_compare(spec);
}
TEST_F(PrefillGpu, NoQueriesWritesNothing) { run_and_compare(edge(0, 128, WindowKind::kCausal, 7)); }
TEST_F(PrefillGpu, DeepSeekShapedChunk) { run_and_compare(edge(512, 8192, WindowKind::kCausal, 8)); }

// Seven heads in eight score every key strongly negative, the eighth strongly positive: the relu
// discards most of each logit's head scores. At H = 64 the kernel computes the relu as |x| plus a
// linear half on the tensor cores, which must then cancel the discarded heads to the bound.
TEST_F(PrefillGpu, MostHeadsScoringNegative) {
  auto spec = edge(96, 1500, WindowKind::kCausal, 11);
  ASSERT_EQ(spec.num_heads, 64);
  auto workload = support::make_prefill_workload(spec);
  constexpr auto kSign = std::byte{0x80};
  for (std::byte& key : workload.buffers[PrefillWorkload::kKv].bytes) key &= ~kSign;
  auto& q = workload.buffers[PrefillWorkload::kQ].bytes;
  const std::int64_t dim = spec.head_dim;
  for (std::size_t i = 0; i < q.size(); ++i) {
    const bool positive_head = i / dim % 8 == 0;
    q[i] = positive_head ? (q[i] & ~kSign) : (q[i] | kSign);
  }
  const auto device = gpu_test::upload(workload.buffers);
  DeviceBuffer out(workload.logits_bytes());
  const auto gpu = gpu_logits(workload, device, out);
  gpu_test::expect_matches_cpu(workload, gpu, cpu_logits(workload));
}

TEST_F(PrefillGpu, RepeatedCallsAreBitwiseIdentical) {
  const auto workload = support::make_prefill_workload(edge(200, 3000, WindowKind::kRandom, 9));
  const auto device = gpu_test::upload(workload.buffers);
  DeviceBuffer out(workload.logits_bytes());
  const auto first = gpu_logits(workload, device, out);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(gpu_logits(workload, device, out), first) << "call " << i;
  }
}

// Device metadata equals host metadata, and the scheduled kernel equals the unscheduled one.
TEST_F(PrefillGpu, ScheduledEqualsUnscheduledBitwise) {
  for (WindowKind windows : {WindowKind::kCausal, WindowKind::kRandom, WindowKind::kContextParallel}) {
    auto spec = edge(333, 5000, windows, 10);
    spec.num_heads = windows == WindowKind::kRandom ? 16 : 64;
    const auto workload = support::make_prefill_workload(spec);
    const auto device = gpu_test::upload(workload.buffers);
    const std::vector<std::int32_t> host_meta = host_metadata(workload, spec.num_heads);
    const auto meta = device_metadata(workload, device);
    const auto device_meta = meta.buffer.download();
    ASSERT_EQ(device_meta.size(), host_meta.size() * sizeof(std::int32_t));
    ASSERT_EQ(std::memcmp(device_meta.data(), host_meta.data(), device_meta.size()), 0) << "device metadata";

    DeviceBuffer out(workload.logits_bytes());
    const auto unscheduled = gpu_logits(workload, device, out);
    const auto scheduled = gpu_logits(workload, device, out, meta.view);
    EXPECT_EQ(scheduled, unscheduled) << support::window_kind_name(windows);
  }
}

// Compressed output with random starts (most rows off the 16-byte grid), the blocks split over
// the CTAs by device metadata: where two CTAs' tiles of a row meet, both write into one 16-byte
// chunk, each its own columns.
TEST_F(PrefillGpu, CompressedScheduledMatchesCpu) {
  for (DType logits : {DType::kFloat32, DType::kBFloat16}) {
    auto spec = edge(300, 6000, WindowKind::kRandom, 12);
    spec.num_heads = 8;
    spec.logits_dtype = logits;
    spec.max_seqlen_k = 3000;
    const auto workload = support::make_prefill_workload(spec);
    const auto device = gpu_test::upload(workload.buffers);
    const auto meta = device_metadata(workload, device);
    DeviceBuffer out(workload.logits_bytes());
    gpu_test::expect_matches_cpu(workload, gpu_logits(workload, device, out, meta.view), cpu_logits(workload));
  }
}

// ---- engine window patterns --------------------------------------------------------------------

// Two GPU outputs are bitwise equal wherever the contract defines the output: everywhere with
// clean_logits, inside the windows (finite in the CPU backend's clean output `cpu`) without.
void expect_bitwise_equal(const PrefillWorkload& workload, const std::vector<std::byte>& cpu,
                          const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  const OutputLayout& layout = workload.layout;
  const DType dtype = workload.spec.logits_dtype;
  const std::size_t element = dtype_size(dtype);
  std::int64_t differing = 0;
  std::string first;
  for (std::int64_t row = 0; row < layout.rows; ++row) {
    for (std::int64_t col = 0; col < layout.cols; ++col) {
      if (!workload.spec.clean_logits &&
          std::isinf(support::read_logit(cpu.data(), dtype, layout, row, col))) {
        continue;
      }
      const std::size_t offset = static_cast<std::size_t>(row * layout.row_stride + col) * element;
      if (std::memcmp(a.data() + offset, b.data() + offset, element) != 0 && differing++ == 0) {
        first = "row " + std::to_string(row) + " col " + std::to_string(col);
      }
    }
  }
  EXPECT_EQ(differing, 0) << "first at " << first;
}

// Without and with device schedule metadata (bitwise equal), then against the CPU backend and
// the oracle: uneven windows are what the metadata's split exists for.
void run_scheduled_and_compare(const PrefillSpec& spec) {
  const auto workload = support::make_prefill_workload(spec);
  const auto device = gpu_test::upload(workload.buffers);
  DeviceBuffer out(workload.logits_bytes());
  const auto unscheduled = gpu_logits(workload, device, out);
  const auto meta = device_metadata(workload, device);
  const auto scheduled = gpu_logits(workload, device, out, meta.view);
  const auto cpu = cpu_logits(workload);
  expect_bitwise_equal(workload, cpu, scheduled, unscheduled);
  gpu_test::expect_matches_cpu(workload, scheduled, cpu);
}

struct PatternCase {
  std::string name;
  PrefillSpec spec;
};

struct PatternOptions {
  std::int64_t heads = 64;
  std::int64_t dim = 128;
  DType logits = DType::kFloat32;
  bool clean = true;
  std::int64_t max_seqlen_k = 0;
};

PrefillSpec pattern_spec(std::int64_t s, std::int64_t t, WindowKind windows,
                         const PatternOptions& o) {
  PrefillSpec spec;
  spec.seq_len = s;
  spec.seq_len_kv = t;
  spec.num_heads = o.heads;
  spec.head_dim = o.dim;
  spec.logits_dtype = o.logits;
  spec.clean_logits = o.clean;
  spec.max_seqlen_k = o.max_seqlen_k;
  spec.windows = windows;
  spec.seed = 20;
  return spec;
}

PrefillSpec packed(std::vector<std::int64_t> lengths, const PatternOptions& o) {
  std::int64_t total = 0;
  for (const std::int64_t length : lengths) total += length;
  auto spec = pattern_spec(total, total, WindowKind::kPacked, o);
  spec.request_lengths = std::move(lengths);
  return spec;
}

PrefillSpec sliding(std::int64_t s, std::int64_t t, std::int64_t window, const PatternOptions& o) {
  auto spec = pattern_spec(s, t, WindowKind::kSliding, o);
  spec.sliding_window = window;
  return spec;
}

// The patterns engines send, small: a query block holds 256 / H rows (4 at H = 64, 32 at H = 8),
// so packed requests of 1 to 33 tokens fall short of blocks, fill them exactly or straddle them.
// Together the cases cover every H and D, fp32 and bf16 logits, clean on and off, compressed
// output.
std::vector<PatternCase> pattern_cases() {
  constexpr DType kBf16 = DType::kBFloat16;
  const std::vector<std::int64_t> short_and_single = {1, 1, 2, 31, 33, 1, 500, 7, 1, 64, 200, 3};
  return {
      {"SquareCausal", pattern_spec(1000, 1000, WindowKind::kCausal, {})},
      {"SquareCausalH8D32Bf16NoClean",
       pattern_spec(777, 777, WindowKind::kCausal,
                    {.heads = 8, .dim = 32, .logits = kBf16, .clean = false})},
      {"PackedEqual16x128", packed(std::vector<std::int64_t>(16, 128), {})},
      {"PackedEqual300x3ShorterThanBlocks",
       packed(std::vector<std::int64_t>(300, 3), {.dim = 64, .logits = kBf16})},
      {"PackedEqual40x20StraddlingBlocksH8NoClean",
       packed(std::vector<std::int64_t>(40, 20), {.heads = 8, .clean = false})},
      {"PackedSingleTokensCompressed",
       packed(short_and_single, {.heads = 16, .dim = 64, .max_seqlen_k = 128})},
      {"PackedSingleTokensCompressedNoCleanH64D32",
       packed(short_and_single, {.dim = 32, .clean = false, .max_seqlen_k = 100})},
      {"PackedUneven12", packed(support::uneven_request_lengths(12, 3000, 1, 16, 1024),
                                {.heads = 32, .logits = kBf16})},
      {"PackedUneven20CompressedNoClean",
       packed(support::uneven_request_lengths(20, 2500, 2, 1, 512),
              {.heads = 32, .dim = 32, .clean = false, .max_seqlen_k = 300})},
      {"Sliding128", sliding(1024, 4096, 128, {})},
      {"Sliding1Bf16", sliding(300, 1000, 1, {.heads = 16, .dim = 32, .logits = kBf16})},
      {"Sliding700CompressedNoClean",
       sliding(1500, 2500, 700, {.heads = 8, .dim = 64, .clean = false, .max_seqlen_k = 512})},
      {"Sliding33Square", sliding(1200, 1200, 33, {.heads = 32, .dim = 64})},
      {"ContextParallelBf16",
       pattern_spec(512, 4096, WindowKind::kContextParallel, {.heads = 16, .logits = kBf16})},
      {"RandomWithEmptyRowsCompressed",
       pattern_spec(700, 3000, WindowKind::kRandom, {.heads = 32, .dim = 32, .max_seqlen_k = 900})},
  };
}

class PrefillPatterns : public gpu_test::GpuParamTest<PatternCase> {};

TEST_P(PrefillPatterns, ScheduledEqualsUnscheduledAndMatchesCpu) {
  run_scheduled_and_compare(GetParam().spec);
}

INSTANTIATE_TEST_SUITE_P(Gpu, PrefillPatterns, ::testing::ValuesIn(pattern_cases()),
                         [](const auto& info) { return info.param.name; });

// The checking mode refuses a compressed output narrower than a window, as the CPU backend does,
// before any kernel writes; valid inputs give the same logits as without it.
TEST_F(PrefillGpu, CheckingModeRefusesWhatTheCpuRefuses) {
  auto spec = edge(100, 700, WindowKind::kCausal, 21);
  for (const std::int64_t width : {64, 700}) {  // causal windows reach 700 keys
    spec.max_seqlen_k = width;
    const auto workload = support::make_prefill_workload(spec);
    const auto device = gpu_test::upload(workload.buffers);
    DeviceBuffer out(workload.logits_bytes());
    out.poison();
    auto in = workload.inputs(device.pointers, kGpu);
    in.options.check_inputs = true;
    const auto call = [&] {
      mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end,
                 workload.logits_view(out.data(), kGpu), in.options);
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    };
    if (width == 64) {
      test::expect_refused(call, "max_seqlen_k");
      EXPECT_TRUE(out.untouched());
    } else {
      call();
      const auto checked = out.download();
      EXPECT_EQ(checked, gpu_logits(workload, device, out));
    }
  }
}

// Metadata that is not the call's (another call's windows, another head count, values no
// metadata function gives): the output is unspecified (docs/contract.md), but the call
// completes and writes nothing outside the logits. Under memcheck (CompactForSanitizer) it reads
// nothing out of bounds either.
void expect_foreign_metadata_stays_inside(const PrefillSpec& spec) {
  const auto workload = support::make_prefill_workload(spec);
  const auto device = gpu_test::upload(workload.buffers);
  PrefillSpec longer = spec;
  longer.seq_len = 8 * spec.seq_len + 64;
  longer.seq_len_kv = 2 * spec.seq_len_kv;
  const std::int32_t blocks =
      static_cast<std::int32_t>(std::max<std::int64_t>(spec.seq_len * spec.num_heads / 256, 1));
  const std::vector<std::vector<std::int32_t>> foreign = {
      host_metadata(support::make_prefill_workload(longer), spec.num_heads),
      host_metadata(workload, spec.num_heads == 8 ? 64 : 8),
      gpu_test::garbage_metadata(get_num_sms(), blocks, spec.seed),
      gpu_test::garbage_metadata(get_num_sms(), blocks, spec.seed + 1)};
  for (std::size_t k = 0; k < foreign.size(); ++k) {
    SCOPED_TRACE("foreign metadata " + std::to_string(k));
    gpu_test::GuardedOutput out(workload.logits_bytes());
    const DeviceBuffer meta = gpu_test::upload_values(foreign[k]);
    auto in = workload.inputs(device.pointers, kGpu);
    in.options.schedule_meta = TensorView::contiguous(
        meta.data(), DType::kInt32, {static_cast<std::int64_t>(foreign[k].size() / 2), 2}, kGpu);
    mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end,
               workload.logits_view(out.data(), kGpu), in.options);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_TRUE(out.guards_untouched()) << "written outside the logits";
  }
}

// Compressed output of more columns than the clean pass's grid covers in one chunk a CTA
// (65535 chunks of 4096 columns, CUDA's limit on gridDim.y): every column past a window is -inf,
// and the window's columns are those of a narrow output. bf16 rows of ~537 MB.
TEST_F(PrefillGpu, CleanReachesColumnsPastTheGridLimit) {
  auto spec = edge(3, 64, WindowKind::kCausal, 23);
  spec.logits_dtype = DType::kBFloat16;
  spec.max_seqlen_k = 64;
  const auto narrow_workload = support::make_prefill_workload(spec);
  const auto device = gpu_test::upload(narrow_workload.buffers);
  DeviceBuffer narrow_out(narrow_workload.logits_bytes());
  const auto narrow = gpu_logits(narrow_workload, device, narrow_out);

  spec.max_seqlen_k = 65535 * std::int64_t{4096} + 5000;
  const auto workload = support::make_prefill_workload(spec);
  DeviceBuffer out(workload.logits_bytes());
  gpu_logits_in_place(workload, device, out);
  const std::int64_t stride = workload.layout.row_stride;
  constexpr std::int64_t kTail = 3 * 4096;  // the last columns: a CTA's second chunk and more
  for (std::int64_t row = 0; row < spec.seq_len; ++row) {
    std::vector<std::uint16_t> head(64), tail(kTail);
    const auto* base = static_cast<const std::uint16_t*>(out.data()) + row * stride;
    check_cuda(cudaMemcpy(head.data(), base, 64 * 2, cudaMemcpyDeviceToHost), "cudaMemcpy head");
    check_cuda(cudaMemcpy(tail.data(), base + spec.max_seqlen_k - kTail, kTail * 2,
                          cudaMemcpyDeviceToHost),
               "cudaMemcpy tail");
    EXPECT_EQ(std::memcmp(head.data(), narrow.data() + row * narrow_workload.layout.row_stride * 2,
                          64 * 2),
              0)
        << "row " << row << ": the window's columns";
    constexpr std::uint16_t kBf16NegativeInfinity = 0xff80;
    EXPECT_EQ(std::count(tail.begin(), tail.end(), kBf16NegativeInfinity), kTail)
        << "row " << row << ": columns past the window";
  }
}

// Rows [first, first + count) of `wide` (the whole call's logits, on the device) against a call
// on those rows alone into an output of its own: bitwise the same inside the windows. `first` is
// a multiple of the 4-row blocks, so that both calls group the rows alike.
void expect_rows_as_alone(const PrefillWorkload& workload, const gpu_test::DeviceInputs& device,
                          const DeviceBuffer& wide, std::int64_t first, std::int64_t count) {
  const auto advance = [](TensorView& view, std::int64_t rows) {
    view.data = static_cast<std::byte*>(view.data) +
                rows * view.strides[0] * static_cast<std::int64_t>(dtype_size(view.dtype));
    view.shape[0] -= rows;
  };
  auto in = workload.inputs(device.pointers, kGpu);
  for (TensorView* view : {&in.q.values, &in.weights, &in.k_start, &in.k_end}) {
    advance(*view, first);
    view->shape[0] = count;
  }
  const DType dtype = workload.spec.logits_dtype;
  const OutputLayout alone = mqa_logits_output_layout(count, workload.spec.seq_len_kv,
                                                      workload.spec.max_seqlen_k, dtype);
  DeviceBuffer out(static_cast<std::size_t>(alone.rows * alone.row_stride) * dtype_size(dtype));
  out.poison();
  TensorView logits = TensorView::contiguous(out.data(), dtype, {alone.rows, alone.cols}, kGpu);
  logits.strides[0] = alone.row_stride;
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits, in.options);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto expected = out.download();
  const std::size_t element = dtype_size(dtype);
  const std::int64_t stride = workload.layout.row_stride;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t row = first + i;
    const std::int64_t start = workload.k_start()[row];
    const std::int64_t end = workload.k_end()[row];
    // The window's columns: [start, end) of a full row, [0, end - start) of a compressed one.
    const std::int64_t lo = workload.spec.max_seqlen_k > 0 ? 0 : start;
    const std::int64_t hi = std::min(lo + end - start, workload.layout.cols);
    const auto got = wide.download(static_cast<std::size_t>(row * stride + lo) * element,
                                   static_cast<std::size_t>(hi - lo) * element);
    EXPECT_EQ(std::memcmp(got.data(), expected.data() + (i * alone.row_stride + lo) * element,
                          got.size()),
              0)
        << "row " << row << " (offset " << row * stride << " elements)";
  }
}

// Outputs of more than 2^31 elements, full and compressed (bf16, ~4.3 GB): the last rows start
// past 2^31 elements (2^32 bytes) and must hold what a call on them alone writes; so must the
// first rows, where an offset wrapped to 32 bits would have landed.
TEST_F(PrefillGpu, RowsPastTwoToThe31Elements) {
  constexpr std::int64_t kRows = 64;
  auto spec = edge(32768 + kRows, 65536, WindowKind::kSliding, 43);
  spec.sliding_window = 64;
  spec.head_dim = 32;  // the smallest q: its rows of D bytes are what the host draws
  spec.logits_dtype = DType::kBFloat16;
  spec.clean_logits = false;
  for (const std::int64_t width : {std::int64_t{0}, spec.seq_len_kv}) {
    SCOPED_TRACE(width == 0 ? "full output" : "compressed output");
    spec.max_seqlen_k = width;
    const auto workload = support::make_prefill_workload(spec);
    ASSERT_GT((spec.seq_len - 1) * workload.layout.row_stride, std::int64_t{1} << 31);
    const auto device = gpu_test::upload(workload.buffers);
    DeviceBuffer out(workload.logits_bytes());
    gpu_logits_in_place(workload, device, out);
    expect_rows_as_alone(workload, device, out, 0, kRows);
    expect_rows_as_alone(workload, device, out, spec.seq_len - kRows, kRows);
  }
}

TEST_F(PrefillGpu, ForeignMetadataStaysInsideTheOutput) {
  for (const std::int64_t heads : {64, 8}) {
    auto spec = edge(40, 900, WindowKind::kRandom, 31);
    spec.num_heads = heads;
    expect_foreign_metadata_stays_inside(spec);
    spec.max_seqlen_k = 300;  // compressed rows: the store warp's own stores
    expect_foreign_metadata_stays_inside(spec);
  }
}

// Compact cases for compute-sanitizer (memcheck, racecheck, synccheck): every code path once.
TEST_F(PrefillGpu, CompactForSanitizer) {
  auto spec = edge(17, 260, WindowKind::kRandom, 11);
  run_and_compare(spec);
  run_and_compare(edge(600, 300, WindowKind::kFull, 15));  // CTAs of 2-3 blocks reuse Q buffers
  spec.max_seqlen_k = 100;
  spec.logits_dtype = DType::kBFloat16;
  spec.weights_dtype = DType::kBFloat16;
  run_and_compare(spec);
  // Packed requests shorter than, equal to and straddling the 4-row blocks of H = 64, with the
  // metadata kernel and the scheduled path; a sliding window starting mid-tile.
  run_scheduled_and_compare(packed({1, 5, 4, 2, 30, 3}, {}));
  run_scheduled_and_compare(sliding(40, 300, 17, {.clean = false, .max_seqlen_k = 16}));
  auto foreign = edge(9, 200, WindowKind::kRandom, 19);  // metadata not this call's
  foreign.max_seqlen_k = 150;
  expect_foreign_metadata_stays_inside(foreign);
}

}  // namespace
}  // namespace mqa_logits
