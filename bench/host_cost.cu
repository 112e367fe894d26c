// Host cost benchmark: the time the host spends per call of the C++ API, as engines pay it when
// they run prefill eagerly (61 layers a forward pass). Each figure is a loop of kCalls calls on a
// tiny problem on one stream: the host's time per call is the loop's time before the one
// synchronize at the end (the kernels queue up behind it); the time with that synchronize is
// printed beside it. Beside the API calls, the CUDA runtime's own costs that a call cannot avoid
// (an empty kernel's launch) or that validation pays (a pointer-attribute query) give the floor.
// The empty kernel is launched three ways: <<<>>>, as the library launches (cudaLaunchKernelEx
// with programmatic stream serialization), and through the driver's cuLaunchKernelEx with the
// same attribute, which tells whether the runtime's launch path is worth bypassing.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "cuda/driver_function.hpp"
#include "cuda/launch.hpp"
#include "mqa_logits/errors.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace mqa_logits::bench {
namespace {

constexpr int kCalls = 400;
constexpr int kWarmupCalls = 50;
constexpr double kBarUs = 4.0;  // the C++ API's bar per call
const Device kGpu{DeviceType::kCUDA, 0};

__global__ void empty_kernel() {}

struct HostCost {
  double issue_us = 0;  // host time per call: the loop before its synchronize
  double total_us = 0;  // the loop with its synchronize, per call
};

// The empty kernel launched through the driver API, with the attribute the library's launches
// carry (cuda/launch.hpp).
class DriverLaunch {
 public:
  DriverLaunch()
      : launch_(driver_function<LaunchEx>("cuLaunchKernelEx")) {
    check_cuda(cudaGetFuncBySymbol(&function_, reinterpret_cast<const void*>(&empty_kernel)),
               "cudaGetFuncBySymbol(empty_kernel)");
  }
  void operator()(cudaStream_t stream) const {
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 32;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const CUresult result =
        launch_(&config, reinterpret_cast<CUfunction>(function_), nullptr, nullptr);
    if (result != CUDA_SUCCESS) {
      throw CudaError("cuLaunchKernelEx(empty_kernel) failed with CUresult " +
                      std::to_string(result));
    }
  }

 private:
  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  LaunchEx launch_;
  cudaFunction_t function_ = nullptr;
};

HostCost host_cost(const std::function<void()>& call, cudaStream_t stream) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < kWarmupCalls; ++i) call();
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  const auto start = Clock::now();
  for (int i = 0; i < kCalls; ++i) call();
  const auto issued = Clock::now();
  check_cuda(cudaStreamSynchronize(stream), "host-cost loop");
  const auto done = Clock::now();
  const auto per_call = [](auto duration) {
    return std::chrono::duration<double, std::micro>(duration).count() / kCalls;
  };
  return {per_call(issued - start), per_call(done - start)};
}

// A workload with its inputs and logits on the GPU, and the views of them the API takes.
template <typename Workload>
struct OnDevice {
  explicit OnDevice(Workload w)
      : workload(std::move(w)),
        arena(workload.buffers, workload.logits_bytes()),
        inputs(workload.inputs(arena.pointers(), kGpu)),
        logits(workload.logits_view(arena.logits(), kGpu)) {}
  Workload workload;
  DeviceArena arena;
  decltype(workload.inputs({}, {})) inputs;
  TensorView logits;
};

Record row(const std::string& call, const HostCost& cost, bool has_bar) {
  std::printf("%-34s %8.2f %10.2f   %s\n", call.c_str(), cost.issue_us, cost.total_us,
              !has_bar ? "(floor)" : cost.issue_us <= kBarUs ? "ok" : "over the bar");
  return Record()
      .set("op", std::string("host-cost"))
      .set("call", call)
      .set("host_us", cost.issue_us)
      .set("with_sync_us", cost.total_us)
      .set("bar_us", has_bar ? kBarUs : 0.0)
      .set("verified", true);
}

}  // namespace

std::vector<Record> run_host_cost_bench(const BenchContext&) {
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const support::PrefillSpec prefill_spec{.seq_len = 64, .seq_len_kv = 256, .seed = 11};
  const support::PagedSpec paged_spec{.batch = 4, .avg_context = 256, .seed = 12};
  const OnDevice prefill(support::make_prefill_workload(prefill_spec));
  const OnDevice paged(support::make_paged_workload(paged_spec));
  const auto& prefill_in = prefill.inputs;
  const auto& paged_in = paged.inputs;

  const int workers = get_num_sms();
  const auto meta_rows = schedule_meta_rows(workers);
  std::int32_t* meta = nullptr;
  check_cuda(cudaMalloc(&meta, meta_rows * 2 * sizeof(std::int32_t)), "cudaMalloc meta");
  const auto meta_view = TensorView::contiguous(meta, DType::kInt32, {meta_rows, 2}, kGpu);

  const auto prefill_call = [&](bool clean, cudaStream_t on = nullptr) {
    auto options = prefill_in.options;
    options.clean_logits = clean;
    options.stream = on != nullptr ? on : stream;
    mqa_logits(prefill_in.q, prefill_in.kv, prefill_in.weights, prefill_in.k_start,
               prefill_in.k_end, prefill.logits, options);
  };
  const auto decode_metadata = [&] {
    get_paged_mqa_logits_metadata(paged_in.context_lens, paged_spec.block_kv, workers, meta_view,
                                  std::nullopt, stream);
  };
  const auto decode_call = [&] {
    auto options = paged_in.options;
    options.stream = stream;
    paged_mqa_logits(paged_in.q, paged_in.kv_cache, paged_in.weights, paged_in.context_lens,
                     paged_in.block_table, meta_view, paged.workload.max_context_len, paged.logits,
                     options);
  };
  const auto prefill_metadata = [&] {
    get_mqa_logits_metadata(prefill_in.k_start, prefill_in.k_end, prefill_spec.seq_len_kv,
                            static_cast<int>(prefill_spec.num_heads), meta_view, stream);
  };
  decode_metadata();  // the decode calls read it

  std::printf("\nhost cost per call (%d calls on one stream, tiny problems: prefill S=%lld T=%lld "
              "H=64 D=128, decode B=%lld context %lld)\n",
              kCalls, static_cast<long long>(prefill_spec.seq_len),
              static_cast<long long>(prefill_spec.seq_len_kv),
              static_cast<long long>(paged_spec.batch),
              static_cast<long long>(paged_spec.avg_context));
  std::printf("%-34s %8s %10s   bar %.0f us\n", "call", "host us", "+sync us", kBarUs);
  std::vector<Record> records;
  records.push_back(row("prefill, clean", host_cost([&] { prefill_call(true); }, stream), true));
  records.push_back(row("prefill, no clean", host_cost([&] { prefill_call(false); }, stream), true));
  // torch's current stream unless a program picks one: the legacy default stream.
  records.push_back(row("prefill, no clean, default stream",
                        host_cost([&] { prefill_call(false, cudaStreamLegacy); }, cudaStreamLegacy),
                        true));
  records.push_back(row("paged decode", host_cost(decode_call, stream), true));
  records.push_back(row("decode metadata", host_cost(decode_metadata, stream), true));
  records.push_back(row("prefill metadata", host_cost(prefill_metadata, stream), true));
  records.push_back(row("empty kernel launch", host_cost([&] {
    empty_kernel<<<1, 32, 0, stream>>>();
  }, stream), false));
  records.push_back(row("empty kernel, cudaLaunchKernelEx", host_cost([&] {
    cuda_backend::launch_programmatic(&empty_kernel, dim3(1), dim3(32), 0, stream, "empty_kernel");
  }, stream), false));
  const DriverLaunch driver_launch;
  records.push_back(row("empty kernel, cuLaunchKernelEx",
                        host_cost([&] { driver_launch(stream); }, stream), false));
  records.push_back(row("cudaPointerGetAttributes", host_cost([&] {
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, prefill.arena.logits()),
          "cudaPointerGetAttributes");
  }, stream), false));

  cudaFree(meta);
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return records;
}

}  // namespace mqa_logits::bench
