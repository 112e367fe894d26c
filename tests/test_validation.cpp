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
  EXPECT_EQ(p.format, Format::kMXFP8);
  EXPECT_EQ(p.device, Device{});
  EXPECT_EQ(p.seq_len, 6);
  EXPECT_EQ(p.num_heads, 32);
  EXPECT_EQ(p.head_dim, 64);
  EXPECT_EQ(p.seq_len_kv, 90);
  EXPECT_EQ(p.q, in.q_data.data());
  EXPECT_EQ(static_cast<const void*>(p.q_scales), in.q_scale_data.data());
  EXPECT_EQ(p.kv, in.kv_data.data());
  EXPECT_EQ(p.kv_scales, in.kv_scale_data.data());
  EXPECT_EQ(p.weights, in.weights_data.data());
  EXPECT_EQ(p.weights_dtype, DType::kBFloat16);
  EXPECT_EQ(p.weights_row_stride, 32);
  EXPECT_EQ(p.k_start, in.start_data.data());
  EXPECT_EQ(p.k_end, in.end_data.data());
  EXPECT_EQ(p.logits, in.out.bytes.data());
  EXPECT_EQ(p.logits_dtype, DType::kBFloat16);
  EXPECT_EQ(p.logits_row_stride, 512);  // 90 bf16 padded to 1024 bytes
  EXPECT_EQ(p.out_cols, 90);
  EXPECT_FALSE(p.compressed);
  EXPECT_FALSE(p.clean_logits);
  EXPECT_EQ(p.schedule_meta, meta.data());
  EXPECT_EQ(p.schedule_workers, 4);
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
  PrefillInputs in;
  in.q.values.rank = 2;
  expect_call_refused(in, "q");
  PrefillInputs kv;
  kv.kv.values = TensorView::contiguous(kv.kv_data.data(), DType::kFloat8E4M3, {50, 1, 64});
  expect_call_refused(kv, "kv");
  PrefillInputs w;
  w.weights.rank = 1;
  expect_call_refused(w, "weights");
  PrefillInputs logits;
  logits.logits.rank = 3;
  expect_call_refused(logits, "logits");
}

TEST(PrefillValidation, RefusesWrongDtype) {
  PrefillInputs q;
  q.q.values.dtype = DType::kInt32;
  expect_call_refused(q, "q");
  PrefillInputs w;
  w.weights.dtype = DType::kInt32;
  expect_call_refused(w, "weights");
  PrefillInputs start;
  start.k_start.dtype = DType::kFloat32;
  expect_call_refused(start, "k_start");
  PrefillInputs logits;
  logits.logits.dtype = DType::kInt32;
  expect_call_refused(logits, "logits");
}

TEST(PrefillValidation, RefusesWrongShape) {
  PrefillInputs kv;
  kv.kv.values.shape[1] = 32;
  expect_call_refused(kv, "kv");
  PrefillInputs scales;
  scales.kv.scales->shape[0] = 49;
  expect_call_refused(scales, "kv_scales");
  PrefillInputs w;
  w.weights.shape[0] = 5;
  expect_call_refused(w, "weights");
  PrefillInputs end;
  end.k_end.shape[0] = 7;
  expect_call_refused(end, "k_end");
  PrefillInputs logits;
  logits.logits.shape[1] = 51;
  expect_call_refused(logits, "logits");
  PrefillInputs mx(Format::kMXFP8);
  mx.q.scales->shape[1] = 8;
  expect_call_refused(mx, "q_scales");
  PrefillInputs negative;
  negative.k_start.shape[0] = -1;
  negative.q.values.shape[0] = -1;
  expect_call_refused(negative, "q");
}

TEST(PrefillValidation, RefusesWrongStride) {
  PrefillInputs q;
  q.q.values.strides[1] = 128;  // heads 128 bytes apart: not contiguous
  expect_call_refused(q, "q");
  PrefillInputs kv;
  kv.kv.values.strides[0] = 128;
  expect_call_refused(kv, "kv");
  PrefillInputs w;
  w.weights.strides[1] = 2;
  expect_call_refused(w, "weights");
  PrefillInputs logits;
  logits.logits.strides[0] = 49;  // rows overlap
  expect_call_refused(logits, "logits");
  PrefillInputs start;
  start.k_start.strides[0] = 2;
  expect_call_refused(start, "k_start");
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
  PrefillInputs bytes_without_scales(Format::kMXFP4);
  bytes_without_scales.q.scales.reset();
  expect_call_refused(bytes_without_scales, "q_scales");
  PrefillInputs fp32_q_scales(Format::kMXFP8);
  fp32_q_scales.q.scales->dtype = DType::kFloat32;
  expect_call_refused(fp32_q_scales, "q_scales");
  PrefillInputs fp8_with_int_key_scales(Format::kFP8);
  fp8_with_int_key_scales.kv.scales->dtype = DType::kInt32;
  expect_call_refused(fp8_with_int_key_scales, "kv_scales");
  PrefillInputs mx_with_float_key_scales(Format::kMXFP8);
  mx_with_float_key_scales.kv.scales->dtype = DType::kFloat32;
  expect_call_refused(mx_with_float_key_scales, "kv_scales");
  PrefillInputs missing_key_scales;
  missing_key_scales.kv.scales.reset();
  expect_call_refused(missing_key_scales, "kv_scales");
  PrefillInputs byte_keys(Format::kMXFP8);
  byte_keys.kv.values.dtype = DType::kUInt8;
  expect_call_refused(byte_keys, "kv");
  PrefillInputs e4m3_keys(Format::kMXFP4);
  e4m3_keys.kv.values.dtype = DType::kFloat8E4M3;
  expect_call_refused(e4m3_keys, "kv");
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
  PrefillInputs negative;
  negative.options.max_seqlen_k = -1;
  expect_call_refused(negative, "max_seqlen_k");
  PrefillInputs mismatch;  // logits stay [S, T]
  mismatch.options.max_seqlen_k = 20;
  expect_call_refused(mismatch, "logits");
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
  PrefillInputs query(Format::kMXFP8);
  query.q_scale_data[5] |= 0xffu << 8;
  expect_call_refused(query, "q_scales");
  PrefillInputs key(Format::kMXFP4);
  key.kv_scale_data[7] |= 0xffu;
  expect_call_refused(key, "kv_scales");
  PrefillInputs padding(Format::kMXFP8);  // D = 64
  padding.q_scale_data[5] |= 0xffu << 24;
  padding.kv_scale_data[7] |= 0xffu << 16;
  EXPECT_NO_THROW(padding.call());
}

// The logits may not share memory with an input, nor may a view span 2^63 bytes or more.
TEST(PrefillValidation, RefusesOverlappingAndOversizedViews) {
  PrefillInputs queries;
  queries.q.values.data = queries.out.bytes.data();
  expect_call_refused(queries, "logits");
  PrefillInputs ends;
  ends.k_end.data = ends.out.bytes.data() + ends.out.bytes.size() - 1024;  // the last row
  expect_call_refused(ends, "logits");
  PrefillInputs huge;
  huge.q.values.shape[0] = std::int64_t{1} << 60;  // S x H x D elements past 2^63
  expect_call_refused(huge, "q");
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
  PrefillInputs null_kv;
  null_kv.kv.values.data = nullptr;
  expect_call_refused(null_kv, "kv");
  PrefillInputs misaligned;
  misaligned.k_start.data = reinterpret_cast<std::uint8_t*>(misaligned.start_data.data()) + 1;
  expect_call_refused(misaligned, "k_start");
}

TEST(PrefillValidation, RefusesMixedDevices) {
  PrefillInputs weights_on_gpu;
  weights_on_gpu.weights.device = kCuda;
  expect_call_refused(weights_on_gpu, "weights");
  PrefillInputs logits_on_gpu;
  logits_on_gpu.logits.device = kCuda;
  expect_call_refused(logits_on_gpu, "logits");
  PrefillInputs scales_on_gpu(Format::kMXFP8);
  scales_on_gpu.q.scales->device = kCuda;
  expect_call_refused(scales_on_gpu, "q_scales");
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
