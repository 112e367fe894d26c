// Valid host inputs of one prefill or decode call, with random quantized data, for the
// validation tests: a test edits one view (or constructs unsupported extents) and expects the
// call to be refused without touching the poisoned logits buffer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "metadata.hpp"
#include "mqa_logits/formats.hpp"
#include "mqa_logits/mqa_logits.hpp"

namespace mqa_logits::test {

inline constexpr std::uint8_t kPoison = 0xa5;

// Bytes of a buffer allocated with a 16-byte aligned base (operator new guarantees it).
using Bytes = std::vector<std::uint8_t>;

inline std::int64_t stored_dim(Format format, std::int64_t head_dim) {
  return format == Format::kMXFP4 ? head_dim / 2 : head_dim;
}

// Quantizes a random vector of `head_dim` values into `values`; returns its 4-byte scale: the
// fp32 bits of an FP8 key scale, packed UE8M0 for MX, 0 for FP8 queries (which have none).
inline std::uint32_t quantize_random(std::mt19937& gen, Format format, bool key,
                                     std::int64_t head_dim, std::uint8_t* values) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> x(static_cast<std::size_t>(head_dim));
  for (float& v : x) v = normal(gen);
  const std::span<std::uint8_t> out(values, static_cast<std::size_t>(stored_dim(format, head_dim)));
  switch (format) {
    case Format::kMXFP8: return std::bit_cast<std::uint32_t>(quantize_mxfp8_vector(x, out));
    case Format::kMXFP4: return std::bit_cast<std::uint32_t>(quantize_mxfp4_vector(x, out));
    case Format::kFP8: break;
  }
  if (key) return std::bit_cast<std::uint32_t>(quantize_fp8_token(x, out));
  std::transform(x.begin(), x.end(), out.begin(), encode_e4m3);
  return 0;
}

// `count` random weights of `dtype` (fp32 or bf16) as bytes.
inline Bytes random_weights(std::mt19937& gen, std::int64_t count, DType dtype) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Bytes bytes(static_cast<std::size_t>(count) * dtype_size(dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    const float w = uniform(gen);
    if (dtype == DType::kBFloat16) {
      const std::uint16_t bits = float_to_bf16(w);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &w, 4);
    }
  }
  return bytes;
}

// A logits buffer of rows x cols with the library's padded layout, poisoned.
struct PoisonedLogits {
  PoisonedLogits(std::int64_t rows, std::int64_t cols, DType dtype, OutputLayout layout)
      : bytes(static_cast<std::size_t>(layout.rows * layout.row_stride) * dtype_size(dtype),
              kPoison),
        view(TensorView::contiguous(bytes.data(), dtype, {rows, cols})) {
    view.strides[0] = layout.row_stride;
  }
  bool untouched() const {
    return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == kPoison; });
  }
  Bytes bytes;
  TensorView view;
};

struct PrefillInputs {
  explicit PrefillInputs(Format format = Format::kFP8, std::int64_t S = 6, std::int64_t H = 16,
                         std::int64_t D = 64, std::int64_t T = 50,
                         DType weights_dtype = DType::kFloat32,
                         DType logits_dtype = DType::kFloat32)
      : gen(1234 + S * 7 + H * 13 + D + T),
        q_data(static_cast<std::size_t>(S * H * stored_dim(format, D))),
        q_scale_data(static_cast<std::size_t>(S * H)),
        kv_data(static_cast<std::size_t>(T * stored_dim(format, D))),
        kv_scale_data(static_cast<std::size_t>(T)),
        weights_data(random_weights(gen, S * H, weights_dtype)),
        start_data(static_cast<std::size_t>(S)),
        end_data(static_cast<std::size_t>(S)),
        out(S, T, logits_dtype, mqa_logits_output_layout(S, T, 0, logits_dtype)) {
    const std::int64_t dim = stored_dim(format, D);
    for (std::int64_t i = 0; i < S * H; ++i) {
      q_scale_data[i] = quantize_random(gen, format, false, D, q_data.data() + i * dim);
    }
    for (std::int64_t j = 0; j < T; ++j) {
      kv_scale_data[j] = quantize_random(gen, format, true, D, kv_data.data() + j * dim);
    }
    std::uniform_int_distribution<std::int32_t> key(0, static_cast<std::int32_t>(T));
    for (std::int64_t i = 0; i < S; ++i) {
      start_data[i] = key(gen);
      end_data[i] = std::max(start_data[i], key(gen));
    }
    const DType values = format == Format::kMXFP4 ? DType::kUInt8 : DType::kFloat8E4M3;
    const DType key_scales = format == Format::kFP8 ? DType::kFloat32 : DType::kInt32;
    q.values = TensorView::contiguous(q_data.data(), values, {S, H, dim});
    if (format != Format::kFP8) {
      q.scales = TensorView::contiguous(q_scale_data.data(), DType::kInt32, {S, H});
    }
    kv.values = TensorView::contiguous(kv_data.data(), values, {T, dim});
    kv.scales = TensorView::contiguous(kv_scale_data.data(), key_scales, {T});
    weights = TensorView::contiguous(weights_data.data(), weights_dtype, {S, H});
    k_start = TensorView::contiguous(start_data.data(), DType::kInt32, {S});
    k_end = TensorView::contiguous(end_data.data(), DType::kInt32, {S});
    logits = out.view;
  }
  PrefillInputs(const PrefillInputs&) = delete;
  PrefillInputs& operator=(const PrefillInputs&) = delete;

  void call() const { mqa_logits(q, kv, weights, k_start, k_end, logits, options); }

  std::mt19937 gen;
  Bytes q_data;
  std::vector<std::uint32_t> q_scale_data;
  Bytes kv_data;
  std::vector<std::uint32_t> kv_scale_data;
  Bytes weights_data;
  std::vector<std::int32_t> start_data, end_data;
  PoisonedLogits out;

  QuantizedTensor q, kv;
  TensorView weights, k_start, k_end, logits;
  MqaLogitsOptions options;
};

struct PagedInputs {
  explicit PagedInputs(Format format = Format::kFP8, std::int64_t B = 3, std::int64_t N = 2,
                       std::int64_t H = 16, std::int64_t D = 64, std::int64_t block_kv = 64,
                       std::int64_t max_context_len = 150, DType weights_dtype = DType::kFloat32,
                       DType logits_dtype = DType::kFloat32)
      : gen(4321 + B * 7 + N * 11 + H * 13 + D + block_kv),
        max_blocks((max_context_len + block_kv - 1) / block_kv),
        num_blocks(B * max_blocks + 1),
        q_data(static_cast<std::size_t>(B * N * H * stored_dim(format, D))),
        q_scale_data(static_cast<std::size_t>(B * N * H)),
        cache_data(static_cast<std::size_t>(num_blocks * block_kv * (stored_dim(format, D) + 4))),
        weights_data(random_weights(gen, B * N * H, weights_dtype)),
        lens_data(static_cast<std::size_t>(B * N)),
        table_data(static_cast<std::size_t>(B * max_blocks)),
        meta_data(2 * (kWorkers + 1), -1),
        out(B * N, max_context_len, logits_dtype,
            paged_mqa_logits_output_layout(B * N, max_context_len, logits_dtype)),
        max_context_len(max_context_len) {
    const std::int64_t dim = stored_dim(format, D);
    for (std::int64_t i = 0; i < B * N * H; ++i) {
      q_scale_data[i] = quantize_random(gen, format, false, D, q_data.data() + i * dim);
    }
    // Each block: block_kv token values, then block_kv 4-byte scales.
    for (std::int64_t k = 0; k < num_blocks; ++k) {
      std::uint8_t* block = cache_data.data() + k * block_kv * (dim + 4);
      for (std::int64_t t = 0; t < block_kv; ++t) {
        const std::uint32_t scale = quantize_random(gen, format, true, D, block + t * dim);
        std::memcpy(block + block_kv * dim + 4 * t, &scale, 4);
      }
    }
    std::uniform_int_distribution<std::int32_t> len(1, static_cast<std::int32_t>(max_context_len));
    for (auto& l : lens_data) l = len(gen);
    std::uniform_int_distribution<std::int32_t> block(0, static_cast<std::int32_t>(num_blocks - 1));
    for (auto& b : table_data) b = block(gen);
    host::paged_metadata(lens_data.data(), B, N, true, nullptr, kWorkers, meta_data.data());

    const DType values = format == Format::kMXFP4 ? DType::kUInt8 : DType::kFloat8E4M3;
    q.values = TensorView::contiguous(q_data.data(), values, {B, N, H, dim});
    if (format != Format::kFP8) {
      q.scales = TensorView::contiguous(q_scale_data.data(), DType::kInt32, {B, N, H});
    }
    kv_cache = TensorView::contiguous(cache_data.data(), DType::kUInt8,
                                      {num_blocks, block_kv, 1, dim + 4});
    weights = TensorView::contiguous(weights_data.data(), weights_dtype, {B * N, H});
    context_lens = TensorView::contiguous(lens_data.data(), DType::kInt32, {B, N});
    block_table = TensorView::contiguous(table_data.data(), DType::kInt32, {B, max_blocks});
    schedule_meta = TensorView::contiguous(meta_data.data(), DType::kInt32, {kWorkers + 1, 2});
    logits = out.view;
  }
  PagedInputs(const PagedInputs&) = delete;
  PagedInputs& operator=(const PagedInputs&) = delete;

  void call() const {
    paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                     max_context_len, logits, options);
  }

  static constexpr int kWorkers = 4;
  std::mt19937 gen;
  std::int64_t max_blocks, num_blocks;
  Bytes q_data;
  std::vector<std::uint32_t> q_scale_data;
  Bytes cache_data, weights_data;
  std::vector<std::int32_t> lens_data, table_data, meta_data;
  PoisonedLogits out;

  QuantizedTensor q;
  TensorView kv_cache, weights, context_lens, block_table, schedule_meta, logits;
  std::int64_t max_context_len;
  PagedMqaLogitsOptions options;
};

// The fields a prefill and a decode descriptor (PrefillProblem, PagedProblem) share, as a test
// expects them; expect_common_fields checks them and the pointers into the inputs they share.
struct CommonFields {
  Format format;
  std::int64_t num_heads;
  std::int64_t head_dim;
  DType weights_dtype;
  DType logits_dtype;
  std::int64_t logits_row_stride;
  bool clean_logits;
  const std::int32_t* schedule_meta;
  int schedule_workers;
};

template <typename Problem, typename Inputs>
void expect_common_fields(const Problem& p, const Inputs& in, const CommonFields& expected) {
  EXPECT_EQ(p.format, expected.format);
  EXPECT_EQ(p.device, Device{});
  EXPECT_EQ(p.num_heads, expected.num_heads);
  EXPECT_EQ(p.head_dim, expected.head_dim);
  EXPECT_EQ(p.q, in.q_data.data());
  EXPECT_EQ(static_cast<const void*>(p.q_scales), in.q_scale_data.data());
  EXPECT_EQ(p.weights, in.weights_data.data());
  EXPECT_EQ(p.weights_dtype, expected.weights_dtype);
  EXPECT_EQ(p.logits, in.out.bytes.data());
  EXPECT_EQ(p.logits_dtype, expected.logits_dtype);
  EXPECT_EQ(p.logits_row_stride, expected.logits_row_stride);
  EXPECT_EQ(p.clean_logits, expected.clean_logits);
  EXPECT_EQ(p.schedule_meta, expected.schedule_meta);
  EXPECT_EQ(p.schedule_workers, expected.schedule_workers);
}

// Runs `call`, which must throw InvalidArgument naming `argument` ("argument: expected ...").
template <typename Call>
void expect_refused(Call&& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected a refusal naming " << argument;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(argument + ": ", 0), 0u) << what;
    EXPECT_GT(what.size(), argument.size() + 10) << what;
  }
}

// The refusal must also leave the poisoned output as it was.
template <typename Inputs>
void expect_call_refused(const Inputs& inputs, const std::string& argument) {
  expect_refused([&] { inputs.call(); }, argument);
  EXPECT_TRUE(inputs.out.untouched()) << "the output was written before the refusal";
}

// Builds inputs of type Inputs from `args`, lets `edit` break one view or option, and expects the
// call refused as expect_call_refused does.
template <typename Inputs, typename Edit, typename... Args>
void expect_edit_refused(const std::string& argument, Edit edit, const Args&... args) {
  Inputs inputs(args...);
  edit(inputs);
  expect_call_refused(inputs, argument);
}

}  // namespace mqa_logits::test
