// The checks of inputs whose values live where validation cannot read them without a
// synchronization on the GPU: block ids, context lengths, the tables of varlen sequences, key
// scales, the widest window against a compressed output, and schedule metadata. The CPU backend
// runs them on every call; the CUDA backend runs them in its checking mode
// (MQA_LOGITS_CHECK_INPUTS=1 or the options' check_inputs), on host copies of those inputs.
// Without the checking mode the CUDA kernels still read and write nothing out of bounds;
// docs/contract.md says what each such input gives. Each check throws InvalidArgument naming
// the argument, the position and the value.
#pragma once

#include <cstdint>

#include "problem.hpp"
#include "topk.hpp"

namespace mqa_logits::input_checks {

// The key scales of a paged FP8 cache: scale of token t of block k at
// scales[k * block_stride + t] (fp32).
struct PagedScales {
  const float* scales = nullptr;
  std::int64_t block_stride = 0;  // floats
};

// `problem`'s pointers must be readable on the host (context_lens, block_table, indices and
// schedule_meta; q_scales for the MX formats, which only the CPU backend runs); `scales` those
// of its cache (fp32, or for the MX formats packed UE8M0 words in the same slots).
void check_paged(const PagedProblem& problem, const PagedScales& scales);
// `problem`'s k_start, k_end, kv_scales, schedule_meta (and q_scales for the MX formats) must be
// readable on the host.
void check_prefill(const PrefillProblem& problem);

// Each candidate list of `indices` ([R, S, K], host memory) ascending with -1 after its last
// candidate, and a row's indices distinct across the lists.
void check_merge(const MergeProblem& problem, const std::int32_t* indices);

// The scales of a host paged cache, as check_paged reads them.
PagedScales host_paged_scales(const PagedProblem& problem);

}  // namespace mqa_logits::input_checks
