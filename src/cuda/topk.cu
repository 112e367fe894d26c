// CUDA selection entries: topk_per_row's kernel (kernels/topk_kernel.cuh: a cluster of CTAs a
// row, each CTA's chunk of the row cached in its shared memory where it fits) and merge_topk's
// (kernels/merge_topk_kernel.cuh: a CTA a row).
#include <algorithm>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/launch.hpp"
#include "kernels/merge_topk_kernel.cuh"
#include "kernels/topk_kernel.cuh"

namespace mqa_logits::cuda_backend {
namespace {

namespace k = kernels;

// Keys a CTA caches at most, so that two CTAs share an SM (one's loads beside the other's passes).
constexpr std::int64_t kTargetChunkKeys = 16384;

// CTAs a row: enough that each chunk is at most kTargetChunkKeys and that the rows fill the SMs,
// at most kTopkMaxCluster.
unsigned cluster_size(std::int64_t rows, std::int64_t cols, int sm_count) {
  unsigned ctas = 1;
  while (ctas < k::kTopkMaxCluster &&
         ((cols + ctas - 1) / ctas > kTargetChunkKeys || rows * ctas < sm_count)) {
    ctas *= 2;
  }
  return ctas;
}

}  // namespace

void run_topk(const TopkProblem& problem, cudaStream_t stream) {
  const int device = problem.device.index;
  const DeviceGuard guard(device);
  allow_all_dynamic_smem<&k::topk_rows_kernel>(device, "topk_rows_kernel");
  const DeviceLimits& limits = device_limits(device);
  const unsigned ctas = cluster_size(problem.rows, problem.cols, limits.sm_count);
  constexpr std::int64_t kStaticBytes = sizeof(k::TopkShared) + 1024;  // and the runtime's
  const std::int64_t capacity = (limits.smem_optin - kStaticBytes) / 4 / k::kTopkItems * k::kTopkItems;
  const std::int64_t chunk =
      (problem.cols + ctas * k::kTopkItems - 1) / (ctas * k::kTopkItems) * k::kTopkItems;
  const std::int64_t cache_keys = std::min(capacity, chunk);
  constexpr std::int64_t kMaxClusters = 1 << 20;  // rows beyond take turns
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(problem.rows, kMaxClusters) * ctas));
  config.blockDim = dim3(k::kTopkThreads);
  config.dynamicSmemBytes = static_cast<std::size_t>(cache_keys) * 4;
  config.stream = stream;
  cudaLaunchAttribute cluster = cluster_attribute(ctas);
  config.attrs = &cluster;
  config.numAttrs = ctas > 1 ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, &k::topk_rows_kernel, problem, cache_keys),
             "topk_rows_kernel launch");
}

void run_merge(const MergeProblem& problem, cudaStream_t stream) {
  const int device = problem.device.index;
  const DeviceGuard guard(device);
  allow_all_dynamic_smem<&k::merge_topk_kernel>(device, "merge_topk_kernel");
  constexpr std::int64_t kMaxGrid = 1 << 20;  // rows beyond take turns
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(problem.rows, kMaxGrid)));
  config.blockDim = dim3(k::kTopkThreads);
  config.dynamicSmemBytes =
      static_cast<std::size_t>(k::merge_smem_bytes(problem.lists * problem.candidates));
  config.stream = stream;
  check_cuda(cudaLaunchKernelEx(&config, &k::merge_topk_kernel, problem),
             "merge_topk_kernel launch");
}

}  // namespace mqa_logits::cuda_backend
