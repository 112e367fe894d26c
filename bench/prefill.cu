// Prefill benchmark: the shapes of the performance bar, causal windows, clean on and off, fp32 and
// bf16 logits, with and without schedule metadata; each result checked against the float64
// oracle on sampled rows before it is reported.
#include <cstdio>
#include <stdexcept>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"

namespace mqa_logits::bench {
namespace {

struct Shape {
  std::int64_t seq_len, seq_len_kv, heads, head_dim;
};

std::int64_t window_pairs(const support::PrefillWorkload& w) {
  std::int64_t pairs = 0;
  const auto start = w.k_start(), end = w.k_end();
  for (std::size_t i = 0; i < start.size(); ++i) {
    const std::int64_t lo = std::max<std::int64_t>(start[i], 0);
    const std::int64_t hi = std::min<std::int64_t>(end[i], w.spec.seq_len_kv);
    pairs += std::max<std::int64_t>(hi - lo, 0);
  }
  return pairs;
}

Record bench_case(const BenchContext& context, const support::PrefillWorkload& workload,
                  const DeviceArena& arena, bool scheduled) {
  const auto& spec = workload.spec;
  auto in = workload.inputs(arena.pointers(), {DeviceType::kCUDA, 0});
  const Device gpu{DeviceType::kCUDA, 0};
  std::int32_t* meta = nullptr;
  if (scheduled) {
    const auto rows = schedule_meta_rows(get_num_sms());
    check(cudaMalloc(&meta, rows * 2 * sizeof(std::int32_t)), "cudaMalloc meta");
    const auto meta_view = TensorView::contiguous(meta, DType::kInt32, {rows, 2}, gpu);
    get_mqa_logits_metadata(in.k_start, in.k_end, spec.seq_len_kv, static_cast<int>(spec.num_heads), meta_view);
    in.options.schedule_meta = meta_view;
  }
  const TensorView logits = workload.logits_view(arena.logits(), gpu);
  auto call = [&](cudaStream_t stream) {
    auto options = in.options;
    options.stream = stream;
    mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits, options);
  };
  check(cudaMemset(arena.logits(), 0xff, workload.logits_bytes()), "poison logits");
  call(nullptr);
  check(cudaDeviceSynchronize(), "prefill call");
  const auto host = arena.download_logits();
  const auto rows = support::sample_rows(spec.seq_len, context.quick ? 4 : 8, 3);
  const auto verdict = support::verify_rows(workload, host.data(), rows, support::Operands::kQuantized);
  const Timing t = time_graph(call, 5, context.quick ? 10 : 40);
  if (meta != nullptr) cudaFree(meta);

  const double pairs = static_cast<double>(window_pairs(workload));
  const double tflops = 2.0 * spec.num_heads * spec.head_dim * pairs / (t.median_us * 1e-6) / 1e12;
  return Record()
      .set("op", std::string("prefill"))
      .set("S", spec.seq_len)
      .set("T", spec.seq_len_kv)
      .set("H", spec.num_heads)
      .set("D", spec.head_dim)
      .set("clean", spec.clean_logits)
      .set("logits", std::string(dtype_name(spec.logits_dtype)))
      .set("scheduled", scheduled)
      .set("median_us", t.median_us)
      .set("p10_us", t.p10_us)
      .set("p90_us", t.p90_us)
      .set("tflops", tflops)
      .set("pct_fp8_ceiling", 100.0 * tflops / context.ceilings.fp8_tflops)
      .set("verified", verdict.ok)
      .set("oracle_diff", verdict.diff);
}

}  // namespace

std::vector<Record> run_prefill_bench(const BenchContext& context) {
  std::vector<Shape> shapes = {{2048, 8192, 64, 128},  {2048, 32768, 64, 128}, {4096, 65536, 64, 128},
                               {8192, 65536, 64, 128}, {4096, 32768, 32, 128}, {4096, 32768, 64, 64}};
  if (context.quick) shapes = {{2048, 32768, 64, 128}, {4096, 32768, 32, 128}, {4096, 32768, 64, 64}};
  std::vector<Record> records;
  std::printf("%-24s %-6s %-9s %-5s %10s %9s %8s %s\n", "prefill S/T/H/D", "clean", "logits", "meta",
              "us", "TFLOPS", "%fp8", "check");
  for (const Shape& shape : shapes) {
    support::PrefillSpec spec;
    spec.seq_len = shape.seq_len;
    spec.seq_len_kv = shape.seq_len_kv;
    spec.num_heads = shape.heads;
    spec.head_dim = shape.head_dim;
    spec.windows = support::WindowKind::kCausal;
    spec.seed = 42;
    auto workload = support::make_prefill_workload(spec);
    // Every variant reads the same inputs and fits the largest (fp32) output.
    const DeviceArena arena(workload.buffers, workload.logits_bytes());
    for (DType logits : {DType::kFloat32, DType::kBFloat16}) {
      for (bool clean : {false, true}) {
        for (bool scheduled : {false, true}) {
          if (context.quick && scheduled && !clean) continue;
          workload.spec.logits_dtype = logits;
          workload.spec.clean_logits = clean;
          workload.layout = mqa_logits_output_layout(spec.seq_len, spec.seq_len_kv, 0, logits);
          const std::string shape_name = std::to_string(shape.seq_len) + "/" + std::to_string(shape.seq_len_kv) +
                                         "/" + std::to_string(shape.heads) + "/" + std::to_string(shape.head_dim);
          try {
            const Record r = bench_case(context, workload, arena, scheduled);
            records.push_back(r);
            std::printf("%-24s %-6s %-9s %-5s %10.1f %9.1f %7.1f%% %s\n", shape_name.c_str(),
                        clean ? "yes" : "no", dtype_name(logits), scheduled ? "yes" : "no",
                        std::get<double>(r.at("median_us")), std::get<double>(r.at("tflops")),
                        std::get<double>(r.at("pct_fp8_ceiling")),
                        std::get<bool>(r.at("verified")) ? "ok" : "FAILED");
          } catch (const std::exception& e) {
            records.push_back(Record().set("op", std::string("prefill")).set("shape", shape_name)
                                  .set("verified", false).set("error", std::string(e.what())));
            std::printf("%-24s %-6s %-9s %-5s ERROR: %s\n", shape_name.c_str(), clean ? "yes" : "no",
                        dtype_name(logits), scheduled ? "yes" : "no", e.what());
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return records;
}

}  // namespace mqa_logits::bench
