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

struct Check {
  support::Operands operands;
  double tolerance = 0.0;
  support::VerifyResult result;
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

  bool verified() const;
  double pairs_per_second() const { return pairs / seconds_per_call; }
  double flops_per_second() const { return flops / seconds_per_call; }
  // The roofline's lower bound on the time per call, and the measured time's fraction of it.
  std::optional<double> floor_seconds() const;
  std::optional<double> roofline_fraction() const;
};

RunResult run_case(const Options& options, Executor& executor, Progress& progress);

}  // namespace mqa_logits::cli
