// What mqa-logits checks before it makes any input, so that a mistake costs milliseconds rather
// than the seconds (or minutes) of generating a DeepSeek-shaped workload. Each check throws
// UsageError naming the option at fault.
#pragma once

#include "executor.hpp"
#include "options.hpp"

namespace mqa_logits::cli {

// The --json destination can be written: an existing file opens for appending (nothing is
// changed), or its directory exists and takes new files. "-" (stdout) always can.
void check_json_destination(const Options& options);

// The library's own validation judges the options, on a call with no rows (so any value, however
// large, costs nothing): format, heads, head dim, dtypes, next_n, block_kv, compressed output.
// Then the sizes against the library's output layout (keys and columns are int32), and against
// the host's memory.
void check_with_library(const Options& options);

// The same options on a 1-token call on the executor that will run the case, for what the
// device refuses beyond the validation (e.g. a format its kernels do not run).
void check_on_device(const Options& options, Executor& executor);

}  // namespace mqa_logits::cli
