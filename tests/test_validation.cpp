// Refusals of mqa_logits (docs/contract.md, "Errors") on host tensors: each names the argument and
// leaves the output untouched. Valid calls must pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mqa_logits/mqa_logits.hpp"
#include "validate.hpp"
#include "validate_checks.hpp"
#include "validation_inputs.hpp"

namespace mqa_logits {
namespace {

using test::expect_call_refused;
using test::expect_edit_refused;
using test::expect_refused;
using test::PrefillInputs;

constexpr Device kCuda{DeviceType::kCUDA, 0};

TEST(PrefillValidation, ValidCallsPass) {
  const std::pair<DType, DType> dtypes[] = {{DType::kFloat32, DType::kFloat32},
                                            {DType::kFloat32, DType::kBFloat16},
                                            {DType::kBFloat16, DType::kBFloat16}};
  for (const Format format : {Format::kFP8, Format::kMXFP8, Format::kMXFP4}) {
    for (const auto& [weights, logits] : dtypes) {
      PrefillInputs in(format, 5, 8, 128, 70, weights, logits);
      EXPECT_NO_THROW(in.call()) << format_name(format);
      EXPECT_FALSE(in.out.untouched()) << format_name(format);
    }
  }
  PrefillInputs compressed(Format::kFP8, 4, 16, 32, 40);
  compressed.options.max_seqlen_k = 40;
  EXPECT_NO_THROW(compressed.call());
  PrefillInputs no_rows(Format::kFP8, 0, 8, 64, 40);
  EXPECT_NO_THROW(no_rows.call());
}

TEST(PrefillValidation, DescriptorHasEveryField) {
  PrefillInputs in(Format::kMXFP8, 6, 32, 64, 90, DType::kBFloat16, DType::kBFloat16);
  std::vector<std::int32_t> meta(2 * 5);
  in.options.schedule_meta = TensorView::contiguous(meta.data(), DType::kInt32, {5, 2});
  in.options.clean_logits = false;
  const PrefillProblem p =
      validate_prefill(in.q, in.kv, in.weights, in.k_start, in.k_end, in.logits, in.options);
  EXPECT_EQ(p.seq_len, 6);
  EXPECT_EQ(p.seq_len_kv, 90);
  EXPECT_EQ(p.kv, in.kv_data.data());
  EXPECT_EQ(p.kv_scales, in.kv_scale_data.data());
  EXPECT_EQ(p.weights_row_stride, 32);
  EXPECT_EQ(p.k_start, in.start_data.data());
  EXPECT_EQ(p.k_end, in.end_data.data());
  EXPECT_EQ(p.out_cols, 90);
  EXPECT_FALSE(p.compressed);
  test::expect_common_fields(
      p, in,
      {.format = Format::kMXFP8, .num_heads = 32, .head_dim = 64, .weights_dtype = DType::kBFloat16,
       .logits_dtype = DType::kBFloat16, .logits_row_stride = 512,  // 90 bf16 padded to 1024 bytes
       .clean_logits = false, .schedule_meta = meta.data(), .schedule_workers = 4});
}

TEST(PrefillValidation, OffsetsBeyond32Bits) {
  // S * T > 2^31: validation must not overflow (it reads no data).
  PrefillInputs in(Format::kFP8, 2, 8, 64, 4);
  const std::int64_t S = 70000, T = 40000;
  in.q.values.shape = {S, 8, 64};
  in.q.values.strides = {8 * 64, 64, 1};
  in.kv.values.shape = {T, 64};
  in.kv.scales->shape = {T};
  in.weights.shape = {S, 8};
  in.k_start.shape = {S};
  in.k_end.shape = {S};
  in.logits.shape = {S, T};
  in.logits.strides = {T, 1};
  // Validation reads no data: the logits' 11 GB view sits at an address of its own, apart from
  // the other views (which it would otherwise overlap).
  in.logits.data = reinterpret_cast<void*>(std::uintptr_t{1} << 46);
  const PrefillProblem p =
      validate_prefill(in.q, in.kv, in.weights, in.k_start, in.k_end, in.logits, in.options);
  EXPECT_GT(p.seq_len * p.logits_row_stride, std::int64_t{1} << 31);
  EXPECT_EQ(p.logits_row_stride, T);
}

TEST(PrefillValidation, RefusesWrongRank) {
  expect_edit_refused<PrefillInputs>("q", [](auto& in) { in.q.values.rank = 2; });
  expect_edit_refused<PrefillInputs>("kv", [](auto& in) {
    in.kv.values = TensorView::contiguous(in.kv_data.data(), DType::kFloat8E4M3, {50, 1, 64});
  });
  expect_edit_refused<PrefillInputs>("weights", [](auto& in) { in.weights.rank = 1; });
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.logits.rank = 3; });
}

TEST(PrefillValidation, RefusesWrongDtype) {
  expect_edit_refused<PrefillInputs>("q", [](auto& in) { in.q.values.dtype = DType::kInt32; });
  expect_edit_refused<PrefillInputs>("weights", [](auto& in) { in.weights.dtype = DType::kInt32; });
  expect_edit_refused<PrefillInputs>("k_start",
                                     [](auto& in) { in.k_start.dtype = DType::kFloat32; });
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.logits.dtype = DType::kInt32; });
}

TEST(PrefillValidation, RefusesWrongShape) {
  expect_edit_refused<PrefillInputs>("kv", [](auto& in) { in.kv.values.shape[1] = 32; });
  expect_edit_refused<PrefillInputs>("kv_scales", [](auto& in) { in.kv.scales->shape[0] = 49; });
  expect_edit_refused<PrefillInputs>("weights", [](auto& in) { in.weights.shape[0] = 5; });
  expect_edit_refused<PrefillInputs>("k_end", [](auto& in) { in.k_end.shape[0] = 7; });
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.logits.shape[1] = 51; });
  expect_edit_refused<PrefillInputs>(
      "q_scales", [](auto& in) { in.q.scales->shape[1] = 8; }, Format::kMXFP8);
  expect_edit_refused<PrefillInputs>("q", [](auto& in) {  // negative extents
    in.k_start.shape[0] = -1;
    in.q.values.shape[0] = -1;
  });
}

TEST(PrefillValidation, RefusesWrongStride) {
  // Heads 128 bytes apart: not contiguous.
  expect_edit_refused<PrefillInputs>("q", [](auto& in) { in.q.values.strides[1] = 128; });
  expect_edit_refused<PrefillInputs>("kv", [](auto& in) { in.kv.values.strides[0] = 128; });
  expect_edit_refused<PrefillInputs>("weights", [](auto& in) { in.weights.strides[1] = 2; });
  // Rows overlap.
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.logits.strides[0] = 49; });
  expect_edit_refused<PrefillInputs>("k_start", [](auto& in) { in.k_start.strides[0] = 2; });
}

TEST(PrefillValidation, RefusesUnsupportedHeadsAndHeadDim) {
  for (const std::int64_t heads : {4, 12, 128}) {
    PrefillInputs in(Format::kFP8, 3, heads, 64, 20);
    expect_call_refused(in, "q");
  }
  for (const std::int64_t dim : {16, 96, 256}) {
    PrefillInputs in(Format::kFP8, 3, 8, dim, 20);
    expect_call_refused(in, "q");
  }
  PrefillInputs mxfp4_d32(Format::kMXFP4, 3, 8, 32, 20);  // MXFP4 needs D 64 or 128
  expect_call_refused(mxfp4_d32, "q");
}

TEST(PrefillValidation, RefusesFormatMismatch) {
  // MXFP4 bytes without query scales, MXFP8 fp32 query scales.
  expect_edit_refused<PrefillInputs>(
      "q_scales", [](auto& in) { in.q.scales.reset(); }, Format::kMXFP4);
  expect_edit_refused<PrefillInputs>(
      "q_scales", [](auto& in) { in.q.scales->dtype = DType::kFloat32; }, Format::kMXFP8);
  // FP8 with int key scales, MXFP8 with float key scales, no key scales.
  expect_edit_refused<PrefillInputs>(
      "kv_scales", [](auto& in) { in.kv.scales->dtype = DType::kInt32; }, Format::kFP8);
  expect_edit_refused<PrefillInputs>(
      "kv_scales", [](auto& in) { in.kv.scales->dtype = DType::kFloat32; }, Format::kMXFP8);
  expect_edit_refused<PrefillInputs>("kv_scales", [](auto& in) { in.kv.scales.reset(); });
  // MXFP8 byte keys, MXFP4 e4m3 keys.
  expect_edit_refused<PrefillInputs>(
      "kv", [](auto& in) { in.kv.values.dtype = DType::kUInt8; }, Format::kMXFP8);
  expect_edit_refused<PrefillInputs>(
      "kv", [](auto& in) { in.kv.values.dtype = DType::kFloat8E4M3; }, Format::kMXFP4);
}

TEST(PrefillValidation, RefusesBf16WeightsWithFp32Logits) {
  PrefillInputs in(Format::kFP8, 6, 16, 64, 50, DType::kBFloat16, DType::kFloat32);
  expect_call_refused(in, "logits");
  try {
    in.call();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}

TEST(PrefillValidation, RefusesBadCompressedOutput) {
  expect_edit_refused<PrefillInputs>("max_seqlen_k",
                                     [](auto& in) { in.options.max_seqlen_k = -1; });
  // The logits stay [S, T].
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.options.max_seqlen_k = 20; });
}

// Compressed output: key j of row i lands in column j - start[i], so a window from a negative
// start needs end - start columns, more than its keys (the CPU backend's check).
TEST(PrefillValidation, CompressedOutputCountsColumnsFromTheStart) {
  const auto inputs = [](std::int32_t start) {
    auto in = std::make_unique<PrefillInputs>();  // S = 6, T = 50: compressed as wide as T
    in->options.max_seqlen_k = 50;
    std::fill(in->start_data.begin(), in->start_data.end(), 0);
    std::fill(in->end_data.begin(), in->end_data.end(), 5);
    in->start_data[2] = start;
    return in;
  };
  EXPECT_NO_THROW(inputs(-45)->call());  // keys 0-4 in columns 45-49
  expect_call_refused(*inputs(-46), "max_seqlen_k");  // key 4 in column 50
}

// UE8M0 255 is NaN: the CPU backend refuses it in a used block of any query or key scale word,
// and takes it in a padding byte (head dim 64 uses bytes 0 and 1 of each word).
TEST(PrefillValidation, RefusesNanScales) {
  expect_edit_refused<PrefillInputs>(
      "q_scales", [](auto& in) { in.q_scale_data[5] |= 0xffu << 8; }, Format::kMXFP8);
  expect_edit_refused<PrefillInputs>(
      "kv_scales", [](auto& in) { in.kv_scale_data[7] |= 0xffu; }, Format::kMXFP4);
  PrefillInputs padding(Format::kMXFP8);  // D = 64
  padding.q_scale_data[5] |= 0xffu << 24;
  padding.kv_scale_data[7] |= 0xffu << 16;
  EXPECT_NO_THROW(padding.call());
}

// The logits may not share memory with an input, nor may a view span 2^63 bytes or more.
TEST(PrefillValidation, RefusesOverlappingAndOversizedViews) {
  expect_edit_refused<PrefillInputs>("logits",
                                     [](auto& in) { in.q.values.data = in.out.bytes.data(); });
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) {  // the ends in the last row
    in.k_end.data = in.out.bytes.data() + in.out.bytes.size() - 1024;
  });
  expect_edit_refused<PrefillInputs>("q", [](auto& in) {  // S x H x D elements past 2^63
    in.q.values.shape[0] = std::int64_t{1} << 60;
  });
  TensorView wide = TensorView::contiguous(nullptr, DType::kFloat32, {4, 8});
  wide.strides[0] = std::numeric_limits<std::int64_t>::max() / 2;  // its last row past 2^63 bytes
  EXPECT_FALSE(checks::byte_span(wide).has_value());
  wide.strides[0] = -8;  // rows backwards: the span starts 3 rows before the pointer
  const auto span = checks::byte_span(wide);
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->first, -3 * 8 * 4);
  EXPECT_EQ(span->last, 8 * 4);
}

TEST(PrefillValidation, RefusesScheduleMetadataOfTheWrongSize) {
  std::vector<std::int32_t> meta(3 * 5);
  const auto refuse_meta = [&](std::initializer_list<std::int64_t> shape, DType dtype) {
    PrefillInputs in;
    in.options.schedule_meta = TensorView::contiguous(meta.data(), dtype, shape);
    expect_call_refused(in, "schedule_meta");
  };
  refuse_meta({5, 3}, DType::kInt32);
  refuse_meta({1, 2}, DType::kInt32);  // no worker
  refuse_meta({10}, DType::kInt32);
  refuse_meta({5, 2}, DType::kFloat32);
  PrefillInputs strided;
  strided.options.schedule_meta = TensorView::contiguous(meta.data(), DType::kInt32, {4, 2});
  strided.options.schedule_meta->strides[0] = 3;
  expect_call_refused(strided, "schedule_meta");
}

TEST(PrefillValidation, RefusesNullAndMisalignedPointers) {
  expect_edit_refused<PrefillInputs>("kv", [](auto& in) { in.kv.values.data = nullptr; });
  expect_edit_refused<PrefillInputs>("k_start", [](auto& in) {
    in.k_start.data = reinterpret_cast<std::uint8_t*>(in.start_data.data()) + 1;
  });
}

TEST(PrefillValidation, RefusesMixedDevices) {
  expect_edit_refused<PrefillInputs>("weights", [](auto& in) { in.weights.device = kCuda; });
  expect_edit_refused<PrefillInputs>("logits", [](auto& in) { in.logits.device = kCuda; });
  expect_edit_refused<PrefillInputs>(
      "q_scales", [](auto& in) { in.q.scales->device = kCuda; }, Format::kMXFP8);
}

TEST(PrefillValidation, RefusesHostMemoryMarkedAsCuda) {
  // All views claim cuda:0 but point to host memory. Without the CUDA backend, or without a
  // device, the device itself is refused; with one, the host pointer is.
  PrefillInputs in;
  for (TensorView* view : {&in.q.values, &in.kv.values, &*in.kv.scales, &in.weights, &in.k_start,
                           &in.k_end, &in.logits}) {
    view->device = kCuda;
  }
  expect_call_refused(in, "q");
}

}  // namespace
}  // namespace mqa_logits
