// Prefill benchmark, two suites; each result checked against the float64 oracle on sampled rows
// before it is reported.
// - shapes ("prefill"): the shapes of the performance bar, causal windows, clean on and off, fp32
//   and bf16 logits, with and without schedule metadata;
// - window patterns ("patterns"): what engines send (docs/contract.md, "How performance is
//   counted"): one request, square causal, packed requests of equal and uneven lengths, sliding
//   windows, context-parallel shards, random windows with empty rows; each with schedule
//   metadata without and with clean_logits, and without either (the drop-in call), its rate
//   against the one-request call of the same H / D, and the time clean adds against the time
//   writing the masked elements at copy bandwidth takes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "support/reference.hpp"

namespace mqa_logits::bench {
namespace {

struct Shape {
  std::int64_t seq_len, seq_len_kv, heads, head_dim;
};

// (row, key) pairs inside the windows, and with compressed output inside its columns (key j of
// row i is column j - start[i], kept below max_seqlen_k).
std::int64_t window_pairs(const support::PrefillWorkload& w) {
  std::int64_t pairs = 0;
  const auto start = w.k_start(), end = w.k_end();
  for (std::size_t i = 0; i < start.size(); ++i) {
    const std::int64_t lo = std::max<std::int64_t>(start[i], 0);
    std::int64_t hi = std::min<std::int64_t>(end[i], w.spec.seq_len_kv);
    if (w.spec.max_seqlen_k > 0) hi = std::min<std::int64_t>(hi, start[i] + w.spec.max_seqlen_k);
    pairs += std::max<std::int64_t>(hi - lo, 0);
  }
  return pairs;
}

// The bytes no call can move fewer of, for its floor: every input read once (q alone is S x H x
// D: 8 KB a query row at H = 64, D = 128, which short windows use for few keys) and the logits
// written, the window pairs' without clean_logits, every column with it.
double call_bytes(const support::PrefillWorkload& workload, double pairs) {
  double bytes = 0;
  for (const support::HostBuffer& buffer : workload.buffers) {
    bytes += static_cast<double>(buffer.bytes.size());
  }
  const double written = workload.spec.clean_logits
                             ? static_cast<double>(workload.spec.seq_len * workload.out_cols())
                             : pairs;
  return bytes + written * static_cast<double>(dtype_size(workload.spec.logits_dtype));
}

Record bench_case(const BenchContext& context, const support::PrefillWorkload& workload,
                  const DeviceArena& arena, bool scheduled) {
  const auto& spec = workload.spec;
  auto in = workload.inputs(arena.pointers(), {DeviceType::kCUDA, 0});
  const Device gpu{DeviceType::kCUDA, 0};
  std::int32_t* meta = nullptr;
  std::function<void(cudaStream_t)> metadata;
  if (scheduled) {
    const auto rows = schedule_meta_rows(get_num_sms());
    check_cuda(cudaMalloc(&meta, rows * 2 * sizeof(std::int32_t)), "cudaMalloc meta");
    const auto meta_view = TensorView::contiguous(meta, DType::kInt32, {rows, 2}, gpu);
    metadata = [&, meta_view](cudaStream_t stream) {
      get_mqa_logits_metadata(in.k_start, in.k_end, spec.seq_len_kv,
                              static_cast<int>(spec.num_heads), meta_view, stream);
    };
    metadata(nullptr);
    in.options.schedule_meta = meta_view;
  }
  const TensorView logits = workload.logits_view(arena.logits(), gpu);
  auto call = [&](cudaStream_t stream) {
    auto options = in.options;
    options.stream = stream;
    mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits, options);
  };
  check_cuda(cudaMemset(arena.logits(), 0xff, workload.logits_bytes()), "poison logits");
  call(nullptr);
  check_cuda(cudaDeviceSynchronize(), "prefill call");
  const auto rows = support::sample_rows(spec.seq_len, context.quick ? 4 : 8, 3);
  const std::size_t element = dtype_size(spec.logits_dtype);
  const auto host = arena.download_rows(rows, workload.layout.row_stride * element,
                                        workload.layout.cols * element);
  const auto verdict = support::verify_rows(workload, host.get(), rows, support::Operands::kQuantized);
  const Timing t = time_graph(call, 5, context.quick ? 10 : 40);
  const bool replays_match =
      rows_unchanged(host.get(), arena.logits(), workload.logits_bytes(), rows,
                     workload.layout.row_stride * element, workload.layout.cols * element);
  // The metadata kernel alone, as an engine runs it once for the calls that share the windows
  // (once per workload: it does not depend on clean_logits).
  std::optional<Timing> metadata_time;
  if (metadata && !spec.clean_logits) {
    metadata_time = time_graph(metadata, 5, context.quick ? 10 : 40);
  }
  if (meta != nullptr) cudaFree(meta);

  const double pairs = static_cast<double>(window_pairs(workload));
  const double flops = 2.0 * spec.num_heads * spec.head_dim * pairs;
  const double tflops = flops / (t.median_us * 1e-6) / 1e12;
  const double bytes = call_bytes(workload, pairs);
  Record record;
  if (metadata_time) record.set("metadata_us", metadata_time->median_us);
  return record
      .set("op", std::string("prefill"))
      .set("S", spec.seq_len)
      .set("T", spec.seq_len_kv)
      .set("H", spec.num_heads)
      .set("D", spec.head_dim)
      .set("clean", spec.clean_logits)
      .set("logits", std::string(dtype_name(spec.logits_dtype)))
      .set("scheduled", scheduled)
      .set_timing(t)
      .set("tflops", tflops)
      .set("pct_fp8_ceiling", 100.0 * tflops / context.ceilings.fp8_tflops)
      .set("bytes", bytes)
      .set_floor(context.ceilings, flops, bytes, t.median_us)
      .set("replays_match", replays_match)
      .set("verified", verdict.ok && replays_match)
      .set("oracle_diff", verdict.diff);
}

}  // namespace

std::vector<Record> run_prefill_bench(const BenchContext& context) {
  std::vector<Shape> shapes = {{2048, 8192, 64, 128},  {2048, 32768, 64, 128}, {4096, 65536, 64, 128},
                               {8192, 65536, 64, 128}, {4096, 32768, 32, 128}, {4096, 32768, 64, 64}};
  if (context.quick) shapes = {{2048, 32768, 64, 128}, {4096, 32768, 32, 128}, {4096, 32768, 64, 64}};
  std::vector<Record> records;
  std::printf("prefill shapes: causal windows\n");
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

// ---- window patterns ---------------------------------------------------------------------------

namespace {

// One call as an engine sends it: its name in the table, its shape and windows.
struct Pattern {
  std::string name;
  support::PrefillSpec spec;
};

Pattern pattern(std::string name, std::int64_t s, std::int64_t t, std::int64_t heads,
                std::int64_t dim, support::WindowKind windows) {
  support::PrefillSpec spec;
  spec.seq_len = s;
  spec.seq_len_kv = t;
  spec.num_heads = heads;
  spec.head_dim = dim;
  spec.windows = windows;
  spec.seed = 42;
  return {std::move(name), spec};
}

// Requests packed into one call: S = T = their sum.
Pattern packed(std::string name, std::vector<std::int64_t> lengths, std::int64_t heads,
               std::int64_t dim) {
  std::int64_t total = 0;
  for (const std::int64_t length : lengths) total += length;
  Pattern p = pattern(std::move(name), total, total, heads, dim, support::WindowKind::kPacked);
  p.spec.request_lengths = std::move(lengths);
  return p;
}

Pattern packed_equal(std::int64_t requests, std::int64_t length, std::int64_t heads,
                     std::int64_t dim) {
  return packed("packed " + std::to_string(requests) + " x " + std::to_string(length),
                std::vector<std::int64_t>(requests, length), heads, dim);
}

// Requests of 256 to 16384 tokens, log-uniform (support::uneven_request_lengths).
Pattern packed_uneven(std::int64_t requests, std::int64_t total, std::uint64_t seed) {
  return packed("packed " + std::to_string(requests) + " uneven",
                support::uneven_request_lengths(requests, total, seed, 256, 16384), 64, 128);
}

// The queries of a long-context request (8192 of 65536 tokens) behind a sliding window.
Pattern sliding(std::int64_t window) {
  Pattern p = pattern("sliding " + std::to_string(window), 8192, 65536, 64, 128,
                      support::WindowKind::kSliding);
  p.spec.sliding_window = window;
  return p;
}

// Every pattern at H = 64, D = 128; the one-request call, square causal 8192^2 and 8 x 2048 packed
// at the other H / D of the performance bar, and at H = 16 and 8. Within one H / D the one-request
// call comes first (the other rates are fractions of its), and patterns of one shape are
// neighbours: they share one workload (23 in all, generated in about 8 s on 16 cores).
std::vector<Pattern> pattern_list(bool quick) {
  using support::WindowKind;
  std::vector<Pattern> list;
  for (const auto& [heads, dim] : {std::pair<std::int64_t, std::int64_t>{64, 128}, {32, 128},
                                   {64, 64}, {64, 32}, {16, 128}, {8, 128}}) {
    const bool every_pattern = heads == 64 && dim == 128;
    if (quick && !every_pattern) break;
    list.push_back(pattern("one request", 2048, 8192, heads, dim, WindowKind::kCausal));
    if (every_pattern && !quick) {
      list.push_back(pattern("square causal", 2048, 2048, heads, dim, WindowKind::kCausal));
      list.push_back(pattern("square causal", 4096, 4096, heads, dim, WindowKind::kCausal));
    }
    list.push_back(pattern("square causal", 8192, 8192, heads, dim, WindowKind::kCausal));
    list.push_back(packed_equal(8, 2048, heads, dim));  // S = T = 16384
    if (!every_pattern) continue;
    if (!quick) {
      list.push_back(packed_equal(64, 256, heads, dim));
      list.push_back(packed_uneven(2, 16384, 2));
      list.push_back(packed_equal(32, 1024, heads, dim));  // S = T = 32768
    }
    list.push_back(packed_uneven(12, 32768, 1));
    list.push_back(sliding(2048));  // S = 8192, T = 65536
    if (!quick) {
      list.push_back(sliding(512));
      list.push_back(sliding(128));
    }
    list.push_back(pattern("context parallel", 8192, 65536, heads, dim,
                           WindowKind::kContextParallel));
    list.push_back(pattern("random", 4096, 16384, heads, dim, WindowKind::kRandom));
  }
  return list;
}

bool same_shape(const support::PrefillSpec& a, const support::PrefillSpec& b) {
  return a.seq_len == b.seq_len && a.seq_len_kv == b.seq_len_kv && a.num_heads == b.num_heads &&
         a.head_dim == b.head_dim;
}

std::string joined(const std::vector<std::int64_t>& values) {
  std::string text;
  for (const std::int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

// "12.3", or "-" where there is no value.
std::string cell(std::optional<double> value, int precision = 1) {
  if (!value) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", precision, *value);
  return text;
}

std::optional<double> number(const Record& r, const std::string& key) {
  try {
    return std::get<double>(r.at(key));
  } catch (const std::out_of_range&) {
    return std::nullopt;
  }
}

void print_pattern_header() {
  std::printf("prefill patterns: fp32 logits\n"
              "  meta: schedule metadata given (no: the drop-in call, each CTA computes its own)\n"
              "  x1req: TFLOPS / those of the one-request 2048/8192 call of the same H/D, clean and"
              " meta\n"
              "  +clean: the time clean_logits adds; allowed: 1.1 x masked bytes / copy bandwidth"
              " + 5 us\n"
              "  %%floor: the floor over the median; the floor is the window pairs' FLOPs at the"
              " FP8 ceiling or\n"
              "    the bytes (inputs read once, logits written) at the copy ceiling, whichever is"
              " longer (bound)\n"
              "  meta us: the metadata kernel alone (graphs of 5 calls)\n");
  std::printf("%-18s %-11s %-6s %-5s %-4s %9s %9s %9s %7s %6s %5s %6s %-6s %8s %8s %-5s %7s %s\n",
              "pattern", "S/T", "H/D", "clean", "meta", "median us", "p10 us", "p90 us", "TFLOPS",
              "%fp8", "x1req", "%floor", "bound", "+clean", "allowed", "clean", "meta us", "check");
}

void print_pattern_row(const Pattern& p, const Record& r) {
  const auto& s = p.spec;
  const bool clean = std::get<bool>(r.at("clean"));
  const bool scheduled = std::get<bool>(r.at("scheduled"));
  const std::string shape = std::to_string(s.seq_len) + "/" + std::to_string(s.seq_len_kv);
  const std::string heads_dim = std::to_string(s.num_heads) + "/" + std::to_string(s.head_dim);
  std::string allowance;
  if (clean) allowance = std::get<bool>(r.at("clean_within_allowance")) ? "pass" : "FAIL";
  std::printf("%-18s %-11s %-6s %-5s %-4s %9s %9s %9s %7s %5s%% %5s %5s%% %-6s %8s %8s %-5s %7s %s\n",
              p.name.c_str(), shape.c_str(), heads_dim.c_str(), clean ? "yes" : "no",
              scheduled ? "yes" : "no",
              cell(number(r, "median_us")).c_str(), cell(number(r, "p10_us")).c_str(),
              cell(number(r, "p90_us")).c_str(), cell(number(r, "tflops")).c_str(),
              cell(number(r, "pct_fp8_ceiling")).c_str(),
              cell(number(r, "rate_vs_one_request"), 2).c_str(),
              cell(number(r, "pct_floor")).c_str(),
              std::get<std::string>(r.at("floor_bound")).c_str(),
              cell(number(r, "clean_added_us")).c_str(),
              cell(number(r, "clean_allowance_us")).c_str(), allowance.c_str(),
              cell(number(r, "metadata_us"), 2).c_str(),
              std::get<bool>(r.at("verified")) ? "ok" : "FAILED");
}

}  // namespace

std::vector<Record> run_prefill_patterns_bench(const BenchContext& context) {
  std::vector<Record> records;
  print_pattern_header();
  // TFLOPS of the one-request call per (H, D, clean, metadata): what the other patterns are
  // compared with.
  std::map<std::tuple<std::int64_t, std::int64_t, bool, bool>, double> one_request_tflops;
  std::optional<support::PrefillWorkload> workload;
  std::unique_ptr<DeviceArena> arena;
  int workloads = 0;
  std::chrono::duration<double> generation{0};
  for (const Pattern& p : pattern_list(context.quick)) {
    try {
      if (workload && same_shape(workload->spec, p.spec)) {
        workload->spec = p.spec;  // only the windows differ: keep the queries and keys
        support::rewrite_windows(*workload);
        arena->upload(support::PrefillWorkload::kStart,
                      workload->buffers[support::PrefillWorkload::kStart]);
        arena->upload(support::PrefillWorkload::kEnd,
                      workload->buffers[support::PrefillWorkload::kEnd]);
      } else {
        arena.reset();  // the largest shapes hold GBs on both sides: one at a time
        workload.reset();
        const auto begin = std::chrono::steady_clock::now();
        workload = support::make_prefill_workload(p.spec);
        generation += std::chrono::steady_clock::now() - begin;
        ++workloads;
        arena = std::make_unique<DeviceArena>(workload->buffers, workload->logits_bytes());
      }
      const std::int64_t pairs = window_pairs(*workload);
      std::optional<double> no_clean_us;
      struct Setting {
        bool clean, scheduled;
      };
      // With metadata, without and with clean (the clean rule compares the two); then the call
      // as the drop-in API makes it: no clean, no metadata.
      for (const auto [clean, scheduled] :
           {Setting{false, true}, Setting{true, true}, Setting{false, false}}) {
        workload->spec.clean_logits = clean;
        Record r = bench_case(context, *workload, *arena, scheduled);
        const double tflops = std::get<double>(r.at("tflops"));
        const double median_us = std::get<double>(r.at("median_us"));
        r.set("op", std::string("prefill_pattern"))
            .set("pattern", p.name)
            .set("windows", std::string(support::window_kind_name(p.spec.windows)))
            .set("requests", static_cast<std::int64_t>(p.spec.request_lengths.size()))
            .set("request_lengths", joined(p.spec.request_lengths))
            .set("sliding_window", p.spec.sliding_window)
            .set("pairs", pairs);
        const auto key = std::tuple{p.spec.num_heads, p.spec.head_dim, clean, scheduled};
        if (p.name == "one request") one_request_tflops[key] = tflops;
        if (const auto it = one_request_tflops.find(key); it != one_request_tflops.end()) {
          r.set("rate_vs_one_request", tflops / it->second);
        }
        if (!clean) {
          if (scheduled) no_clean_us = median_us;
        } else {
          // What clean adds is writing -inf to every element outside the windows: at copy
          // bandwidth (bytes read + written per second, so generous to a write-only fill) plus
          // a launch's worth of fixed cost.
          const std::int64_t masked_bytes =
              (p.spec.seq_len * workload->out_cols() - pairs) *
              static_cast<std::int64_t>(dtype_size(workload->spec.logits_dtype));
          const double allowance_us =
              1.1 * static_cast<double>(masked_bytes) / (context.ceilings.copy_tbps * 1e12) * 1e6 +
              5.0;
          const double added_us = median_us - *no_clean_us;
          r.set("clean_added_us", added_us)
              .set("masked_bytes", masked_bytes)
              .set("clean_allowance_us", allowance_us)
              .set("clean_within_allowance", added_us <= allowance_us);
        }
        print_pattern_row(p, r);
        records.push_back(std::move(r));
        std::fflush(stdout);
      }
    } catch (const std::exception& e) {
      records.push_back(Record()
                            .set("op", std::string("prefill_pattern"))
                            .set("pattern", p.name)
                            .set("S", p.spec.seq_len)
                            .set("T", p.spec.seq_len_kv)
                            .set("verified", false)
                            .set("error", std::string(e.what())));
      std::printf("%-18s %lld/%lld ERROR: %s\n", p.name.c_str(),
                  static_cast<long long>(p.spec.seq_len),
                  static_cast<long long>(p.spec.seq_len_kv), e.what());
      arena.reset();  // the next pattern starts from a fresh workload
      workload.reset();
    }
  }
  std::printf("prefill patterns: %d workloads generated on the host in %.1f s\n", workloads,
              generation.count());
  return records;
}

}  // namespace mqa_logits::bench
