// Command line of mqa-logits: what to run, on which device, and how to report it.
#pragma once

#include <cstdint>
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
  std::int64_t max_seqlen_k = 0;  // > 0: compressed output [S, max_seqlen_k]
  bool schedule = true;           // --no-schedule: call without schedule metadata

  // Decode
  std::int64_t batch = 64;
  std::int64_t next_n = 1;
  std::int64_t avg_context = 8192;
  int block_kv = 64;

  std::optional<int> iters;  // unset: a default per device
  std::int64_t verify_rows = 32;
  std::uint64_t seed = 1;
  std::string json_path;  // empty: no JSON file
  bool help = false;
};

// A malformed command line; main() prints it with the usage and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError on anything it does not understand.
Options parse_options(int argc, const char* const* argv);
std::string usage_text();

}  // namespace mqa_logits::cli
