// Turning a failed CUDA runtime call into mqa_logits::CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mqa_logits/errors.hpp"

namespace mqa_logits {

// Throws CudaError "<what>: <error name>: <error string>" unless `status` is cudaSuccess. The
// runtime's last-error slot is read (and so reset) first: a non-sticky failure must not surface
// again from an unrelated later call, in this library or in the caller's code.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  static_cast<void>(cudaGetLastError());
  throw CudaError(std::string(what) + ": " + cudaGetErrorName(status) + ": " +
                  cudaGetErrorString(status));
}

}  // namespace mqa_logits
