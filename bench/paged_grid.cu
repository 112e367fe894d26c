// Decode grid benchmark: the contract's decode range as one grid rather than a few chosen shapes,
// B in {1 .. 512} x average context in {1K .. 128K} x next_n in {1, 2, 3, 4, 6, 8} x block_kv in
// {32, 64}, H 64, D 128, FP8, fp32 logits, context_lens [B, N], contexts uniform in
// [0.7, 1.3] x avg, random block tables, schedule metadata given, clean_logits off. Every cell is
// measured by measure_decode (paged.cu), so it is verified and floored exactly as a decode row.
//
// The host workload is the slow part: it is generated once per (B, context, block_kv) and only
// its queries are rebuilt per next_n (support::rewrite_next_n), and the cache stays on the device
// across next_n. Cells whose cache would pass the budget, or that would not fit in free device
// memory, are reported as skipped.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace mqa_logits::bench {
namespace {

constexpr std::int64_t kHeads = 64;
constexpr std::int64_t kHeadDim = 128;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Cache bytes at the longest contexts (1.3 x avg): what a cell may hold on the device. Keeps a
// cell's host workload (cache plus its float keys, ~5x the cache) within a benchmark host.
constexpr double kCacheBudgetBytes = 16.0 * kGiB;

struct Axes {
  std::vector<std::int64_t> batches, contexts, next_ns;
  std::vector<int> block_kvs;
};

Axes grid_axes(bool quick) {
  if (quick) return {{1, 8, 64, 256}, {4096, 32768}, {1, 2, 4}, {64}};
  return {{1, 4, 8, 16, 32, 64, 128, 256, 512},
          {1024, 4096, 16384, 32768, 131072},
          {1, 2, 3, 4, 6, 8},
          {32, 64}};
}

double cache_budget_bytes(std::int64_t batch, std::int64_t avg_context) {
  return static_cast<double>(batch) * static_cast<double>(avg_context) * 1.3 *
         static_cast<double>(kHeadDim + 4);
}

// Why a (B, context) pair is not run, empty when it is: over the cache budget, or (cache, plus
// the logits of the largest next_n) over the device's free memory.
std::string skip_reason(std::int64_t batch, std::int64_t avg_context, std::int64_t max_next_n) {
  const double cache = cache_budget_bytes(batch, avg_context);
  char reason[128];
  if (cache > kCacheBudgetBytes) {
    std::snprintf(reason, sizeof(reason), "cache %.1f GiB > %.0f GiB budget", cache / kGiB,
                  kCacheBudgetBytes / kGiB);
    return reason;
  }
  std::size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double logits = static_cast<double>(batch * max_next_n) * 1.3 *
                        static_cast<double>(avg_context) * sizeof(float);
  if (cache + logits > 0.9 * static_cast<double>(free_bytes)) {
    std::snprintf(reason, sizeof(reason), "needs %.1f GiB, device has %.1f GiB free",
                  (cache + logits) / kGiB, static_cast<double>(free_bytes) / kGiB);
    return reason;
  }
  return {};
}

// One device allocation, optionally holding a copy of a host buffer; empty buffers stay null, as
// in DeviceArena.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes != 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  explicit DeviceBuffer(const support::HostBuffer& buffer) : DeviceBuffer(buffer.bytes.size()) {
    if (data_ != nullptr) {
      check_cuda(cudaMemcpy(data_, buffer.bytes.data(), buffer.bytes.size(), cudaMemcpyHostToDevice),
            "cudaMemcpy");
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

std::string cell_name(std::int64_t batch, std::int64_t next_n, std::int64_t avg_context,
                      int block_kv) {
  return std::to_string(batch) + "/" + std::to_string(next_n) + "/" +
         std::to_string(avg_context) + "/" + std::to_string(block_kv);
}

void print_header() {
  std::printf("%-22s %9s %9s %9s %7s %9s %7s %7s %8s %s\n", "grid B/N/avg/bk", "median us",
              "p10 us", "p90 us", "p90/p10", "floor us", "%floor", "bound", "meta us", "check");
}

void print_row(const std::string& name, const Record& r) {
  std::printf("%-22s %9.1f %9.1f %9.1f %7.2f %9.1f %6.1f%% %7s %8.2f %s\n", name.c_str(),
              std::get<double>(r.at("median_us")), std::get<double>(r.at("p10_us")),
              std::get<double>(r.at("p90_us")), std::get<double>(r.at("p90_over_p10")),
              std::get<double>(r.at("floor_us")), std::get<double>(r.at("pct_floor")),
              std::get<std::string>(r.at("floor_bound")).c_str(),
              std::get<double>(r.at("metadata_us")),
              std::get<bool>(r.at("verified")) ? "ok" : "FAILED");
}

Record cell_record(const std::string& name) {
  return Record().set("op", std::string("decode-grid")).set("shape", name);
}

struct Tally {
  int ran = 0, verified = 0, skipped = 0, failed = 0;
};

// All next_n cells of one (B, context, block_kv): one workload and one device copy of its cache
// and block table; queries, weights, lengths and logits are per next_n.
void run_group(const BenchContext& context, const Axes& axes, std::int64_t batch,
               std::int64_t avg_context, int block_kv, std::vector<Record>& records,
               Tally& tally) {
  support::PagedSpec spec;
  spec.batch = batch;
  spec.next_n = axes.next_ns.front();
  spec.num_heads = kHeads;
  spec.head_dim = kHeadDim;
  spec.block_kv = block_kv;
  spec.avg_context = avg_context;
  spec.context_jitter = 0.3;
  spec.lens_2d = true;
  spec.seed = 7;
  auto workload = support::make_paged_workload(spec);
  using Slot = support::PagedWorkload::Slot;
  const DeviceBuffer cache(workload.buffers[Slot::kKvCache]);
  const DeviceBuffer table(workload.buffers[Slot::kBlockTable]);
  for (const std::int64_t next_n : axes.next_ns) {
    const std::string name = cell_name(batch, next_n, avg_context, block_kv);
    try {
      support::rewrite_next_n(workload, next_n);
      const DeviceBuffer q(workload.buffers[Slot::kQ]);
      const DeviceBuffer q_scales(workload.buffers[Slot::kQScales]);
      const DeviceBuffer weights(workload.buffers[Slot::kWeights]);
      const DeviceBuffer lens(workload.buffers[Slot::kContextLens]);
      const DeviceBuffer logits(workload.logits_bytes());
      std::vector<void*> inputs(Slot::kNumSlots, nullptr);
      inputs[Slot::kQ] = q.get();
      inputs[Slot::kQScales] = q_scales.get();
      inputs[Slot::kKvCache] = cache.get();
      inputs[Slot::kWeights] = weights.get();
      inputs[Slot::kContextLens] = lens.get();
      inputs[Slot::kBlockTable] = table.get();
      // The small calls of the fixed-cost bar (B = 1, L = 4096) and their neighbours are also
      // timed behind another kernel: their fixed cost is most of their time.
      const bool isolated = batch == 1 && avg_context <= 4096 && next_n <= 2;
      Record r = measure_decode(context, workload, inputs, logits.get(), isolated);
      const double p10 = std::get<double>(r.at("p10_us"));
      r.set("op", std::string("decode-grid"))
          .set("shape", name)
          .set("p90_over_p10", p10 > 0 ? std::get<double>(r.at("p90_us")) / p10 : 0.0);
      print_row(name, r);
      ++tally.ran;
      if (std::get<bool>(r.at("verified"))) {
        ++tally.verified;
      } else {
        ++tally.failed;
      }
      records.push_back(std::move(r));
    } catch (const std::exception& e) {
      ++tally.failed;
      records.push_back(
          cell_record(name).set("verified", false).set("error", std::string(e.what())));
      std::printf("%-22s ERROR: %s\n", name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
}

// Every next_n cell of one (B, context, block_kv) that does not run, with why.
void report_group(const Axes& axes, std::int64_t batch, std::int64_t avg_context, int block_kv,
                  bool skipped, const std::string& reason, std::vector<Record>& records) {
  const std::string what = skipped ? "skipped" : "error";
  for (const std::int64_t next_n : axes.next_ns) {
    const std::string name = cell_name(batch, next_n, avg_context, block_kv);
    // A skipped cell is no failure (the exit status stays 0); it is not verified either.
    records.push_back(cell_record(name).set("verified", false).set(what, reason));
    std::printf("%-22s %s: %s\n", name.c_str(), what.c_str(), reason.c_str());
  }
}

}  // namespace

std::vector<Record> run_paged_grid_bench(const BenchContext& context) {
  Axes axes = grid_axes(context.quick);
  if (!context.grid_batches.empty()) axes.batches = context.grid_batches;
  if (!context.grid_next_ns.empty()) axes.next_ns = context.grid_next_ns;
  const std::int64_t max_next_n = std::ranges::max(axes.next_ns);
  const auto group_size = static_cast<int>(axes.next_ns.size());
  std::vector<Record> records;
  Tally tally;
  print_header();
  for (const std::int64_t batch : axes.batches) {
    for (const std::int64_t avg_context : axes.contexts) {
      const std::string reason = skip_reason(batch, avg_context, max_next_n);
      for (const int block_kv : axes.block_kvs) {
        if (!reason.empty()) {
          tally.skipped += group_size;
          report_group(axes, batch, avg_context, block_kv, true, reason, records);
          continue;
        }
        try {
          run_group(context, axes, batch, avg_context, block_kv, records, tally);
        } catch (const std::exception& e) {
          // Generating the workload or uploading its cache failed: no cell of the group ran.
          tally.failed += group_size;
          report_group(axes, batch, avg_context, block_kv, false, e.what(), records);
        }
      }
      std::fflush(stdout);
    }
  }
  std::printf("decode-grid: %d cells ran, %d verified, %d failed, %d skipped\n", tally.ran,
              tally.verified, tally.failed, tally.skipped);
  return records;
}

}  // namespace mqa_logits::bench
