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
// at most max_ctas.
unsigned cluster_size(std::int64_t rows, std::int64_t cols, int sm_count, unsigned max_ctas) {
  unsigned ctas = 1;
  while (ctas < max_ctas &&
         ((cols + ctas - 1) / ctas > kTargetChunkKeys || rows * ctas < sm_count)) {
    ctas *= 2;
  }
  return ctas;
}

// A cluster of `ctas` CTAs a row, each with `cache_keys` keys of shared memory (kCached) or none.
template <bool kBf16, bool kDecodeRows, bool kCached>
void launch_rows(const TopkProblem& problem, unsigned ctas, std::int64_t cache_keys,
                 cudaStream_t stream) {
  constexpr auto kKernel = &k::topk_rows_kernel<kBf16, kDecodeRows, kCached>;
  allow_all_dynamic_smem<kKernel>(problem.device.index, "topk_rows_kernel", true);
  constexpr std::int64_t kMaxClusters = 1 << 20;  // rows beyond take turns
  // Programmatic: the launch overlaps the end of the logits kernel before it (mqa_topk).
  launch_programmatic_clusters(
      kKernel, dim3(static_cast<unsigned>(std::min(problem.rows, kMaxClusters) * ctas)),
      dim3(k::kTopkThreads), static_cast<std::size_t>(kCached ? cache_keys * 4 : 0), ctas,
      stream, "topk_rows_kernel launch", problem);
}

template <bool kBf16, bool kDecodeRows>
void launch_rows(const TopkProblem& problem, unsigned ctas, std::int64_t cache_keys,
                 bool cached, cudaStream_t stream) {
  if (cached) {
    launch_rows<kBf16, kDecodeRows, true>(problem, ctas, cache_keys, stream);
  } else {
    launch_rows<kBf16, kDecodeRows, false>(problem, ctas, cache_keys, stream);
  }
}

}  // namespace

void run_topk(const TopkProblem& problem, cudaStream_t stream) {
  const int device = problem.device.index;
  const DeviceGuard guard(device);
  const DeviceLimits& limits = device_limits(device);
  constexpr auto kProbe = &k::topk_rows_kernel<false, false, true>;
  allow_all_dynamic_smem<kProbe>(device, "topk_rows_kernel", true);
  constexpr std::int64_t kStaticBytes = sizeof(k::TopkShared) + 1024;  // and the runtime's
  const std::int64_t capacity = (limits.smem_optin - kStaticBytes) / 4;
  // Clusters past the portable 8 where the device runs them with every CTA's shared memory full.
  const bool large_fit = resident_clusters<kProbe>(device, dim3(k::kTopkThreads),
                                                   static_cast<std::size_t>(capacity * 4),
                                                   k::kTopkMaxCluster) > 0;
  const unsigned ctas = cluster_size(problem.rows, problem.cols, limits.sm_count,
                                     large_fit ? k::kTopkMaxCluster : 8);
  // A row's chunks: a multiple of kTopkItems columns each, the first ones of this length.
  const std::int64_t chunk =
      (problem.cols + ctas * k::kTopkItems - 1) / (ctas * k::kTopkItems) * k::kTopkItems;
  const bool cached = chunk <= capacity;
  const bool bf16 = problem.logits_dtype == DType::kBFloat16;
  const bool decode_rows = problem.context_lens != nullptr;
  if (bf16) {
    if (decode_rows) launch_rows<true, true>(problem, ctas, chunk, cached, stream);
    else launch_rows<true, false>(problem, ctas, chunk, cached, stream);
  } else {
    if (decode_rows) launch_rows<false, true>(problem, ctas, chunk, cached, stream);
    else launch_rows<false, false>(problem, ctas, chunk, cached, stream);
  }
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
