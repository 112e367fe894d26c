// The linear half of the prefill head sum, moved onto the tensor cores (prefill_kernel.cuh).
//
// relu(x) = (|x| + x) / 2, so for one query (heads q_h, weights w_h) and one key k:
//     sum_h w_h relu(q_h . k) = sum_h (w_h / 2) |q_h . k|  +  v . k,   v = sum_h (w_h / 2) q_h.
// The first sum costs the epilogue one FFMA per (key, head), its |x| a free operand modifier,
// where relu costs an FMNMX besides (epilogue instructions add to the tensor time: docs/design.md,
// "Choices made by measurement"). The second is a dot product per (key, query): a
// few more MMA columns. v is fp32 and the MMA takes e4m3, so v enters as kFoldTerms e4m3 rows,
//     v ~= sum_s t_s * 2^-(a + kTermShift * s),
// a placing max |v| in [128, 256) and each term carrying the rounding error of the ones before
// (at most 8 in the units of its predecessor, 2^kTermShift coarser): after four terms the error
// is below 2^-19 max |v|, finer than the tensor cores' own accumulation (the per-value steps are
// in kernels/fold_terms.hpp; tests/gpu/test_fold_terms.cpp checks them on the CPU). The epilogue
// multiplies the column of term s by 2^-(a + kTermShift * s) (its multiplier) and adds it to the
// head sum.
//
// Numerics: the |x| sum carries the tensor cores' rounding of every head's score, where relu
// drops that of the negative ones, and v . k adds its own; with random scores the logits match
// the relu form's accuracy (oracle diff 6.1e-9 either way), and where most of a logit's head
// scores are negative the error grows as the square root of (all heads' squared weighted scores /
// the positive heads'): tests/gpu "MostHeadsScoringNegative" holds the bound with 7 heads in 8.
//
// Column order of a query group's folded rows (after its kGroupN (query, head) rows): column
// kGroupN + 8 j + 2 s + c holds term s of query 2 j + c, so that in the wgmma accumulator layout
// (column 8 j + 2 (lane % 4) + c) a lane holds term lane % 4 of queries 2 j and 2 j + 1: every
// lane's folded columns belong to queries known at compile time.
#pragma once

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "kernels/fold_terms.hpp"
#include "kernels/sm90/primitives.cuh"

namespace mqa_logits::sm90 {

using kernels::kFoldTerms;

// Row of term `term` of query `query` (of its group) in the group's Q tile.
template <int kGroupN>
__host__ __device__ constexpr int folded_row(int query, int term) {
  return kGroupN + 8 * (query / 2) + 2 * term + query % 2;
}

// kDims consecutive bytes at `at` (kDims in {1, 2, 4}, `at` kDims-aligned), little-endian.
template <int kDims>
__device__ __forceinline__ std::uint32_t load_bytes(const std::uint8_t* at) {
  if constexpr (kDims == 4) {
    return *reinterpret_cast<const std::uint32_t*>(at);
  } else if constexpr (kDims == 2) {
    return *reinterpret_cast<const std::uint16_t*>(at);
  } else {
    return *at;
  }
}

// v[i] += w * e4m3 byte i of `bytes`, two bytes per conversion.
template <int kDims>
__device__ __forceinline__ void fma_e4m3(std::uint32_t bytes, float w, float (&v)[kDims]) {
#pragma unroll
  for (int i = 0; i < kDims; i += 2) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(bytes >> (8 * i));
    const float2 q = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    v[i] = fmaf(w, q.x, v[i]);
    if (i + 1 < kDims) v[i + 1] = fmaf(w, q.y, v[i + 1]);
  }
}

template <int kDims>
__device__ __forceinline__ void store_bytes(std::uint8_t* at, std::uint32_t bytes) {
  if constexpr (kDims == 4) {
    *reinterpret_cast<std::uint32_t*>(at) = bytes;
  } else if constexpr (kDims == 2) {
    *reinterpret_cast<std::uint16_t*>(at) = static_cast<std::uint16_t>(bytes);
  } else {
    *at = static_cast<std::uint8_t>(bytes);
  }
}

// Called by one full warp for query `query` of a group whose Q tile (kGroupN TMA rows, then the
// folded rows) starts at `group_tile`: v = sum_h half_w[h] q_h from the tile's rows, split into
// the query's kFoldTerms folded rows; `multipliers[s * term_stride]` receives term s's multiplier.
// `half_w[i]` is w_h / 2 for h = lane + 32 i (0 for a query past S).
template <int kHeadDim, int kNumHeads, int kGroupN>
__device__ __forceinline__ void fold_query(std::uint8_t* group_tile, int query,
                                           const float (&half_w)[kNumHeads / 32],
                                           float* multipliers, int term_stride, int lane) {
  constexpr int kDims = kHeadDim / 32;  // of v, per lane
  constexpr int kHeadsInFlight = 4;  // loads issued before their products: the warpgroup runs
                                     // on 32 registers, which leaves the compiler no room to
                                     // overlap iterations by itself
  const int dim0 = lane * kDims;
  float v[kDims] = {};
#pragma unroll
  for (int part = 0; part < kNumHeads / 32; ++part) {  // static: half_w stays in registers
#pragma unroll 1
    for (int h0 = 0; h0 < 32; h0 += kHeadsInFlight) {
      std::uint32_t bytes[kHeadsInFlight];
      float w[kHeadsInFlight];
#pragma unroll
      for (int k = 0; k < kHeadsInFlight; ++k) {
        const auto row = static_cast<std::uint32_t>(query * kNumHeads + 32 * part + h0 + k);
        bytes[k] = load_bytes<kDims>(group_tile + swizzled_offset<kHeadDim>(row * kHeadDim + dim0));
        w[k] = __shfl_sync(0xffffffffu, half_w[part], h0 + k);
      }
#pragma unroll
      for (int k = 0; k < kHeadsInFlight; ++k) fma_e4m3<kDims>(bytes[k], w[k], v);
    }
  }
  float largest = 0.f;
#pragma unroll
  for (int i = 0; i < kDims; ++i) largest = fmaxf(largest, fabsf(v[i]));
  // Non-negative floats order as their bit patterns.
  largest = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(largest)));
  kernels::split_into_terms(
      v, kernels::first_fold_shift(largest),
      [&](int s, float down, const __nv_fp8_e4m3 (&terms)[kDims]) {
        std::uint32_t bytes = 0;
#pragma unroll
        for (int i = 0; i < kDims; ++i) {
          bytes |= static_cast<std::uint32_t>(terms[i].__x) << (8 * i);
        }
        const auto row = static_cast<std::uint32_t>(folded_row<kGroupN>(query, s));
        store_bytes<kDims>(group_tile + swizzled_offset<kHeadDim>(row * kHeadDim + dim0), bytes);
        if (lane == 0) multipliers[s * term_stride] = down;
      });
}

}  // namespace mqa_logits::sm90
