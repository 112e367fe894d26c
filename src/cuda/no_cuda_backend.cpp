// The CUDA backend of a build without a CUDA compiler: no device is ever visible, and every call
// that would need one refuses the tensor that asked for it.
#include <string>

#include "cuda/cuda_backend.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {
namespace {

[[noreturn]] void refuse_device_tensor(const char* argument) {
  throw InvalidArgument(argument,
                        "the tensor is on a CUDA device but this build of mqa_logits has no CUDA "
                        "backend");
}

[[noreturn]] void no_device(const char* call) {
  throw CudaError(std::string(call) + ": this build of mqa_logits has no CUDA backend");
}

}  // namespace

bool available() { return false; }
bool any_device() { return false; }
int device_count() { return 0; }
int current_device() { no_device("cudaGetDevice"); }
const DeviceLimits& device_limits(int) { no_device("cudaDeviceGetAttribute"); }

// Without the backend no memory can be device memory, so there is nothing to check.
void require_device_pointer(const void*, int, const char*) {}
void require_host_pointer(const void*, const char*) {}

bool stream_capturing(int, cudaStream_t) { no_device("cudaStreamIsCapturing"); }
void check_prefill_inputs(const PrefillProblem&, cudaStream_t) { refuse_device_tensor("q"); }
void check_paged_inputs(const PagedProblem&, cudaStream_t) { refuse_device_tensor("q"); }
void run_prefill(const PrefillProblem&, cudaStream_t) { refuse_device_tensor("q"); }
void run_paged(const PagedProblem&, cudaStream_t) { refuse_device_tensor("q"); }
void run_topk(const TopkProblem&, cudaStream_t) { refuse_device_tensor("logits"); }
void check_merge_inputs(const MergeProblem&, cudaStream_t) {
  refuse_device_tensor("candidate_values");
}
void run_merge(const MergeProblem&, cudaStream_t) { refuse_device_tensor("candidate_values"); }

void prefill_metadata(int, const std::int32_t*, const std::int32_t*, std::int64_t, std::int64_t,
                      int, int, std::int32_t*, cudaStream_t) {
  refuse_device_tensor("k_start");
}

void paged_metadata(int, const std::int32_t*, std::int64_t, std::int64_t, bool,
                    const std::int32_t*, int, std::int32_t*, cudaStream_t) {
  refuse_device_tensor("context_lens");
}

}  // namespace mqa_logits::cuda_backend
