// What the hardware probes in bench/probe/ share: input bytes and error checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace mqa_logits::probe {

// e4m3 bytes of moderate magnitude (exponent field 4..11, never NaN), varying with the index.
__device__ inline std::uint8_t pattern_byte(int i) {
  const unsigned h = static_cast<unsigned>(i) * 2654435761u;
  return static_cast<std::uint8_t>(((h >> 24) & 0x80u) | (((h >> 16) % 8u + 4u) << 3) | ((h >> 8) & 7u));
}

// Exits with `program: what: error` when a CUDA call failed.
inline void check(cudaError_t status, const char* program, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program, what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// The number of SMs of device 0 if it is an sm_90 GPU; otherwise says why not and returns 0.
inline int hopper_sm_count(const char* program) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("%s: no GPU found; nothing to measure\n", program);
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), program, "cudaGetDeviceProperties");
  if (prop.major != 9) {
    std::printf("%s: needs an sm_90 GPU, found sm_%d%d\n", program, prop.major, prop.minor);
    return 0;
  }
  return prop.multiProcessorCount;
}

}  // namespace mqa_logits::probe
