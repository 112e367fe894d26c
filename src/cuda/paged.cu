// CUDA decode entry: picks the kernel instance for (head dim, heads); its translation unit picks
// the MMA rows (paged_launch.cuh). The dispatch code calls it only when there is an output element
// to write.
#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/dispatch.hpp"
#include "mqa_logits/errors.hpp"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

template <int kHeadDim, int kNumHeads>
void launch_paged_group(const PagedProblem& problem, cudaStream_t stream);

void run_paged(const PagedProblem& problem, cudaStream_t stream) {
  if (problem.format != Format::kFP8) {
    throw InvalidArgument("q", std::string("the CUDA backend runs the FP8 format; got ") +
                                   format_name(problem.format));
  }
  if (problem.schedule_workers < 1) {
    throw InvalidArgument("schedule_meta", "expected at least one worker row, got " +
                                               std::to_string(problem.schedule_workers));
  }
  const DeviceGuard guard(problem.device.index);
  with_instance(problem.head_dim, problem.num_heads, [&](auto dim, auto heads) {
    launch_paged_group<decltype(dim)::value, decltype(heads)::value>(problem, stream);
  });
}

}  // namespace mqa_logits::cuda_backend
