// Schedule metadata computed on the host (see schedule.hpp for the encoding).
#pragma once

#include <cstdint>

namespace mqa_logits::host {

// out: [workers + 1, 2] int32.
void prefill_metadata(const std::int32_t* k_start, const std::int32_t* k_end,
                      std::int64_t seq_len, std::int64_t seq_len_kv, int num_heads, int workers,
                      std::int32_t* out);
// lens: [batch] (lens_2d false) or [batch, lens_cols]; indices: [batch] or null (varlen form).
void paged_metadata(const std::int32_t* context_lens, std::int64_t batch, std::int64_t lens_cols,
                    bool lens_2d, const std::int32_t* indices, int workers, std::int32_t* out);

}  // namespace mqa_logits::host
