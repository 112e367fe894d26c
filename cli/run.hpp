// One end-to-end case: build the workload, run and time it on an executor, verify sampled rows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "executor.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "support/reference.hpp"

namespace mqa_logits::cli {

// Decode contexts are uniform in [(1 - j) L, (1 + j) L]: sequences of a batch differ in length.
inline constexpr double kContextJitter = 0.5;

struct Check {
  support::Operands operands;
  double tolerance = 0.0;
  support::VerifyResult result;
};

// What a run showed: every check passed and compared at least one in-window element; a check
// failed; or nothing was compared (--verify-rows 0, or no sampled row has a key in its window),
// which is not a pass.
enum class Verdict : std::uint8_t { kPassed, kFailed, kNotVerified };

// The top-k operation of a run (--topk): its time, and its sampled rows against the oracle's.
struct TopkResult {
  std::int64_t topk = 0;
  double seconds_per_call = 0.0;  // median
  std::int64_t rows_checked = 0;
  std::int64_t rows_mismatched = 0;
};

struct RunResult {
  std::string shape;     // human-readable problem description
  std::string executor;  // Executor::description()
  std::string timing_method;
  int iters = 0;
  double seconds_per_call = 0.0;  // median
  double min_seconds_per_call = 0.0;
  std::int64_t rows = 0;   // output rows
  std::int64_t cols = 0;   // output columns
  std::int64_t pairs = 0;  // (row, key) elements inside windows
  double flops = 0.0;      // 2 * H * D * pairs (tensor-core work)
  double bytes = 0.0;      // inputs read once plus outputs written
  std::optional<DeviceRates> rates;
  std::vector<Check> checks;  // empty when no rows were verified
  std::optional<TopkResult> topk;

  Verdict verdict() const;
  double pairs_per_second() const { return pairs / seconds_per_call; }
  double flops_per_second() const { return flops / seconds_per_call; }
  // The roofline's lower bound on the time per call, and the measured time's fraction of it.
  std::optional<double> floor_seconds() const;
  std::optional<double> roofline_fraction() const;
};

RunResult run_case(const Options& options, Executor& executor, Progress& progress);

// One call with the options' format, heads, head dim, dtypes, flags, next_n and block_kv on a
// problem of one query token and one key (decode: one sequence of next_n tokens), through the
// same path as run_case: what the library or the executor's device refuses is refused in
// milliseconds, before the real inputs are made. Throws what the library throws.
void probe_call(const Options& options, Executor& executor);

}  // namespace mqa_logits::cli
