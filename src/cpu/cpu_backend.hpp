// CPU reference backend: the backend for host tensors, and through its float64 core (kernel.hpp)
// the library's one C++ oracle: support/reference.hpp computes the expected logits of the tests
// (the GPU tests' too), the CLI and the benchmark with it.
//
// Arithmetic (documented because the GPU tests, the CLI and the benchmark check against it), all
// in float64:
// - The dot product of a query head with a key (MX: over one 32-element block) is exact: every
//   e4m3 value is an integer multiple of 2^-9 below 2^9 and every e2m1 value a multiple of 1/2,
//   so every partial sum fits in float64's 53 bits, whatever the summation order.
// - MX: s = the sum over blocks b = 0, 1, ... in order of block_dot * (qscale * kscale), the
//   scale product exact (powers of two), each addition rounded. FP8: s is the exact dot product.
// - The head sum runs h = 0..H-1 as sum += w[i, h] * max(s, 0): the product rounded, then the
//   addition (this step is compiled for the baseline ISA, which on x86-64 has no fused
//   multiply-add for the compiler to contract into).
// - FP8 multiplies the head sum by the key's fp32 scale once at the end (the same as scaling s
//   inside the relu, for the non-negative key scales the format's quantizer produces).
// - The result is rounded once to the logits dtype (to nearest even, for bf16 too).
// Outside the windows: -inf with clean_logits, otherwise nothing is written. Schedule metadata
// is not read: the output never depends on it.
#pragma once

#include "problem.hpp"
#include "topk.hpp"

namespace mqa_logits::cpu {

// `num_threads` workers (<= 0: every hardware thread) share the work; results do not depend on it.
void run_prefill(const PrefillProblem& problem, int num_threads);
void run_paged(const PagedProblem& problem, int num_threads);
// Selection (topk.hpp): rows are independent, each selected whole by one worker.
void run_topk(const TopkProblem& problem, int num_threads);
void run_merge(const MergeProblem& problem, int num_threads);

}  // namespace mqa_logits::cpu
