// Refusals of paged_mqa_logits, the metadata functions and the settings (docs/contract.md,
// "Errors") on host tensors: each names the argument and leaves the output untouched. Valid calls
// must pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
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
using test::PagedInputs;

constexpr Device kCuda{DeviceType::kCUDA, 0};

TEST(PagedValidation, ValidCallsPass) {
  for (const Format format : {Format::kFP8, Format::kMXFP8, Format::kMXFP4}) {
    for (const std::int64_t next_n : {1, 3, 8}) {
      PagedInputs in(format, 2, next_n, 32, 128, 32, 100);
      EXPECT_NO_THROW(in.call()) << format_name(format) << " next_n " << next_n;
    }
  }
  PagedInputs clean(Format::kFP8, 3, 2, 64, 64, 64, 150, DType::kBFloat16, DType::kBFloat16);
  clean.options.clean_logits = true;
  EXPECT_NO_THROW(clean.call());
  EXPECT_FALSE(clean.out.untouched());
  // Varlen form: a block-table row per row (token), 1-D lengths; the indices only label
  // sequences (rows 0 and 1 are one, so they hold the same blocks).
  PagedInputs varlen(Format::kFP8, 4, 1);
  std::vector<std::int32_t> indices{7, 7, -2, 40};
  varlen.options.indices = TensorView::contiguous(indices.data(), DType::kInt32, {4});
  varlen.context_lens = TensorView::contiguous(varlen.lens_data.data(), DType::kInt32, {4});
  std::copy_n(varlen.table_data.begin(), varlen.max_blocks,
              varlen.table_data.begin() + varlen.max_blocks);
  EXPECT_NO_THROW(varlen.call());
}

// Varlen rows of one sequence load its keys once, through one of its rows' block-table row: the
// CPU backend (and the CUDA checking mode) refuse a sequence whose rows hold different blocks
// over the keys of its longest row, and accept any entries past them.
TEST(PagedValidation, VarlenSequenceRowsHoldTheSameBlocks) {
  const auto varlen_inputs = [](std::vector<std::int32_t>& indices) {
    auto in = std::make_unique<PagedInputs>(Format::kFP8, 4, 1, 16, 64, 64, 150);
    in->options.indices = TensorView::contiguous(indices.data(), DType::kInt32, {4});
    in->context_lens = TensorView::contiguous(in->lens_data.data(), DType::kInt32, {4});
    in->lens_data = {100, 60, 5, 150};  // rows 0 and 1 one sequence: blocks 0 and 1 shared
    for (std::int64_t k = 0; k < in->max_blocks; ++k) {
      in->table_data[in->max_blocks + k] = in->table_data[k];
    }
    return in;
  };
  std::vector<std::int32_t> indices{3, 3, 4, 5};
  auto same = varlen_inputs(indices);
  EXPECT_NO_THROW(same->call());
  auto past_keys = varlen_inputs(indices);  // block 2 lies past the sequence's 100 keys
  past_keys->table_data[past_keys->max_blocks + 2] = past_keys->table_data[2] + 1;
  EXPECT_NO_THROW(past_keys->call());
  auto differing = varlen_inputs(indices);  // row 1's second block: inside row 0's 100 keys
  differing->table_data[differing->max_blocks + 1] =
      (differing->table_data[1] + 1) % static_cast<std::int32_t>(differing->num_blocks);
  expect_call_refused(*differing, "block_table");
  std::vector<std::int32_t> apart{3, 4, 3, 5};  // equal labels, not consecutive: two sequences
  auto separate = varlen_inputs(apart);
  separate->table_data[separate->max_blocks + 1] =
      (separate->table_data[1] + 1) % static_cast<std::int32_t>(separate->num_blocks);
  EXPECT_NO_THROW(separate->call());
}

TEST(PagedValidation, DescriptorHasEveryField) {
  PagedInputs in(Format::kMXFP4, 3, 2, 16, 128, 32, 100);
  in.kv_cache.strides[0] += 4;  // blocks further apart than their size
  in.kv_cache.shape[0] -= 1;    // keep the view inside the buffer
  in.options.clean_logits = true;
  const PagedProblem p =
      validate_paged(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table,
                     in.schedule_meta, in.max_context_len, in.logits, in.options);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.next_n, 2);
  EXPECT_EQ(p.kv_cache, in.cache_data.data());
  EXPECT_EQ(p.num_blocks, in.num_blocks - 1);
  EXPECT_EQ(p.block_kv, 32);
  EXPECT_EQ(p.token_bytes, 64);
  EXPECT_EQ(p.block_stride_bytes, 32 * 68 + 4);
  EXPECT_EQ(p.context_lens, in.lens_data.data());
  EXPECT_TRUE(p.context_lens_2d);
  EXPECT_EQ(p.block_table, in.table_data.data());
  EXPECT_EQ(p.max_blocks, 4);
  EXPECT_EQ(p.block_table_row_stride, 4);
  EXPECT_EQ(p.indices, nullptr);
  EXPECT_EQ(p.max_context_len, 100);
  test::expect_common_fields(
      p, in,
      {.format = Format::kMXFP4, .num_heads = 16, .head_dim = 128, .weights_dtype = DType::kFloat32,
       .logits_dtype = DType::kFloat32, .logits_row_stride = 256,  // 100 fp32 padded to 1024 bytes
       .clean_logits = true, .schedule_meta = in.meta_data.data(),
       .schedule_workers = PagedInputs::kWorkers});
}

TEST(PagedValidation, RefusesWrongRankDtypeAndShape) {
  expect_edit_refused<PagedInputs>("q", [](auto& in) { in.q.values.rank = 3; });
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.dtype = DType::kInt32; });
  // Rows of D + 8 bytes, two heads.
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.shape[3] = 72; });
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.shape[2] = 2; });
  expect_edit_refused<PagedInputs>("weights", [](auto& in) { in.weights.shape[0] = 5; });
  expect_edit_refused<PagedInputs>("context_lens", [](auto& in) { in.context_lens.shape[1] = 3; });
  expect_edit_refused<PagedInputs>("context_lens",
                                   [](auto& in) { in.context_lens.dtype = DType::kFloat32; });
  expect_edit_refused<PagedInputs>("block_table", [](auto& in) { in.block_table.shape[0] = 2; });
  expect_edit_refused<PagedInputs>("block_table", [](auto& in) { in.block_table.rank = 1; });
  expect_edit_refused<PagedInputs>("logits", [](auto& in) { in.logits.shape[1] = 149; });
  expect_edit_refused<PagedInputs>("max_context_len", [](auto& in) { in.max_context_len = -1; });
  expect_edit_refused<PagedInputs>(
      "q_scales", [](auto& in) { in.q.scales->shape[2] = 8; }, Format::kMXFP8);
}

TEST(PagedValidation, RefusesWrongStride) {
  expect_edit_refused<PagedInputs>("q", [](auto& in) { in.q.values.strides[0] *= 2; });
  // Blocks apart by a gap that is not a multiple of 4 bytes, blocks overlapping, tokens
  // interleaved.
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.strides[0] += 2; });
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.strides[0] -= 4; });
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.strides[1] *= 2; });
  expect_edit_refused<PagedInputs>("block_table", [](auto& in) { in.block_table.strides[1] = 2; });
  // Paged weights are contiguous.
  expect_edit_refused<PagedInputs>("weights", [](auto& in) { in.weights.strides[0] = 32; });
  expect_edit_refused<PagedInputs>("logits", [](auto& in) { in.logits.strides[1] = 2; });
}

TEST(PagedValidation, RefusesVarlenTablesOfSequencesAndNegativeRowStrides) {
  std::vector<std::int32_t> indices{0, 0, 1, 2};
  expect_edit_refused<PagedInputs>(  // one block-table row per row, not per sequence
      "block_table",
      [&](auto& in) {
        in.options.indices = TensorView::contiguous(indices.data(), DType::kInt32, {4});
        in.context_lens = TensorView::contiguous(in.lens_data.data(), DType::kInt32, {4});
        in.block_table.shape[0] = 3;
      },
      Format::kFP8, 4, 1);
  // Rows read backwards from the last one.
  expect_edit_refused<PagedInputs>("block_table", [](auto& in) {
    in.block_table.data = in.table_data.data() + 2 * in.max_blocks;
    in.block_table.strides[0] = -in.max_blocks;
  });
}

// The logits may not share memory with an input: the kernels would read what they write.
// UE8M0 255 is NaN: refused in a query scale, and in the scales of a key a context reads.
TEST(PagedValidation, RefusesNanScales) {
  expect_edit_refused<PagedInputs>(
      "q_scales", [](auto& in) { in.q_scale_data[4] |= 0xffu; }, Format::kMXFP8);
  expect_edit_refused<PagedInputs>(
      "kv_cache",
      [](auto& in) {  // token 0 of the first sequence's first block
        const std::int64_t dim = 64 / 2;
        auto* scale = in.cache_data.data() + in.table_data[0] * 64 * (dim + 4) + 64 * dim;
        scale[1] = 0xff;
      },
      Format::kMXFP4);
}

TEST(PagedValidation, RefusesLogitsOverlappingAnInput) {
  expect_edit_refused<PagedInputs>("logits", [](auto& in) {  // weights in the logits' last row
    in.weights.data = in.out.bytes.data() + (in.out.bytes.size() - 1024);
  });
  expect_edit_refused<PagedInputs>("logits", [](auto& in) {  // the table in their first row
    in.block_table.data = in.out.bytes.data();
  });
}

TEST(PagedValidation, AcceptsAnyBlockTableRowStride) {
  PagedInputs in;
  in.block_table.shape[1] = 2;  // view the first two blocks of each row
  in.max_context_len = 128;
  in.logits.shape[1] = 128;
  EXPECT_NO_THROW(validate_paged(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table,
                                 in.schedule_meta, in.max_context_len, in.logits, in.options));
}

TEST(PagedValidation, RefusesUnsupportedHeadsHeadDimAndNextN) {
  PagedInputs heads(Format::kFP8, 2, 1, 24);
  expect_call_refused(heads, "q");
  PagedInputs dim(Format::kFP8, 2, 1, 16, 48);
  expect_call_refused(dim, "q");
  PagedInputs next_n_9(Format::kFP8, 2, 9);
  expect_call_refused(next_n_9, "q");
  PagedInputs next_n_0(Format::kFP8, 2, 0);
  expect_call_refused(next_n_0, "q");
}

TEST(PagedValidation, RefusesBlockKv16) {
  PagedInputs in(Format::kFP8, 2, 2, 16, 64, 16);
  expect_call_refused(in, "kv_cache");
}

TEST(PagedValidation, RefusesFormatMismatch) {
  // The MXFP4 cache layout for MXFP8, MXFP4 bytes without query scales, float query scales.
  expect_edit_refused<PagedInputs>(
      "kv_cache", [](auto& in) { in.kv_cache.shape[3] = 64 / 2 + 4; }, Format::kMXFP8);
  expect_edit_refused<PagedInputs>(
      "q_scales", [](auto& in) { in.q.scales.reset(); }, Format::kMXFP4);
  expect_edit_refused<PagedInputs>(
      "q_scales", [](auto& in) { in.q.scales->dtype = DType::kFloat32; }, Format::kMXFP8);
}

TEST(PagedValidation, RefusesBf16WeightsWithFp32Logits) {
  PagedInputs in(Format::kFP8, 3, 2, 16, 64, 64, 150, DType::kBFloat16, DType::kFloat32);
  expect_call_refused(in, "logits");
}

TEST(PagedValidation, RefusesIndicesWithNextNAboveOne) {
  std::vector<std::int32_t> indices{0, 1, 2};
  const auto indices_of_length = [&](std::int64_t length) {
    return [&indices, length](auto& in) {
      in.options.indices = TensorView::contiguous(indices.data(), DType::kInt32, {length});
    };
  };
  expect_edit_refused<PagedInputs>("indices", indices_of_length(3), Format::kFP8, 3, 2);
  expect_edit_refused<PagedInputs>("indices", indices_of_length(2), Format::kFP8, 3, 1);
}

TEST(PagedValidation, RefusesScheduleMetadataOfTheWrongSize) {
  expect_edit_refused<PagedInputs>("schedule_meta", [](auto& in) {  // three columns
    in.schedule_meta.shape = {3, 3};
    in.schedule_meta.strides = {3, 1};
  });
  // No worker; flat; workers past checks::kMaxWorkers (validation reads no row).
  expect_edit_refused<PagedInputs>("schedule_meta",
                                   [](auto& in) { in.schedule_meta.shape[0] = 1; });
  expect_edit_refused<PagedInputs>("schedule_meta", [](auto& in) { in.schedule_meta.rank = 1; });
  expect_edit_refused<PagedInputs>("schedule_meta", [](auto& in) {
    in.schedule_meta.shape[0] = checks::kMaxWorkers + 2;
  });
}

TEST(PagedValidation, RefusesMixedDevicesAndNullPointers) {
  expect_edit_refused<PagedInputs>("block_table", [](auto& in) { in.block_table.device = kCuda; });
  expect_edit_refused<PagedInputs>("schedule_meta",
                                   [](auto& in) { in.schedule_meta.device = kCuda; });
  PagedInputs all_on_gpu;
  for (TensorView* view : {&all_on_gpu.q.values, &all_on_gpu.kv_cache, &all_on_gpu.weights,
                           &all_on_gpu.context_lens, &all_on_gpu.block_table,
                           &all_on_gpu.schedule_meta, &all_on_gpu.logits}) {
    view->device = kCuda;
  }
  expect_call_refused(all_on_gpu, "q");
  expect_edit_refused<PagedInputs>("kv_cache", [](auto& in) { in.kv_cache.data = nullptr; });
}

// ---- metadata ----

struct MetadataOut {
  explicit MetadataOut(std::int64_t rows) : data(static_cast<std::size_t>(2 * rows), -5) {}
  TensorView view() {
    const auto rows = static_cast<std::int64_t>(data.size() / 2);
    return TensorView::contiguous(data.data(), DType::kInt32, {rows, 2});
  }
  bool untouched() const {
    return std::all_of(data.begin(), data.end(), [](std::int32_t v) { return v == -5; });
  }
  std::vector<std::int32_t> data;
};

TEST(MetadataValidation, PagedRefusals) {
  std::vector<std::int32_t> lens{5, 300, 0, 17, 900, 3};
  const auto lens_1d = TensorView::contiguous(lens.data(), DType::kInt32, {6});
  const auto lens_2d = TensorView::contiguous(lens.data(), DType::kInt32, {3, 2});
  std::vector<std::int32_t> indices{0, 0, 1, 2, 2, 2};
  const auto index_view = TensorView::contiguous(indices.data(), DType::kInt32, {6});
  const auto refused = [](auto call, MetadataOut& out, const std::string& argument) {
    expect_refused(call, argument);
    EXPECT_TRUE(out.untouched());
  };
  MetadataOut out(9);
  refused([&] { get_paged_mqa_logits_metadata(lens_1d, 64, 7, out.view()); }, out, "out");
  refused([&] { get_paged_mqa_logits_metadata(lens_1d, 16, 8, out.view()); }, out, "block_kv");
  refused([&] { get_paged_mqa_logits_metadata(lens_1d, 64, 0, out.view()); }, out, "num_sms");
  refused([&] { get_paged_mqa_logits_metadata(lens_1d, 64, checks::kMaxWorkers + 1, out.view()); },
          out, "num_sms");
  const auto lens_in_out = TensorView::contiguous(out.view().data, DType::kInt32, {6});
  refused([&] { get_paged_mqa_logits_metadata(lens_in_out, 64, 8, out.view()); }, out, "out");
  refused([&] { get_paged_mqa_logits_metadata(lens_2d, 64, 8, out.view(), index_view); }, out,
          "indices");
  auto float_lens = lens_1d;
  float_lens.dtype = DType::kFloat32;
  refused([&] { get_paged_mqa_logits_metadata(float_lens, 64, 8, out.view()); }, out,
          "context_lens");
  auto gpu_out = out.view();
  gpu_out.device = kCuda;
  refused([&] { get_paged_mqa_logits_metadata(lens_1d, 64, 8, gpu_out); }, out, "out");
  EXPECT_NO_THROW(get_paged_mqa_logits_metadata(lens_2d, 32, 8, out.view()));
  EXPECT_NO_THROW(get_paged_mqa_logits_metadata(lens_1d, 64, 8, out.view(), index_view));
}

TEST(MetadataValidation, PrefillRefusals) {
  std::vector<std::int32_t> start{0, 3, 9, 1}, end{4, 10, 2, 40};
  const auto start_view = TensorView::contiguous(start.data(), DType::kInt32, {4});
  const auto end_view = TensorView::contiguous(end.data(), DType::kInt32, {4});
  const auto short_end = TensorView::contiguous(end.data(), DType::kInt32, {3});
  const auto refused = [](auto call, MetadataOut& out, const std::string& argument) {
    expect_refused(call, argument);
    EXPECT_TRUE(out.untouched());
  };
  MetadataOut right(schedule_meta_rows(get_num_sms()));
  MetadataOut wrong(schedule_meta_rows(get_num_sms()) + 1);
  refused([&] { get_mqa_logits_metadata(start_view, end_view, 40, 16, wrong.view()); }, wrong,
          "out");
  refused([&] { get_mqa_logits_metadata(start_view, end_view, 40, 12, right.view()); }, right,
          "num_heads");
  refused([&] { get_mqa_logits_metadata(start_view, end_view, -1, 16, right.view()); }, right,
          "seq_len_kv");
  refused([&] { get_mqa_logits_metadata(start_view, end_view, checks::kMaxColumns + 1, 16,
                                        right.view()); },
          right, "seq_len_kv");  // T past what the logits functions take
  refused([&] { get_mqa_logits_metadata(start_view, short_end, 40, 16, right.view()); }, right,
          "k_end");
  EXPECT_NO_THROW(get_mqa_logits_metadata(start_view, end_view, 40, 16, right.view()));
}

// ---- settings and layouts ----

TEST(Settings, RefuseInvalidSmCounts) {
  const int before = get_num_sms();
  EXPECT_GE(before, 1);
  expect_refused([] { set_num_sms(-1); }, "num_sms");
  expect_refused([] { set_num_sms(-3); }, "num_sms");
  expect_refused([] { set_num_sms(1 << 20); }, "num_sms");
  EXPECT_EQ(get_num_sms(), before);
  expect_refused([] { schedule_meta_rows(0); }, "num_sms");
  expect_refused([] { schedule_meta_rows(checks::kMaxWorkers + 1); }, "num_sms");
  EXPECT_EQ(schedule_meta_rows(132), 133);
}

TEST(Settings, ZeroSmsGoBackToTheDefault) {
  const int default_sms = get_num_sms();
  set_num_sms(1);
  EXPECT_EQ(get_num_sms(), 1);
  set_num_sms(0);
  EXPECT_EQ(get_num_sms(), default_sms);
}

TEST(Settings, OutputLayoutsFitSixtyFourBits) {
  expect_refused([] { paged_mqa_logits_output_layout(std::int64_t{1} << 40, 1 << 30,
                                                     DType::kFloat32); },
                 "num_rows");
  expect_refused([] { mqa_logits_output_layout(std::int64_t{1} << 50, 1 << 20, 0,
                                               DType::kBFloat16); },
                 "seq_len");
  EXPECT_EQ(mqa_logits_output_layout(std::int64_t{1} << 30, 1 << 20, 0, DType::kBFloat16).rows,
            std::int64_t{1} << 30);  // 2^51 bytes: fits
}

TEST(Settings, OutputLayoutsPadRowsTo1024Bytes) {
  const OutputLayout fp32 = mqa_logits_output_layout(7, 1000, 0, DType::kFloat32);
  EXPECT_EQ(fp32.rows, 7);
  EXPECT_EQ(fp32.cols, 1000);
  EXPECT_EQ(fp32.row_stride, 1024);
  EXPECT_EQ(mqa_logits_output_layout(7, 1025, 0, DType::kFloat32).row_stride, 1280);
  EXPECT_EQ(mqa_logits_output_layout(7, 1000, 0, DType::kBFloat16).row_stride, 1024);
  EXPECT_EQ(mqa_logits_output_layout(7, 5000, 300, DType::kBFloat16).cols, 300);
  EXPECT_EQ(mqa_logits_output_layout(7, 5000, 300, DType::kBFloat16).row_stride, 512);
  const OutputLayout paged = paged_mqa_logits_output_layout(12, 4097, DType::kFloat32);
  EXPECT_EQ(paged.rows, 12);
  EXPECT_EQ(paged.cols, 4097);
  EXPECT_EQ(paged.row_stride, 4352);
  expect_refused([] { mqa_logits_output_layout(-1, 10, 0, DType::kFloat32); }, "seq_len");
  expect_refused([] { mqa_logits_output_layout(1, 10, 0, DType::kInt32); }, "logits_dtype");
  expect_refused([] { paged_mqa_logits_output_layout(1, -10, DType::kFloat32); },
                 "max_context_len");
}

}  // namespace
}  // namespace mqa_logits
