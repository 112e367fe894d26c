// Benchmark framework: ceilings measured in the same run, CUDA-graph timing with medians, device
// copies of workloads, and a small JSON writer for machine-readable results.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "support/workload.hpp"

namespace mqa_logits::bench {


struct Ceilings {
  double copy_tbps = 0;   // device-to-device copy, bytes read + written per second / 1e12
  double fp8_tflops = 0;  // cuBLASLt FP8 e4m3 GEMM 8192^3 with bf16 output
};
Ceilings measure_ceilings();

struct Timing {
  double median_us = 0;
  double p10_us = 0;
  double p90_us = 0;
  // What NVML reported after each replay (0 without NVML): the median SM clock, and the share of
  // replays after which the software power cap was holding the clock down.
  double sm_mhz = 0;
  double power_capped = 0;
};

// Captures `calls` invocations of `enqueue(stream)` into one CUDA graph, warms it up, then
// replays it `samples` times, timing each replay with events; returns per-call statistics.
Timing time_graph(const std::function<void(cudaStream_t)>& enqueue, int calls = 5, int samples = 40);

// Each call's median time (us) with a plain empty kernel before it in the graph, less that
// kernel's own (timed once for all): the graph's calls otherwise follow each other by
// programmatic launch, each starting under the previous one's tail, which an engine's call behind
// another kernel does not.
std::vector<double> isolated_medians_us(
    std::initializer_list<std::function<void(cudaStream_t)>> calls, int samples = 40);

// Owning device copy of a workload's inputs (slot order), plus a logits buffer.
class DeviceArena {
 public:
  explicit DeviceArena(const std::vector<support::HostBuffer>& buffers, std::size_t logits_bytes);
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena();
  const std::vector<void*>& pointers() const { return pointers_; }
  // Copies `buffer` over the device copy of input `slot` (of the same size): new windows for the
  // same queries and keys.
  void upload(std::size_t slot, const support::HostBuffer& buffer) const;
  void* logits() const { return logits_; }
  std::vector<std::byte> download_logits() const;
  // Rows `rows` of the logits (`row_bytes` each, `row_stride_bytes` apart) at their own offsets in
  // a host buffer of the whole logits' size, the other rows left unwritten: verifying a sample of
  // rows then neither copies nor touches the gigabytes of the rest.
  std::unique_ptr<std::byte[]> download_rows(std::span<const std::int64_t> rows,
                                             std::size_t row_stride_bytes,
                                             std::size_t row_bytes) const;

 private:
  std::vector<void*> pointers_;
  void* logits_ = nullptr;
  std::size_t logits_bytes_ = 0;
};

// Rows `rows` of a device buffer of `bytes` bytes, as DeviceArena::download_rows does.
std::unique_ptr<std::byte[]> download_rows(const void* device, std::size_t bytes,
                                           std::span<const std::int64_t> rows,
                                           std::size_t row_stride_bytes, std::size_t row_bytes);

// Whether rows `rows` of the device buffer still hold `host`'s bytes (a download_rows of the same
// rows): after the timed replays, the output of the verified call (calls are bitwise repeatable).
bool rows_unchanged(const std::byte* host, const void* device, std::size_t bytes,
                    std::span<const std::int64_t> rows, std::size_t row_stride_bytes,
                    std::size_t row_bytes);

// One result row: ordered (key, value) pairs, written to JSON as an object.
class Record {
 public:
  using Value = std::variant<double, std::int64_t, std::string, bool>;
  Record& set(const std::string& key, Value value);
  Record& set_timing(const Timing& t);  // the times (us) and the clocks (MHz) of `t`
  // The call's floor, max(flops at the FP8 ceiling, bytes at the copy ceiling) in us, which of
  // the two sets it (fp8 or memory), and its percentage of the median.
  Record& set_floor(const Ceilings& ceilings, double flops, double bytes, double median_us);
  std::string json() const;
  const Value& at(const std::string& key) const;
  bool has(const std::string& key) const;

 private:
  std::vector<std::pair<std::string, Value>> fields_;
};

struct BenchContext {
  Ceilings ceilings;
  bool quick = false;  // fewer shapes and samples
  // decode-grid only: the batch sizes to run instead of the grid's (one run can then stay within
  // a per-command time limit); empty: the grid's.
  std::vector<std::int64_t> grid_batches;
  // decode-grid only: the next_n values to run instead of the grid's; empty: the grid's.
  std::vector<std::int64_t> grid_next_ns;
};

std::vector<Record> run_prefill_bench(const BenchContext& context);
std::vector<Record> run_prefill_patterns_bench(const BenchContext& context);
std::vector<Record> run_paged_bench(const BenchContext& context);
std::vector<Record> run_paged_grid_bench(const BenchContext& context);
std::vector<Record> run_topk_bench(const BenchContext& context);
std::vector<Record> run_host_cost_bench(const BenchContext& context);

// One decode row over a workload whose inputs are on the device at `device_inputs` (slot order,
// as DeviceArena::pointers) with room for its logits at `device_logits`: verified on sampled rows
// against the float64 oracle, timed with CUDA graphs, compared with the floor of the measured
// ceilings. Fields as the decode suite reports them ("op" is "decode"). With `isolated`, the
// call and the metadata kernel are also timed behind another kernel (isolated_medians_us).
Record measure_decode(const BenchContext& context, const support::PagedWorkload& workload,
                      std::span<void* const> device_inputs, void* device_logits,
                      bool isolated = false);

}  // namespace mqa_logits::bench
