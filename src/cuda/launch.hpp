// How the CUDA backend launches its kernels: each kernel's dynamic shared-memory limit raised
// once per device, programmatic dependent launch, which lets a kernel's prologue overlap its
// predecessor in the stream, and clusters (how many of them fit the device at once).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"

namespace mqa_logits::cuda_backend {

// Lets kKernel take all the dynamic shared memory a block may opt in to on `device`, the current
// device (less its static shared memory). The limit belongs to the kernel on each device and
// setting it costs about a microsecond, so it is set on the first launch on a device only: each
// kernel keeps its record of the devices done, one bit each (device indices stay below
// kMaxDevices: device_count()). large_clusters also allows clusters of up to 16 CTAs, past the
// portable 8.
template <auto kKernel>
void allow_all_dynamic_smem(int device, const char* name, bool large_clusters = false) {
  static_assert(kMaxDevices <= 64, "one bit a device");
  static std::atomic<std::uint64_t> configured_devices{0};
  const std::uint64_t bit = std::uint64_t{1} << device;
  if ((configured_devices.load(std::memory_order_acquire) & bit) != 0) return;
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kKernel), name);
  const int bytes =
      device_limits(device).smem_optin - static_cast<int>(attributes.sharedSizeBytes);
  check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             name);
  if (large_clusters) {
    check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
               name);
  }
  configured_devices.fetch_or(bit, std::memory_order_release);
}

// The launch attribute that groups CTAs into clusters of `ctas` along x.
inline cudaLaunchAttribute cluster_attribute(unsigned ctas) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = ctas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// Launches `kernel` with programmatic dependent launch allowed: its prologue may run while the
// previous kernel of the stream finishes; the kernel calls cudaGridDependencySynchronize() before
// it touches global memory. In clusters of `cluster_ctas` CTAs along x where that is over 1.
template <typename... Params, typename... Args>
void launch_programmatic_clusters(void (*kernel)(Params...), dim3 grid, dim3 block,
                                  std::size_t smem_bytes, unsigned cluster_ctas,
                                  cudaStream_t stream, const char* name, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1] = cluster_attribute(cluster_ctas);
  config.attrs = attributes;
  config.numAttrs = cluster_ctas > 1 ? 2 : 1;
  // Its own error only: an earlier, unrelated one left in the runtime must not fail a call whose
  // kernel is already queued.
  check_cuda(cudaLaunchKernelEx(&config, kernel, args...), name);
}

template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes,
                         cudaStream_t stream, const char* name, const Args&... args) {
  launch_programmatic_clusters(kernel, grid, block, smem_bytes, 1, stream, name, args...);
}

// Clusters of `cluster_ctas` CTAs of kKernel (`block` threads, `smem_bytes` of dynamic shared
// memory) that `device`, the current device, runs at once; 0 where the device cannot say (the
// caller then launches without clusters, and no error is left behind). Queried on a kernel's
// first call on a device only: for a kernel whose registers hold one CTA an SM, the count does not
// depend on the call.
template <auto kKernel>
int resident_clusters(int device, dim3 block, std::size_t smem_bytes, unsigned cluster_ctas) {
  static std::atomic<int> known[kMaxDevices] = {};  // 0: not queried yet; else the count + 1
  const int seen = known[device].load(std::memory_order_acquire);
  if (seen != 0) return seen - 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster_ctas);
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  cudaLaunchAttribute cluster = cluster_attribute(cluster_ctas);
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // no clusters here: clear what the query set
    clusters = 0;
  }
  known[device].store(clusters + 1, std::memory_order_release);
  return clusters;
}

}  // namespace mqa_logits::cuda_backend
