// Makes a CUDA device current for a scope and restores the previous one.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace mqa_logits::cuda_backend {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_ &&
        cudaSetDevice(previous_) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // not left for the caller's next check
    }
  }

 private:
  int previous_ = 0;
};

}  // namespace mqa_logits::cuda_backend
