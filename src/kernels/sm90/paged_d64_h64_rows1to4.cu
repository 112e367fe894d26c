// Decode kernel instances (head dim, heads, MMA rows) for head dim 64; the instances are spread
// over several files so that they compile in parallel. The instances are the row counts that
// mma_rows_for maps to themselves (paged.cu dispatches to them).
#include "cuda/paged_launch.cuh"

namespace mqa_logits::cuda_backend {
template void launch_paged<64, 64, 1>(const PagedProblem&, cudaStream_t);
template void launch_paged<64, 64, 2>(const PagedProblem&, cudaStream_t);
template void launch_paged<64, 64, 3>(const PagedProblem&, cudaStream_t);
template void launch_paged<64, 64, 4>(const PagedProblem&, cudaStream_t);
}  // namespace mqa_logits::cuda_backend
