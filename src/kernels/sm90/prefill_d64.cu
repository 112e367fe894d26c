// Prefill kernel instances for head dim 64 (one file per head dim so they compile in parallel).
#include "cuda/prefill_launch.cuh"

namespace mqa_logits::cuda_backend {
template void launch_prefill<64, 8>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<64, 16>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<64, 32>(const PrefillProblem&, cudaStream_t);
template void launch_prefill<64, 64>(const PrefillProblem&, cudaStream_t);
}  // namespace mqa_logits::cuda_backend
