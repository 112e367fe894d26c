#include "options.hpp"

#include <charconv>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>

namespace mqa_logits::cli {
namespace {

template <typename Int>
Int parse_int(std::string_view flag, std::string_view text, Int min_value) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) {
    throw UsageError(std::string(flag) + ": expected an integer, got '" + std::string(text) + "'");
  }
  if (value < min_value) {
    throw UsageError(std::string(flag) + ": expected at least " + std::to_string(min_value) +
                     ", got " + std::string(text));
  }
  return value;
}

// "2048,512,8192": a comma-separated list of integers, each at least `min_value`.
std::vector<std::int64_t> parse_int_list(std::string_view flag, std::string_view text,
                                         std::int64_t min_value) {
  std::vector<std::int64_t> values;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    values.push_back(parse_int<std::int64_t>(flag, text.substr(begin, comma - begin), min_value));
    if (comma == std::string_view::npos) return values;
    begin = comma + 1;
  }
}

// Looks `text` up among `choices` (name, value) pairs.
template <typename T>
T parse_choice(std::string_view flag, std::string_view text,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names += names.empty() ? "" : "|";
    names += name;
  }
  throw UsageError(std::string(flag) + ": expected one of " + names + ", got '" +
                   std::string(text) + "'");
}

using ValueHandler = std::function<void(Options&, std::string_view flag, std::string_view value)>;
using SwitchHandler = std::function<void(Options&)>;

const std::map<std::string_view, ValueHandler>& value_flags() {
  static const std::map<std::string_view, ValueHandler> flags = {
      {"--device",
       [](Options& o, auto flag, auto v) {
         o.device = parse_choice<DeviceType>(
             flag, v, {{"cpu", DeviceType::kCPU}, {"cuda", DeviceType::kCUDA}});
       }},
      {"--format",
       [](Options& o, auto flag, auto v) {
         o.format = parse_choice<Format>(
             flag, v,
             {{"fp8", Format::kFP8}, {"mxfp8", Format::kMXFP8}, {"mxfp4", Format::kMXFP4}});
       }},
      {"--windows",
       [](Options& o, auto flag, auto v) {
         using support::WindowKind;
         o.windows = parse_choice<WindowKind>(flag, v,
                                              {{"causal", WindowKind::kCausal},
                                               {"full", WindowKind::kFull},
                                               {"random", WindowKind::kRandom},
                                               {"context-parallel", WindowKind::kContextParallel},
                                               {"packed", WindowKind::kPacked},
                                               {"sliding", WindowKind::kSliding}});
       }},
      {"--requests",
       [](Options& o, auto flag, auto v) { o.request_lengths = parse_int_list(flag, v, 1); }},
      {"--window",
       [](Options& o, auto f, auto v) { o.sliding_window = parse_int<std::int64_t>(f, v, 1); }},
      {"--seq-len",
       [](Options& o, auto f, auto v) { o.seq_len = parse_int<std::int64_t>(f, v, 0); }},
      {"--seq-len-kv",
       [](Options& o, auto f, auto v) { o.seq_len_kv = parse_int<std::int64_t>(f, v, 0); }},
      {"--max-seqlen-k",
       [](Options& o, auto f, auto v) { o.max_seqlen_k = parse_int<std::int64_t>(f, v, 0); }},
      {"--heads",
       [](Options& o, auto f, auto v) { o.head_count = parse_int<std::int64_t>(f, v, 1); }},
      {"--head-dim",
       [](Options& o, auto f, auto v) { o.head_dim = parse_int<std::int64_t>(f, v, 1); }},
      {"--batch", [](Options& o, auto f, auto v) { o.batch = parse_int<std::int64_t>(f, v, 1); }},
      {"--next-n", [](Options& o, auto f, auto v) { o.next_n = parse_int<std::int64_t>(f, v, 1); }},
      {"--context",
       [](Options& o, auto f, auto v) { o.avg_context = parse_int<std::int64_t>(f, v, 1); }},
      {"--block-kv", [](Options& o, auto f, auto v) { o.block_kv = parse_int<int>(f, v, 1); }},
      {"--iters", [](Options& o, auto f, auto v) { o.iters = parse_int<int>(f, v, 1); }},
      {"--verify-rows",
       [](Options& o, auto f, auto v) { o.verify_rows = parse_int<std::int64_t>(f, v, 0); }},
      {"--seed", [](Options& o, auto f, auto v) { o.seed = parse_int<std::uint64_t>(f, v, 0); }},
      {"--json",
       [](Options& o, auto flag, auto v) {
         if (v.empty()) throw UsageError(std::string(flag) + ": expected a file name");
         o.json_path = std::string(v);
       }},
  };
  return flags;
}

const std::map<std::string_view, SwitchHandler>& switch_flags() {
  static const std::map<std::string_view, SwitchHandler> flags = {
      {"--bf16", [](Options& o) { o.bf16 = true; }},
      {"--no-clean", [](Options& o) { o.clean_logits = false; }},
      {"--no-schedule", [](Options& o) { o.schedule = false; }},
      {"--help", [](Options& o) { o.help = true; }},
      {"-h", [](Options& o) { o.help = true; }},
  };
  return flags;
}

// The flags that only make sense together: packed windows and their requests (which set S and
// T), sliding windows and their width. `given` holds the value flags on the command line.
void check_window_flags(Options& options, const std::set<std::string_view>& given) {
  using support::WindowKind;
  const bool packed = options.windows == WindowKind::kPacked;
  const bool sliding = options.windows == WindowKind::kSliding;
  if (given.contains("--requests") && !packed) {
    throw UsageError("--requests: only with --windows packed");
  }
  if (given.contains("--window") && !sliding) {
    throw UsageError("--window: only with --windows sliding");
  }
  if (sliding && !given.contains("--window")) {
    throw UsageError("--windows sliding: expected --window N (keys per window)");
  }
  if (!packed) return;
  if (!given.contains("--requests")) {
    throw UsageError("--windows packed: expected --requests N,N,... (tokens per request)");
  }
  std::int64_t total = 0;
  for (const std::int64_t length : options.request_lengths) total += length;
  // Packed requests are both the queries and the keys: S = T = their sum.
  for (const auto& [flag, value] : {std::pair{"--seq-len", &options.seq_len},
                                    std::pair{"--seq-len-kv", &options.seq_len_kv}}) {
    if (given.contains(flag) && *value != total) {
      throw UsageError(std::string(flag) + ": expected the sum of --requests (" +
                       std::to_string(total) + ") with --windows packed, got " +
                       std::to_string(*value));
    }
    *value = total;
  }
}

}  // namespace

const char* operation_name(Operation operation) {
  return operation == Operation::kPrefill ? "prefill" : "decode";
}

Options parse_options(int argc, const char* const* argv) {
  Options options;
  bool have_operation = false;
  std::set<std::string_view> given;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (const auto it = switch_flags().find(arg); it != switch_flags().end()) {
      it->second(options);
      continue;
    }
    if (!arg.starts_with("-")) {
      if (have_operation) throw UsageError("unexpected argument '" + std::string(arg) + "'");
      options.operation = parse_choice<Operation>(
          "operation", arg, {{"prefill", Operation::kPrefill}, {"decode", Operation::kDecode}});
      have_operation = true;
      continue;
    }
    // "--flag value" or "--flag=value".
    const std::size_t equals = arg.find('=');
    const std::string_view flag = arg.substr(0, equals);
    const auto it = value_flags().find(flag);
    if (it == value_flags().end()) throw UsageError("unknown option '" + std::string(flag) + "'");
    std::string_view value;
    if (equals != std::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(std::string(flag) + ": missing value");
    }
    it->second(options, flag, value);
    given.insert(flag);
  }
  if (!have_operation && !options.help) throw UsageError("missing operation: prefill or decode");
  if (!options.help) check_window_flags(options, given);
  return options;
}

std::string usage_text() {
  return R"(usage: mqa-logits prefill|decode [options]

Runs one DeepSeek-shaped lightning-indexer case end to end on random data: quantizes the inputs,
calls the library, verifies a sample of output rows against the float64 formula (on the
quantized values and on the unquantized inputs, with the SPEC's bounds) and reports the time
per call.

common options:
  --device cpu|cuda         default: cuda when a Hopper GPU and the CUDA backend are present
  --format fp8|mxfp8|mxfp4  number format of queries and keys (default fp8)
  --heads H --head-dim D    query heads and head dim (default 64, 128)
  --bf16                    bf16 weights and logits (default fp32)
  --no-clean                leave logits outside the windows unspecified (default: -inf)
  --iters K                 timed calls; the median is reported (default 50 GPU, 3 CPU)
  --verify-rows R           output rows checked against the oracle (default 32; 0: none)
  --seed X                  random data seed (default 1)
  --json FILE               also write the results as JSON to FILE
prefill options:
  --seq-len S --seq-len-kv T   queries and keys (default 512, 8192)
  --windows causal|full|random|context-parallel|packed|sliding
                            key window of each query (default causal)
  --requests N,N,...        packed: tokens per request, packed into one call; S = T = their
                            sum, each query sees its own request's keys up to itself
  --window W                sliding: each query sees the W keys ending at its causal end
  --max-seqlen-k K          compressed output [S, K]: column c of row i is key start[i] + c
                            (default 0: the full [S, T] output)
  --no-schedule             call without schedule metadata (default: computed once, passed
                            to every call)
decode options:
  --batch B --next-n N      sequences and queries per sequence (default 64, 1)
  --context L               average context length; lengths are uniform in [L/2, 3L/2]
                            (default 8192)
  --block-kv 32|64          tokens per KV-cache block (default 64)

exit status: 0 verified, 1 verification failed, 2 usage error or input refused by the library,
3 runtime error (e.g. no usable GPU)
)";
}

}  // namespace mqa_logits::cli
