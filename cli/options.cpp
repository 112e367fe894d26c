#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "mqa_logits/capabilities.hpp"

namespace mqa_logits::cli {
namespace {

template <typename Int>
Int parse_int(std::string_view flag, std::string_view text, Int min_value) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) {
    throw UsageError(std::string(flag) + ": " + std::string(text) + " is out of range");
  }
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

// Which operation takes an option.
enum class Scope : std::uint8_t { kBoth, kPrefill, kDecode };

// One option: the single place that says which operation takes it, what its help says and how
// it sets Options, so that the help of an operation and the options it accepts cannot disagree.
struct OptionSpec {
  std::string_view name;
  Scope scope;
  std::string_view value;  // what follows the name in the help ("H", "cpu|cuda"); empty: a switch
  std::string_view help;   // lines separated by '\n'
  std::function<void(Options&, std::string_view flag, std::string_view value)> set;
};

template <typename Int>
auto set_int(Int Options::*field, Int min_value) {
  return [field, min_value](Options& o, std::string_view flag, std::string_view v) {
    o.*field = parse_int<Int>(flag, v, min_value);
  };
}

// "8, 16, 32 or 64" (`last` "or"), or "32|64" (`last` "|", every separator too).
template <std::size_t N>
std::string listed(const int (&values)[N], std::string_view last = " or ") {
  const std::string_view between = last == "|" ? "|" : ", ";
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    text += (i == 0 ? "" : (i + 1 == N ? std::string(last) : std::string(between))) +
            std::to_string(values[i]);
  }
  return text;
}

// The help of the options whose values the capability table gives.
const std::string& heads_help() {
  static const std::string text =
      "query heads: " + listed(capabilities::kHeadCounts) + " (default 64)";
  return text;
}
const std::string& head_dim_help() {
  static const std::string text = "head dim: " + listed(capabilities::kHeadDims) + "; MXFP4 " +
                                  listed(capabilities::kMxfp4HeadDims) + " (default 128)";
  return text;
}
const std::string& next_n_help() {
  static const std::string text =
      "queries per sequence: 1 to " + std::to_string(capabilities::kMaxNextN) + " (default 1)";
  return text;
}
const std::string& block_kv_values() {
  static const std::string text = listed(capabilities::kBlockKvs, "|");
  return text;
}

template <typename Setter>
auto set_switch(Setter setter) {
  return [setter](Options& o, std::string_view, std::string_view) { setter(o); };
}

const std::vector<OptionSpec>& option_specs() {
  using support::WindowKind;
  static const std::vector<OptionSpec> specs = {
      {"--device", Scope::kBoth, "cpu|cuda",
       "where the calls run (default: cuda when a Hopper GPU and the CUDA\n"
       "backend are present, else cpu)",
       [](Options& o, auto flag, auto v) {
         o.device = parse_choice<DeviceType>(
             flag, v, {{"cpu", DeviceType::kCPU}, {"cuda", DeviceType::kCUDA}});
       }},
      {"--format", Scope::kBoth, "fp8|mxfp8|mxfp4",
       "number format of queries and keys (default fp8)",
       [](Options& o, auto flag, auto v) {
         o.format = parse_choice<Format>(
             flag, v,
             {{"fp8", Format::kFP8}, {"mxfp8", Format::kMXFP8}, {"mxfp4", Format::kMXFP4}});
       }},
      {"--heads", Scope::kBoth, "H", heads_help(),
       set_int(&Options::head_count, std::int64_t{1})},
      {"--head-dim", Scope::kBoth, "D", head_dim_help(),
       set_int(&Options::head_dim, std::int64_t{1})},
      {"--bf16", Scope::kBoth, "", "bf16 weights and logits (default fp32)",
       set_switch([](Options& o) { o.bf16 = true; })},
      {"--no-clean", Scope::kBoth, "",
       "leave logits outside the windows unspecified (default: -inf)",
       set_switch([](Options& o) { o.clean_logits = false; })},
      {"--topk", Scope::kBoth, "K",
       "also run the top-k operation (k 1 to 2048), timed, its indices checked\n"
       "on the verified rows against the top-k of the logits (default: off)",
       set_int(&Options::topk, std::int64_t{1})},
      {"--iters", Scope::kBoth, "K", "timed calls; the median is reported (default 50 GPU, 3 CPU)",
       [](Options& o, auto f, auto v) { o.iters = parse_int<int>(f, v, 1); }},
      {"--verify-rows", Scope::kBoth, "R",
       "output rows checked against the float64 formula (default 32;\n"
       "0: none, and the result is NOT VERIFIED)",
       set_int(&Options::verify_rows, std::int64_t{0})},
      {"--seed", Scope::kBoth, "X", "random data seed (default 1)",
       set_int(&Options::seed, std::uint64_t{0})},
      {"--json", Scope::kBoth, "FILE",
       "also write the results as JSON to FILE; '-': the JSON to stdout\n"
       "and the human-readable report to stderr",
       [](Options& o, auto flag, auto v) {
         if (v.empty()) throw UsageError(std::string(flag) + ": expected a file name, or -");
         o.json_path = std::string(v);
       }},
      {"--help", Scope::kBoth, "", "this help (also -h); after prefill or decode: that operation's",
       set_switch([](Options& o) { o.help = true; })},

      {"--seq-len", Scope::kPrefill, "S", "queries (default 512)",
       set_int(&Options::seq_len, std::int64_t{0})},
      {"--seq-len-kv", Scope::kPrefill, "T", "keys (default 8192)",
       set_int(&Options::seq_len_kv, std::int64_t{0})},
      {"--windows", Scope::kPrefill, "causal|full|random|context-parallel|packed|sliding",
       "key window of each query (default causal)",
       [](Options& o, auto flag, auto v) {
         o.windows = parse_choice<WindowKind>(flag, v,
                                              {{"causal", WindowKind::kCausal},
                                               {"full", WindowKind::kFull},
                                               {"random", WindowKind::kRandom},
                                               {"context-parallel", WindowKind::kContextParallel},
                                               {"packed", WindowKind::kPacked},
                                               {"sliding", WindowKind::kSliding}});
       }},
      {"--requests", Scope::kPrefill, "N,N,...",
       "packed: tokens per request, packed into one call; S = T = their\n"
       "sum, each query sees its own request's keys up to itself",
       [](Options& o, auto flag, auto v) { o.request_lengths = parse_int_list(flag, v, 1); }},
      {"--window", Scope::kPrefill, "W",
       "sliding: each query sees the W keys ending at its causal end",
       set_int(&Options::sliding_window, std::int64_t{1})},
      {"--max-seqlen-k", Scope::kPrefill, "K",
       "compressed output [S, K]: column c of row i is key start[i] + c\n"
       "(default 0: the full [S, T] output)",
       set_int(&Options::max_seqlen_k, std::int64_t{0})},
      {"--no-schedule", Scope::kPrefill, "",
       "call without schedule metadata (default: computed once, passed\nto every call)",
       set_switch([](Options& o) { o.schedule = false; })},

      {"--batch", Scope::kDecode, "B", "sequences (default 64)",
       set_int(&Options::batch, std::int64_t{1})},
      {"--next-n", Scope::kDecode, "N", next_n_help(),
       set_int(&Options::next_n, std::int64_t{1})},
      {"--context", Scope::kDecode, "L",
       "average context length; lengths are uniform in [L/2, 3L/2]\n(default 8192)",
       set_int(&Options::avg_context, std::int64_t{1})},
      {"--block-kv", Scope::kDecode, block_kv_values(), "tokens per KV-cache block (default 64)",
       set_int(&Options::block_kv, 1)},
  };
  return specs;
}

const OptionSpec* find_option(std::string_view name) {
  if (name == "-h") name = "--help";
  const auto& specs = option_specs();
  const auto it = std::find_if(specs.begin(), specs.end(),
                               [&](const OptionSpec& spec) { return spec.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

bool takes(Scope scope, Operation operation) {
  return scope == Scope::kBoth || (scope == Scope::kPrefill) == (operation == Operation::kPrefill);
}

// An option of the other operation is a mistake (a decode shape passed to prefill would be
// silently ignored), so it is refused rather than dropped.
void check_scopes(const Options& options) {
  for (const auto& [flag, value] : options.given) {
    const OptionSpec* spec = find_option(flag);
    if (spec == nullptr || takes(spec->scope, options.operation)) continue;
    const std::string mine = operation_name(options.operation);
    throw UsageError(flag + ": " + (spec->scope == Scope::kPrefill ? "a prefill" : "a decode") +
                     " option; " + mine + " does not take it");
  }
}

// The flags that only make sense together: packed windows and their requests (which set S and
// T), sliding windows and their width.
void check_window_flags(Options& options) {
  using support::WindowKind;
  const auto given = [&](std::string_view flag) { return options.given.contains(flag); };
  const bool packed = options.windows == WindowKind::kPacked;
  const bool sliding = options.windows == WindowKind::kSliding;
  if (given("--requests") && !packed) throw UsageError("--requests: only with --windows packed");
  if (given("--topk") && options.max_seqlen_k > 0) {
    throw UsageError("--topk: selects over whole rows, not with --max-seqlen-k");
  }
  if (given("--window") && !sliding) throw UsageError("--window: only with --windows sliding");
  if (sliding && !given("--window")) {
    throw UsageError("--windows sliding: expected --window N (keys per window)");
  }
  if (!packed) return;
  if (!given("--requests")) {
    throw UsageError("--windows packed: expected --requests N,N,... (tokens per request)");
  }
  std::int64_t total = 0;
  for (const std::int64_t length : options.request_lengths) {
    if (length > std::numeric_limits<std::int64_t>::max() - total) {
      throw UsageError("--requests: the sum of the lengths is out of range");
    }
    total += length;
  }
  // Packed requests are both the queries and the keys: S = T = their sum.
  for (const auto& [flag, value] :
       {std::pair{"--seq-len", &options.seq_len}, std::pair{"--seq-len-kv", &options.seq_len_kv}}) {
    if (given(flag) && *value != total) {
      throw UsageError(std::string(flag) + ": expected the sum of --requests (" +
                       std::to_string(total) + ") with --windows packed, got " +
                       std::to_string(*value));
    }
    *value = total;
  }
}

// "  --heads H                 query heads ..." with continuation lines aligned.
std::string describe_options(Scope scope) {
  constexpr std::size_t kHelpColumn = 28;
  std::string text;
  for (const OptionSpec& spec : option_specs()) {
    if (spec.scope != scope) continue;
    std::string left(2, ' ');
    left += spec.name;
    if (!spec.value.empty()) (left += ' ') += spec.value;
    if (left.size() >= kHelpColumn) {
      text += left + "\n";
      left.clear();
    }
    std::string_view help = spec.help;
    for (bool first = true; !help.empty() || first; first = false) {
      const std::size_t newline = help.find('\n');
      const std::string_view line = help.substr(0, newline);
      left.resize(kHelpColumn, ' ');
      text += left + std::string(line) + "\n";
      left.clear();
      help = newline == std::string_view::npos ? std::string_view{} : help.substr(newline + 1);
    }
  }
  return text;
}

// What the program does, wrapped for each help.
constexpr std::string_view kIntroBoth =
    "Runs one DeepSeek-shaped lightning-indexer case end to end on random data (prefill:\n"
    "mqa_logits, decode: paged_mqa_logits): quantizes the inputs, calls the library, verifies a\n"
    "sample of output rows against the float64 formula (on the quantized values and on the\n"
    "unquantized inputs, with the contract's bounds) and reports the time per call.\n";
constexpr std::string_view kIntroPrefill =
    "Runs one DeepSeek-shaped prefill call (mqa_logits: S queries against T contiguous keys, a "
    "key\n"
    "window per query) end to end on random data: quantizes the inputs, calls the library,\n"
    "verifies a sample of output rows against the float64 formula (on the quantized values and on\n"
    "the unquantized inputs, with the contract's bounds) and reports the time per call.\n";
constexpr std::string_view kIntroDecode =
    "Runs one DeepSeek-shaped decode call (paged_mqa_logits: next_n queries per sequence against\n"
    "a paged KV cache) end to end on random data: quantizes the inputs, calls the library,\n"
    "verifies a sample of output rows against the float64 formula (on the quantized values and on\n"
    "the unquantized inputs, with the contract's bounds) and reports the time per call.\n";

constexpr std::string_view kClosing = R"(
Options are checked before any input is made: a value the library does not take, an option of
the other operation, or a --json destination that cannot be written is refused (status 2).
Progress goes to stderr (on a terminal, with the time left in long CPU calls); the report goes
to stdout, or to stderr with --json -.

exit status: 0 verified, or NOT VERIFIED (--verify-rows 0, or no in-window element in the
sampled rows); 1 verification failed; 2 usage error or input refused by the library; 3 runtime
error (e.g. no usable GPU)
)";

}  // namespace

const char* operation_name(Operation operation) {
  return operation == Operation::kPrefill ? "prefill" : "decode";
}

Options parse_options(int argc, const char* const* argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!arg.starts_with("-")) {
      if (options.operation_given) {
        throw UsageError("unexpected argument '" + std::string(arg) + "'");
      }
      options.operation = parse_choice<Operation>(
          "operation", arg, {{"prefill", Operation::kPrefill}, {"decode", Operation::kDecode}});
      options.operation_given = true;
      continue;
    }
    // "--flag value", "--flag=value" or "--switch".
    const std::size_t equals = arg.find('=');
    const std::string_view flag = arg.substr(0, equals);
    const OptionSpec* spec = find_option(flag);
    if (spec == nullptr) throw UsageError("unknown option '" + std::string(flag) + "'");
    std::string_view value;
    if (spec->value.empty()) {
      if (equals != std::string_view::npos)
        throw UsageError(std::string(flag) + ": takes no value");
    } else if (equals != std::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(std::string(flag) + ": missing value");
    }
    spec->set(options, spec->name, value);
    options.given.insert_or_assign(std::string(spec->name), std::string(value));
  }
  if (options.help) return options;
  if (!options.operation_given) throw UsageError("missing operation: prefill or decode");
  check_scopes(options);
  check_window_flags(options);
  return options;
}

std::string usage_text(std::optional<Operation> operation) {
  if (!operation) {
    return "usage: mqa-logits prefill [options]\n"
           "       mqa-logits decode [options]\n"
           "       mqa-logits prefill|decode --help     the options of one operation\n\n" +
           std::string(kIntroBoth) + "\noptions of both operations:\n" +
           describe_options(Scope::kBoth) + "prefill options:\n" +
           describe_options(Scope::kPrefill) + "decode options:\n" +
           describe_options(Scope::kDecode) + std::string(kClosing);
  }
  const bool prefill = *operation == Operation::kPrefill;
  const std::string name = operation_name(*operation);
  return "usage: mqa-logits " + name + " [options]\n\n" +
         std::string(prefill ? kIntroPrefill : kIntroDecode) + "\noptions:\n" +
         describe_options(Scope::kBoth) + name + " options:\n" +
         describe_options(prefill ? Scope::kPrefill : Scope::kDecode) + std::string(kClosing);
}

std::string quote_option(const Options& options, std::string_view flag) {
  const auto it = options.given.find(flag);
  if (it == options.given.end() || it->second.empty()) return std::string(flag);
  return std::string(flag) + " " + it->second;
}

}  // namespace mqa_logits::cli
