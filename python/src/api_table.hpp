// The C++ API as a table of functions that throw nothing. mqa_logits._C, which holds the one copy
// of the library in the package, hands it out in a capsule (`_C.api_table()`); the package's other
// extension, _torch_C (the torch fast path), calls the library through it instead of linking a
// second copy (a second set of kernels, and a second get_num_sms() setting that set_num_sms()
// would not reach). Exceptions stay inside the module that threw them: each function returns a
// Status, and message() gives the failure's message (per thread, until the next call).
#pragma once

#include <cstdint>
#include <optional>

#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"

namespace mqa_logits::python {

enum class Status : int { kOk, kInvalidArgument, kCudaError };

struct ApiTable {
  int version;
  Status (*mqa_logits_output_layout)(std::int64_t seq_len, std::int64_t seq_len_kv,
                                     std::int64_t max_seqlen_k, DType logits_dtype,
                                     OutputLayout* layout);
  Status (*paged_mqa_logits_output_layout)(std::int64_t num_rows, std::int64_t max_context_len,
                                           DType logits_dtype, OutputLayout* layout);
  Status (*mqa_logits)(const QuantizedTensor& q, const QuantizedTensor& kv,
                       const TensorView& weights, const TensorView& k_start,
                       const TensorView& k_end, const TensorView& logits,
                       const MqaLogitsOptions& options);
  Status (*paged_mqa_logits)(const QuantizedTensor& q, const TensorView& kv_cache,
                             const TensorView& weights, const TensorView& context_lens,
                             const TensorView& block_table, const TensorView& schedule_meta,
                             std::int64_t max_context_len, const TensorView& logits,
                             const PagedMqaLogitsOptions& options);
  Status (*get_paged_mqa_logits_metadata)(const TensorView& context_lens, int block_kv,
                                          int num_sms, const TensorView& out,
                                          const std::optional<TensorView>& indices,
                                          cudaStream_t stream);
  Status (*get_mqa_logits_metadata)(const TensorView& k_start, const TensorView& k_end,
                                    std::int64_t seq_len_kv, int num_heads,
                                    const TensorView& out, cudaStream_t stream);
  Status (*get_num_sms)(int* num_sms);
  const char* (*message)();
};

// Raised when _C and _torch_C were built from different sources.
inline constexpr int kApiTableVersion = 1;
inline constexpr const char* kApiTableName = "mqa_logits._C.api_table";

}  // namespace mqa_logits::python
