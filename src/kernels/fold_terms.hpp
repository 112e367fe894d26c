// The e4m3 terms of the prefill kernel's folded linear half (sm90/prefill_folded_query.cuh): a
// value v held as sum_s t_s * 2^-(shift_0 + kTermShift * s), per value and exactly as the kernel
// computes it. Host and device code, so that the split is tested on the CPU.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mqa_logits::kernels {

inline constexpr int kFoldTerms = 4;  // the 4 lanes of a quad: one term each
inline constexpr int kTermShift = 5;  // max |v| in [128, 256): rounding error <= 8 = 256 / 2^5

// 2^e exactly, for e in [-126, 127].
__host__ __device__ inline float power_of_two(int e) {
#ifdef __CUDA_ARCH__
  return __int_as_float((127 + e) << 23);
#else
  const auto bits = static_cast<std::uint32_t>(127 + e) << 23;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// Term 0's shift for values whose largest magnitude is `largest` (term s's is that plus
// kTermShift * s): it places `largest` in [128, 256). Clamped so that every term's shift and its
// negation lie within [-126, 126] (power_of_two's range); only `largest` < 2^-104 loses precision
// to the clamp. `largest` >= 2^127 may round up to 2^128 and overflow: weights that large
// overflow the logits themselves.
__host__ __device__ inline int first_fold_shift(float largest) {
  int exponent;  // largest in [2^(exponent - 1), 2^exponent), 0 for 0
  frexpf(largest, &exponent);
  constexpr int kLastShift = 8 + kTermShift * (kFoldTerms - 1);
  return 8 - (exponent > kLastShift - 126 ? exponent : kLastShift - 126);
}

// The next term of `residual` in units of 2^-shift (up = 2^shift), rounded to nearest.
__host__ __device__ inline __nv_fp8_e4m3 next_term(float residual, float up) {
  return __nv_fp8_e4m3(residual * up);
}

// `residual` less its term (down = 2^-shift): exact, the term being the residual's leading bits.
__host__ __device__ inline float less_term(float residual, __nv_fp8_e4m3 term, float down) {
  return residual - static_cast<float>(term) * down;
}

// Splits v[0, N) in place into kFoldTerms terms with the shifts of first_shift (v ends as the
// residuals): on_term(s, down, terms) sees term s of every value, in units of down = 2^-shift.
template <int N, typename OnTerm>
__host__ __device__ inline void split_into_terms(float (&v)[N], int first_shift, OnTerm&& on_term) {
  for (int s = 0; s < kFoldTerms; ++s) {
    const int shift = first_shift + kTermShift * s;  // term units: 2^-shift
    const float up = power_of_two(shift), down = power_of_two(-shift);
    __nv_fp8_e4m3 terms[N];
    for (int i = 0; i < N; ++i) {
      terms[i] = next_term(v[i], up);
      v[i] = less_term(v[i], terms[i], down);
    }
    on_term(s, down, terms);
  }
}

}  // namespace mqa_logits::kernels
