#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "src/cpu/kernel.hpp"
#include "src/cpu/parallel.hpp"

namespace mqa_logits::support {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// One key inside a row's window: the output column it lands in, where its stored codes and
// 4-byte scale are, and its float values before quantization.
struct WindowKey {
  std::int64_t col;
  const std::uint8_t* codes;
  const void* scale;
  const float* unquantized;
};

// Prefill row i sees keys max(start, 0) <= j < min(end, T), key j at column j, or at column
// j - start when the output is compressed (then keys past its max_seqlen_k columns drop out).
std::vector<WindowKey> window_keys(const PrefillWorkload& w, std::int64_t row) {
  const auto& spec = w.spec;
  const std::int64_t dim = spec.head_dim;
  const std::int64_t token_bytes = spec.format == Format::kMXFP4 ? dim / 2 : dim;
  const auto* kv =
      reinterpret_cast<const std::uint8_t*>(w.buffers[PrefillWorkload::kKv].bytes.data());
  const std::byte* kv_scales = w.buffers[PrefillWorkload::kKvScales].bytes.data();
  const std::int64_t start = w.k_start()[row];
  const std::int64_t lo = std::max<std::int64_t>(start, 0);
  const std::int64_t hi = std::min<std::int64_t>(w.k_end()[row], spec.seq_len_kv);
  std::vector<WindowKey> keys;
  for (std::int64_t col = 0; col < w.out_cols(); ++col) {
    const std::int64_t j = spec.max_seqlen_k > 0 ? start + col : col;
    if (j < lo || j >= hi) continue;
    keys.push_back({col, kv + j * token_bytes, kv_scales + j * 4, w.kv_float.data() + j * dim});
  }
  return keys;
}

// Decode row r sees positions [0, its context length) through its block-table row, less those
// in invalid blocks; position p is column p.
std::vector<WindowKey> window_keys(const PagedWorkload& w, std::int64_t row) {
  const auto& spec = w.spec;
  const std::int64_t bkv = spec.block_kv;
  const std::int64_t table_row = w.table_row(row);

  // The clamping rules of src/problem.hpp: the output width and the block-table row's reach.
  const std::int64_t length = std::min({std::max<std::int64_t>(w.context_length(row), 0),
                                        w.max_context_len, w.max_blocks * bkv});
  std::vector<WindowKey> keys;
  for (std::int64_t p = 0; p < length; ++p) {
    const std::int64_t block = w.block_table()[table_row * w.max_blocks + p / bkv];
    if (block < 0 || block >= w.num_blocks) continue;
    const std::int64_t slot = p % bkv;
    const std::uint8_t* base = w.kv_cache() + block * w.block_stride_bytes;
    keys.push_back({p, base + slot * w.token_bytes, base + bkv * w.token_bytes + slot * 4,
                    w.kv_float.data() + (block * bkv + slot) * spec.head_dim});
  }
  return keys;
}

// The contract's second check: the formula on the float inputs before quantization, which have
// no scales.
template <class Workload>
double unquantized_logit(const Workload& w, std::int64_t row, const float* key) {
  const std::int64_t heads = w.spec.num_heads;
  const std::int64_t dim = w.spec.head_dim;
  double sum = 0.0;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* q = w.q_float.data() + (row * heads + h) * dim;
    double dot = 0.0;
    for (std::int64_t d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * key[d];
    sum += w.weights_float[row * heads + h] * std::max(dot, 0.0);
  }
  return sum;
}

// Row `row` of a workload: -inf outside the window, and inside it the logits of the stored
// operands from the CPU backend's float64 core, up to kKeyTile keys at a time (the lanes of a
// tile are independent, so which keys share one does not change a result), or the unquantized
// formula.
template <class Workload>
std::vector<double> row_logits(const Workload& w, std::int64_t row,
                               std::int64_t weights_row_stride, std::int64_t cols,
                               Operands operands) {
  const std::vector<WindowKey> keys = window_keys(w, row);
  std::vector<double> out(cols, kMinusInf);
  if (operands == Operands::kUnquantized) {
    for (const WindowKey& key : keys) out[key.col] = unquantized_logit(w, row, key.unquantized);
    return out;
  }
  const auto& spec = w.spec;
  const cpu::QueryLayout layout{
      spec.format,
      spec.num_heads,
      spec.head_dim,
      w.buffers[Workload::kQ].bytes.data(),
      reinterpret_cast<const std::int32_t*>(w.buffers[Workload::kQScales].bytes.data()),
      w.buffers[Workload::kWeights].bytes.data(),
      spec.weights_dtype,
      weights_row_stride};
  cpu::QueryRow query(layout);
  query.load(row);
  cpu::KeyTile tile(spec.format, spec.head_dim);
  double logits[cpu::kKeyTile];
  for (std::size_t k0 = 0; k0 < keys.size(); k0 += cpu::kKeyTile) {
    const std::size_t lanes = std::min<std::size_t>(cpu::kKeyTile, keys.size() - k0);
    for (std::size_t k = 0; k < lanes; ++k) {
      tile.load(static_cast<int>(k), keys[k0 + k].codes, keys[k0 + k].scale);
    }
    tile.logits(query, logits);
    for (std::size_t k = 0; k < lanes; ++k) out[keys[k0 + k].col] = logits[k];
  }
  return out;
}

// ---- verification ------------------------------------------------------------------------------

struct RowCheck {
  DiffMetric metric;
  std::int64_t elements = 0;
  std::string failure;
};

RowCheck check_row(const std::vector<double>& expected, const void* logits, DType dtype,
                   const OutputLayout& layout, std::int64_t row, bool clean) {
  RowCheck check;
  const auto fail = [&](std::int64_t col, const char* what, double want, double got) {
    if (!check.failure.empty()) return;
    std::ostringstream text;
    text << "row " << row << " column " << col << ": " << what << " (expected " << want
         << ", got " << got << ")";
    check.failure = text.str();
  };
  for (std::int64_t col = 0; col < layout.cols; ++col) {
    const double want = expected[col];
    const double got = read_logit(logits, dtype, layout, row, col);
    if (want == kMinusInf) {
      if (clean && got != kMinusInf) fail(col, "outside the window, not -inf", want, got);
      continue;
    }
    if (!std::isfinite(got)) {
      fail(col, "inside the window, not finite", want, got);
      continue;
    }
    check.metric.add(got, want);
    ++check.elements;
  }
  return check;
}

template <class Workload>
VerifyResult verify(const Workload& w, const void* logits, std::span<const std::int64_t> rows,
                    Operands operands, double tolerance, int num_threads) {
  const auto& spec = w.spec;
  if (tolerance <= 0.0) {
    tolerance = spec_tolerance(spec.format, spec.weights_dtype, spec.logits_dtype, operands);
  }
  std::vector<RowCheck> checks(rows.size());
  cpu::parallel_for(static_cast<std::int64_t>(rows.size()), num_threads, [&](std::int64_t k) {
    checks[k] = check_row(reference_row(w, rows[k], operands), logits, spec.logits_dtype,
                          w.layout, rows[k], spec.clean_logits);
  });

  VerifyResult result;
  DiffMetric total;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const RowCheck& check = checks[k];
    total.merge(check.metric);
    result.elements_checked += check.elements;
    if (result.worst_row < 0 || check.metric.value() > result.max_row_diff) {
      result.max_row_diff = check.metric.value();
      result.worst_row = rows[k];
    }
    if (result.first_failure.empty() && !check.failure.empty()) result.first_failure = check.failure;
  }
  result.rows_checked = static_cast<std::int64_t>(rows.size());
  result.diff = total.value();
  if (result.first_failure.empty() && !(result.diff < tolerance)) {
    std::ostringstream text;
    text << "diff " << result.diff << " against the " << operands_name(operands)
         << " formula is not below " << tolerance << " (worst row " << result.worst_row
         << ": " << result.max_row_diff << ")";
    result.first_failure = text.str();
  }
  result.ok = result.first_failure.empty();
  return result;
}

}  // namespace

const char* operands_name(Operands operands) {
  return operands == Operands::kQuantized ? "quantized" : "unquantized";
}

double spec_tolerance(Format format, DType weights_dtype, DType logits_dtype, Operands operands) {
  if (operands == Operands::kUnquantized) return format == Format::kMXFP4 ? 2e-2 : 1e-3;
  const bool bf16 = weights_dtype == DType::kBFloat16 || logits_dtype == DType::kBFloat16;
  return bf16 ? 3e-5 : 5e-6;
}

std::vector<double> reference_row(const PrefillWorkload& w, std::int64_t row, Operands operands) {
  const auto& spec = w.spec;
  const std::int64_t weights_row_stride =
      spec.weights_row_stride > 0 ? spec.weights_row_stride : spec.num_heads;
  return row_logits(w, row, weights_row_stride, w.out_cols(), operands);
}

std::vector<double> reference_row(const PagedWorkload& w, std::int64_t row, Operands operands) {
  return row_logits(w, row, w.spec.num_heads, w.max_context_len, operands);
}

VerifyResult verify_rows(const PrefillWorkload& workload, const void* logits,
                         std::span<const std::int64_t> rows, Operands operands, double tolerance,
                         int num_threads) {
  return verify(workload, logits, rows, operands, tolerance, num_threads);
}

VerifyResult verify_rows(const PagedWorkload& workload, const void* logits,
                         std::span<const std::int64_t> rows, Operands operands, double tolerance,
                         int num_threads) {
  return verify(workload, logits, rows, operands, tolerance, num_threads);
}

std::vector<std::int64_t> all_rows(std::int64_t num_rows) {
  std::vector<std::int64_t> rows(std::max<std::int64_t>(num_rows, 0));
  for (std::int64_t r = 0; r < num_rows; ++r) rows[r] = r;
  return rows;
}

std::vector<std::int64_t> sample_rows(std::int64_t num_rows, std::int64_t count,
                                      std::uint64_t seed) {
  if (count >= num_rows) return all_rows(num_rows);
  if (count <= 0) return {};
  // Evenly spaced strata, one random row in each; the first and the last stratum are pinned to
  // their ends so both edge rows are always checked.
  std::vector<std::int64_t> rows;
  std::uint64_t state = seed;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t begin = k * num_rows / count;
    const std::int64_t end = (k + 1) * num_rows / count;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::int64_t row = begin + static_cast<std::int64_t>((state >> 33) % static_cast<std::uint64_t>(end - begin));
    if (k == 0) row = 0;
    if (k == count - 1) row = num_rows - 1;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace mqa_logits::support
