// Prefill kernel instances for head dim 128 (one file per head dim so they compile in parallel).
#include "cuda/prefill_launch.cuh"

namespace mqa_logits::cuda_backend {
template void launch_prefill<128, 8>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<128, 16>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<128, 32>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<128, 64>(const PrefillProblem&, cudaStream_t);
}  // namespace mqa_logits::cuda_backend
