// What the CUDA entry points share around their kernels: the run-time (head dim, heads) mapped to
// a compile-time instance, and a launch that lets the kernel's prologue overlap its predecessor.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {

// Calls f(std::integral_constant<int, D>{}, std::integral_constant<int, H>{}) for the instance of
// (head_dim, num_heads); any other pair is refused naming `q`.
template <typename F>
void with_instance(int head_dim, int num_heads, F&& f) {
  const auto with_heads = [&](auto dim) {
    switch (num_heads) {
      case 8: return f(dim, std::integral_constant<int, 8>{});
      case 16: return f(dim, std::integral_constant<int, 16>{});
      case 32: return f(dim, std::integral_constant<int, 32>{});
      case 64: return f(dim, std::integral_constant<int, 64>{});
      default: break;
    }
    throw InvalidArgument("q", "expected 8, 16, 32 or 64 heads, got " + std::to_string(num_heads));
  };
  switch (head_dim) {
    case 32: return with_heads(std::integral_constant<int, 32>{});
    case 64: return with_heads(std::integral_constant<int, 64>{});
    case 128: return with_heads(std::integral_constant<int, 128>{});
    default: break;
  }
  throw InvalidArgument("q", "expected head dim 32, 64 or 128, got " + std::to_string(head_dim));
}

// Lets `kernel` take all the dynamic shared memory a block may opt in to on the current device
// (less its static shared memory). The limit belongs to the kernel on each device and setting it
// costs about a microsecond, so it is set on the first launch on a device only: `devices` is the
// kernel's own record of the devices done, one bit each.
template <typename... Params>
void allow_all_dynamic_smem(void (*kernel)(Params...), std::atomic<std::uint64_t>& devices,
                            const char* name) {
  const int device = current_device();
  const std::uint64_t bit = std::uint64_t{1} << device;
  if ((devices.load(std::memory_order_acquire) & bit) != 0) return;
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), name);
  const auto bytes = device_limits(device).smem_optin - static_cast<int>(attributes.sharedSizeBytes);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), name);
  devices.fetch_or(bit, std::memory_order_release);
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
