// Top-k on the GPU: topk_per_row against the CPU backend's on the same rows (random, adversarial,
// rows past the shared-memory cache), and the fused operations against the oracle applied to the
// GPU's own logits for the same inputs. Outputs are poisoned before every call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "gpu/gpu_test_support.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/topk_oracle.hpp"
#include "support/workload.hpp"
#include "topk_rows.hpp"

namespace mqa_logits {
namespace {

using namespace topk_test;
using gpu_test::DeviceBuffer;
using gpu_test::GpuTest;
using gpu_test::kGpu;
using gpu_test::upload_values;

TensorView on_gpu(TensorView view, void* data) {
  view.data = data;
  view.device = kGpu;
  return view;
}

// The rows' bytes on the device (the stride kept).
DeviceBuffer upload_rows(const Rows& logits) {
  const std::size_t bytes = logits.fp32.size() * (logits.dtype == DType::kBFloat16 ? 2 : 4);
  DeviceBuffer buffer(bytes);
  check_cuda(cudaMemcpy(buffer.data(), logits.data(), bytes, cudaMemcpyHostToDevice), "H2D");
  return buffer;
}

// Poisoned device outputs of [rows, topk], downloaded after the call.
struct DeviceSelection {
  DeviceBuffer indices;
  DeviceBuffer values;
  DeviceSelection(std::int64_t rows, std::int64_t topk)
      : indices(static_cast<std::size_t>(rows * topk) * 4),
        values(static_cast<std::size_t>(rows * topk) * 4) {
    indices.poison();
    values.poison();
  }
  Selection download() const {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    Selection out;
    out.indices.resize(indices.bytes() / 4);
    out.values.resize(values.bytes() / 4);
    if (!out.indices.empty()) {
      std::memcpy(out.indices.data(), indices.download().data(), indices.bytes());
      std::memcpy(out.values.data(), values.download().data(), values.bytes());
    }
    return out;
  }
};

Selection run_per_row_gpu(const Rows& logits, PerRowCall& call, std::int64_t topk) {
  const DeviceBuffer rows = upload_rows(logits);
  const DeviceBuffer starts = upload_values(call.starts);
  const DeviceBuffer ends = upload_values(call.ends);
  DeviceSelection out(logits.rows, topk);
  TopkPerRowOptions options;
  options.compressed = call.compressed;
  options.absolute_indices = call.absolute;
  options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {logits.rows, topk}, kGpu);
  std::optional<TensorView> starts_view;
  if (!call.starts.empty()) {
    starts_view = TensorView::contiguous(starts.data(), DType::kInt32, {logits.rows}, kGpu);
  }
  topk_per_row(on_gpu(logits.view(), rows.data()), starts_view,
               TensorView::contiguous(ends.data(), DType::kInt32, {logits.rows}, kGpu), topk,
               TensorView::contiguous(out.indices.data(), DType::kInt32, {logits.rows, topk}, kGpu),
               options);
  check_cuda(cudaGetLastError(), "topk_per_row");
  return out.download();
}

// GPU and CPU selections of the same rows, bitwise.
void expect_gpu_equals_cpu(const Rows& logits, PerRowCall call, std::int64_t topk) {
  const Selection gpu = run_per_row_gpu(logits, call, topk);
  const Selection cpu = run_per_row(logits, call, topk);
  ASSERT_EQ(gpu.indices, cpu.indices);
  for (std::size_t k = 0; k < cpu.values.size(); ++k) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(gpu.values[k]), std::bit_cast<std::uint32_t>(cpu.values[k]))
        << "value " << k;
  }
}

using TopkPerRowGpu = GpuTest;

TEST_F(TopkPerRowGpu, RandomRowsMatchTheCpu) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const bool compressed : {false, true}) {
      for (const std::int64_t topk : {1, 7, 512, 1024, 2048}) {
        const auto seed = static_cast<std::uint64_t>(topk) * 2 + compressed;
        const Rows logits = random_rows(300, 6000, dtype, seed);
        PerRowCall call = random_windows(300, 6000, seed + 1);
        call.compressed = compressed;
        call.absolute = topk % 2 == 0;
        expect_gpu_equals_cpu(logits, call, topk);
      }
    }
  }
}

// Rows longer than the shared-memory cache, read from global memory on every pass.
TEST_F(TopkPerRowGpu, RowsPastTheCache) {
  for (const std::int64_t topk : {1, 2048}) {
    const Rows logits = random_rows(6, 200000, DType::kFloat32, 40 + topk);
    PerRowCall call = random_windows(6, 200000, 41);
    expect_gpu_equals_cpu(logits, call, topk);
  }
}

TEST_F(TopkPerRowGpu, AdversarialRowsMatchTheCpu) {
  constexpr std::int64_t kMillion = 1 << 20;
  Rows equal(1, kMillion, DType::kFloat32, 0);
  for (std::int64_t c = 0; c < kMillion; ++c) equal.set(0, c, 0.25f);
  const Rows one_bin = one_bin_row(kMillion, 5);
  const Rows ties = four_value_rows(8, 20000, 3);
  const Rows special = special_value_rows(64);
  for (const std::int64_t topk : {1, 999, 2048}) {
    expect_gpu_equals_cpu(equal, {{}, {static_cast<std::int32_t>(kMillion)}}, topk);
    expect_gpu_equals_cpu(one_bin, {{}, {static_cast<std::int32_t>(kMillion)}}, topk);
    expect_gpu_equals_cpu(ties, random_windows(8, 20000, 7), topk);
    expect_gpu_equals_cpu(special, {{}, {64, 64, 64, 64}}, topk);
  }
}

TEST_F(TopkPerRowGpu, RepeatedCallsAreBitwiseEqual) {
  expect_repeated_calls_bitwise_equal(run_per_row_gpu, 200);
}

TEST_F(TopkPerRowGpu, RefusesHostOutputsAndWritesNothing) {
  const Rows logits = random_rows(4, 100, DType::kFloat32, 1);
  const DeviceBuffer rows = upload_rows(logits);
  std::vector<std::int32_t> ends_host(4, 100);
  const DeviceBuffer ends = upload_values(ends_host);
  std::vector<std::int32_t> host_indices(4 * 8, kIndexPoison);
  DeviceSelection out(4, 8);
  try {
    topk_per_row(on_gpu(logits.view(), rows.data()), std::nullopt,
                 TensorView::contiguous(ends.data(), DType::kInt32, {4}, kGpu), 8,
                 TensorView::contiguous(host_indices.data(), DType::kInt32, {4, 8}, kGpu));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "topk_indices") << e.what();
  }
  for (const std::int32_t v : host_indices) ASSERT_EQ(v, kIndexPoison);
  ASSERT_TRUE(out.indices.untouched());
}

// Small enough for compute-sanitizer (scripts/gpu-check): both paths of the kernel (rows in the
// shared-memory cache and past it), ties, and both fused operations.
TEST_F(TopkPerRowGpu, CompactForSanitizer) {
  expect_gpu_equals_cpu(random_rows(3, 70000, DType::kFloat32, 2), random_windows(3, 70000, 3), 2048);
  expect_gpu_equals_cpu(four_value_rows(5, 3000, 4), random_windows(5, 3000, 5), 700);
  expect_gpu_equals_cpu(random_rows(4, 900, DType::kBFloat16, 6), random_windows(4, 900, 7), 1);
}

// ---- merge_topk: the GPU's merge of shard candidates equals the CPU's, bitwise ----

Selection run_merge_gpu(const Candidates& c, std::int64_t rows, std::int64_t lists_topk,
                        std::int64_t topk) {
  const DeviceBuffer values = upload_values(c.values);
  const DeviceBuffer indices = upload_values(c.indices);
  DeviceSelection out(rows, topk);
  MergeTopkOptions options;
  options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {rows, topk}, kGpu);
  merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {c.ranks, rows, lists_topk},
                                    kGpu),
             TensorView::contiguous(indices.data(), DType::kInt32, {c.ranks, rows, lists_topk},
                                    kGpu),
             topk, TensorView::contiguous(out.indices.data(), DType::kInt32, {rows, topk}, kGpu),
             options);
  check_cuda(cudaGetLastError(), "merge_topk");
  return out.download();
}

using MergeTopkGpu = GpuTest;

TEST_F(MergeTopkGpu, MatchesTheCpuOnShardCandidates) {
  const Rows random = random_rows(40, 9000, DType::kFloat32, 51);
  const Rows ties = four_value_rows(20, 6000, 52);
  for (const Rows* logits : {&random, &ties}) {
    for (const std::int64_t ranks : {1, 2, 8}) {
      for (const std::int64_t topk : {1, 512, 2048}) {
        const Candidates c = shard_candidates(*logits, ranks, ranks % 2 == 0, topk);
        const Selection gpu = run_merge_gpu(c, logits->rows, topk, topk);
        const Selection cpu = run_merge(c, logits->rows, topk, topk);
        ASSERT_EQ(gpu.indices, cpu.indices) << "ranks " << ranks << " topk " << topk;
        ASSERT_EQ(0, std::memcmp(gpu.values.data(), cpu.values.data(), cpu.values.size() * 4));
      }
    }
  }
}

// Small enough for compute-sanitizer (scripts/gpu-check).
TEST_F(MergeTopkGpu, CompactForSanitizer) {
  const Candidates c = shard_candidates(four_value_rows(3, 900, 53), 3, true, 300);
  ASSERT_EQ(run_merge_gpu(c, 3, 300, 300).indices, run_merge(c, 3, 300, 300).indices);
}

TEST_F(MergeTopkGpu, RefusesMoreCandidatesThanARowHoldsOnTheGpu) {
  const DeviceBuffer values(9 * 2048 * 4), indices(9 * 2048 * 4);
  DeviceSelection out(1, 16);
  try {
    merge_topk(TensorView::contiguous(values.data(), DType::kFloat32, {9, 1, 2048}, kGpu),
               TensorView::contiguous(indices.data(), DType::kInt32, {9, 1, 2048}, kGpu), 16,
               TensorView::contiguous(out.indices.data(), DType::kInt32, {1, 16}, kGpu));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "candidate_values") << e.what();
  }
  ASSERT_TRUE(out.indices.untouched());
}

// ---- the fused operations: the oracle over the GPU's own logits ----

// Device logits of `rows` x `cols` in the padded layout, downloaded as Rows.
Rows download_logits(const DeviceBuffer& buffer, std::int64_t rows, std::int64_t cols,
                     std::int64_t stride, DType dtype) {
  Rows logits(rows, cols, dtype, 0);
  logits.stride = stride;
  const auto bytes = buffer.download();
  if (dtype == DType::kBFloat16) {
    logits.bf16.resize(bytes.size() / 2);
    std::memcpy(logits.bf16.data(), bytes.data(), bytes.size());
  } else {
    logits.fp32.resize(bytes.size() / 4);
    std::memcpy(logits.fp32.data(), bytes.data(), bytes.size());
  }
  return logits;
}

using MqaTopkGpu = GpuTest;

TEST_F(MqaTopkGpu, MatchesTheOracleOverItsLogits) {
  for (const FusedCase& c : kFusedCases) {
    const support::PrefillSpec spec = fused_spec(c, Format::kFP8, 512, 6000, 64, 128, 23);
    const auto w = support::make_prefill_workload(spec);
    const auto device = gpu_test::upload(w.buffers);
    const auto in = w.inputs(device.pointers, kGpu);

    DeviceBuffer logits_buffer(w.logits_bytes());
    logits_buffer.poison();
    mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end,
               w.logits_view(logits_buffer.data(), kGpu), in.options);
    const Rows logits = download_logits(logits_buffer, spec.seq_len, spec.seq_len_kv,
                                        w.layout.row_stride, c.logits);

    for (const bool absolute : {false, true}) {
      DeviceSelection out(spec.seq_len, c.topk);
      DeviceBuffer workspace(static_cast<std::size_t>(
          mqa_topk_workspace_bytes(spec.seq_len, spec.seq_len_kv, c.topk)));
      workspace.poison();
      MqaTopkOptions options;
      options.absolute_indices = absolute;
      options.logits_dtype = c.logits;
      options.values =
          TensorView::contiguous(out.values.data(), DType::kFloat32, {spec.seq_len, c.topk}, kGpu);
      mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, c.topk,
               TensorView::contiguous(out.indices.data(), DType::kInt32, {spec.seq_len, c.topk}, kGpu),
               TensorView::contiguous(workspace.data(), DType::kUInt8,
                                      {static_cast<std::int64_t>(workspace.bytes())}, kGpu),
               options);
      const Selection got = out.download();
      const PerRowCall call = prefill_rows(w, absolute);
      SCOPED_TRACE(support::window_kind_name(c.windows));
      expect_per_row_oracle(logits, call, c.topk, got);
    }
  }
}

using PagedMqaTopkGpu = GpuTest;

TEST_F(PagedMqaTopkGpu, MatchesTheOracleOverItsLogits) {
  for (const PagedCase& c : kPagedCases) {
    const support::PagedSpec spec = paged_spec(c, 64, 128, c.batch == 1 ? 70000 : 5000);
    const auto w = support::make_paged_workload(spec);
    const auto device = gpu_test::upload(w.buffers);
    const auto in = w.inputs(device.pointers, kGpu);
    const std::int64_t rows = w.num_rows;
    const int workers = get_num_sms();
    DeviceBuffer meta(static_cast<std::size_t>(schedule_meta_rows(workers) * 2 * 4));
    const TensorView meta_view =
        TensorView::contiguous(meta.data(), DType::kInt32, {schedule_meta_rows(workers), 2}, kGpu);
    get_paged_mqa_logits_metadata(in.context_lens, c.block_kv, workers, meta_view,
                                  in.options.indices);

    DeviceBuffer logits_buffer(w.logits_bytes());
    logits_buffer.poison();
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                     w.max_context_len, w.logits_view(logits_buffer.data(), kGpu), in.options);
    const Rows logits =
        download_logits(logits_buffer, rows, w.max_context_len, w.layout.row_stride, c.weights);
    for (const bool slots : {false, true}) {
      for (const std::int64_t topk : {1, 2048}) {
        DeviceSelection out(rows, topk);
        DeviceBuffer workspace(static_cast<std::size_t>(
            paged_mqa_topk_workspace_bytes(rows, w.max_context_len, topk)));
        workspace.poison();
        PagedMqaTopkOptions options;
        options.cache_slots = slots;
        options.indices = in.options.indices;
        options.values = TensorView::contiguous(out.values.data(), DType::kFloat32, {rows, topk}, kGpu);
        paged_mqa_topk(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                       w.max_context_len, topk,
                       TensorView::contiguous(out.indices.data(), DType::kInt32, {rows, topk}, kGpu),
                       TensorView::contiguous(workspace.data(), DType::kUInt8,
                                              {static_cast<std::int64_t>(workspace.bytes())}, kGpu),
                       options);
        const Selection got = out.download();
        expect_paged_rows(got, w, logits, topk, slots);
      }
    }
  }
}

}  // namespace
}  // namespace mqa_logits
