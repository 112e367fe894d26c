// CUDA prefill entry: picks the kernel instance for (head dim, heads). The dispatch code calls it
// only when there is an output element to write.
#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "mqa_logits/errors.hpp"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

template <int kHeadDim, int kNumHeads>
void launch_prefill(const PrefillProblem& problem, cudaStream_t stream);

namespace {

template <int kHeadDim>
void dispatch_heads(const PrefillProblem& problem, cudaStream_t stream) {
  switch (problem.num_heads) {
    case 8: return launch_prefill<kHeadDim, 8>(problem, stream);
    case 16: return launch_prefill<kHeadDim, 16>(problem, stream);
    case 32: return launch_prefill<kHeadDim, 32>(problem, stream);
    case 64: return launch_prefill<kHeadDim, 64>(problem, stream);
    default: break;
  }
  throw InvalidArgument("q", "expected 8, 16, 32 or 64 heads, got " + std::to_string(problem.num_heads));
}

}  // namespace

void run_prefill(const PrefillProblem& problem, cudaStream_t stream) {
  if (problem.format != Format::kFP8) {
    throw InvalidArgument("q", std::string("the CUDA backend runs the FP8 format; got ") +
                                   format_name(problem.format));
  }
  const DeviceGuard guard(problem.device.index);
  switch (problem.head_dim) {
    case 32: return dispatch_heads<32>(problem, stream);
    case 64: return dispatch_heads<64>(problem, stream);
    case 128: return dispatch_heads<128>(problem, stream);
    default: break;
  }
  throw InvalidArgument("q", "expected head dim 32, 64 or 128, got " + std::to_string(problem.head_dim));
}

}  // namespace mqa_logits::cuda_backend
