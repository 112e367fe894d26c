// Validation of the public entry points: every check of docs/contract.md, "Errors" runs here,
// before any backend sees the call, and produces the descriptors the backends consume.
#pragma once

#include <cstdint>
#include <optional>

#include "mqa_logits/mqa_logits.hpp"
#include "problem.hpp"
#include "topk.hpp"
#include "validate_checks.hpp"

namespace mqa_logits {

PrefillProblem validate_prefill(const QuantizedTensor& q, const QuantizedTensor& kv,
                                const TensorView& weights, const TensorView& k_start,
                                const TensorView& k_end, const TensorView& logits,
                                const MqaLogitsOptions& options,
                                const char* logits_name = "logits");

PagedProblem validate_paged(const QuantizedTensor& q, const TensorView& kv_cache,
                            const TensorView& weights, const TensorView& context_lens,
                            const TensorView& block_table, const TensorView& schedule_meta,
                            std::int64_t max_context_len, const TensorView& logits,
                            const PagedMqaLogitsOptions& options,
                            const char* logits_name = "logits");

// Validated arguments of get_mqa_logits_metadata.
struct PrefillMetadataRequest {
  Device device{};
  const std::int32_t* k_start = nullptr;  // [seq_len]
  const std::int32_t* k_end = nullptr;    // [seq_len]
  std::int64_t seq_len = 0;
  std::int64_t seq_len_kv = 0;
  int num_heads = 0;
  int workers = 0;
  std::int32_t* out = nullptr;  // [workers + 1, 2]
};

// `workers`: the worker count the output must be sized for (get_num_sms()).
PrefillMetadataRequest validate_prefill_metadata(const TensorView& k_start,
                                                 const TensorView& k_end,
                                                 std::int64_t seq_len_kv, int num_heads,
                                                 int workers, const TensorView& out);

// Validated arguments of get_paged_mqa_logits_metadata.
struct PagedMetadataRequest {
  Device device{};
  const std::int32_t* context_lens = nullptr;  // [batch] or [batch, lens_cols]
  std::int64_t batch = 0;
  std::int64_t lens_cols = 1;
  bool lens_2d = false;
  const std::int32_t* indices = nullptr;  // [batch] or null
  int workers = 0;
  std::int32_t* out = nullptr;  // [workers + 1, 2]
};

PagedMetadataRequest validate_paged_metadata(const TensorView& context_lens, int block_kv,
                                             int num_sms, const TensorView& out,
                                             const std::optional<TensorView>& indices);

TopkProblem validate_topk_per_row(const TensorView& logits,
                                  const std::optional<TensorView>& starts,
                                  const TensorView& ends, std::int64_t topk,
                                  const TensorView& topk_indices,
                                  const TopkPerRowOptions& options);

MergeProblem validate_merge_topk(const TensorView& candidate_values,
                                 const TensorView& candidate_indices, std::int64_t topk,
                                 const TensorView& topk_indices,
                                 const MergeTopkOptions& options);

// Pieces of the fused top-k operations' validation, around validate_prefill / validate_paged of
// their logits (written to the workspace).
namespace topk_checks {
void expect_topk(std::int64_t topk);
// uint8 or int8 [bytes], contiguous.
void expect_workspace_form(const TensorView& workspace);
void expect_workspace_bytes(const TensorView& workspace, std::int64_t bytes);
// The workspace as the logits of `rows` x `cols` (padded fp32 rows; bf16 logits use the first
// half of each), for validate_prefill / validate_paged to check under the name "workspace".
TensorView workspace_logits(const TensorView& workspace, DType dtype, std::int64_t rows,
                            std::int64_t cols);
// topk_indices [rows, topk] int32 and values [rows, topk] fp32, both contiguous, on the
// placement's device, in memory apart from `inputs` and from each other.
void expect_selection_outputs(const checks::Placement& placement, std::int64_t rows,
                              std::int64_t topk,
                              const TensorView& topk_indices,
                              const std::optional<TensorView>& values,
                              std::initializer_list<checks::Arg> inputs);
}  // namespace topk_checks

}  // namespace mqa_logits
