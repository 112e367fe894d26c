// How the CUDA backend launches its kernels: each kernel's dynamic shared-memory limit raised
// once per device, and programmatic dependent launch, which lets a kernel's prologue overlap its
// predecessor in the stream.
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
// kMaxDevices: device_count()).
template <auto kKernel>
void allow_all_dynamic_smem(int device, const char* name) {
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
  configured_devices.fetch_or(bit, std::memory_order_release);
}

// Launches `kernel` with programmatic dependent launch allowed: its prologue may run while the
// previous kernel of the stream finishes; the kernel calls cudaGridDependencySynchronize() before
// it touches global memory.
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes,
                         cudaStream_t stream, const char* name, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args...), name);
  check_cuda(cudaGetLastError(), name);
}

}  // namespace mqa_logits::cuda_backend
