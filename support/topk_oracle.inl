// Template definitions of topk_oracle.hpp.
#pragma once

#include <algorithm>
#include <cmath>

namespace mqa_logits::support {

template <class Excluded>
std::vector<std::int64_t> oracle_topk_columns(const void* row, DType dtype, std::int64_t first,
                                              std::int64_t count, std::int64_t topk,
                                              const Excluded& excluded) {
  std::vector<std::int64_t> cols;
  for (std::int64_t col = first; col < first + count; ++col) {
    const float v = logit_value(row, dtype, col);
    if (std::isnan(v) || v == -INFINITY || excluded(col)) continue;
    cols.push_back(col);
  }
  std::stable_sort(cols.begin(), cols.end(), [&](std::int64_t a, std::int64_t b) {
    return logit_value(row, dtype, a) > logit_value(row, dtype, b);
  });
  if (static_cast<std::int64_t>(cols.size()) > topk) cols.resize(static_cast<std::size_t>(topk));
  std::sort(cols.begin(), cols.end());
  return cols;
}

}  // namespace mqa_logits::support
