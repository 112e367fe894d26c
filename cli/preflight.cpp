#include "preflight.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>

#include "mqa_logits/mqa_logits.hpp"
#include "run.hpp"
#include "text.hpp"

namespace mqa_logits::cli {
namespace {

using Probe = std::function<void(const Options&)>;

// ---- the options the library judges, taken one at a time ---------------------------------------

// An option whose value the library judges, and how a probe's options take it from the command
// line's.
struct JudgedOption {
  std::string_view flag;
  void (*take)(Options& probe, const Options& given);
};

constexpr JudgedOption kFormat{"--format",
                               [](Options& p, const Options& g) { p.format = g.format; }};
constexpr JudgedOption kHeads{"--heads",
                              [](Options& p, const Options& g) { p.head_count = g.head_count; }};
constexpr JudgedOption kHeadDim{"--head-dim",
                                [](Options& p, const Options& g) { p.head_dim = g.head_dim; }};
constexpr JudgedOption kBf16{"--bf16", [](Options& p, const Options& g) { p.bf16 = g.bf16; }};
constexpr JudgedOption kNoClean{
    "--no-clean", [](Options& p, const Options& g) { p.clean_logits = g.clean_logits; }};
constexpr JudgedOption kMaxSeqlenK{
    "--max-seqlen-k", [](Options& p, const Options& g) { p.max_seqlen_k = g.max_seqlen_k; }};
constexpr JudgedOption kNoSchedule{"--no-schedule",
                                   [](Options& p, const Options& g) { p.schedule = g.schedule; }};
constexpr JudgedOption kNextN{"--next-n",
                              [](Options& p, const Options& g) { p.next_n = g.next_n; }};
constexpr JudgedOption kBlockKv{"--block-kv",
                                [](Options& p, const Options& g) { p.block_kv = g.block_kv; }};

// In this order, so that an option refused only together with an earlier one (--head-dim 32
// after --format mxfp4) is the one named.
constexpr std::array kPrefillJudged{kFormat,  kHeads,      kHeadDim,   kBf16,
                                    kNoClean, kMaxSeqlenK, kNoSchedule};
constexpr std::array kDecodeJudged{kFormat, kHeads, kHeadDim, kBf16, kNoClean, kNextN, kBlockKv};

std::span<const JudgedOption> judged_options(Operation operation) {
  if (operation == Operation::kPrefill) return kPrefillJudged;
  return kDecodeJudged;
}

// Runs `probe` on the options. When the library refuses them, a probe from the defaults takes
// the judged options one at a time until it is refused too: the option it took last is the one
// at fault. The library's message follows, with the values it accepts.
void name_refused_option(const Options& options, const Probe& probe, const std::string& where) {
  try {
    probe(options);
    return;
  } catch (const std::invalid_argument& whole) {
    Options trial;
    trial.operation = options.operation;
    trial.device = options.device;
    try {
      probe(trial);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("the library refused the default ") +
                       operation_name(options.operation) + " options" + where + ": " + e.what());
    }
    for (const JudgedOption& option : judged_options(options.operation)) {
      option.take(trial, options);
      try {
        probe(trial);
      } catch (const std::invalid_argument& e) {
        throw UsageError(quote_option(options, option.flag) + ": refused by the library" + where +
                         ": " + e.what());
      }
    }
    throw UsageError("the library refused these options together" + where + ": " + whole.what());
  }
}

// The options' call with no query rows and no keys: every tensor is empty, so nothing is
// allocated whatever the values, yet every shape, dtype and flag goes through the library's
// validation (which runs before the early return of an empty call).
void call_with_no_rows(const Options& o) {
  // The CLI stores MXFP4 as D / 2 bytes: an odd D would pass for the even one below it.
  if (o.format == Format::kMXFP4 && o.head_dim % 2 != 0) {
    throw InvalidArgument("head_dim",
                          "MXFP4 packs two elements per byte: expected an even "
                          "head dim, got " +
                              std::to_string(o.head_dim));
  }
  const bool mx = o.format != Format::kFP8;
  const std::int64_t stored_dim = o.format == Format::kMXFP4 ? o.head_dim / 2 : o.head_dim;
  const DType values = o.format == Format::kMXFP4 ? DType::kUInt8 : DType::kFloat8E4M3;
  const DType floats = o.bf16 ? DType::kBFloat16 : DType::kFloat32;  // weights and logits
  const std::int64_t heads = o.head_count;
  const auto empty = [](DType dtype, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, dtype, shape);
  };
  std::array<std::int32_t, 4> meta_values{};  // [2, 2]: one worker; no row reads it
  const TensorView meta = TensorView::contiguous(meta_values.data(), DType::kInt32, {2, 2});

  if (o.operation == Operation::kPrefill) {
    const QuantizedTensor q{empty(values, {0, heads, stored_dim}),
                            mx ? std::optional(empty(DType::kInt32, {0, heads})) : std::nullopt};
    const QuantizedTensor kv{empty(values, {0, stored_dim}),
                             empty(mx ? DType::kInt32 : DType::kFloat32, {0})};
    MqaLogitsOptions options;
    options.clean_logits = o.clean_logits;
    options.max_seqlen_k = o.max_seqlen_k;
    if (o.schedule) options.schedule_meta = meta;
    mqa_logits(q, kv, empty(floats, {0, heads}), empty(DType::kInt32, {0}),
               empty(DType::kInt32, {0}), empty(floats, {0, o.max_seqlen_k}), options);
    return;
  }
  const QuantizedTensor q{
      empty(values, {0, o.next_n, heads, stored_dim}),
      mx ? std::optional(empty(DType::kInt32, {0, o.next_n, heads})) : std::nullopt};
  PagedMqaLogitsOptions options;
  options.clean_logits = o.clean_logits;
  paged_mqa_logits(q, empty(DType::kUInt8, {0, o.block_kv, 1, stored_dim + 4}),
                   empty(floats, {0, heads}), empty(DType::kInt32, {0}),
                   empty(DType::kInt32, {0, 1}), meta, 0, empty(floats, {0, 0}), options);
}

// ---- sizes -------------------------------------------------------------------------------------

std::int64_t decode_rows(const Options& o) {
  if (o.batch > std::numeric_limits<std::int64_t>::max() / o.next_n) {
    throw UsageError(quote_option(o, "--batch") + ": B x next_n output rows is out of range");
  }
  return o.batch * o.next_n;
}

// The longest decode context the workload can draw: the output's columns.
std::int64_t longest_context(const Options& o) {
  const double longest = (1.0 + kContextJitter) * static_cast<double>(o.avg_context);
  constexpr double kLimit = 9.0e18;  // past it, llround is undefined; the library refuses it
  return longest >= kLimit ? std::numeric_limits<std::int64_t>::max() : std::llround(longest);
}

// The option behind a size argument the layout functions refuse.
std::string size_option(const Options& o, const std::string& argument) {
  const bool packed = o.windows == support::WindowKind::kPacked;
  if (argument == "seq_len" || argument == "seq_len_kv") {
    if (packed) return quote_option(o, "--requests") + " (S = T = their sum)";
    return quote_option(o, argument == "seq_len" ? "--seq-len" : "--seq-len-kv");
  }
  if (argument == "max_seqlen_k") return quote_option(o, "--max-seqlen-k");
  if (argument == "num_rows") return quote_option(o, "--batch");
  if (argument == "max_context_len") {
    return quote_option(o, "--context") +
           " (contexts reach 3L/2 = " + std::to_string(longest_context(o)) + ")";
  }
  return argument;
}

// The output layout of the options' sizes, from the library, which refuses keys and columns
// past int32 (windows and context lengths are int32).
OutputLayout output_layout(const Options& o) {
  const DType dtype = o.bf16 ? DType::kBFloat16 : DType::kFloat32;
  try {
    if (o.operation == Operation::kPrefill) {
      return mqa_logits_output_layout(o.seq_len, o.seq_len_kv, o.max_seqlen_k, dtype);
    }
    return paged_mqa_logits_output_layout(decode_rows(o), longest_context(o), dtype);
  } catch (const InvalidArgument& e) {
    throw UsageError(size_option(o, e.argument()) + ": refused by the library: " + e.what());
  }
}

// Bytes a run holds at the least: the logits, and the float copies of the queries and keys the
// workload keeps for the check on unquantized inputs. The quantized inputs come on top.
double least_bytes(const Options& o, const OutputLayout& layout) {
  const double logits = static_cast<double>(layout.rows) * static_cast<double>(layout.row_stride) *
                        static_cast<double>(o.bf16 ? 2 : 4);
  const double vector = static_cast<double>(o.head_dim) * sizeof(float);
  if (o.operation == Operation::kPrefill) {
    const double queries = static_cast<double>(o.seq_len) * static_cast<double>(o.head_count);
    return logits + vector * (queries + static_cast<double>(o.seq_len_kv));
  }
  const double queries = static_cast<double>(layout.rows) * static_cast<double>(o.head_count);
  const double keys = static_cast<double>(o.batch) * (1.0 - kContextJitter) *
                      static_cast<double>(o.avg_context);  // every context is at least this
  return logits + vector * (queries + keys);
}

// "--seq-len 200000 --seq-len-kv 200000": the size options given, for a message about memory.
std::string size_options_given(const Options& o) {
  static constexpr std::array<std::string_view, 4> kPrefillSizes{"--seq-len", "--seq-len-kv",
                                                                 "--requests", "--max-seqlen-k"};
  static constexpr std::array<std::string_view, 3> kDecodeSizes{"--batch", "--next-n", "--context"};
  const std::span<const std::string_view> flags =
      o.operation == Operation::kPrefill ? std::span<const std::string_view>(kPrefillSizes)
                                         : std::span<const std::string_view>(kDecodeSizes);
  std::string text;
  for (const std::string_view flag : flags) {
    if (!o.given.contains(flag)) continue;
    text += (text.empty() ? "" : " ") + quote_option(o, flag);
  }
  return text.empty() ? "the default sizes" : text;
}

// "25.3 GB", "4.03 TB".
std::string format_bytes(double bytes) {
  return bytes >= 1e12 ? format_string("%.3g TB", bytes * 1e-12)
                       : format_string("%.3g GB", bytes * 1e-9);
}

void check_memory(const Options& o, const OutputLayout& layout) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return;  // unknown: let the run try
  const double physical = static_cast<double>(pages) * static_cast<double>(page_size);
  const double need = least_bytes(o, layout);
  if (need <= physical) return;
  throw UsageError(size_options_given(o) + ": the run needs at least " + format_bytes(need) +
                   " of memory (logits and inputs), more than this machine's " +
                   format_bytes(physical));
}

}  // namespace

void check_json_destination(const Options& options) {
  const std::string& path = options.json_path;
  if (path.empty() || options.json_to_stdout()) return;
  namespace fs = std::filesystem;
  const std::string flag = "--json " + path;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) throw UsageError(flag + ": is a directory, expected a file");
    // Appending changes nothing, and fails the way the final write would.
    const std::ofstream file(path, std::ios::app);
    if (!file) throw UsageError(flag + ": cannot write to it (" + std::strerror(errno) + ")");
    return;
  }
  // A new file is only created at the end, so that a failed run leaves no empty results behind.
  const fs::path parent = fs::path(path).parent_path();
  const fs::path directory = parent.empty() ? fs::path(".") : parent;
  if (!fs::is_directory(directory, error)) {
    throw UsageError(flag + ": the directory '" + directory.string() + "' does not exist");
  }
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    throw UsageError(flag + ": cannot create a file in '" + directory.string() + "' (" +
                     std::strerror(errno) + ")");
  }
}

void check_with_library(const Options& options) {
  name_refused_option(options, call_with_no_rows, "");
  check_memory(options, output_layout(options));
}

void check_on_device(const Options& options, Executor& executor) {
  std::string where = " on " + executor.description();
  if (!options.device && executor.device().type == DeviceType::kCUDA) {
    where += " (picked because a GPU is present; --device cpu runs the CPU reference backend)";
  }
  name_refused_option(
      options, [&](const Options& probe) { probe_call(probe, executor); }, where);
}

}  // namespace mqa_logits::cli
