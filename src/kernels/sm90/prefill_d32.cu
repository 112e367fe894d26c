// Prefill kernel instances for head dim 32 (one file per head dim so they compile in parallel).
#include "cuda/prefill_launch.cuh"

namespace mqa_logits::cuda_backend {
template void launch_prefill<32, 8>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<32, 16>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<32, 32>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<32, 64>(const PrefillProblem&, cudaStream_t);
}  // namespace mqa_logits::cuda_backend
