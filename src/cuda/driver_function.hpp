// A CUDA driver API function looked up by name through the runtime (no link against libcuda).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/cuda_check.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits {

// `Function` is the pointer type of the driver function `name` (its CUDA 12.0 signature).
template <typename Function>
Function driver_function(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const std::string what = std::string("cudaGetDriverEntryPointByVersion(") + name + ")";
  check_cuda(cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &status),
             what.c_str());
  if (status != cudaDriverEntryPointSuccess || entry == nullptr) {
    throw CudaError(std::string(name) + " is not available from the CUDA driver");
  }
  return reinterpret_cast<Function>(entry);
}

}  // namespace mqa_logits
