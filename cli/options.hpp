// Command line of mqa-logits: what to run, on which device, and how to report it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mqa_logits/formats.hpp"
#include "mqa_logits/tensor.hpp"
#include "support/workload.hpp"

namespace mqa_logits::cli {

enum class Operation : std::uint8_t { kPrefill, kDecode };
const char* operation_name(Operation operation);

struct Options {
  Operation operation = Operation::kPrefill;
  std::optional<DeviceType> device;  // unset: CUDA when its backend is available, else the CPU
  Format format = Format::kFP8;
  bool bf16 = false;         // bf16 weights and logits (fp32 otherwise)
  bool clean_logits = true;  // --no-clean turns it off for either operation
  std::int64_t head_count = 64;
  std::int64_t head_dim = 128;

  // Prefill
  std::int64_t seq_len = 512;
  std::int64_t seq_len_kv = 8192;
  support::WindowKind windows = support::WindowKind::kCausal;
  std::vector<std::int64_t> request_lengths;  // --requests: packed windows, S = T = their sum
  std::int64_t sliding_window = 0;            // --window: keys per sliding window
  std::int64_t max_seqlen_k = 0;              // > 0: compressed output [S, max_seqlen_k]
  bool schedule = true;                       // --no-schedule: call without schedule metadata

  // Decode
  std::int64_t batch = 64;
  std::int64_t next_n = 1;
  std::int64_t avg_context = 8192;
  int block_kv = 64;

  std::int64_t topk = 0;  // > 0: also the top-k operation, with this k

  std::optional<int> iters;  // unset: a default per device
  std::int64_t verify_rows = 32;
  std::uint64_t seed = 1;
  std::string json_path;  // empty: no JSON; "-": the JSON on stdout, the report on stderr
  bool help = false;
  bool operation_given = false;  // with help: the help of that operation only

  // Every option on the command line, as typed ("--heads" -> "7"; switches -> ""), so that an
  // error can quote what the user wrote.
  std::map<std::string, std::string, std::less<>> given;

  bool json_to_stdout() const { return json_path == "-"; }
};

// A malformed or unusable command line; main() prints it and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError on anything it does not understand, and on an option of the other operation.
// Values the library judges (heads, head dim, next_n, ...) are checked by check_with_library()
// in preflight.hpp, not here.
Options parse_options(int argc, const char* const* argv);

// The help: of one operation (its options and the common ones) or, without one, of both.
std::string usage_text(std::optional<Operation> operation = std::nullopt);

// "--heads 7", "--bf16": the option as the command line gave it (its name alone when not given).
std::string quote_option(const Options& options, std::string_view flag);

}  // namespace mqa_logits::cli
