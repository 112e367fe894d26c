// Decode kernel instances (head dim, heads, MMA rows) for head dim 32; the instances are spread
// over several files so that they compile in parallel. The instances are the row counts that
// mma_rows_for maps to themselves (paged.cu dispatches to them).
#include "cuda/paged_launch.cuh"

namespace mqa_logits::cuda_backend {
template void launch_paged<32, 64, 5>(const PagedProblem&, cudaStream_t);
template void launch_paged<32, 64, 6>(const PagedProblem&, cudaStream_t);
template void launch_paged<32, 64, 7>(const PagedProblem&, cudaStream_t);
template void launch_paged<32, 64, 8>(const PagedProblem&, cudaStream_t);
}  // namespace mqa_logits::cuda_backend
