// The GPU executor: inputs copied to device memory, calls timed with CUDA events over CUDA graphs.
// Every copy, fill and call goes on the executor's one non-blocking stream, which orders them.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "executor.hpp"

namespace mqa_logits::cli {
namespace {

constexpr int kWarmupCalls = 3;
constexpr int kCallsPerGraph = 10;  // a replay long enough that launch gaps do not dominate
constexpr std::size_t kCopyProbeBytes = std::size_t{1} << 30;
constexpr int kCopyProbeReps = 10;
// Dense FP8 tensor-core FLOPs per SM per clock on compute capability 9.x: 1979 TFLOPS for an
// H100/H200 SXM (132 SMs) at its 1830 MHz rated clock.
constexpr double kHopperFp8FlopsPerSmClock = 8192.0;

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

DeviceBuffer device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
  return DeviceBuffer(p);
}

class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Seconds between two events recorded around whatever `enqueue` puts on `stream`.
template <typename Enqueue>
double time_on_stream(cudaStream_t stream, const Enqueue& enqueue) {
  Event start;
  Event stop;
  check_cuda(cudaEventRecord(start.get(), stream), "cudaEventRecord");
  enqueue();
  check_cuda(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
  return ms * 1e-3;
}

struct GraphExecDestroy {
  void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
};
using GraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDestroy>;

struct GraphDestroy {
  void operator()(cudaGraph_t graph) const { cudaGraphDestroy(graph); }
};
using Graph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroy>;

// Ends a capture on `stream`: the captured graph, or null when the capture failed.
Graph end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream, &graph);
  Graph owned(graph);
  return status == cudaSuccess ? std::move(owned) : nullptr;
}

// A graph of `calls` back-to-back calls, or null when the calls cannot be captured (the capture
// is then ended and its error cleared, and the caller times the calls directly).
GraphExec capture_calls(cudaStream_t stream, const std::function<void()>& enqueue_call, int calls) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  bool enqueued = true;
  try {
    for (int i = 0; i < calls; ++i) enqueue_call();
  } catch (const CudaError&) {
    enqueued = false;  // an operation a capture does not allow, e.g. a synchronization
  } catch (...) {
    end_capture(stream);  // leave the stream usable, then report the refusal
    throw;
  }
  const Graph graph = end_capture(stream);
  cudaGraphExec_t exec = nullptr;
  if (!enqueued || !graph || cudaGraphInstantiate(&exec, graph.get(), 0) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return GraphExec(exec);
}

class CudaExecutor final : public Executor {
 public:
  CudaExecutor() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw std::runtime_error("no CUDA device is visible");
    }
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    cudaDeviceProp props{};
    check_cuda(cudaGetDeviceProperties(&props, device_), "cudaGetDeviceProperties");
    name_ = props.name;
    compute_capability_ = props.major * 10 + props.minor;
    sm_count_ = props.multiProcessorCount;
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaExecutor() override {
    cudaStreamSynchronize(stream_);
    buffers_.clear();
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return {DeviceType::kCUDA, device_}; }
  std::string description() const override {
    return "CUDA backend on " + name_ + " (sm_" + std::to_string(compute_capability_) + ", " +
           std::to_string(get_num_sms()) + " of " + std::to_string(sm_count_) + " SMs)";
  }
  cudaStream_t stream() const override { return stream_; }

  std::vector<void*> place(const std::vector<support::HostBuffer>& buffers) override {
    std::vector<void*> pointers;
    for (const auto& buffer : buffers) {
      if (buffer.bytes.empty()) {
        pointers.push_back(nullptr);
        continue;
      }
      void* p = keep(device_alloc(buffer.bytes.size()));
      check_cuda(cudaMemcpyAsync(p, buffer.bytes.data(), buffer.bytes.size(), cudaMemcpyHostToDevice,
                            stream_),
            "cudaMemcpyAsync");
      pointers.push_back(p);
    }
    // The host buffers may change or go once this returns.
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return pointers;
  }

  void* allocate_poisoned(std::size_t bytes) override {
    void* p = keep(device_alloc(bytes));
    check_cuda(cudaMemsetAsync(p, 0xff, bytes, stream_), "cudaMemsetAsync");
    return p;
  }

  std::vector<std::byte> read_back(const void* data, std::size_t bytes) override {
    std::vector<std::byte> host(bytes);
    check_cuda(cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return host;
  }

  CallTiming time_calls(const std::function<void()>& enqueue_call, int iters,
                        const CallsProgress& progress) override {
    progress.line.update(progress.label + ": warm-up and " + std::to_string(iters) +
                         " timed repetitions");
    for (int i = 0; i < kWarmupCalls; ++i) enqueue_call();
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");

    CallTiming timing;
    if (const GraphExec graph = capture_calls(stream_, enqueue_call, kCallsPerGraph)) {
      timing.method = "CUDA events around a graph of " + std::to_string(kCallsPerGraph) + " calls";
      for (int i = 0; i < iters; ++i) {
        const double seconds = time_on_stream(
            stream_, [&] { check_cuda(cudaGraphLaunch(graph.get(), stream_), "cudaGraphLaunch"); });
        timing.seconds.push_back(seconds / kCallsPerGraph);
      }
    } else {
      timing.method = "CUDA events around each call (the call cannot be graph-captured)";
      for (int i = 0; i < iters; ++i)
        timing.seconds.push_back(time_on_stream(stream_, enqueue_call));
    }
    return timing;
  }

  int default_iters() const override { return 50; }

  // The peak uses the maximum SM clock the device reports, so it errs high and the roofline
  // fraction low.
  std::optional<DeviceRates> measure_rates() override {
    DeviceRates rates;
    if (compute_capability_ / 10 == 9) {
      int clock_khz = 0;
      check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_),
            "cudaDeviceGetAttribute");
      rates.peak_flops = kHopperFp8FlopsPerSmClock * sm_count_ * clock_khz * 1e3;
    }
    rates.copy_bandwidth = measure_copy_bandwidth();
    return rates;
  }

 private:
  void* keep(DeviceBuffer buffer) { return buffers_.emplace_back(std::move(buffer)).get(); }

  // Median device-to-device copy rate, counting the bytes read and the bytes written.
  double measure_copy_bandwidth() {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const std::size_t bytes = std::min(kCopyProbeBytes, free_bytes / 4);
    const DeviceBuffer src = device_alloc(bytes);
    const DeviceBuffer dst = device_alloc(bytes);
    const auto copy = [&] {
      check_cuda(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
    };
    copy();  // warm-up
    std::vector<double> seconds;
    for (int i = 0; i < kCopyProbeReps; ++i) seconds.push_back(time_on_stream(stream_, copy));
    std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
    return 2.0 * static_cast<double>(bytes) / seconds[seconds.size() / 2];
  }

  int device_ = 0;
  std::string name_;
  int compute_capability_ = 0;
  int sm_count_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceBuffer> buffers_;
};

}  // namespace

std::unique_ptr<Executor> make_cuda_executor() { return std::make_unique<CudaExecutor>(); }

}  // namespace mqa_logits::cli
