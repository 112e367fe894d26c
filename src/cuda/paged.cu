// CUDA decode entry: picks the kernel instance for (format, head dim, heads); its translation unit
// picks the MMA rows (paged_launch.cuh). The dispatch code calls it only when there is an output
// element to write.
#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/dispatch.hpp"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

template <Format kFormat, int kHeadDim, int kNumHeads>
void launch_paged_group(const PagedProblem& problem, cudaStream_t stream);

void run_paged(const PagedProblem& problem, cudaStream_t stream) {
  const DeviceGuard guard(problem.device.index);
  with_instance(problem.format, problem.head_dim, problem.num_heads,
                [&](auto format, auto dim, auto heads) {
                  launch_paged_group<decltype(format)::value, decltype(dim)::value,
                                     decltype(heads)::value>(problem, stream);
                });
}

}  // namespace mqa_logits::cuda_backend
