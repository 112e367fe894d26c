#include "common.hpp"

#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace mqa_logits::bench {

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(status));
  }
}

// Deterministic pseudo-random bytes on the device: never all-zero data.
__global__ void fill_random_fp8(std::uint8_t* data, std::size_t count, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    // e4m3 codes with exponent field 4..10 (|x| in [2^-3, 2^4)): no NaN, no overflow in the GEMM.
    data[i] = static_cast<std::uint8_t>((x & 0x80u) | ((4u + (x >> 8) % 7u) << 3) | ((x >> 16) & 7u));
  }
}

// 16-byte vector copy, grid-stride: what a bandwidth-bound kernel can reach.
__global__ void copy_kernel(const uint4* src, uint4* dst, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}

// Keeps the stream's GPU busy for `ns` nanoseconds: what the host enqueues meanwhile (a sample's
// begin event, graph launch and end event) is queued before the GPU reaches it.
__global__ void hold_stream(unsigned long long ns) {
  const auto now = [] {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  for (const auto start = now(); now() - start < ns;) {
  }
}

// Nothing: a plain launch between two calls, which the second's programmatic launch waits for.
__global__ void separate_calls() {}

double copy_bandwidth_tbps() {
  constexpr std::size_t kBytes = std::size_t{2} << 30;
  void *src = nullptr, *dst = nullptr;
  check_cuda(cudaMalloc(&src, kBytes), "cudaMalloc");
  check_cuda(cudaMalloc(&dst, kBytes), "cudaMalloc");
  fill_random_fp8<<<1024, 256>>>(static_cast<std::uint8_t*>(src), kBytes, 7);
  check_cuda(cudaGetLastError(), "fill_random_fp8");
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  const Timing t = time_graph([&](cudaStream_t s) {
    copy_kernel<<<sms * 8, 512, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                         kBytes / sizeof(uint4));
  }, 2, 20);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * kBytes / (t.median_us * 1e-6) / 1e12;
}

double fp8_gemm_tflops() {
  constexpr int kSize = 8192;
  constexpr std::size_t kWorkspace = 64 << 20;
  std::uint8_t *a = nullptr, *b = nullptr;
  void *d = nullptr, *workspace = nullptr;
  check_cuda(cudaMalloc(&a, std::size_t{kSize} * kSize), "cudaMalloc");
  check_cuda(cudaMalloc(&b, std::size_t{kSize} * kSize), "cudaMalloc");
  check_cuda(cudaMalloc(&d, std::size_t{kSize} * kSize * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&workspace, kWorkspace), "cudaMalloc");
  fill_random_fp8<<<1024, 256>>>(a, std::size_t{kSize} * kSize, 1);
  fill_random_fp8<<<1024, 256>>>(b, std::size_t{kSize} * kSize, 2);
  check_cuda(cudaGetLastError(), "fill_random_fp8");

  cublasLtHandle_t handle;
  check_cublas(cublasLtCreate(&handle), "cublasLtCreate");
  cublasLtMatmulDesc_t desc;
  check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;  // FP8 needs "TN"
  check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)), "TRANSB");
  cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
  check_cublas(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_8F_E4M3, kSize, kSize, kSize), "layout A");
  check_cublas(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_8F_E4M3, kSize, kSize, kSize), "layout B");
  check_cublas(cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_16BF, kSize, kSize, kSize), "layout D");
  cublasLtMatmulPreference_t preference;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "PreferenceCreate");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &kWorkspace, sizeof(kWorkspace)), "workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout_a, layout_b, layout_d, layout_d,
                                              preference, 1, &heuristic, &found), "AlgoGetHeuristic");
  if (found == 0) throw std::runtime_error("cuBLASLt has no FP8 GEMM algorithm for this GPU");
  const float alpha = 1.f, beta = 0.f;
  const Timing t = time_graph([&](cudaStream_t s) {
    check_cublas(cublasLtMatmul(handle, desc, &alpha, a, layout_a, b, layout_b, &beta, d, layout_d, d,
                                layout_d, &heuristic.algo, workspace, kWorkspace, s), "cublasLtMatmul");
  }, 3, 20);
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(layout_a);
  cublasLtMatrixLayoutDestroy(layout_b);
  cublasLtMatrixLayoutDestroy(layout_d);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(d);
  cudaFree(workspace);
  return 2.0 * kSize * kSize * double{kSize} / (t.median_us * 1e-6) / 1e12;
}

// The SM clock of the benchmark's device and whether the power cap holds it down, read through
// NVML, which is loaded at run time so that the benchmark needs no more than the driver. NVML's
// readings trail the clock by tens of milliseconds: they describe a row's replays together, not
// one replay.
class ClockReader {
 public:
  ClockReader() {
    void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml == nullptr) return;
    using Init = int (*)();
    using ByBusId = int (*)(const char*, void**);
    const auto init = reinterpret_cast<Init>(dlsym(nvml, "nvmlInit_v2"));
    const auto by_bus_id =
        reinterpret_cast<ByBusId>(dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_info_ = reinterpret_cast<ClockInfo>(dlsym(nvml, "nvmlDeviceGetClockInfo"));
    reasons_ = reinterpret_cast<Reasons>(dlsym(nvml, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (reasons_ == nullptr) {  // its name before driver R535
      reasons_ =
          reinterpret_cast<Reasons>(dlsym(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    }
    int cuda_device = 0;
    char bus_id[32] = {};
    if (init == nullptr || by_bus_id == nullptr || clock_info_ == nullptr || reasons_ == nullptr ||
        cudaGetDevice(&cuda_device) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess ||
        init() != 0 || by_bus_id(bus_id, &device_) != 0) {
      clock_info_ = nullptr;
    }
  }
  bool available() const { return clock_info_ != nullptr; }
  double sm_mhz() const {
    constexpr int kNvmlClockSm = 1;
    unsigned value = 0;
    return available() && clock_info_(device_, kNvmlClockSm, &value) == 0 ? value : 0.0;
  }
  bool power_capped() const {
    constexpr unsigned long long kSoftwarePowerCap = 0x4;
    unsigned long long reasons = 0;
    return available() && reasons_(device_, &reasons) == 0 && (reasons & kSoftwarePowerCap) != 0;
  }

 private:
  using ClockInfo = int (*)(void*, int, unsigned*);
  using Reasons = int (*)(void*, unsigned long long*);
  ClockInfo clock_info_ = nullptr;
  Reasons reasons_ = nullptr;
  void* device_ = nullptr;
};

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::string json_value(const Record::Value& value) {
  std::ostringstream out;
  std::visit([&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) {
      out << '"' << v << '"';
    } else if constexpr (std::is_same_v<V, bool>) {
      out << (v ? "true" : "false");
    } else {
      out << v;
    }
  }, value);
  return out.str();
}

}  // namespace

Ceilings measure_ceilings() { return {copy_bandwidth_tbps(), fp8_gemm_tflops()}; }

std::vector<double> isolated_medians_us(
    std::initializer_list<std::function<void(cudaStream_t)>> calls, int samples) {
  const auto separator = [](cudaStream_t stream) {
    separate_calls<<<1, 32, 0, stream>>>();
    check_cuda(cudaGetLastError(), "separate_calls");
  };
  const double separator_us = time_graph(separator, 5, samples).median_us;
  std::vector<double> medians;
  for (const auto& enqueue : calls) {
    const Timing both = time_graph(
        [&](cudaStream_t stream) {
          separator(stream);
          enqueue(stream);
        },
        5, samples);
    medians.push_back(both.median_us - separator_us);
  }
  return medians;
}

Timing time_graph(const std::function<void(cudaStream_t)>& enqueue, int calls, int samples) {
  constexpr unsigned long long kHoldNs = 30000;  // well past a graph launch's host time
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < 3; ++i) enqueue(stream);  // warm-up outside the graph (module load etc.)
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < calls; ++i) enqueue(stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int i = 0; i < 3; ++i) check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  cudaEvent_t begin, end;
  check_cuda(cudaEventCreate(&begin), "cudaEventCreate");
  check_cuda(cudaEventCreate(&end), "cudaEventCreate");
  // One replay, timed by events around it. The GPU is held busy while the host records the
  // events and launches the graph: with an idle GPU the begin event fires at once and the time
  // would include the host's launch of the graph (docs/design.md, "Choices made by measurement").
  const auto replay_ms = [&] {
    hold_stream<<<1, 1, 0, stream>>>(kHoldNs);
    check_cuda(cudaGetLastError(), "hold_stream");
    check_cuda(cudaEventRecord(begin, stream), "cudaEventRecord");
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check_cuda(cudaEventRecord(end, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    return ms;
  };
  // Replay back to back for kWarmUpMs first, so that every sample is taken at the clock a busy
  // engine runs at. The clock falls while the host prepares a case and takes milliseconds to rise
  // again (without a warm-up, the first microsecond-scale case of a run measured ~20% slow); and
  // under a heavy call the power cap lowers it 20-60 ms into the load: samples that straddled that
  // step made the heaviest rows look bimodal (docs/design.md, "Choices made by measurement").
  // The warm-up outlasts the step, so the samples measure the sustained rate.
  // (Replays under 20 us stop at 10000 launches: such calls do not draw the power of the cap.)
  constexpr float kWarmUpMs = 200.0f;
  const int warm_launches =
      std::min(10000, static_cast<int>(kWarmUpMs / std::max(replay_ms(), 1e-3f)));
  for (int i = 0; i < warm_launches; ++i) {
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  static const ClockReader clock;
  std::vector<double> per_call, clock_mhz;
  int power_capped = 0;
  for (int i = 0; i < samples; ++i) {
    per_call.push_back(replay_ms() * 1000.0 / calls);
    clock_mhz.push_back(clock.sm_mhz());
    power_capped += clock.power_capped() ? 1 : 0;
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(per_call.begin(), per_call.end());
  const auto at = [&](double q) {
    return per_call[static_cast<std::size_t>(q * (per_call.size() - 1))];
  };
  const double capped_share = static_cast<double>(power_capped) / samples;
  return {at(0.5), at(0.1), at(0.9), median(clock_mhz), capped_share};
}

DeviceArena::DeviceArena(const std::vector<support::HostBuffer>& buffers, std::size_t logits_bytes)
    : logits_bytes_(logits_bytes) {
  for (const auto& buffer : buffers) {
    void* device = nullptr;
    if (!buffer.bytes.empty()) {
      check_cuda(cudaMalloc(&device, buffer.bytes.size()), "cudaMalloc");
      check_cuda(cudaMemcpy(device, buffer.bytes.data(), buffer.bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    pointers_.push_back(device);
  }
  check_cuda(cudaMalloc(&logits_, logits_bytes), "cudaMalloc logits");
  check_cuda(cudaMemset(logits_, 0xff, logits_bytes), "cudaMemset logits");
}

DeviceArena::~DeviceArena() {
  for (void* p : pointers_) cudaFree(p);
  cudaFree(logits_);
}

void DeviceArena::upload(std::size_t slot, const support::HostBuffer& buffer) const {
  if (!buffer.bytes.empty()) {
    check_cuda(cudaMemcpy(pointers_.at(slot), buffer.bytes.data(), buffer.bytes.size(), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
}

std::vector<std::byte> DeviceArena::download_logits() const {
  std::vector<std::byte> host(logits_bytes_);
  check_cuda(cudaMemcpy(host.data(), logits_, logits_bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy logits");
  return host;
}

std::unique_ptr<std::byte[]> DeviceArena::download_rows(std::span<const std::int64_t> rows,
                                                        std::size_t row_stride_bytes,
                                                        std::size_t row_bytes) const {
  return bench::download_rows(logits_, logits_bytes_, rows, row_stride_bytes, row_bytes);
}

std::unique_ptr<std::byte[]> download_rows(const void* device, std::size_t bytes,
                                           std::span<const std::int64_t> rows,
                                           std::size_t row_stride_bytes, std::size_t row_bytes) {
  auto host = std::make_unique_for_overwrite<std::byte[]>(bytes);
  for (const std::int64_t row : rows) {
    const std::size_t offset = static_cast<std::size_t>(row) * row_stride_bytes;
    check_cuda(cudaMemcpy(host.get() + offset, static_cast<const std::byte*>(device) + offset, row_bytes,
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy logits row");
  }
  return host;
}

bool rows_unchanged(const std::byte* host, const void* device, std::size_t bytes,
                    std::span<const std::int64_t> rows, std::size_t row_stride_bytes,
                    std::size_t row_bytes) {
  const auto now = download_rows(device, bytes, rows, row_stride_bytes, row_bytes);
  return std::all_of(rows.begin(), rows.end(), [&](std::int64_t row) {
    const std::size_t offset = static_cast<std::size_t>(row) * row_stride_bytes;
    return std::memcmp(host + offset, now.get() + offset, row_bytes) == 0;
  });
}

Record& Record::set_timing(const Timing& t) {
  return set("median_us", t.median_us)
      .set("p10_us", t.p10_us)
      .set("p90_us", t.p90_us)
      .set("sm_mhz", t.sm_mhz)
      .set("power_capped", t.power_capped);
}

Record& Record::set_floor(const Ceilings& ceilings, double flops, double bytes,
                          double median_us) {
  const double compute_us = flops / (ceilings.fp8_tflops * 1e12) * 1e6;
  const double memory_us = bytes / (ceilings.copy_tbps * 1e12) * 1e6;
  const double floor_us = std::max(compute_us, memory_us);
  return set("floor_us", floor_us)
      .set("floor_bound", std::string(compute_us > memory_us ? "fp8" : "memory"))
      .set("pct_floor", 100.0 * floor_us / median_us);
}

Record& Record::set(const std::string& key, Value value) {
  for (auto& field : fields_) {
    if (field.first == key) {
      field.second = std::move(value);
      return *this;
    }
  }
  fields_.emplace_back(key, std::move(value));
  return *this;
}

const Record::Value& Record::at(const std::string& key) const {
  for (const auto& field : fields_) {
    if (field.first == key) return field.second;
  }
  throw std::out_of_range("no field " + key);
}

bool Record::has(const std::string& key) const {
  return std::any_of(fields_.begin(), fields_.end(),
                     [&](const auto& field) { return field.first == key; });
}

std::string Record::json() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    out += (i ? ", \"" : "\"") + fields_[i].first + "\": " + json_value(fields_[i].second);
  }
  return out + "}";
}

}  // namespace mqa_logits::bench
