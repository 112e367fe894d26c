// Validation of the top-k entry points (docs/contract.md, "Top-k"): the selection's own
// arguments, in the order of the arguments; the logits operations' inputs through validate.cpp.
#include <string>

#include "topk.hpp"
#include "validate.hpp"
#include "validate_checks.hpp"

namespace mqa_logits {
namespace {

using checks::Arg;
using checks::Placement;

void expect_int32_rows(const Placement& placement, Arg arg, std::int64_t rows) {
  placement.expect_same_device(arg);
  checks::expect_dtype(arg, {DType::kInt32});
  checks::expect_shape(arg, {rows}, "[R]");
  checks::expect_contiguous(arg);
}

// An output of the selection: `dtype`, [rows, topk], contiguous, on the call's device.
void expect_selection_output(const Placement& placement, Arg arg, DType dtype, std::int64_t rows,
                             std::int64_t topk) {
  placement.expect_same_device(arg);
  checks::expect_dtype(arg, {dtype});
  checks::expect_shape(arg, {rows, topk}, "[R, topk]");
  checks::expect_contiguous(arg);
}

}  // namespace

namespace topk_checks {

void expect_topk(std::int64_t topk) {
  checks::expect_in_range("topk", "topk", topk, 1, kMaxTopk);
}

void expect_workspace_form(const TensorView& workspace) {
  const Arg arg{workspace, "workspace"};
  checks::expect_dtype(arg, {DType::kUInt8, DType::kInt8}, "a workspace of bytes");
  checks::expect_rank(arg, 1, "[bytes]");
  checks::expect_contiguous(arg);
}

void expect_workspace_bytes(const TensorView& workspace, std::int64_t bytes) {
  if (workspace.shape[0] >= bytes) return;
  checks::refuse("workspace", "expected at least " + std::to_string(bytes) +
                                  " bytes (the *_topk_workspace_bytes of the call), got " +
                                  std::to_string(workspace.shape[0]));
}

TensorView workspace_logits(const TensorView& workspace, DType dtype, std::int64_t rows,
                            std::int64_t cols) {
  rows = rows > 0 ? rows : 0;
  cols = topk::clamp_to(cols, 0, checks::kMaxColumns);
  const std::int64_t unit =
      kLogitsRowAlignmentBytes / static_cast<std::int64_t>(dtype_size(DType::kFloat32));
  TensorView view;
  view.data = workspace.data;
  view.dtype = dtype;
  view.rank = 2;
  view.shape = {rows, cols};
  view.strides = {(cols + unit - 1) / unit * unit, 1};  // fp32 rows; bf16 takes their first half
  view.device = workspace.device;
  return view;
}

void expect_selection_outputs(const Placement& placement, std::int64_t rows, std::int64_t topk,
                              const TensorView& topk_indices,
                              const std::optional<TensorView>& values,
                              std::initializer_list<Arg> inputs) {
  const Arg indices{topk_indices, "topk_indices"};
  expect_selection_output(placement, indices, DType::kInt32, rows, topk);
  if (values) expect_selection_output(placement, {*values, "values"}, DType::kFloat32, rows, topk);
  placement.expect_memory(indices);
  if (values) placement.expect_memory({*values, "values"});
  checks::expect_disjoint(indices, inputs);
  if (!values) return;
  checks::expect_disjoint({*values, "values"}, inputs);
  checks::expect_disjoint({*values, "values"}, {indices});
}

}  // namespace topk_checks

TopkProblem validate_topk_per_row(const TensorView& logits,
                                  const std::optional<TensorView>& starts,
                                  const TensorView& ends, std::int64_t topk,
                                  const TensorView& topk_indices,
                                  const TopkPerRowOptions& options) {
  const Arg logits_arg{logits, "logits"};
  const Placement placement(logits_arg);
  checks::expect_dtype(logits_arg, {DType::kFloat32, DType::kBFloat16});
  checks::expect_rank(logits_arg, 2, "[R, C]");
  checks::expect_row_major_rows(logits_arg);
  const std::int64_t rows = logits.shape[0];
  checks::expect_in_range("logits", "C (dim 1)", logits.shape[1], 0, checks::kMaxColumns);
  const TensorView no_starts = checks::view_or_empty(starts);
  if (starts) expect_int32_rows(placement, {*starts, "starts"}, rows);
  expect_int32_rows(placement, {ends, "ends"}, rows);
  if (options.compressed && !starts) {
    checks::refuse("starts", "expected the window starts of compressed rows, got none");
  }
  topk_checks::expect_topk(topk);
  placement.expect_memory(logits_arg);
  if (starts) placement.expect_memory({*starts, "starts"});
  placement.expect_memory({ends, "ends"});
  topk_checks::expect_selection_outputs(
      placement, rows, topk, topk_indices, options.values,
      {logits_arg, {no_starts, "starts"}, {ends, "ends"}});

  TopkProblem problem;
  problem.device = placement.device();
  problem.rows = rows;
  problem.cols = logits.shape[1];
  problem.logits = logits.data;
  problem.logits_dtype = logits.dtype;
  problem.logits_row_stride = checks::row_stride(logits);
  problem.starts = starts ? static_cast<const std::int32_t*>(starts->data) : nullptr;
  problem.ends = static_cast<const std::int32_t*>(ends.data);
  problem.compressed = options.compressed;
  problem.absolute_indices = options.absolute_indices;
  problem.topk = topk;
  problem.indices = static_cast<std::int32_t*>(topk_indices.data);
  problem.values = options.values ? static_cast<float*>(options.values->data) : nullptr;
  return problem;
}

MergeProblem validate_merge_topk(const TensorView& candidate_values,
                                 const TensorView& candidate_indices, std::int64_t topk,
                                 const TensorView& topk_indices,
                                 const MergeTopkOptions& options) {
  const Arg values{candidate_values, "candidate_values"};
  const Arg indices{candidate_indices, "candidate_indices"};
  const Placement placement(values);
  placement.expect_same_device(indices);
  checks::expect_dtype(values, {DType::kFloat32});
  checks::expect_rank(values, 3, "[R, S, K]");
  checks::expect_contiguous(values);
  const auto& shape = candidate_values.shape;
  checks::expect_dtype(indices, {DType::kInt32});
  checks::expect_shape(indices, {shape[0], shape[1], shape[2]}, "[R, S, K] (as candidate_values)");
  checks::expect_contiguous(indices);
  if (placement.on_cuda()) {
    checks::expect_in_range("candidate_values", "R * K (candidates a row) on a CUDA device",
                            shape[0] * shape[2], 0, kMaxMergeCandidatesCuda);
  }
  topk_checks::expect_topk(topk);
  placement.expect_memory(values);
  placement.expect_memory(indices);
  topk_checks::expect_selection_outputs(placement, shape[1], topk, topk_indices, options.values,
                                        {values, indices});

  MergeProblem problem;
  problem.device = placement.device();
  problem.lists = shape[0];
  problem.rows = shape[1];
  problem.candidates = shape[2];
  problem.values = static_cast<const float*>(candidate_values.data);
  problem.indices = static_cast<const std::int32_t*>(candidate_indices.data);
  problem.topk = topk;
  problem.out_indices = static_cast<std::int32_t*>(topk_indices.data);
  problem.out_values = options.values ? static_cast<float*>(options.values->data) : nullptr;
  return problem;
}

}  // namespace mqa_logits
