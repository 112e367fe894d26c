// CUDA decode entry. The sm90 decode kernel has not passed its hardware checks yet, so device
// calls are refused before anything is launched (never a silent CPU fallback).
#include "cuda/cuda_backend.hpp"
#include "mqa_logits/errors.hpp"

namespace mqa_logits::cuda_backend {

void run_paged(const PagedProblem&, cudaStream_t) {
  throw InvalidArgument("q", "paged_mqa_logits has no CUDA kernel in this release; pass host "
                             "tensors to run the CPU backend");
}

}  // namespace mqa_logits::cuda_backend
