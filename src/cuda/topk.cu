// CUDA selection entry: kernels/topk_kernel.cuh, one CTA a row, rows cached in shared memory
// where they fit.
#include <algorithm>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/launch.hpp"
#include "kernels/topk_kernel.cuh"

namespace mqa_logits::cuda_backend {

void run_topk(const TopkProblem& problem, cudaStream_t stream) {
  namespace k = kernels;
  const DeviceGuard guard(problem.device.index);
  allow_all_dynamic_smem<&k::topk_rows_kernel>(problem.device.index, "topk_rows_kernel");
  // What a CTA may take beside its static shared memory (and the runtime's reserve).
  constexpr std::int64_t kStaticBytes = sizeof(k::TopkShared) + 1024;
  const std::int64_t capacity =
      (device_limits(problem.device.index).smem_optin - kStaticBytes) / 4 / k::kTopkItems *
      k::kTopkItems;
  const std::int64_t cache_keys =
      std::min(capacity, (problem.cols + k::kTopkItems - 1) / k::kTopkItems * k::kTopkItems);
  constexpr std::int64_t kMaxGrid = 1 << 30;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(problem.rows, kMaxGrid)));
  config.blockDim = dim3(k::kTopkThreads);
  config.dynamicSmemBytes = static_cast<std::size_t>(cache_keys) * 4;
  config.stream = stream;
  check_cuda(cudaLaunchKernelEx(&config, &k::topk_rows_kernel, problem, cache_keys),
             "topk_rows_kernel launch");
}

}  // namespace mqa_logits::cuda_backend
