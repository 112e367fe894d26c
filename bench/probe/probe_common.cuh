// What the hardware probes in bench/probe/ share: input bytes, error checks, a timed launch and
// the per-SM reading of their clock64 records.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

// Runs `launch` (one kernel launch) between two events and waits for it; its milliseconds.
template <typename Launch>
float time_launch(const char* program, Launch&& launch) {
  cudaEvent_t begin, finish;
  check(cudaEventCreate(&begin), program, "cudaEventCreate");
  check(cudaEventCreate(&finish), program, "cudaEventCreate");
  check(cudaEventRecord(begin), program, "cudaEventRecord");
  launch();
  check(cudaGetLastError(), program, "launch");
  check(cudaEventRecord(finish), program, "cudaEventRecord");
  check(cudaEventSynchronize(finish), program, "kernel");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, begin, finish), program, "cudaEventElapsedTime");
  check(cudaEventDestroy(begin), program, "cudaEventDestroy");
  check(cudaEventDestroy(finish), program, "cudaEventDestroy");
  return ms;
}

// The `count` cycle records of a launch (device memory), on the host.
inline std::vector<long long> records_on_host(const long long* records, std::size_t count,
                                              const char* program) {
  std::vector<long long> host(count);
  check(cudaMemcpy(host.data(), records, count * sizeof(long long), cudaMemcpyDeviceToHost), program,
        "copy");
  return host;
}

// Per SM (`stride` records each, in SM order), the largest of its records [first, first + count).
inline std::vector<long long> slowest_per_sm(const std::vector<long long>& records, int stride,
                                             int first, int count) {
  std::vector<long long> slowest;
  for (std::size_t sm = 0; sm + stride <= records.size(); sm += stride) {
    const auto from = records.begin() + static_cast<std::ptrdiff_t>(sm) + first;
    slowest.push_back(*std::max_element(from, from + count));
  }
  return slowest;
}

}  // namespace mqa_logits::probe
