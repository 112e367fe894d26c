// Validation of the two schedule-metadata entry points.
#include <cstdint>
#include <limits>
#include <string>

#include "validate.hpp"
#include "mqa_logits/capabilities.hpp"
#include "validate_checks.hpp"

namespace mqa_logits {
namespace {

using checks::Arg;
using checks::Placement;

constexpr std::int64_t kMaxGroups = std::numeric_limits<std::int32_t>::max();

// Row indices and group counts are stored as int32.
void expect_encodable_rows(Arg arg) {
  if (arg.view.shape[0] <= kMaxGroups) return;
  checks::refuse(arg.name, "expected at most " + std::to_string(kMaxGroups) +
                               " rows (dim 0), got " + std::to_string(arg.view.shape[0]));
}

void expect_int32_contiguous(Arg arg) {
  checks::expect_dtype(arg, {DType::kInt32});
  checks::expect_contiguous(arg);
}

void expect_metadata_out(Arg out, int workers, std::string_view dims) {
  checks::expect_dtype(out, {DType::kInt32});
  checks::expect_shape(out, {static_cast<std::int64_t>(workers) + 1, 2}, dims);
  checks::expect_contiguous(out);
}

template <typename T>
T* typed(const TensorView& view) {
  return static_cast<T*>(view.data);
}

}  // namespace

PrefillMetadataRequest validate_prefill_metadata(const TensorView& k_start,
                                                 const TensorView& k_end,
                                                 std::int64_t seq_len_kv, int num_heads,
                                                 int workers, const TensorView& out) {
  const Placement placement({k_start, "k_start"});
  placement.expect_same_device({k_end, "k_end"});
  placement.expect_same_device({out, "out"});

  checks::expect_rank({k_start, "k_start"}, 1, "[S]");
  expect_int32_contiguous({k_start, "k_start"});
  expect_encodable_rows({k_start, "k_start"});
  const std::int64_t seq_len = k_start.shape[0];
  checks::expect_shape({k_end, "k_end"}, {seq_len}, "[S] (as k_start)");
  expect_int32_contiguous({k_end, "k_end"});
  checks::expect_in_range("seq_len_kv", "seq_len_kv", seq_len_kv, 0, checks::kMaxColumns);
  checks::expect_num_heads("num_heads", "num_heads", num_heads);
  expect_metadata_out({out, "out"}, workers, "[get_num_sms() + 1, 2]");

  placement.expect_memory({k_start, "k_start"});
  placement.expect_memory({k_end, "k_end"});
  placement.expect_memory({out, "out"});
  checks::expect_disjoint({out, "out"}, {{k_start, "k_start"}, {k_end, "k_end"}});

  PrefillMetadataRequest request;
  request.device = placement.device();
  request.k_start = typed<const std::int32_t>(k_start);
  request.k_end = typed<const std::int32_t>(k_end);
  request.seq_len = seq_len;
  request.seq_len_kv = seq_len_kv;
  request.num_heads = num_heads;
  request.workers = workers;
  request.out = typed<std::int32_t>(out);
  return request;
}

PagedMetadataRequest validate_paged_metadata(const TensorView& context_lens, int block_kv,
                                             int num_sms, const TensorView& out,
                                             const std::optional<TensorView>& indices) {
  const Placement placement({context_lens, "context_lens"});
  placement.expect_same_device({out, "out"});
  if (indices) placement.expect_same_device({*indices, "indices"});

  const Arg lens{context_lens, "context_lens"};
  if (context_lens.rank == 2) {
    checks::expect_rank(lens, 2, "[B, N]");
  } else {
    checks::expect_rank(lens, 1, "[B] or [B, N]");
  }
  expect_int32_contiguous(lens);
  expect_encodable_rows(lens);
  const std::int64_t batch = context_lens.shape[0];
  const bool lens_2d = context_lens.rank == 2;
  const std::int64_t next_n = lens_2d ? context_lens.shape[1] : 1;
  if (lens_2d) checks::expect_in_set(lens.name, "next_n (dim 1)", next_n, checks::next_n_values());
  checks::expect_in_set("block_kv", "block_kv", block_kv, capabilities::kBlockKvs);
  checks::expect_in_range("num_sms", "num_sms", num_sms, 1, checks::kMaxWorkers);
  if (indices) {
    if (next_n != 1) {
      checks::refuse("indices", "expected next_n 1 (context_lens [B] or [B, 1]) in the varlen "
                                "form, got context_lens " + checks::shape_string(context_lens));
    }
    checks::expect_shape({*indices, "indices"}, {batch}, "[B] (as context_lens)");
    expect_int32_contiguous({*indices, "indices"});
  }
  expect_metadata_out({out, "out"}, num_sms, "[num_sms + 1, 2]");

  placement.expect_memory(lens);
  placement.expect_memory({out, "out"});
  if (indices) placement.expect_memory({*indices, "indices"});
  checks::expect_disjoint({out, "out"}, {{context_lens, "context_lens"},
                                         {checks::view_or_empty(indices), "indices"}});

  PagedMetadataRequest request;
  request.device = placement.device();
  request.context_lens = typed<const std::int32_t>(context_lens);
  request.batch = batch;
  request.lens_cols = next_n;
  request.lens_2d = lens_2d;
  request.indices = indices ? typed<const std::int32_t>(*indices) : nullptr;
  request.workers = num_sms;
  request.out = typed<std::int32_t>(out);
  return request;
}

}  // namespace mqa_logits
