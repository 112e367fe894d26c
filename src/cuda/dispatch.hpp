// What the CUDA entry points share around their kernels: the run-time (head dim, heads) mapped to
// a compile-time instance, and a launch that lets the kernel's prologue overlap its predecessor.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "instances.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {

// Calls f(std::integral_constant<int, D>{}, std::integral_constant<int, H>{}) for the compiled
// instance (instances.hpp) of (head_dim, num_heads); validation accepts no other pair, which is
// refused here too, naming `q`.
template <typename F>
void with_instance(int head_dim, int num_heads, F&& f) {
  using instances::kHeadCounts;
  using instances::kHeadDims;
  const auto visit = [&]<std::size_t... kDims, std::size_t... kHeads>(
                         std::index_sequence<kDims...>, std::index_sequence<kHeads...>) {
    const auto try_dim = [&]<std::size_t kD>() {
      const auto try_heads = [&]<std::size_t kH>() {
        if (num_heads != kHeadCounts[kH]) return false;
        f(std::integral_constant<int, kHeadDims[kD]>{},
          std::integral_constant<int, kHeadCounts[kH]>{});
        return true;
      };
      return head_dim == kHeadDims[kD] && (try_heads.template operator()<kHeads>() || ...);
    };
    return (try_dim.template operator()<kDims>() || ...);
  };
  if (!visit(std::make_index_sequence<std::size(kHeadDims)>{},
             std::make_index_sequence<std::size(kHeadCounts)>{})) {
    throw InvalidArgument("q", "no kernel instance for head dim " + std::to_string(head_dim) +
                                   " and " + std::to_string(num_heads) + " heads");
  }
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
