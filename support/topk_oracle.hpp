// The top-k oracle of the tests and the tools: brute force over one row's logits, written apart
// from the library's selection (which compares order keys): float comparisons, a stable sort.
#pragma once

#include <cstdint>
#include <vector>

#include "mqa_logits/tensor.hpp"

namespace mqa_logits::support {

// One row's selection: the columns of [first, first + count) with the `topk` largest logits
// (ties to the lower column; -inf and NaN never; columns with excluded(col) never), in ascending
// column order. `row` holds fp32 or bf16 logits.
template <class Excluded>
std::vector<std::int64_t> oracle_topk_columns(const void* row, DType dtype, std::int64_t first,
                                              std::int64_t count, std::int64_t topk,
                                              const Excluded& excluded);
std::vector<std::int64_t> oracle_topk_columns(const void* row, DType dtype, std::int64_t first,
                                              std::int64_t count, std::int64_t topk);

// Logit `col` of a row of fp32 or bf16 logits, as a float.
float logit_value(const void* row, DType dtype, std::int64_t col);

}  // namespace mqa_logits::support

#include "support/topk_oracle.inl"
