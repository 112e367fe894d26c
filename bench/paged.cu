// Decode benchmark: the shapes of the performance bar (H 64, D 128, contexts uniform in
// [0.7, 1.3] x avg, random block tables), each checked against the float64 oracle on sampled rows
// before it is reported. Per shape: the kernel's median time, its bandwidth, the floor
// max(FLOPs / FP8 GEMM ceiling, bytes / copy ceiling) with both ceilings measured in this run,
// the percentage of that floor reached, and the schedule-metadata kernel's time on its own.
// measure_decode is shared with the decode grid (paged_grid.cu).
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"

namespace mqa_logits::bench {
namespace {

struct Shape {
  std::int64_t batch, next_n, avg_context;
  int block_kv;
};

// Work and traffic as the contract counts them: every key of a sequence read once (its rows share
// the load), queries, weights, lengths and the block-table entries used read once, and every
// output element written (the whole row when clean).
struct Traffic {
  double pairs = 0;
  double bytes = 0;
};

// A sequence's keys (and block ids) are read once, up to its longest row: a sequence is next_n
// rows, or a run of varlen rows with one index.
Traffic traffic(const support::PagedWorkload& w) {
  const auto& spec = w.spec;
  const double out_bytes = static_cast<double>(dtype_size(spec.logits_dtype));
  Traffic t;
  for (std::int64_t first = 0, end = 0; first < w.num_rows; first = end) {
    std::int64_t keys = 0;
    for (end = first; end < w.num_rows && w.sequence(end) == w.sequence(first); ++end) {
      const std::int64_t len =
          std::clamp<std::int64_t>(w.context_length(end), 0, w.max_context_len);
      keys = std::max(keys, len);
      t.pairs += static_cast<double>(len);
    }
    t.bytes += static_cast<double>(keys) * static_cast<double>(w.token_bytes + 4);
    t.bytes += 4.0 * static_cast<double>((keys + spec.block_kv - 1) / spec.block_kv);
  }
  t.bytes +=
      static_cast<double>(w.num_rows * spec.num_heads) *
      (static_cast<double>(w.token_bytes) + static_cast<double>(dtype_size(spec.weights_dtype)));
  t.bytes += 4.0 * static_cast<double>(w.context_lens().size());
  t.bytes += spec.clean_logits ? static_cast<double>(w.num_rows * w.max_context_len) * out_bytes
                               : t.pairs * out_bytes;
  return t;
}

Record bench_shape(const BenchContext& context, const Shape& shape) {
  support::PagedSpec spec;
  spec.batch = shape.batch;
  spec.next_n = shape.next_n;
  spec.num_heads = 64;
  spec.head_dim = 128;
  spec.block_kv = shape.block_kv;
  spec.avg_context = shape.avg_context;
  spec.context_jitter = 0.3;
  spec.seed = 7;
  const auto workload = support::make_paged_workload(spec);
  const DeviceArena arena(workload.buffers, workload.logits_bytes());
  return measure_decode(context, workload, arena.pointers(), arena.logits());
}

}  // namespace

Record measure_decode(const BenchContext& context, const support::PagedWorkload& workload,
                      std::span<void* const> device_inputs, void* device_logits, bool isolated) {
  const auto& spec = workload.spec;
  const Device gpu{DeviceType::kCUDA, 0};
  const auto in = workload.inputs(device_inputs, gpu);

  const int workers = get_num_sms();
  const auto rows = schedule_meta_rows(workers);
  std::int32_t* meta = nullptr;
  check_cuda(cudaMalloc(&meta, rows * 2 * sizeof(std::int32_t)), "cudaMalloc meta");
  const auto meta_view = TensorView::contiguous(meta, DType::kInt32, {rows, 2}, gpu);
  auto metadata = [&](cudaStream_t stream) {
    get_paged_mqa_logits_metadata(in.context_lens, spec.block_kv, workers, meta_view,
                                  in.options.indices, stream);
  };
  const TensorView logits = workload.logits_view(device_logits, gpu);
  auto call = [&](cudaStream_t stream) {
    auto options = in.options;
    options.stream = stream;
    paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta_view,
                     workload.max_context_len, logits, options);
  };

  metadata(nullptr);
  check_cuda(cudaMemset(device_logits, 0xff, workload.logits_bytes()), "poison logits");
  call(nullptr);
  check_cuda(cudaDeviceSynchronize(), "decode call");
  // Only the sampled rows come back: the whole output is gigabytes at large B x N x context.
  const auto sample = support::sample_rows(workload.num_rows, context.quick ? 4 : 8, 3);
  const std::size_t element = dtype_size(spec.logits_dtype);
  const auto host = download_rows(device_logits, workload.logits_bytes(), sample,
                                  workload.layout.row_stride * element,
                                  workload.layout.cols * element);
  const auto verdict =
      support::verify_rows(workload, host.get(), sample, support::Operands::kQuantized);
  const int samples = context.quick ? 10 : 40;
  const Timing t = time_graph(call, 5, samples);
  const bool replays_match =
      rows_unchanged(host.get(), device_logits, workload.logits_bytes(), sample,
                     workload.layout.row_stride * element, workload.layout.cols * element);
  const Timing meta_time = time_graph(metadata, 5, samples);
  const std::vector<double> isolated_us =  // the call's, then the metadata kernel's
      isolated ? isolated_medians_us({call, metadata}, samples) : std::vector<double>{};
  cudaFree(meta);

  const Traffic work = traffic(workload);
  const double flops = 2.0 * static_cast<double>(spec.num_heads * spec.head_dim) * work.pairs;
  Record r = Record()
      .set("op", std::string("decode"))
      .set("B", spec.batch)
      .set("N", spec.next_n)
      .set("avg_context", spec.avg_context)
      .set("block_kv", static_cast<std::int64_t>(spec.block_kv))
      .set("H", spec.num_heads)
      .set("D", spec.head_dim)
      .set_timing(t)
      .set("tbps", work.bytes / (t.median_us * 1e-6) / 1e12)
      .set("tflops", flops / (t.median_us * 1e-6) / 1e12)
      .set_floor(context.ceilings, flops, work.bytes, t.median_us)
      .set("metadata_us", meta_time.median_us)
      .set("replays_match", replays_match)
      .set("verified", verdict.ok && replays_match)
      .set("oracle_diff", verdict.diff);
  if (!isolated_us.empty()) {
    r.set("isolated_us", isolated_us[0]).set("metadata_isolated_us", isolated_us[1]);
  }
  return r;
}

std::vector<Record> run_paged_bench(const BenchContext& context) {
  std::vector<Shape> shapes = {{64, 1, 32768, 64}, {64, 2, 32768, 64},  {64, 4, 32768, 64},
                               {256, 1, 8192, 64}, {256, 2, 65536, 64}, {128, 4, 65536, 64},
                               {1, 1, 131072, 64}, {512, 1, 4096, 64},  {64, 1, 32768, 32},
                               {64, 2, 32768, 32}};
  if (context.quick) {
    shapes = {{64, 1, 32768, 64}, {64, 4, 32768, 64}, {1, 1, 131072, 64}, {64, 2, 32768, 32}};
  }
  std::vector<Record> records;
  std::printf("%-22s %9s %8s %9s %7s %8s %9s %s\n", "decode B/N/avg/bk", "us", "TB/s", "floor us",
              "%floor", "bound", "meta us", "check");
  for (const Shape& shape : shapes) {
    const std::string name = std::to_string(shape.batch) + "/" + std::to_string(shape.next_n) +
                             "/" + std::to_string(shape.avg_context) + "/" +
                             std::to_string(shape.block_kv);
    try {
      const Record r = bench_shape(context, shape);
      records.push_back(r);
      std::printf("%-22s %9.1f %8.2f %9.1f %6.1f%% %8s %9.2f %s\n", name.c_str(),
                  std::get<double>(r.at("median_us")), std::get<double>(r.at("tbps")),
                  std::get<double>(r.at("floor_us")), std::get<double>(r.at("pct_floor")),
                  std::get<std::string>(r.at("floor_bound")).c_str(),
                  std::get<double>(r.at("metadata_us")),
                  std::get<bool>(r.at("verified")) ? "ok" : "FAILED");
    } catch (const std::exception& e) {
      records.push_back(Record()
                            .set("op", std::string("decode"))
                            .set("shape", name)
                            .set("verified", false)
                            .set("error", std::string(e.what())));
      std::printf("%-22s ERROR: %s\n", name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  return records;
}

}  // namespace mqa_logits::bench
