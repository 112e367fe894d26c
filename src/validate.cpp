#include "validate.hpp"

#include <algorithm>
#include <span>
#include <string>

#include "instances.hpp"
#include "mqa_logits/capabilities.hpp"
#include "validate_checks.hpp"

namespace mqa_logits {
namespace {

using checks::Arg;
using checks::Placement;

constexpr std::size_t kScaleBytes = 4;  // one fp32 or packed-UE8M0 scale per key token
constexpr std::size_t kRowAlignment = 16;

void expect_same_device(const Placement& placement, const std::optional<TensorView>& view,
                        const char* name) {
  if (view) placement.expect_same_device({*view, name});
}

void expect_memory(const Placement& placement, const std::optional<TensorView>& view,
                   const char* name) {
  if (view) placement.expect_memory({*view, name});
}

std::string format_reason(Format format) { return std::string("q is ") + format_name(format); }

// The CUDA backend runs the formats of the instance table (FP8); the CPU backend runs them all.
void expect_backend_format(const Placement& placement, Format format) {
  if (!placement.on_cuda()) return;
  std::string compiled;
  for (const Format f : instances::kCudaFormats) {
    if (f == format) return;
    compiled += std::string(compiled.empty() ? "" : ", ") + format_name(f);
  }
  checks::refuse("q", "the CUDA backend runs the formats {" + compiled + "}; got " +
                          format_name(format));
}

// ---- operands shared by both operations ----

// q: contiguous [lead..., H, D or D / 2] (lead dims already named by `dims`). Returns D. On a
// CUDA device the kernels address q's rows of D bytes (the product of the other dims) by TMA
// coordinates, which are 32-bit.
std::int64_t expect_query(const Placement& placement, const QuantizedTensor& q, Format format,
                          int rank, std::string_view dims) {
  const Arg arg{q.values, "q"};
  checks::expect_rank(arg, rank, dims);
  checks::expect_num_heads("q", "heads (dim " + std::to_string(rank - 2) + ")",
                           q.values.shape[rank - 2]);
  const std::int64_t dim = checks::head_dim(format, q.values.shape[rank - 1]);
  checks::expect_contiguous(arg);
  if (placement.on_cuda()) {
    std::int64_t rows = 1;
    for (int d = 0; d < rank - 1; ++d) rows *= q.values.shape[d];  // at most numel
    checks::expect_in_range("q", "its rows of D bytes on a CUDA device (all dims but the last)",
                            rows, 0, checks::kMaxColumns);
  }
  return dim;
}

// q_scales (MX only): contiguous int32 of q's shape without the head dim.
void expect_query_scales(const QuantizedTensor& q, std::string_view dims) {
  if (!q.scales) return;
  const Arg arg{*q.scales, "q_scales"};
  const auto rank = static_cast<std::size_t>(q.values.rank - 1);
  checks::expect_shape(arg, std::span(q.values.shape).first(rank), dims);
  checks::expect_contiguous(arg);
}

void expect_int32_vector(Arg arg, std::int64_t length, std::string_view dims) {
  checks::expect_dtype(arg, {DType::kInt32});
  checks::expect_shape(arg, {length}, dims);
  checks::expect_contiguous(arg);
}

// weights [rows, H], logits [rows, cols]: the dtype rule and row-major rows.
void expect_weights_and_logits(Arg weights, Arg logits, std::int64_t rows, std::int64_t heads,
                               std::int64_t cols, std::string_view weights_dims,
                               std::string_view logits_dims) {
  checks::expect_weights_dtype(weights);
  checks::expect_shape(weights, {rows, heads}, weights_dims);
  checks::expect_row_major_rows(weights);
  checks::expect_logits_dtype(logits, weights.view.dtype);
  checks::expect_shape(logits, {rows, cols}, logits_dims);
  checks::expect_row_major_rows(logits);
}

void expect_weights_and_logits_memory(const Placement& placement, Arg weights, Arg logits) {
  placement.expect_memory(weights, placement.vector_alignment());
  placement.expect_row_alignment(weights, kRowAlignment);
  placement.expect_memory(logits, placement.vector_alignment());
  placement.expect_row_alignment(logits, kRowAlignment);
}

// ---- prefill ----

void expect_keys(const QuantizedTensor& kv, Format format, std::int64_t stored_dim) {
  const Arg values{kv.values, "kv"};
  if (format == Format::kMXFP4) {
    checks::expect_dtype(values, {DType::kUInt8, DType::kInt8}, format_reason(format));
  } else {
    checks::expect_dtype(values, {DType::kFloat8E4M3}, format_reason(format));
  }
  checks::expect_rank(values, 2, "[T, D]");
  const std::int64_t seq_len_kv = kv.values.shape[0];
  checks::expect_shape(values, {seq_len_kv, stored_dim},
                       format == Format::kMXFP4 ? "[T, D / 2] (as q)" : "[T, D] (as q)");
  checks::expect_contiguous(values);

  const DType scale_dtype = format == Format::kFP8 ? DType::kFloat32 : DType::kInt32;
  if (!kv.scales) {
    checks::refuse("kv_scales", std::string("expected ") + dtype_name(scale_dtype) +
                                    " per-token scales (" + format_reason(format) +
                                    "), got none");
  }
  const Arg scales{*kv.scales, "kv_scales"};
  checks::expect_dtype(scales, {scale_dtype}, format_reason(format));
  checks::expect_shape(scales, {seq_len_kv}, "[T]");
  checks::expect_contiguous(scales);
}

Placement place_prefill(const QuantizedTensor& q, const QuantizedTensor& kv,
                        const TensorView& weights, const TensorView& k_start,
                        const TensorView& k_end, checks::Arg logits,
                        const MqaLogitsOptions& options) {
  Placement placement({q.values, "q"});
  expect_same_device(placement, q.scales, "q_scales");
  placement.expect_same_device({kv.values, "kv"});
  expect_same_device(placement, kv.scales, "kv_scales");
  placement.expect_same_device({weights, "weights"});
  placement.expect_same_device({k_start, "k_start"});
  placement.expect_same_device({k_end, "k_end"});
  placement.expect_same_device(logits);
  expect_same_device(placement, options.schedule_meta, "schedule_meta");
  return placement;
}

// ---- paged ----

// kv_cache [num_blocks, block_kv, 1, token_bytes + 4] bytes, each block dense, blocks a multiple
// of 4 bytes apart and never overlapping. Returns the block stride in bytes.
std::int64_t expect_kv_cache(Arg cache, Format format, std::int64_t token_bytes) {
  checks::expect_dtype(cache, {DType::kUInt8, DType::kInt8, DType::kFloat8E4M3},
                       "fused blocks of bytes");
  const std::string_view dims = format == Format::kMXFP4
                                    ? "[num_blocks, block_kv, 1, D / 2 + 4]"
                                    : "[num_blocks, block_kv, 1, D + 4]";
  checks::expect_rank(cache, 4, dims);
  const auto& shape = cache.view.shape;
  const auto& strides = cache.view.strides;
  checks::expect_in_set(cache.name, "block_kv (dim 1)", shape[1], capabilities::kBlockKvs);
  const std::int64_t row_bytes = token_bytes + static_cast<std::int64_t>(kScaleBytes);
  checks::expect_shape(cache, {shape[0], shape[1], 1, row_bytes}, dims);
  if (strides[3] != 1 || strides[1] != row_bytes) {
    checks::refuse(cache.name, "expected dense blocks (stride 1 = " + std::to_string(row_bytes) +
                                   ", stride 3 = 1), got strides " +
                                   std::to_string(strides[1]) + " and " +
                                   std::to_string(strides[3]));
  }
  const std::int64_t block_bytes = shape[1] * row_bytes;
  const std::int64_t block_stride = shape[0] > 1 ? strides[0] : block_bytes;
  if (block_stride < block_bytes || block_stride % static_cast<std::int64_t>(kScaleBytes) != 0) {
    checks::refuse(cache.name, "expected a block stride (stride 0) that is a multiple of 4 and "
                               "at least " + std::to_string(block_bytes) + " bytes, got " +
                                   std::to_string(block_stride));
  }
  return block_stride;
}

// context_lens [B] or [B, N]; returns whether it is 2-D.
bool expect_context_lens(Arg lens, std::int64_t batch, std::int64_t next_n) {
  checks::expect_dtype(lens, {DType::kInt32});
  if (lens.view.rank == 2) {
    checks::expect_shape(lens, {batch, next_n}, "[B, N]");
  } else {
    checks::expect_shape(lens, {batch}, "[B] or [B, N]");
  }
  checks::expect_contiguous(lens);
  return lens.view.rank == 2;
}

// One row per sequence, or per token (row of q) in the varlen form.
void expect_block_table(Arg table, std::int64_t batch, bool varlen) {
  checks::expect_dtype(table, {DType::kInt32});
  checks::expect_rank(table, 2, "[B, max_blocks]");
  checks::expect_shape(table, {batch, table.view.shape[1]},
                       varlen ? "[B, max_blocks] (a row per row of q in the varlen form)"
                              : "[B, max_blocks]");
  // An empty table addresses nothing: any strides (numpy gives 0) will do.
  if (table.view.numel() == 0) return;
  if (table.view.shape[1] > 1 && table.view.strides[1] != 1) {
    checks::refuse(table.name, "expected a contiguous last dim (stride 1), got stride " +
                                   std::to_string(table.view.strides[1]));
  }
  if (table.view.shape[0] > 1 && table.view.strides[0] < 0) {
    checks::refuse(table.name, "expected a non-negative row stride (stride 0), got " +
                                   std::to_string(table.view.strides[0]));
  }
}

void expect_indices(const std::optional<TensorView>& indices, std::int64_t batch,
                    std::int64_t next_n) {
  if (!indices) return;
  if (next_n != 1) {
    checks::refuse("indices", "expected next_n 1 (dim 1 of q) in the varlen form, got next_n " +
                                  std::to_string(next_n));
  }
  expect_int32_vector({*indices, "indices"}, batch, "[B]");
}

Placement place_paged(const QuantizedTensor& q, const TensorView& kv_cache,
                      const TensorView& weights, const TensorView& context_lens,
                      const TensorView& block_table, const TensorView& schedule_meta,
                      checks::Arg logits, const PagedMqaLogitsOptions& options) {
  Placement placement({q.values, "q"});
  expect_same_device(placement, q.scales, "q_scales");
  placement.expect_same_device({kv_cache, "kv_cache"});
  placement.expect_same_device({weights, "weights"});
  placement.expect_same_device({context_lens, "context_lens"});
  placement.expect_same_device({block_table, "block_table"});
  placement.expect_same_device({schedule_meta, "schedule_meta"});
  placement.expect_same_device(logits);
  expect_same_device(placement, options.indices, "indices");
  return placement;
}

template <typename T>
const T* typed(const TensorView& view) {
  return static_cast<const T*>(view.data);
}

template <typename T>
const T* typed(const std::optional<TensorView>& view) {
  return view ? typed<T>(*view) : nullptr;
}

// What a prefill and a paged problem take alike: the format, the device, the queries, the
// weights and the output.
template <typename Problem>
Problem problem_of(Format format, const Placement& placement, const QuantizedTensor& q,
                   const TensorView& weights, const TensorView& logits, bool clean_logits) {
  Problem problem;
  problem.format = format;
  problem.device = placement.device();
  problem.q = q.values.data;
  problem.q_scales = typed<std::int32_t>(q.scales);
  problem.weights = weights.data;
  problem.weights_dtype = weights.dtype;
  problem.logits = logits.data;
  problem.logits_dtype = logits.dtype;
  problem.logits_row_stride = checks::row_stride(logits);
  problem.clean_logits = clean_logits;
  return problem;
}

}  // namespace

PrefillProblem validate_prefill(const QuantizedTensor& q, const QuantizedTensor& kv,
                                const TensorView& weights, const TensorView& k_start,
                                const TensorView& k_end, const TensorView& logits,
                                const MqaLogitsOptions& options, const char* logits_name) {
  const Arg out{logits, logits_name};
  const Placement placement = place_prefill(q, kv, weights, k_start, k_end, out, options);
  const Format format = checks::infer_format(q);
  expect_backend_format(placement, format);
  const std::int64_t head_dim = expect_query(placement, q, format, 3, "[S, H, D]");
  const std::int64_t seq_len = q.values.shape[0];
  const std::int64_t num_heads = q.values.shape[1];
  expect_query_scales(q, "[S, H]");
  expect_keys(kv, format, q.values.shape[2]);
  const std::int64_t seq_len_kv = kv.values.shape[0];
  checks::expect_in_range("kv", "T (dim 0)", seq_len_kv, 0, checks::kMaxColumns);
  expect_int32_vector({k_start, "k_start"}, seq_len, "[S]");
  expect_int32_vector({k_end, "k_end"}, seq_len, "[S]");
  checks::expect_in_range("max_seqlen_k", "max_seqlen_k", options.max_seqlen_k, 0, checks::kMaxColumns);
  const bool compressed = options.max_seqlen_k > 0;
  const std::int64_t out_cols = compressed ? options.max_seqlen_k : seq_len_kv;
  expect_weights_and_logits({weights, "weights"}, out, seq_len, num_heads,
                            out_cols, "[S, H]", compressed ? "[S, max_seqlen_k]" : "[S, T]");
  const int workers = options.schedule_meta
                          ? checks::expect_schedule_meta({*options.schedule_meta, "schedule_meta"})
                          : 0;

  placement.expect_memory({q.values, "q"}, placement.vector_alignment());
  expect_memory(placement, q.scales, "q_scales");
  placement.expect_memory({kv.values, "kv"}, placement.vector_alignment());
  placement.expect_memory({*kv.scales, "kv_scales"}, placement.vector_alignment());  // TMA
  placement.expect_memory({k_start, "k_start"});
  placement.expect_memory({k_end, "k_end"});
  expect_memory(placement, options.schedule_meta, "schedule_meta");
  expect_weights_and_logits_memory(placement, {weights, "weights"}, out);
  checks::expect_disjoint(out,
                          {{q.values, "q"}, {checks::view_or_empty(q.scales), "q_scales"},
                           {kv.values, "kv"}, {*kv.scales, "kv_scales"}, {weights, "weights"},
                           {k_start, "k_start"}, {k_end, "k_end"},
                           {checks::view_or_empty(options.schedule_meta), "schedule_meta"}});

  auto problem = problem_of<PrefillProblem>(format, placement, q, weights, logits,
                                            options.clean_logits);
  problem.seq_len = seq_len;
  problem.num_heads = num_heads;
  problem.head_dim = head_dim;
  problem.seq_len_kv = seq_len_kv;
  problem.kv = kv.values.data;
  problem.kv_scales = kv.scales->data;
  problem.weights_row_stride = checks::row_stride(weights);
  problem.k_start = typed<std::int32_t>(k_start);
  problem.k_end = typed<std::int32_t>(k_end);
  problem.out_cols = out_cols;
  problem.compressed = compressed;
  problem.schedule_meta = typed<std::int32_t>(options.schedule_meta);
  problem.schedule_workers = workers;
  return problem;
}

PagedProblem validate_paged(const QuantizedTensor& q, const TensorView& kv_cache,
                            const TensorView& weights, const TensorView& context_lens,
                            const TensorView& block_table, const TensorView& schedule_meta,
                            std::int64_t max_context_len, const TensorView& logits,
                            const PagedMqaLogitsOptions& options, const char* logits_name) {
  const Arg out{logits, logits_name};
  const Placement placement = place_paged(q, kv_cache, weights, context_lens, block_table,
                                          schedule_meta, out, options);
  const Format format = checks::infer_format(q);
  expect_backend_format(placement, format);
  const std::int64_t head_dim = expect_query(placement, q, format, 4, "[B, N, H, D]");
  const std::int64_t batch = q.values.shape[0];
  const std::int64_t next_n = q.values.shape[1];
  const std::int64_t num_heads = q.values.shape[2];
  const std::int64_t token_bytes = q.values.shape[3];
  checks::expect_in_set("q", "next_n (dim 1)", next_n, checks::next_n_values());
  expect_query_scales(q, "[B, N, H]");
  const std::int64_t block_stride = expect_kv_cache({kv_cache, "kv_cache"}, format, token_bytes);
  const bool lens_2d = expect_context_lens({context_lens, "context_lens"}, batch, next_n);
  expect_indices(options.indices, batch, next_n);
  expect_block_table({block_table, "block_table"}, batch, options.indices.has_value());
  const int workers = checks::expect_schedule_meta({schedule_meta, "schedule_meta"});
  checks::expect_in_range("max_context_len", "max_context_len", max_context_len, 0, checks::kMaxColumns);
  expect_weights_and_logits({weights, "weights"}, out, batch * next_n, num_heads,
                            max_context_len, "[B * N, H]", "[B * N, max_context_len]");
  checks::expect_contiguous({weights, "weights"});

  placement.expect_memory({q.values, "q"}, placement.vector_alignment());
  expect_memory(placement, q.scales, "q_scales");
  placement.expect_memory({kv_cache, "kv_cache"},
                          std::max(kScaleBytes, placement.vector_alignment()));
  placement.expect_memory({context_lens, "context_lens"});
  placement.expect_memory({block_table, "block_table"});
  placement.expect_memory({schedule_meta, "schedule_meta"});
  expect_memory(placement, options.indices, "indices");
  expect_weights_and_logits_memory(placement, {weights, "weights"}, out);
  checks::expect_disjoint(out,
                          {{q.values, "q"}, {checks::view_or_empty(q.scales), "q_scales"},
                           {kv_cache, "kv_cache"}, {weights, "weights"},
                           {context_lens, "context_lens"}, {block_table, "block_table"},
                           {schedule_meta, "schedule_meta"},
                           {checks::view_or_empty(options.indices), "indices"}});

  auto problem = problem_of<PagedProblem>(format, placement, q, weights, logits,
                                          options.clean_logits);
  problem.batch = batch;
  problem.next_n = next_n;
  problem.num_heads = num_heads;
  problem.head_dim = head_dim;
  problem.kv_cache = typed<std::uint8_t>(kv_cache);
  problem.num_blocks = kv_cache.shape[0];
  problem.block_kv = static_cast<int>(kv_cache.shape[1]);
  problem.token_bytes = token_bytes;
  problem.block_stride_bytes = block_stride;
  problem.context_lens = typed<std::int32_t>(context_lens);
  problem.context_lens_2d = lens_2d;
  problem.block_table = typed<std::int32_t>(block_table);
  problem.max_blocks = block_table.shape[1];
  problem.block_table_row_stride = checks::row_stride(block_table);
  problem.indices = typed<std::int32_t>(options.indices);
  problem.schedule_meta = typed<std::int32_t>(schedule_meta);
  problem.schedule_workers = workers;
  problem.max_context_len = max_context_len;
  return problem;
}

}  // namespace mqa_logits
