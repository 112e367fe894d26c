// Top-k benchmark (k = 2048, H 64, D 128): per call, the logits alone (no clean), the top-k
// operation, and the logits followed by topk_per_row, in one run; topk_per_row alone against the
// time to read its logits once at the measured copy rate. Each top-k call is checked on sampled
// rows against the oracle over the same call's logits before it is reported; device memory is
// the outputs plus the workspace.
#include <algorithm>
#include <array>
#include <tuple>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"
#include "support/topk_oracle.hpp"

namespace mqa_logits::bench {
namespace {

constexpr std::int64_t kTopk = 2048;
constexpr Device kGpu{DeviceType::kCUDA, 0};

// A device allocation for the benchmark's own outputs.
struct DeviceBytes {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBytes(std::size_t n) : bytes(n) {
    check_cuda(cudaMalloc(&data, std::max<std::size_t>(n, 1)), "cudaMalloc");
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(data); }
  TensorView bytes_view() const {
    return TensorView::contiguous(data, DType::kUInt8, {static_cast<std::int64_t>(bytes)}, kGpu);
  }
};

template <typename T>
std::vector<T> download(const void* device, std::size_t count) {
  std::vector<T> host(count);
  check_cuda(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
  return host;
}

// Whether the sampled rows of a selection equal the oracle over the same inputs' logits.
// `window(row)` gives (first column, count, index of column 0).
template <class Window>
bool selection_matches(const void* logits, std::int64_t row_stride, const void* indices,
                       std::span<const std::int64_t> rows, const Window& window) {
  for (const std::int64_t row : rows) {
    const auto logit_row = download<float>(static_cast<const float*>(logits) + row * row_stride,
                                           static_cast<std::size_t>(row_stride));
    const auto got = download<std::int32_t>(static_cast<const std::int32_t*>(indices) + row * kTopk,
                                            kTopk);
    const auto [first, count, offset] = window(row);
    const auto columns =
        support::oracle_topk_columns(logit_row.data(), DType::kFloat32, first, count, kTopk);
    for (std::int64_t i = 0; i < kTopk; ++i) {
      const std::int64_t want =
          i < static_cast<std::int64_t>(columns.size()) ? columns[static_cast<std::size_t>(i)] + offset : -1;
      if (got[static_cast<std::size_t>(i)] != want) return false;
    }
  }
  return true;
}

struct Times {
  Timing logits, fused, composed;
};

Record record_of(const std::string& op, const std::string& name, const Times& t, bool verified,
                 double output_bytes, double workspace_bytes) {
  return Record()
      .set("op", op)
      .set("shape", name)
      .set("k", kTopk)
      .set("logits_us", t.logits.median_us)
      .set("fused_us", t.fused.median_us)
      .set("fused_p10_us", t.fused.p10_us)
      .set("fused_p90_us", t.fused.p90_us)
      .set("composed_us", t.composed.median_us)
      .set("fused_over_logits", t.fused.median_us / t.logits.median_us)
      .set("output_bytes", output_bytes)
      .set("workspace_bytes", workspace_bytes)
      .set("verified", verified);
}

void print_row(const Record& r) {
  if (!r.has("logits_us")) return;  // an error, printed where it was caught
  std::printf("%-26s %10.1f %10.1f %10.1f %7.3f %10.1f %s\n",
              (std::get<std::string>(r.at("op")) + " " + std::get<std::string>(r.at("shape"))).c_str(),
              std::get<double>(r.at("logits_us")), std::get<double>(r.at("fused_us")),
              std::get<double>(r.at("composed_us")), std::get<double>(r.at("fused_over_logits")),
              std::get<double>(r.at("workspace_bytes")) / (1 << 20),
              std::get<bool>(r.at("verified")) ? "ok" : "FAILED");
  std::fflush(stdout);
}

// The fused call's selection checked on sampled rows against the logits that logits_call wrote
// (window(row): the row's first column, column count and index offset), then the three calls
// timed.
template <class LogitsCall, class FusedCall, class ComposedCall, class Window>
Record checked_and_timed(const BenchContext& context, const std::string& op,
                         const std::string& name, std::int64_t rows, const DeviceArena& arena,
                         std::int64_t row_stride, const DeviceBytes& indices,
                         const DeviceBytes& workspace, const LogitsCall& logits_call,
                         const FusedCall& fused_call, const ComposedCall& composed_call,
                         const Window& window, int warmup, int samples) {
  logits_call(nullptr);
  check_cuda(cudaMemset(indices.data, 0xff, indices.bytes), "poison");
  fused_call(nullptr);
  check_cuda(cudaDeviceSynchronize(), "top-k call");
  const auto sample = support::sample_rows(rows, context.quick ? 3 : 6, 5);
  const bool verified = selection_matches(arena.logits(), row_stride, indices.data, sample, window);
  const int timed = context.quick ? 10 : samples;
  const Times t{time_graph(logits_call, warmup, timed), time_graph(fused_call, warmup, timed),
                time_graph(composed_call, warmup, timed)};
  return record_of(op, name, t, verified, static_cast<double>(indices.bytes),
                   static_cast<double>(workspace.bytes));
}

Record prefill_case(const BenchContext& context, const std::string& name,
                    const support::PrefillSpec& spec_in) {
  support::PrefillSpec spec = spec_in;
  spec.clean_logits = false;
  const auto w = support::make_prefill_workload(spec);
  const DeviceArena arena(w.buffers, w.logits_bytes());
  const auto in = w.inputs(arena.pointers(), kGpu);
  const std::int64_t S = spec.seq_len, T = spec.seq_len_kv;
  DeviceBytes indices(static_cast<std::size_t>(S * kTopk) * 4);
  DeviceBytes workspace(static_cast<std::size_t>(mqa_topk_workspace_bytes(S, T, kTopk)));
  const TensorView logits = w.logits_view(arena.logits(), kGpu);
  const TensorView indices_view =
      TensorView::contiguous(indices.data, DType::kInt32, {S, kTopk}, kGpu);

  const auto logits_call = [&](cudaStream_t stream) {
    MqaLogitsOptions options = in.options;
    options.stream = stream;
    mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits, options);
  };
  const auto fused_call = [&](cudaStream_t stream) {
    MqaTopkOptions options;
    options.stream = stream;
    mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, kTopk, indices_view,
             workspace.bytes_view(), options);
  };
  const auto composed_call = [&](cudaStream_t stream) {
    logits_call(stream);
    TopkPerRowOptions options;
    options.stream = stream;
    topk_per_row(logits, in.k_start, in.k_end, kTopk, indices_view, options);
  };

  const auto starts = w.k_start();
  const auto ends = w.k_end();
  return checked_and_timed(
      context, "topk_prefill", name, S, arena, w.layout.row_stride, indices, workspace,
      logits_call, fused_call, composed_call,
      [&](std::int64_t row) {
        const std::int64_t s = starts[static_cast<std::size_t>(row)];
        const std::int64_t first = std::clamp<std::int64_t>(s, 0, T);
        const std::int64_t last =
            std::clamp<std::int64_t>(ends[static_cast<std::size_t>(row)], first, T);
        return std::tuple{first, last - first, -s};
      },
      2, 30);
}

Record decode_case(const BenchContext& context, std::int64_t batch, std::int64_t next_n,
                   std::int64_t context_len) {
  support::PagedSpec spec;
  spec.batch = batch;
  spec.next_n = next_n;
  spec.num_heads = 64;
  spec.head_dim = 128;
  spec.avg_context = context_len;
  spec.context_jitter = batch == 1 ? 0.0 : 0.3;
  spec.seed = 7;
  const auto w = support::make_paged_workload(spec);
  const DeviceArena arena(w.buffers, w.logits_bytes());
  const auto in = w.inputs(arena.pointers(), kGpu);
  const std::int64_t rows = w.num_rows;
  const int workers = get_num_sms();
  DeviceBytes meta(static_cast<std::size_t>(schedule_meta_rows(workers) * 2 * 4));
  const TensorView meta_view =
      TensorView::contiguous(meta.data, DType::kInt32, {schedule_meta_rows(workers), 2}, kGpu);
  get_paged_mqa_logits_metadata(in.context_lens, spec.block_kv, workers, meta_view);
  DeviceBytes indices(static_cast<std::size_t>(rows * kTopk) * 4);
  DeviceBytes workspace(
      static_cast<std::size_t>(paged_mqa_topk_workspace_bytes(rows, w.max_context_len, kTopk)));
  DeviceBytes lengths(static_cast<std::size_t>(rows) * 4);  // topk_per_row's ends: row lengths
  std::vector<std::int32_t> host_lengths;
  for (std::int64_t r = 0; r < rows; ++r) {
    host_lengths.push_back(static_cast<std::int32_t>(
        std::clamp<std::int64_t>(w.context_length(r), 0, w.max_context_len)));
  }
  check_cuda(cudaMemcpy(lengths.data, host_lengths.data(), lengths.bytes, cudaMemcpyHostToDevice),
             "H2D");
  const TensorView logits = w.logits_view(arena.logits(), kGpu);
  const TensorView indices_view =
      TensorView::contiguous(indices.data, DType::kInt32, {rows, kTopk}, kGpu);

  const auto logits_call = [&](cudaStream_t stream) {
    PagedMqaLogitsOptions options = in.options;
    options.stream = stream;
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                     w.max_context_len, logits, options);
  };
  const auto fused_call = [&](cudaStream_t stream) {
    PagedMqaTopkOptions options;
    options.stream = stream;
    paged_mqa_topk(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                   w.max_context_len, kTopk, indices_view, workspace.bytes_view(), options);
  };
  const auto composed_call = [&](cudaStream_t stream) {
    logits_call(stream);
    TopkPerRowOptions options;
    options.stream = stream;
    topk_per_row(logits, std::nullopt,
                 TensorView::contiguous(lengths.data, DType::kInt32, {rows}, kGpu), kTopk,
                 indices_view, options);
  };

  const std::string name =
      std::to_string(batch) + "/" + std::to_string(next_n) + "/" + std::to_string(context_len);
  return checked_and_timed(
      context, "topk_decode", name, rows, arena, w.layout.row_stride, indices, workspace,
      logits_call, fused_call, composed_call,
      [&](std::int64_t row) {
        return std::tuple{std::int64_t{0},
                          static_cast<std::int64_t>(host_lengths[static_cast<std::size_t>(row)]),
                          std::int64_t{0}};
      },
      5, 40);
}

__global__ void fill_random_logits(float* logits, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t x = (static_cast<std::uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    // The sum of two uniform values in [-8, 8): a bell of logits, ties rare.
    const float a = static_cast<float>(x & 0xffffff) / 16777216.0f;
    const float b = static_cast<float>((x >> 24) & 0xffffff) / 16777216.0f;
    logits[i] = 8.0f * (a + b) - 8.0f;
  }
}

Record per_row_case(const BenchContext& context, std::int64_t rows, std::int64_t cols) {
  const std::int64_t stride = (cols + 255) / 256 * 256;
  DeviceBytes logits(static_cast<std::size_t>(rows * stride) * 4);
  fill_random_logits<<<1024, 256>>>(static_cast<float*>(logits.data), rows * stride, 3);
  check_cuda(cudaGetLastError(), "fill_random_logits");
  DeviceBytes ends(static_cast<std::size_t>(rows) * 4);
  const std::vector<std::int32_t> host_ends(static_cast<std::size_t>(rows), static_cast<std::int32_t>(cols));
  check_cuda(cudaMemcpy(ends.data, host_ends.data(), ends.bytes, cudaMemcpyHostToDevice), "H2D");
  DeviceBytes indices(static_cast<std::size_t>(rows * kTopk) * 4);
  TensorView logits_view;
  logits_view.data = logits.data;
  logits_view.dtype = DType::kFloat32;
  logits_view.rank = 2;
  logits_view.shape = {rows, cols};
  logits_view.strides = {stride, 1};
  logits_view.device = kGpu;
  const auto call = [&](cudaStream_t stream) {
    TopkPerRowOptions options;
    options.stream = stream;
    topk_per_row(logits_view, std::nullopt,
                 TensorView::contiguous(ends.data, DType::kInt32, {rows}, kGpu), kTopk,
                 TensorView::contiguous(indices.data, DType::kInt32, {rows, kTopk}, kGpu), options);
  };
  call(nullptr);
  check_cuda(cudaDeviceSynchronize(), "topk_per_row");
  const auto sample = support::sample_rows(rows, 4, 5);
  const bool verified = selection_matches(logits.data, stride, indices.data, sample,
                                          [&](std::int64_t) {
                                            return std::tuple{std::int64_t{0}, cols, std::int64_t{0}};
                                          });
  const Timing t = time_graph(call, 3, context.quick ? 10 : 40);
  const double read_us = static_cast<double>(rows * cols) * 4 / (context.ceilings.copy_tbps * 1e12) * 1e6;
  std::printf("%-26s %10.1f us  p10 %.1f p90 %.1f  read once %.1f us  x%.2f  %s\n",
              ("topk_per_row " + std::to_string(rows) + " x " + std::to_string(cols)).c_str(),
              t.median_us, t.p10_us, t.p90_us, read_us, t.median_us / read_us,
              verified ? "ok" : "FAILED");
  std::fflush(stdout);
  return Record()
      .set("op", std::string("topk_per_row"))
      .set("rows", rows)
      .set("cols", cols)
      .set("k", kTopk)
      .set_timing(t)
      .set("read_once_us", read_us)
      .set("over_read_once", t.median_us / read_us)
      .set("verified", verified);
}

support::PrefillSpec prefill_spec(std::int64_t s, std::int64_t t, support::WindowKind windows) {
  support::PrefillSpec spec;
  spec.seq_len = s;
  spec.seq_len_kv = t;
  spec.num_heads = 64;
  spec.head_dim = 128;
  spec.windows = windows;
  spec.seed = 42;
  return spec;
}

support::PrefillSpec packed_spec(std::int64_t requests, std::int64_t length) {
  support::PrefillSpec spec = prefill_spec(requests * length, requests * length,
                                           support::WindowKind::kPacked);
  spec.request_lengths.assign(static_cast<std::size_t>(requests), length);
  return spec;
}

}  // namespace

std::vector<Record> run_topk_bench(const BenchContext& context) {
  using support::WindowKind;
  std::vector<Record> records;
  const auto guarded = [&](const std::string& name, const auto& run) {
    try {
      records.push_back(run());
    } catch (const std::exception& e) {
      records.push_back(Record().set("op", std::string("topk")).set("shape", name).set("verified", false)
                            .set("error", std::string(e.what())));
      std::printf("%-26s ERROR: %s\n", name.c_str(), e.what());
    }
  };
  guarded("per-row 2048 x 32768", [&] { return per_row_case(context, 2048, 32768); });
  guarded("per-row 1 x 131072", [&] { return per_row_case(context, 1, 131072); });
  std::printf("%-26s %10s %10s %10s %7s %10s %s\n", "top-k (k 2048)", "logits us", "top-k us",
              "l+per-row", "ratio", "ws MiB", "check");
  auto sliding = prefill_spec(8192, 65536, WindowKind::kSliding);
  sliding.sliding_window = 2048;
  const std::vector<std::pair<std::string, support::PrefillSpec>> prefill = {
      {"one request 2048x32768", prefill_spec(2048, 32768, WindowKind::kCausal)},
      {"square causal 8192", prefill_spec(8192, 8192, WindowKind::kCausal)},
      {"packed 8 x 2048", packed_spec(8, 2048)},
      {"packed 32 x 1024", packed_spec(32, 1024)},
      {"sliding 2048", sliding},
      {"context parallel", prefill_spec(8192, 65536, WindowKind::kContextParallel)},
  };
  for (const auto& [name, spec] : prefill) {
    if (context.quick && name != "one request 2048x32768" && name != "packed 8 x 2048") continue;
    guarded(name, [&] { return prefill_case(context, name, spec); });
    print_row(records.back());
  }
  const std::vector<std::array<std::int64_t, 3>> decode = {
      {64, 1, 32768}, {64, 2, 32768}, {1, 1, 4096}, {1, 1, 131072}, {4, 1, 65536},
      {8, 1, 4096},   {8, 1, 131072}, {128, 1, 8192}};
  for (const auto& [batch, next_n, length] : decode) {
    if (context.quick && batch != 64 && !(batch == 1 && length == 131072)) continue;
    guarded("decode", [&] { return decode_case(context, batch, next_n, length); });
    print_row(records.back());
  }
  return records;
}

}  // namespace mqa_logits::bench
