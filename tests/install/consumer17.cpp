// A C++17 consumer of the installed library: one FP8 decode call on the CPU backend with inputs
// written by hand (no formats.hpp, which needs C++20), from const input buffers, checking the
// logits against their closed form.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "mqa_logits/mqa_logits.hpp"

int main() {
  namespace ml = mqa_logits;
  constexpr std::int64_t kBatch = 2, kHeads = 8, kHeadDim = 32, kBlockKv = 32, kBlocks = 2;
  constexpr std::uint8_t kOne = 0x38;  // 1.0 in e4m3
  constexpr std::int64_t kTokenBytes = kHeadDim + 4;  // D values, then the block's fp32 scales
  // Every key and query element 1.0, every key scale 1: each score is D, each logit D sum_h w_h.
  std::vector<std::uint8_t> cache(kBlocks * kBlockKv * kTokenBytes);
  for (std::int64_t b = 0; b < kBlocks; ++b) {
    std::uint8_t* block = cache.data() + b * kBlockKv * kTokenBytes;
    for (std::int64_t v = 0; v < kBlockKv * kHeadDim; ++v) block[v] = kOne;
    auto* scales = reinterpret_cast<float*>(block + kBlockKv * kHeadDim);
    for (std::int64_t t = 0; t < kBlockKv; ++t) scales[t] = 1.0f;
  }
  const std::vector<std::uint8_t> q(kBatch * kHeads * kHeadDim, kOne);
  std::vector<float> weights(kBatch * kHeads);
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = 0.25f * static_cast<float>(i % 5);
  const std::vector<std::int32_t> lens = {20, 7};
  const std::vector<std::int32_t> table = {0, 1};  // one block a sequence
  std::vector<std::int32_t> meta(2 * ml::schedule_meta_rows(4));
  const auto lens_view = ml::TensorView::contiguous(lens.data(), ml::DType::kInt32, {kBatch});
  const auto meta_view = ml::TensorView::contiguous(meta.data(), ml::DType::kInt32,
                                                    {ml::schedule_meta_rows(4), 2});
  ml::get_paged_mqa_logits_metadata(lens_view, kBlockKv, 4, meta_view);

  const std::int64_t max_context_len = 32;
  const ml::OutputLayout layout =
      ml::paged_mqa_logits_output_layout(kBatch, max_context_len, ml::DType::kFloat32);
  std::vector<float> logits(layout.rows * layout.row_stride);
  ml::TensorView logits_view = ml::TensorView::contiguous(
      logits.data(), ml::DType::kFloat32, {layout.rows, layout.cols});
  logits_view.strides[0] = layout.row_stride;
  ml::PagedMqaLogitsOptions options;
  options.clean_logits = true;
  ml::QuantizedTensor query;
  query.values =
      ml::TensorView::contiguous(q.data(), ml::DType::kFloat8E4M3, {kBatch, 1, kHeads, kHeadDim});
  ml::paged_mqa_logits(
      query,
      ml::TensorView::contiguous(cache.data(), ml::DType::kUInt8,
                                 {kBlocks, kBlockKv, 1, kTokenBytes}),
      ml::TensorView::contiguous(weights.data(), ml::DType::kFloat32, {kBatch, kHeads}),
      lens_view, ml::TensorView::contiguous(table.data(), ml::DType::kInt32, {kBatch, 1}),
      meta_view, max_context_len, logits_view, options);

  int wrong = 0;
  for (std::int64_t b = 0; b < kBatch; ++b) {
    float weight_sum = 0.0f;
    for (std::int64_t h = 0; h < kHeads; ++h) weight_sum += weights[b * kHeads + h];
    for (std::int64_t p = 0; p < max_context_len; ++p) {
      const float got = logits[b * layout.row_stride + p];
      const bool inside = p < lens[b];
      wrong += inside ? got != kHeadDim * weight_sum : !(std::isinf(got) && got < 0);
    }
  }
  std::printf("consumer17: %d of %lld logits wrong\n", wrong,
              static_cast<long long>(kBatch * max_context_len));
  return wrong == 0 ? 0 : 1;
}
