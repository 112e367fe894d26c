#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "src/cpu/parallel.hpp"

namespace mqa_logits::support {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// One query head or key token in float64: its element values and its scales (one per MX block,
// one per token for an FP8 key, none for an FP8 query or an unquantized vector).
struct Vector {
  std::vector<double> values;
  std::vector<double> scales;
};

Vector decode_vector(Format format, const std::uint8_t* codes, const void* scale,
                     std::int64_t head_dim) {
  Vector v;
  v.values.resize(head_dim);
  for (std::int64_t d = 0; d < head_dim; ++d) {
    v.values[d] = format == Format::kMXFP4 ? mxfp4_element(codes, d) : decode_e4m3(codes[d]);
  }
  if (scale == nullptr) return v;
  if (format == Format::kFP8) {
    float s = 0.0f;
    std::memcpy(&s, scale, sizeof(s));
    v.scales.push_back(s);
    return v;
  }
  std::int32_t packed = 0;
  std::memcpy(&packed, scale, sizeof(packed));
  for (std::int64_t b = 0; b < head_dim / kMxBlock; ++b) {
    v.scales.push_back(decode_ue8m0(packed_scale_byte(packed, static_cast<int>(b))));
  }
  return v;
}

Vector float_vector(const float* x, std::int64_t head_dim) {
  return {std::vector<double>(x, x + head_dim), {}};
}

double dot(const Vector& q, const Vector& k, std::int64_t begin, std::int64_t end) {
  double sum = 0.0;
  for (std::int64_t d = begin; d < end; ++d) sum += q.values[d] * k.values[d];
  return sum;
}

// The contract's s(i, h, j) for one query head and one key.
double scaled_dot(Format format, Operands operands, const Vector& q, const Vector& k) {
  const auto dim = static_cast<std::int64_t>(q.values.size());
  if (operands == Operands::kUnquantized) return dot(q, k, 0, dim);
  if (format == Format::kFP8) return k.scales[0] * dot(q, k, 0, dim);
  double s = 0.0;
  for (std::int64_t b = 0; b < dim / kMxBlock; ++b) {
    s += q.scales[b] * k.scales[b] * dot(q, k, b * kMxBlock, (b + 1) * kMxBlock);
  }
  return s;
}

// One query row ready for the formula: its heads and their weights.
struct QueryRow {
  std::vector<Vector> heads;
  std::vector<double> weights;
};

double logit(Format format, Operands operands, const QueryRow& row, const Vector& key) {
  double sum = 0.0;
  for (std::size_t h = 0; h < row.heads.size(); ++h) {
    sum += row.weights[h] * std::max(scaled_dot(format, operands, row.heads[h], key), 0.0);
  }
  return sum;
}

double stored_weight(const void* data, DType dtype, std::int64_t index) {
  if (dtype == DType::kBFloat16) return bf16_to_float(static_cast<const std::uint16_t*>(data)[index]);
  return static_cast<const float*>(data)[index];
}

// Query row `row` of a workload whose q bytes, q scales and weights follow the contract's layouts.
template <class Workload>
QueryRow query_row(const Workload& w, std::int64_t row, std::int64_t weights_row_stride,
                   std::int64_t token_bytes, Operands operands) {
  const auto& spec = w.spec;
  const std::int64_t h_count = spec.num_heads;
  const std::int64_t dim = spec.head_dim;
  const auto* q = reinterpret_cast<const std::uint8_t*>(w.buffers[Workload::kQ].bytes.data());
  const auto* q_scales = reinterpret_cast<const std::int32_t*>(w.buffers[Workload::kQScales].bytes.data());
  const void* weights = w.buffers[Workload::kWeights].bytes.data();
  QueryRow out;
  for (std::int64_t h = 0; h < h_count; ++h) {
    const std::int64_t vector = row * h_count + h;
    if (operands == Operands::kUnquantized) {
      out.heads.push_back(float_vector(w.q_float.data() + vector * dim, dim));
      out.weights.push_back(w.weights_float[vector]);
    } else {
      const void* scale = spec.format == Format::kFP8 ? nullptr : q_scales + vector;
      out.heads.push_back(decode_vector(spec.format, q + vector * token_bytes, scale, dim));
      out.weights.push_back(stored_weight(weights, spec.weights_dtype, row * weights_row_stride + h));
    }
  }
  return out;
}

std::int64_t token_bytes_of(Format format, std::int64_t head_dim) {
  return format == Format::kMXFP4 ? head_dim / 2 : head_dim;
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
  const std::int64_t dim = spec.head_dim;
  const std::int64_t token_bytes = token_bytes_of(spec.format, dim);
  const std::int64_t weights_stride =
      spec.weights_row_stride > 0 ? spec.weights_row_stride : spec.num_heads;
  const QueryRow query = query_row(w, row, weights_stride, token_bytes, operands);
  const auto* kv = reinterpret_cast<const std::uint8_t*>(w.buffers[PrefillWorkload::kKv].bytes.data());
  const auto* kv_scales = w.buffers[PrefillWorkload::kKvScales].bytes.data();

  const std::int64_t start = w.k_start()[row];
  const std::int64_t lo = std::max<std::int64_t>(start, 0);
  const std::int64_t hi = std::min<std::int64_t>(w.k_end()[row], spec.seq_len_kv);
  std::vector<double> out(w.out_cols(), kMinusInf);
  for (std::int64_t col = 0; col < w.out_cols(); ++col) {
    const std::int64_t j = spec.max_seqlen_k > 0 ? start + col : col;
    if (j < lo || j >= hi) continue;
    const Vector key = operands == Operands::kUnquantized
                           ? float_vector(w.kv_float.data() + j * dim, dim)
                           : decode_vector(spec.format, kv + j * token_bytes, kv_scales + j * 4, dim);
    out[col] = logit(spec.format, operands, query, key);
  }
  return out;
}

std::vector<double> reference_row(const PagedWorkload& w, std::int64_t row, Operands operands) {
  const auto& spec = w.spec;
  const std::int64_t dim = spec.head_dim;
  const std::int64_t bkv = spec.block_kv;
  std::vector<double> out(w.max_context_len, kMinusInf);
  const std::int64_t table_row = w.table_row(row);
  if (table_row < 0 || table_row >= w.table_rows) return out;

  // The clamping rules of src/problem.hpp: the output width and the block-table row's reach.
  const std::int64_t length = std::min({std::max<std::int64_t>(w.context_length(row), 0),
                                        w.max_context_len, w.max_blocks * bkv});
  const QueryRow query = query_row(w, row, spec.num_heads, w.token_bytes, operands);
  for (std::int64_t p = 0; p < length; ++p) {
    const std::int64_t block = w.block_table()[table_row * w.max_blocks + p / bkv];
    if (block < 0 || block >= w.num_blocks) continue;
    const std::int64_t slot = p % bkv;
    const std::uint8_t* base = w.kv_cache() + block * w.block_stride_bytes;
    const Vector key =
        operands == Operands::kUnquantized
            ? float_vector(w.kv_float.data() + (block * bkv + slot) * dim, dim)
            : decode_vector(spec.format, base + slot * w.token_bytes,
                            base + bkv * w.token_bytes + slot * 4, dim);
    out[p] = logit(spec.format, operands, query, key);
  }
  return out;
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
