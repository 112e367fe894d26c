// Runs a tiny FP8 prefill case on the CPU backend through the installed headers and library, and
// checks that every logit inside a window is finite and every logit outside is -inf.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include "mqa_logits/formats.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace {

constexpr std::int64_t kSeqLen = 5;
constexpr std::int64_t kSeqLenKv = 37;
constexpr std::int64_t kHeads = 8;
constexpr std::int64_t kHeadDim = 32;

std::vector<float> random_values(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

}  // namespace

int main() {
  namespace ml = mqa_logits;
  std::mt19937 rng(7);

  // Queries: FP8 codes without scales (a per-tensor scale would be folded into the weights).
  const std::vector<float> q_values = random_values(kSeqLen * kHeads * kHeadDim, rng);
  std::vector<std::uint8_t> q(q_values.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = ml::encode_e4m3(q_values[i]);

  // Keys: FP8 codes with one fp32 scale per token.
  std::vector<std::uint8_t> kv(kSeqLenKv * kHeadDim);
  std::vector<float> kv_scales(kSeqLenKv);
  for (std::int64_t j = 0; j < kSeqLenKv; ++j) {
    const std::vector<float> key = random_values(kHeadDim, rng);
    kv_scales[j] = ml::quantize_fp8_token(key, std::span(kv).subspan(j * kHeadDim, kHeadDim));
  }

  std::vector<float> weights = random_values(kSeqLen * kHeads, rng);
  // Causal windows of a chunk of the last kSeqLen queries.
  std::vector<std::int32_t> k_start(kSeqLen, 0);
  std::vector<std::int32_t> k_end(kSeqLen);
  for (std::int64_t i = 0; i < kSeqLen; ++i) k_end[i] = kSeqLenKv - kSeqLen + i + 1;

  const ml::OutputLayout layout =
      ml::mqa_logits_output_layout(kSeqLen, kSeqLenKv, 0, ml::DType::kFloat32);
  std::vector<float> logits(layout.rows * layout.row_stride);

  ml::TensorView logits_view{.data = logits.data(),
                             .dtype = ml::DType::kFloat32,
                             .rank = 2,
                             .shape = {layout.rows, layout.cols},
                             .strides = {layout.row_stride, 1}};
  ml::mqa_logits(
      {ml::TensorView::contiguous(q.data(), ml::DType::kFloat8E4M3, {kSeqLen, kHeads, kHeadDim}),
       std::nullopt},
      {ml::TensorView::contiguous(kv.data(), ml::DType::kFloat8E4M3, {kSeqLenKv, kHeadDim}),
       ml::TensorView::contiguous(kv_scales.data(), ml::DType::kFloat32, {kSeqLenKv})},
      ml::TensorView::contiguous(weights.data(), ml::DType::kFloat32, {kSeqLen, kHeads}),
      ml::TensorView::contiguous(k_start.data(), ml::DType::kInt32, {kSeqLen}),
      ml::TensorView::contiguous(k_end.data(), ml::DType::kInt32, {kSeqLen}), logits_view);

  int bad = 0;
  for (std::int64_t i = 0; i < kSeqLen; ++i) {
    for (std::int64_t j = 0; j < kSeqLenKv; ++j) {
      const float x = logits[i * layout.row_stride + j];
      const bool inside = j >= k_start[i] && j < k_end[i];
      if (inside ? !std::isfinite(x) : !(std::isinf(x) && x < 0)) ++bad;
    }
  }
  if (bad != 0) {
    std::fprintf(stderr, "consumer: %d logits violate the window mask\n", bad);
    return 1;
  }
  std::printf("consumer: %lld x %lld logits OK (installed mqa_logits, CPU backend)\n",
              static_cast<long long>(kSeqLen), static_cast<long long>(kSeqLenKv));
  return 0;
}
