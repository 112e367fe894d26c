#include "support/topk_oracle.hpp"

#include <cstring>

namespace mqa_logits::support {

float logit_value(const void* row, DType dtype, std::int64_t col) {
  std::uint32_t bits = dtype == DType::kBFloat16
                           ? static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(row)[col])
                                 << 16
                           : static_cast<const std::uint32_t*>(row)[col];
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::vector<std::int64_t> oracle_topk_columns(const void* row, DType dtype, std::int64_t first,
                                              std::int64_t count, std::int64_t topk) {
  return oracle_topk_columns(row, dtype, first, count, topk, [](std::int64_t) { return false; });
}

}  // namespace mqa_logits::support
