// The expected logits of a workload's rows, and the contract's acceptance checks.
//
// The expected values of the stored (quantized) operands come from the CPU backend's float64
// core (src/cpu/kernel.hpp), the library's one C++ oracle: src/cpu/cpu_backend.hpp documents its
// arithmetic, and tests/test_cpu_backend.cpp anchors it to hand-derived values. What this file
// adds is what is not the formula: which columns are inside each row's window, derived from the
// workload's windows, context lengths and block table as the contract defines them (not by the
// backend's planning, so comparing the backend with it still checks windows, clamping and
// stores), and the checks. The Python tests keep an independent numpy formula
// (tests/python/reference.py) on purpose: code the backend does not share checks the formula.
//
// The formula on the unquantized inputs is the contract's second check, not an oracle of the
// stored values: it bounds how far quantization moves the logits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/workload.hpp"

namespace mqa_logits::support {

enum class Operands : std::uint8_t {
  kQuantized,    // the stored values and scales, through the CPU core (the contract's oracle)
  kUnquantized,  // the float inputs before quantization (the contract's second check)
};
const char* operands_name(Operands operands);

// One output row (layout.cols entries): the logit of every column inside the row's window, and
// -inf for every column outside it. -inf is never an in-window value, so it is also the window
// mask: with clean_logits the output must match it exactly there, without clean_logits those
// columns are unspecified and not compared.
std::vector<double> reference_row(const PrefillWorkload& workload, std::int64_t row,
                                  Operands operands);
std::vector<double> reference_row(const PagedWorkload& workload, std::int64_t row,
                                  Operands operands);

// The contract's metric over pairs of in-window elements: diff = 1 - 2 sum(x y) / sum(x^2 + y^2),
// 0 when both are all zero.
class DiffMetric {
 public:
  void add(double x, double y) {
    xy_ += x * y;
    squares_ += x * x + y * y;
  }
  void merge(const DiffMetric& other) {
    xy_ += other.xy_;
    squares_ += other.squares_;
  }
  double value() const { return squares_ == 0.0 ? 0.0 : 1.0 - 2.0 * xy_ / squares_; }

 private:
  double xy_ = 0.0;
  double squares_ = 0.0;
};

// The contract's acceptance bound for a comparison of this workload against `operands`.
double spec_tolerance(Format format, DType weights_dtype, DType logits_dtype, Operands operands);

struct VerifyResult {
  bool ok = true;
  double diff = 0.0;           // the contract metric over all checked in-window elements
  double max_row_diff = 0.0;   // the metric of the worst single row (informative)
  std::int64_t worst_row = -1;
  std::int64_t rows_checked = 0;
  std::int64_t elements_checked = 0;  // in-window elements
  std::string first_failure;          // empty when ok
};

// Checks `rows` of a computed logits buffer (host memory, the workload's layout and logits
// dtype) against reference_row: every in-window element finite, with clean_logits every other
// column exactly -inf, and the diff over all checked rows below `tolerance` (<= 0: the contract's
// bound for the workload and `operands`). Rows are evaluated on `num_threads` threads (<= 0: the
// hardware's); the result does not depend on it.
VerifyResult verify_rows(const PrefillWorkload& workload, const void* logits,
                         std::span<const std::int64_t> rows, Operands operands,
                         double tolerance = 0.0, int num_threads = 0);
VerifyResult verify_rows(const PagedWorkload& workload, const void* logits,
                         std::span<const std::int64_t> rows, Operands operands,
                         double tolerance = 0.0, int num_threads = 0);

// `count` distinct rows of [0, num_rows) in increasing order, always including the first and the
// last; all rows when count >= num_rows.
std::vector<std::int64_t> sample_rows(std::int64_t num_rows, std::int64_t count,
                                      std::uint64_t seed);
std::vector<std::int64_t> all_rows(std::int64_t num_rows);

}  // namespace mqa_logits::support
