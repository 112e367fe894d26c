// CPU selection: per row, the order keys of its columns, the topk best by (key descending, column
// ascending) through nth_element, then put back in column order. Exact by construction; the GPU
// kernel must give the same rows (topk.hpp's rules).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/parallel.hpp"
#include "topk.hpp"

namespace mqa_logits::cpu {
namespace {

struct Candidate {
  std::uint32_t key;    // topk::order_key of the logit
  std::int64_t at;      // what ties break on and the output is ordered by: the key (or column)
  std::int64_t source;  // where the candidate's value is (a merge's position in its input)
};

// The topk best of `candidates` by (key descending, `at` ascending), put in `at` order.
void select(std::vector<Candidate>& candidates, std::int64_t topk) {
  const auto better = [](const Candidate& a, const Candidate& b) {
    return a.key != b.key ? a.key > b.key : a.at < b.at;
  };
  const auto k = static_cast<std::size_t>(topk);
  if (candidates.size() > k) {
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k - 1),
                     candidates.end(), better);
    candidates.resize(k);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.at < b.at; });
}

}  // namespace

void run_topk(const TopkProblem& p, int num_threads) {
  const bool bf16 = p.logits_dtype == DType::kBFloat16;
  const std::int64_t element_bytes = bf16 ? 2 : 4;
  parallel_for(p.rows, num_threads, [&](std::int64_t row) {
    const topk::RowSpan span = topk::row_span(p, row);
    const topk::DecodeBlocks blocks = topk::decode_blocks(p, row);
    const auto* row_data =
        static_cast<const char*>(p.logits) + row * p.logits_row_stride * element_bytes;
    std::vector<Candidate> candidates;
    candidates.reserve(static_cast<std::size_t>(span.count));
    for (std::int64_t col = span.first; col < span.first + span.count; ++col) {
      const std::uint32_t key = topk::column_key(p, blocks, row_data, col);
      if (key != 0) candidates.push_back({key, col, col});
    }
    select(candidates, p.topk);
    const auto k = static_cast<std::size_t>(p.topk);
    std::int32_t* indices = p.indices + row * p.topk;
    float* values = p.values != nullptr ? p.values + row * p.topk : nullptr;
    for (std::size_t i = 0; i < k; ++i) {
      const bool selected = i < candidates.size();
      indices[i] = selected ? topk::column_index(p, span, blocks, candidates[i].at) : -1;
      if (values == nullptr) continue;
      if (selected) {
        const std::uint32_t bits = topk::logit_bits(row_data, candidates[i].at, bf16);
        std::memcpy(&values[i], &bits, sizeof(float));
      } else {
        values[i] = -std::numeric_limits<float>::infinity();
      }
    }
  });
}

void run_merge(const MergeProblem& p, int num_threads) {
  parallel_for(p.rows, num_threads, [&](std::int64_t row) {
    std::vector<Candidate> candidates;
    for (std::int64_t r = 0; r < p.lists; ++r) {
      const std::int64_t base = (r * p.rows + row) * p.candidates;
      for (std::int64_t j = 0; j < p.candidates; ++j) {
        std::uint32_t bits;
        std::memcpy(&bits, &p.values[base + j], sizeof bits);
        const std::uint32_t key = topk::order_key(bits);
        if (p.indices[base + j] >= 0 && key != 0) {
          candidates.push_back({key, p.indices[base + j], base + j});
        }
      }
    }
    select(candidates, p.topk);
    std::int32_t* indices = p.out_indices + row * p.topk;
    float* values = p.out_values != nullptr ? p.out_values + row * p.topk : nullptr;
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.topk); ++i) {
      const bool selected = i < candidates.size();
      indices[i] = selected ? static_cast<std::int32_t>(candidates[i].at) : -1;
      if (values != nullptr) {
        values[i] = selected ? p.values[candidates[i].source]
                             : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace mqa_logits::cpu
