// The split of the prefill kernel's folded linear half into e4m3 terms (kernels/fold_terms.hpp),
// run on the CPU with the kernel's own functions: every term fits e4m3 without saturating, the
// residual arithmetic is exact, and four terms hold each value to 2^-19 of the largest one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/fold_terms.hpp"

namespace mqa_logits {
namespace {

using kernels::kTermShift;

struct Split {
  float largest = 0.0f;               // the largest magnitude among the values
  std::vector<double> reconstructed;  // sum of the terms, in double
  std::vector<float> residual;        // what the kernel's residual holds after the last term
  float largest_term = 0.0f;          // in term units, over all terms
};

// The kernel's split (split_into_terms, as fold_query calls it) of one query's values: one shift
// for all of them, each value split on its own.
Split split(const std::vector<float>& v) {
  float largest = 0.0f;
  for (float x : v) largest = std::max(largest, std::fabs(x));
  const int first_shift = kernels::first_fold_shift(largest);
  Split out{largest, std::vector<double>(v.size(), 0.0), v, 0.0f};
  for (std::size_t i = 0; i < v.size(); ++i) {
    float value[1] = {v[i]};
    kernels::split_into_terms(value, first_shift, [&](int s, float down,
                                                      const __nv_fp8_e4m3 (&terms)[1]) {
      const int shift = first_shift + kTermShift * s;
      EXPECT_EQ(static_cast<double>(down), std::ldexp(1.0, -shift));
      const double term = std::ldexp(double{static_cast<float>(terms[0])}, -shift);
      out.largest_term = std::max(out.largest_term, std::fabs(static_cast<float>(terms[0])));
      EXPECT_EQ(static_cast<double>(value[0]), double{out.residual[i]} - term)
          << "inexact residual at " << i;
      out.residual[i] = value[0];
      out.reconstructed[i] += term;
    });
  }
  return out;
}

// |v - sum of terms| <= 2^-19 max(largest, 2^-104) per value; the residual is that difference.
void expect_split_within_bound(const std::vector<float>& v) {
  const Split s = split(v);
  EXPECT_LT(s.largest_term, 448.0f) << "a term saturated e4m3";
  const double bound = std::ldexp(std::max(double{s.largest}, std::ldexp(1.0, -104)), -19);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double error = double{v[i]} - s.reconstructed[i];
    EXPECT_LE(std::fabs(error), bound) << "value " << i << " = " << v[i];
    EXPECT_EQ(error, double{s.residual[i]}) << "value " << i;
  }
}

TEST(FoldTerms, RandomValuesOfOneScale) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float scale : {1e-6f, 3e-2f, 1.0f, 7.5f, 448.0f * 64, 1e20f}) {
    std::vector<float> v(128);
    for (float& x : v) x = scale * normal(rng);
    expect_split_within_bound(v);
  }
}

TEST(FoldTerms, ValuesSpanningManyBinades) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> exponent(-40.0f, 10.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(128);
  for (float& x : v) x = (negative(rng) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
  expect_split_within_bound(v);
}

TEST(FoldTerms, ZerosTinyAndExtremeValues) {
  expect_split_within_bound(std::vector<float>(128, 0.0f));
  expect_split_within_bound({1e-30f, -3e-30f, 0.0f});            // just above the clamp
  expect_split_within_bound({2e-33f, -3e-34f, 0.0f, 1e-38f});     // below 2^-104: the clamp
  expect_split_within_bound({1e37f, -1.0f, 1e-20f});  // below 2^127 (see first_fold_shift)
  expect_split_within_bound({255.99f, -256.0f, 128.0f, 0.5f});
}

}  // namespace
}  // namespace mqa_logits
