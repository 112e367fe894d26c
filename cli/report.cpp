#include "report.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "text.hpp"

namespace mqa_logits::cli {
namespace {

// "12.3 ms", "456 us": three significant digits in a readable unit.
std::string format_seconds(double seconds) {
  if (seconds >= 1.0) return format_string("%.3g s", seconds);
  if (seconds >= 1e-3) return format_string("%.3g ms", seconds * 1e3);
  return format_string("%.3g us", seconds * 1e6);
}

void print_row(std::FILE* out, std::string_view label, const std::string& text) {
  std::fprintf(out, "  %-10.*s  %s\n", static_cast<int>(label.size()), label.data(), text.c_str());
}

// Minimal JSON writer for one flat object with one array of objects.
class JsonWriter {
 public:
  JsonWriter& key(std::string_view name) {
    out_ << (first_ ? "" : ",") << "\n" << std::string(2 * depth_, ' ');
    first_ = false;
    string(name);
    out_ << ": ";
    return *this;
  }
  JsonWriter& value(std::string_view text) {
    string(text);
    return *this;
  }
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(bool flag) {
    out_ << (flag ? "true" : "false");
    return *this;
  }
  JsonWriter& value(long long number) {
    out_ << number;
    return *this;
  }
  JsonWriter& value(unsigned long long number) {
    out_ << number;
    return *this;
  }
  JsonWriter& value(double number) {
    if (std::isfinite(number)) {
      out_ << format_string("%.17g", number);
    } else {
      out_ << "null";
    }
    return *this;
  }
  JsonWriter& value(std::optional<double> number) {
    if (number) return value(*number);
    out_ << "null";
    return *this;
  }
  JsonWriter& begin(char bracket) {
    out_ << bracket;
    ++depth_;
    first_ = true;
    return *this;
  }
  JsonWriter& end(char bracket) {
    --depth_;
    out_ << "\n" << std::string(2 * depth_, ' ') << bracket;
    first_ = false;
    return *this;
  }
  // An array element (a value or an object follows).
  JsonWriter& element() {
    out_ << (first_ ? "" : ",") << "\n" << std::string(2 * depth_, ' ');
    first_ = false;
    return *this;
  }
  std::string str() const { return out_.str() + "\n"; }

 private:
  void string(std::string_view text) {
    out_ << '"';
    for (const char c : text) {
      if (c == '"' || c == '\\') {
        out_ << '\\' << c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        out_ << format_string("\\u%04x", c);
      } else {
        out_ << c;
      }
    }
    out_ << '"';
  }

  std::ostringstream out_;
  int depth_ = 0;
  bool first_ = true;
};

long long ll(std::int64_t v) { return static_cast<long long>(v); }

void write_shape(JsonWriter& json, const Options& o) {
  json.key("heads").value(ll(o.head_count)).key("head_dim").value(ll(o.head_dim));
  if (o.operation == Operation::kPrefill) {
    json.key("seq_len").value(ll(o.seq_len)).key("seq_len_kv").value(ll(o.seq_len_kv));
    json.key("windows").value(support::window_kind_name(o.windows));
    if (o.windows == support::WindowKind::kPacked) {
      json.key("request_lengths").begin('[');
      for (const std::int64_t length : o.request_lengths) json.element().value(ll(length));
      json.end(']');
    }
    if (o.windows == support::WindowKind::kSliding) {
      json.key("sliding_window").value(ll(o.sliding_window));
    }
    json.key("max_seqlen_k").value(ll(o.max_seqlen_k));
  } else {
    json.key("batch").value(ll(o.batch)).key("next_n").value(ll(o.next_n));
    json.key("avg_context").value(ll(o.avg_context)).key("block_kv").value(ll(o.block_kv));
  }
}

// Why a run that failed no check still passed none.
std::string not_verified_reason(const RunResult& r) {
  if (r.checks.empty()) return "NOT VERIFIED (--verify-rows 0): timing only";
  const std::int64_t rows = r.checks.front().result.rows_checked;
  if (rows == 0) return "NOT VERIFIED: the output has no rows";
  return format_string("NOT VERIFIED: none of the %lld sampled rows has a key in its window",
                       ll(rows));
}

}  // namespace

std::string describe_check(const Check& check) {
  const auto& r = check.result;
  std::string line = format_string("%lld rows (%lld elements), float64 formula on the %s inputs: ",
                                   static_cast<long long>(r.rows_checked),
                                   static_cast<long long>(r.elements_checked),
                                   support::operands_name(check.operands));
  const bool below = r.diff < check.tolerance;  // false for NaN
  if (r.ok && r.elements_checked == 0) return line + "no in-window element to compare";
  line += format_string("diff %s %s %.0e", format_diff(r.diff, check.tolerance).c_str(),
                        below ? "<" : ">=", check.tolerance);
  if (r.ok) return line + "  OK";
  // Below the bound yet failed: a non-finite element or a column outside the window that is not
  // -inf, which first_failure names.
  line += below ? ", but FAILED" : "  FAILED";
  return line + "\n              " + r.first_failure;
}

std::string format_diff(double diff, double bound) {
  constexpr int kMaxDigits = 17;  // round-trips every double
  for (int digits = 2;; ++digits) {
    std::string text = format_string("%.*e", digits, diff);
    const bool shown_below = std::strtod(text.c_str(), nullptr) < bound;
    if (shown_below == (diff < bound) || digits == kMaxDigits) return text;
  }
}

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPassed:
      return "pass";
    case Verdict::kFailed:
      return "fail";
    case Verdict::kNotVerified:
      return "not verified";
  }
  return "?";
}

void print_report(std::FILE* out, const Options& options, const RunResult& r) {
  std::fprintf(out, "mqa-logits %s\n", operation_name(options.operation));
  const auto row = [out](std::string_view label, const std::string& text) {
    print_row(out, label, text);
  };
  row("problem", r.shape);
  row("device", r.executor);
  row("pairs",
      format_string("%lld in windows (output %lld x %lld)", ll(r.pairs), ll(r.rows), ll(r.cols)));
  std::string time = format_seconds(r.seconds_per_call) + " per call (";
  time += r.iters > 1 ? format_string("median of %d, min %s; ", r.iters,
                                      format_seconds(r.min_seconds_per_call).c_str())
                      : std::string("one call; ");
  row("time", time + r.timing_method + ")");
  std::string rate = format_string("%.3g pairs/s", r.pairs_per_second());
  if (r.rates) rate += format_string(", %.1f TFLOPS", r.flops_per_second() * 1e-12);
  row("rate", rate);
  if (const auto fraction = r.roofline_fraction()) {
    row("roofline", format_string("%.1f%% (floor %s per call: FP8 peak %.0f TFLOPS nominal, copy "
                                  "bandwidth %.2f TB/s measured, %.3g MB moved)",
                                  *fraction * 100.0, format_seconds(*r.floor_seconds()).c_str(),
                                  r.rates->peak_flops * 1e-12, r.rates->copy_bandwidth * 1e-12,
                                  r.bytes * 1e-6));
  }
  if (r.checks.empty()) {
    row("verify", "skipped (--verify-rows 0)");
  } else {
    for (std::size_t i = 0; i < r.checks.size(); ++i) {
      row(i == 0 ? "verify" : "", describe_check(r.checks[i]));
    }
  }
  if (r.topk) {
    row("top-k", format_string("k %lld: %s per call (median); %lld of %lld sampled rows "
                               "identical to the top-k of the logits",
                               ll(r.topk->topk), format_seconds(r.topk->seconds_per_call).c_str(),
                               ll(r.topk->rows_checked - r.topk->rows_mismatched),
                               ll(r.topk->rows_checked)));
  }
  switch (r.verdict()) {
    case Verdict::kPassed:
      row("result", "PASS");
      break;
    case Verdict::kFailed:
      row("result", r.checks.empty() || std::all_of(r.checks.begin(), r.checks.end(), [](const Check& c) { return c.result.ok; })
                        ? "FAIL: the top-k indices are not the top-k of the logits"
                        : "FAIL: the output does not match the formula");
      break;
    case Verdict::kNotVerified:
      row("result", not_verified_reason(r));
      break;
  }
  std::fflush(out);
}

void write_json(const std::string& path, const Options& options, const RunResult& r) {
  JsonWriter json;
  json.begin('{');
  json.key("operation").value(operation_name(options.operation));
  json.key("problem").value(r.shape);
  json.key("device").value(r.executor);
  json.key("format").value(format_name(options.format));
  json.key("weights_and_logits_dtype").value(options.bf16 ? "bfloat16" : "float32");
  json.key("clean_logits").value(options.clean_logits);
  write_shape(json, options);
  json.key("seed").value(static_cast<unsigned long long>(options.seed));
  json.key("output_rows").value(ll(r.rows)).key("output_cols").value(ll(r.cols));
  json.key("pairs").value(ll(r.pairs));
  json.key("flops_per_call").value(r.flops).key("bytes_per_call").value(r.bytes);
  json.key("iters").value(static_cast<long long>(r.iters));
  json.key("timing_method").value(r.timing_method);
  json.key("seconds_per_call_median").value(r.seconds_per_call);
  json.key("seconds_per_call_min").value(r.min_seconds_per_call);
  json.key("pairs_per_second").value(r.pairs_per_second());
  json.key("tflops").value(r.flops_per_second() * 1e-12);
  json.key("peak_fp8_flops_nominal")
      .value(r.rates ? std::optional(r.rates->peak_flops) : std::nullopt);
  json.key("copy_bandwidth_bytes_per_second")
      .value(r.rates ? std::optional(r.rates->copy_bandwidth) : std::nullopt);
  json.key("roofline_floor_seconds").value(r.floor_seconds());
  json.key("roofline_fraction").value(r.roofline_fraction());
  json.key("verification").begin('[');
  for (const Check& check : r.checks) {
    json.element().begin('{');
    json.key("operands").value(support::operands_name(check.operands));
    json.key("rows").value(ll(check.result.rows_checked));
    json.key("elements").value(ll(check.result.elements_checked));
    json.key("diff").value(check.result.diff);
    json.key("max_row_diff").value(check.result.max_row_diff);
    json.key("worst_row").value(ll(check.result.worst_row));
    json.key("tolerance").value(check.tolerance);
    json.key("ok").value(check.result.ok);
    if (!check.result.ok) json.key("first_failure").value(check.result.first_failure);
    json.end('}');
  }
  json.end(']');
  json.key("topk");
  if (r.topk) {
    json.begin('{');
    json.key("k").value(ll(r.topk->topk));
    json.key("seconds_per_call_median").value(r.topk->seconds_per_call);
    json.key("rows_checked").value(ll(r.topk->rows_checked));
    json.key("rows_mismatched").value(ll(r.topk->rows_mismatched));
    json.end('}');
  } else {
    json.value(std::optional<double>());
  }
  json.key("verified").value(r.verdict() == Verdict::kPassed);
  json.key("result").value(verdict_name(r.verdict()));
  json.end('}');

  if (path == "-") {
    const std::string text = json.str();
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout)) {
      throw std::runtime_error("cannot write the JSON results to stdout");
    }
    return;
  }
  std::ofstream file(path);
  file << json.str();
  file.close();
  if (!file) throw std::runtime_error("cannot write the JSON results to '" + path + "'");
}

}  // namespace mqa_logits::cli
