// The CUDA backend as the host dispatch code sees it. Built from src/cuda/*.cu when the CUDA
// compiler is present; otherwise src/cuda/no_cuda_backend.cpp refuses every call with a clear
// error. Every function throws CudaError on a failed CUDA call.
#pragma once

#include <cstdint>

#include "problem.hpp"
#include "topk.hpp"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace mqa_logits::cuda_backend {

// Compiled in, and a device of compute capability 9.0 is visible.
bool available();
// Compiled in and at least one CUDA device is visible (of any architecture).
bool any_device();
// Devices the backend addresses, at most kMaxDevices (per-device records are arrays or bit masks
// of that size).
inline constexpr int kMaxDevices = 64;
// Visible CUDA devices (at most kMaxDevices): 0 without the backend, or when the driver reports
// none (or fails).
int device_count();
int current_device();

struct DeviceLimits {
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  int smem_optin = 0;          // bytes of shared memory a block may opt in to
};
// The limits of visible device `device`, queried once per process.
const DeviceLimits& device_limits(int device);

// Throws InvalidArgument naming `argument` unless `ptr` is device (or managed) memory of `device`.
void require_device_pointer(const void* ptr, int device, const char* argument);
// Throws InvalidArgument naming `argument` if `ptr` is device memory (a host pointer is needed).
void require_host_pointer(const void* ptr, const char* argument);

// Whether `stream` (of CUDA device `device`) is capturing a CUDA graph, its capture valid or
// already invalidated; the legacy stream counts as capturing while another stream captures in a
// mode that forbids its use.
bool stream_capturing(int device, cudaStream_t stream);

// The checking mode (input_checks.hpp): copies the inputs the checks read to the host,
// synchronizing `stream`, and runs the CPU backend's checks on them.
void check_prefill_inputs(const PrefillProblem& problem, cudaStream_t stream);
void check_paged_inputs(const PagedProblem& problem, cudaStream_t stream);

void run_prefill(const PrefillProblem& problem, cudaStream_t stream);
void run_paged(const PagedProblem& problem, cudaStream_t stream);
void run_topk(const TopkProblem& problem, cudaStream_t stream);
void check_merge_inputs(const MergeProblem& problem, cudaStream_t stream);
void run_merge(const MergeProblem& problem, cudaStream_t stream);

// Schedule metadata from inputs on CUDA device `device` into `out` there ([workers + 1, 2]
// int32), launched with that device current (the caller's is restored).
void prefill_metadata(int device, const std::int32_t* k_start, const std::int32_t* k_end,
                      std::int64_t seq_len, std::int64_t seq_len_kv, int num_heads, int workers,
                      std::int32_t* out, cudaStream_t stream);
void paged_metadata(int device, const std::int32_t* context_lens, std::int64_t batch,
                    std::int64_t lens_cols, bool lens_2d, const std::int32_t* indices,
                    int workers, std::int32_t* out, cudaStream_t stream);

}  // namespace mqa_logits::cuda_backend
