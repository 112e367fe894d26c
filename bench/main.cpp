// mqa-logits-bench: GPU benchmark of both operations against ceilings measured in the same run.
//
//   mqa-logits-bench [prefill|patterns|decode|host-cost|decode-grid|topk|all] [--quick]
//                    [--json FILE] [--batch B,B,...] [--next-n N,N,...]
//
// prefill: causal shapes; patterns: the prefill window patterns engines send; decode: paged
// shapes; host-cost: the host's time per call of the C++ API; topk: the top-k operations (k 2048)
// beside the logits alone and the logits followed by topk_per_row (not part of all, as the grid);
// all (default): prefill, patterns, decode and host-cost.
// decode-grid: the decode range engines send as a grid (B 1..512 x context 1K..128K x next_n
// 1..8 x block_kv 32, 64; --quick: a subset); not part of all, whose time budget is fixed.
// --batch: the grid's batch sizes replaced by these (to split the grid over several runs).
// --next-n: the grid's next_n values replaced by these (1 to 8).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: mqa-logits-bench [prefill|patterns|decode|host-cost|decode-grid|topk|all] "
               "[--quick] [--json FILE] [--batch B,B,...] [--next-n N,N,...]\n");
  return 2;
}

// "1,8,64" as {1, 8, 64}; empty when any entry is not a positive integer.
std::vector<std::int64_t> parse_list(const std::string& list) {
  std::vector<std::int64_t> values;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string entry = list.substr(begin, end - begin);
    char* rest = nullptr;
    const long long value = std::strtoll(entry.c_str(), &rest, 10);
    if (entry.empty() || *rest != '\0' || value < 1) return {};
    values.push_back(value);
    begin = end + 1;
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mqa_logits::bench;
  std::string suite = "all", json_path;
  BenchContext context;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "prefill" || arg == "patterns" || arg == "decode" || arg == "host-cost" ||
        arg == "decode-grid" || arg == "topk" || arg == "all") {
      suite = arg;
    } else if (arg == "--quick") {
      context.quick = true;
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--batch" && i + 1 < argc) {
      context.grid_batches = parse_list(argv[++i]);
      if (context.grid_batches.empty()) return usage();
    } else if (arg == "--next-n" && i + 1 < argc) {
      context.grid_next_ns = parse_list(argv[++i]);
      const auto in_range = [](std::int64_t n) { return n <= 8; };
      if (context.grid_next_ns.empty() ||
          !std::all_of(context.grid_next_ns.begin(), context.grid_next_ns.end(), in_range)) {
        return usage();
      }
    } else {
      return usage();
    }
  }
  if (!mqa_logits::cuda_backend_available()) {
    std::fprintf(stderr, "mqa-logits-bench: no sm_90 GPU found; the benchmark needs one\n");
    return 3;
  }
  try {
    cudaDeviceProp props{};
    mqa_logits::check_cuda(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
    context.ceilings = measure_ceilings();
    std::printf("%s, %d SMs: copy %.2f TB/s, FP8 GEMM 8192^3 %.0f TFLOPS\n", props.name,
                props.multiProcessorCount, context.ceilings.copy_tbps, context.ceilings.fp8_tflops);
    std::vector<Record> records;
    // in_all: whether `all` runs the suite (the grid is too long for its fixed budget).
    const auto run_suite = [&](const char* name, std::vector<Record> (*run)(const BenchContext&),
                               bool in_all = true) {
      if (suite != name && !(in_all && suite == "all")) return;
      auto r = run(context);
      records.insert(records.end(), r.begin(), r.end());
    };
    run_suite("prefill", run_prefill_bench);
    run_suite("patterns", run_prefill_patterns_bench);
    run_suite("decode", run_paged_bench);
    run_suite("host-cost", run_host_cost_bench);
    run_suite("decode-grid", run_paged_grid_bench, false);
    run_suite("topk", run_topk_bench, false);
    // Every row ran and was verified, but the cells the grid skips (not run on this GPU).
    bool all_verified = true;
    for (const auto& r : records) {
      all_verified = all_verified && (r.has("skipped") || std::get<bool>(r.at("verified")));
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << "{\"gpu\": \"" << props.name << "\", \"sms\": " << props.multiProcessorCount
          << ", \"copy_tbps\": " << context.ceilings.copy_tbps
          << ", \"fp8_tflops\": " << context.ceilings.fp8_tflops << ", \"results\": [\n";
      for (std::size_t i = 0; i < records.size(); ++i) {
        out << "  " << records[i].json() << (i + 1 < records.size() ? ",\n" : "\n");
      }
      out << "]}\n";
    }
    if (!all_verified) {
      std::fprintf(stderr, "mqa-logits-bench: some results failed verification\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mqa-logits-bench: %s\n", e.what());
    return 3;
  }
  return 0;
}
