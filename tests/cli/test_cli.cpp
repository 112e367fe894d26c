// The mqa-logits program without a GPU: options refused before any input is made (naming the
// option), the help of each operation, the --json destination and stdout, the verdict agreeing
// with the check lines, and the time left in the progress line. The first tests call the CLI's
// code directly; the CliProgram tests run the built program (MQA_LOGITS_CLI_PATH) on the CPU.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "executor.hpp"
#include "mqa_logits/capabilities.hpp"
#include "options.hpp"
#include "preflight.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "run.hpp"

namespace mqa_logits::cli {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' is not in:\n" << text;
}

::testing::AssertionResult lacks(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' is in:\n" << text;
}

Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "mqa-logits");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

// The UsageError message of `check` on the parsed arguments; empty when nothing is refused.
template <typename Check>
std::string refusal(const std::vector<std::string>& args, const Check& check) {
  try {
    check(parse(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string parse_refusal(const std::vector<std::string>& args) {
  return refusal(args, [](const Options&) {});
}

std::string library_refusal(const std::vector<std::string>& args) {
  return refusal(args, [](const Options& options) { check_with_library(options); });
}

// ---- options of the other operation, and the help of each --------------------------------------

TEST(CliOptions, RefusesAnOptionOfTheOtherOperationNamingBoth) {
  EXPECT_EQ(parse_refusal({"prefill", "--next-n", "2"}),
            "--next-n: a decode option; prefill does not take it");
  EXPECT_EQ(parse_refusal({"prefill", "--block-kv", "32"}),
            "--block-kv: a decode option; prefill does not take it");
  EXPECT_EQ(parse_refusal({"decode", "--seq-len-kv", "5"}),
            "--seq-len-kv: a prefill option; decode does not take it");
  EXPECT_EQ(parse_refusal({"decode", "--windows", "causal"}),
            "--windows: a prefill option; decode does not take it");
  EXPECT_EQ(parse_refusal({"decode", "--no-schedule"}),
            "--no-schedule: a prefill option; decode does not take it");
  // The operation may come after the options.
  EXPECT_EQ(parse_refusal({"--context", "100", "prefill"}),
            "--context: a decode option; prefill does not take it");
}

TEST(CliOptions, AcceptsTheOptionsOfItsOperation) {
  EXPECT_EQ(parse_refusal({"prefill", "--seq-len", "4", "--seq-len-kv", "8", "--heads", "8",
                           "--no-schedule", "--max-seqlen-k", "4", "--bf16", "--json", "-"}),
            "");
  EXPECT_EQ(parse_refusal({"decode", "--batch", "2", "--next-n", "3", "--context", "9",
                           "--block-kv", "32", "--no-clean", "--device", "cpu"}),
            "");
}

TEST(CliOptions, RecordsWhatWasTyped) {
  const Options options = parse({"decode", "--heads=16", "--bf16"});
  EXPECT_EQ(quote_option(options, "--heads"), "--heads 16");
  EXPECT_EQ(quote_option(options, "--bf16"), "--bf16");
  EXPECT_EQ(quote_option(options, "--next-n"), "--next-n");  // not given
}

TEST(CliOptions, EachOperationHasItsOwnHelp) {
  const Options prefill = parse({"prefill", "--help"});
  EXPECT_TRUE(prefill.help && prefill.operation_given);
  const Options decode = parse({"decode", "-h"});
  EXPECT_TRUE(decode.help && decode.operation == Operation::kDecode);
  const Options both = parse({"--help"});
  EXPECT_TRUE(both.help && !both.operation_given);

  const std::string prefill_help = usage_text(Operation::kPrefill);
  const std::string decode_help = usage_text(Operation::kDecode);
  const std::string all_help = usage_text();
  for (const char* common : {"--format", "--heads", "--head-dim", "--json", "--verify-rows"}) {
    EXPECT_TRUE(contains(prefill_help, common));
    EXPECT_TRUE(contains(decode_help, common));
  }
  for (const char* option : {"--seq-len-kv", "--windows", "--requests", "--max-seqlen-k"}) {
    EXPECT_TRUE(contains(prefill_help, option));
    EXPECT_TRUE(lacks(decode_help, option));
    EXPECT_TRUE(contains(all_help, option));
  }
  for (const char* option : {"--batch", "--next-n", "--context", "--block-kv"}) {
    EXPECT_TRUE(contains(decode_help, option));
    EXPECT_TRUE(lacks(prefill_help, option));
    EXPECT_TRUE(contains(all_help, option));
  }
  EXPECT_TRUE(contains(prefill_help, "usage: mqa-logits prefill [options]"));
  EXPECT_TRUE(contains(all_help, "mqa-logits prefill|decode --help"));
}

// ---- values the library judges, before any input is made ---------------------------------------

struct Refused {
  std::vector<std::string> args;
  std::string names;    // the option as typed, at the start of the message
  std::string expects;  // part of the library's own words
};

// A set of the capability table as the library's messages write it: "{a, b, c}".
template <std::size_t N>
std::string set_of(const int (&values)[N]) {
  std::string text = "{";
  for (std::size_t i = 0; i < N; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "}";
}

TEST(CliPreflight, NamesTheOptionTheLibraryRefuses) {
  const std::string heads = set_of(capabilities::kHeadCounts);
  const std::vector<Refused> cases = {
      {{"decode", "--next-n", "9"}, "--next-n 9: ", "in {1, 2, 3, 4, 5, 6, 7, 8}, got 9"},
      {{"decode", "--heads", "7"}, "--heads 7: ", "in " + heads + ", got 7"},
      {{"prefill", "--heads", "128"}, "--heads 128: ", "in " + heads + ", got 128"},
      {{"prefill", "--head-dim", "96"}, "--head-dim 96: ",
       "in " + set_of(capabilities::kHeadDims) + ", got 96"},
      {{"decode", "--format", "mxfp4", "--head-dim", "32"}, "--head-dim 32: ", "MXFP4 head dim"},
      {{"prefill", "--format", "mxfp4", "--head-dim", "129"},
       "--head-dim 129: ",
       "expected an even head dim"},
      {{"decode", "--block-kv", "16"}, "--block-kv 16: ",
       "in " + set_of(capabilities::kBlockKvs) + ", got 16"},
      {{"decode", "--heads", "1000000000000"}, "--heads 1000000000000: ", "got 1000000000000"},
      {{"prefill", "--seq-len-kv", "3000000000"},
       "--seq-len-kv 3000000000: ",
       "seq_len_kv <= 2147483647"},
      {{"prefill", "--max-seqlen-k", "3000000000"},
       "--max-seqlen-k 3000000000: ",
       "max_seqlen_k <= 2147483647"},
      {{"decode", "--context", "2000000000"},
       "--context 2000000000 ",
       "max_context_len <= 2147483647"},
      {{"prefill", "--seq-len", "10000000", "--seq-len-kv", "10000000"},
       "--seq-len 10000000 --seq-len-kv 10000000: ",
       "of memory"},
  };
  for (const Refused& c : cases) {
    const std::string message = library_refusal(c.args);
    EXPECT_TRUE(message.starts_with(c.names)) << message;
    EXPECT_TRUE(contains(message, c.expects));
  }
}

TEST(CliPreflight, ParsingRefusesWhatIsNoValueAtAll) {
  EXPECT_TRUE(contains(parse_refusal({"prefill", "--format", "mxfp5"}),
                       "--format: expected one of fp8|mxfp8|mxfp4, got 'mxfp5'"));
  EXPECT_TRUE(contains(parse_refusal({"prefill", "--heads", "99999999999999999999"}),
                       "--heads: 99999999999999999999 is out of range"));
  EXPECT_TRUE(contains(parse_refusal({"decode", "--iters", "0"}), "--iters: expected at least 1"));
  EXPECT_TRUE(contains(parse_refusal({"prefill", "--bf16=yes"}), "--bf16: takes no value"));
}

// Every value the library supports passes both checks (no false refusal): on no rows, then on a
// 1-token call on the CPU executor.
TEST(CliPreflight, AcceptsEverySupportedShape) {
  const std::unique_ptr<Executor> cpu = make_cpu_executor();
  for (const char* operation : {"prefill", "decode"}) {
    for (const char* format : {"fp8", "mxfp8", "mxfp4"}) {
      for (const char* heads : {"8", "16", "32", "64"}) {
        for (const char* dim : {"32", "64", "128"}) {
          if (std::string(format) == "mxfp4" && std::string(dim) == "32") continue;
          std::vector<std::string> args = {operation, "--format",   format, "--heads",
                                           heads,     "--head-dim", dim,    "--bf16"};
          if (std::string(operation) == "decode") {
            args.insert(args.end(), {"--next-n", "5", "--block-kv", "32"});
          } else {
            args.insert(args.end(), {"--max-seqlen-k", "100", "--no-schedule"});
          }
          const Options options = parse(args);
          EXPECT_NO_THROW(check_with_library(options)) << testing::PrintToString(args);
          EXPECT_NO_THROW(check_on_device(options, *cpu)) << testing::PrintToString(args);
        }
      }
    }
  }
}

// ---- --json
// ---------------------------------------------------------------------------------------

class CliJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("mqa_logits_cli_json_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string json_refusal(const std::string& path) {
    return refusal({"prefill", "--json", path}, check_json_destination);
  }

  std::filesystem::path dir_;
};

TEST_F(CliJson, RefusesADestinationThatCannotBeWritten) {
  EXPECT_TRUE(contains(json_refusal((dir_ / "missing" / "out.json").string()), "does not exist"));
  EXPECT_TRUE(contains(json_refusal(dir_.string()), "is a directory"));
}

TEST_F(CliJson, LeavesAWritableDestinationAsItWas) {
  const std::filesystem::path existing = dir_ / "old.json";
  std::ofstream(existing) << "{}\n";
  EXPECT_EQ(json_refusal(existing.string()), "");
  std::ifstream file(existing);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(file), {}), "{}\n");

  const std::filesystem::path fresh = dir_ / "new.json";
  EXPECT_EQ(json_refusal(fresh.string()), "");
  EXPECT_FALSE(std::filesystem::exists(fresh));  // created by the run, not by the check
  EXPECT_EQ(json_refusal("-"), "");
}

// ---- the verdict and the check lines
// ---------------------------------------------------------------

Check make_check(double diff, double tolerance, bool ok, std::int64_t elements = 100,
                 std::string failure = "") {
  Check check{support::Operands::kQuantized, tolerance, {}};
  check.result.ok = ok;
  check.result.diff = diff;
  check.result.rows_checked = 4;
  check.result.elements_checked = elements;
  check.result.first_failure = std::move(failure);
  return check;
}

Verdict verdict_of(std::vector<Check> checks) {
  RunResult result;
  result.checks = std::move(checks);
  return result.verdict();
}

TEST(CliReport, VerdictIsAPassOnlyWhenSomethingWasCompared) {
  EXPECT_EQ(verdict_of({}), Verdict::kNotVerified);  // --verify-rows 0
  EXPECT_EQ(verdict_of({make_check(1e-7, 5e-6, true), make_check(1e-4, 1e-3, true)}),
            Verdict::kPassed);
  EXPECT_EQ(verdict_of({make_check(1e-7, 5e-6, true), make_check(2e-3, 1e-3, false)}),
            Verdict::kFailed);
  EXPECT_EQ(verdict_of({make_check(0.0, 5e-6, true, 0), make_check(0.0, 1e-3, true, 0)}),
            Verdict::kNotVerified);
  EXPECT_EQ(verdict_name(Verdict::kNotVerified), std::string("not verified"));
}

// The number printed must compare with the bound as the diff does: 4.9996e-06 printed with
// three digits would read "5.00e-06 < 5e-06  OK".
TEST(CliReport, PrintedDiffComparesWithTheBoundAsTheDiffDoes) {
  for (const double bound : {5e-6, 3e-5, 1e-3, 2e-2}) {
    for (const double factor : {0.5, 0.999, 0.9999, 0.99999999, 1.0, 1.00001, 1.2}) {
      const double diff = bound * factor;
      const std::string text = format_diff(diff, bound);
      EXPECT_EQ(std::strtod(text.c_str(), nullptr) < bound, diff < bound) << text;
    }
  }
  EXPECT_EQ(format_diff(1.234e-7, 5e-6), "1.23e-07");  // far from the bound: three digits
}

TEST(CliReport, EachCheckLineStatesItsOwnVerdictConsistently) {
  EXPECT_TRUE(contains(describe_check(make_check(1e-7, 5e-6, true)), "< 5e-06  OK"));
  const std::string near = describe_check(make_check(4.9996e-6, 5e-6, true));
  EXPECT_TRUE(contains(near, "diff 4.9996e-06 < 5e-06  OK"));

  const std::string above =
      describe_check(make_check(2e-3, 1e-3, false, 100, "diff 0.002 ... is not below 0.001"));
  EXPECT_TRUE(contains(above, ">= 1e-03  FAILED"));

  // Below the bound, yet failed: the line says so and why, rather than "<" then FAILED.
  const std::string inf = describe_check(
      make_check(1e-7, 5e-6, false, 100, "row 3 column 7: inside the window, not finite"));
  EXPECT_TRUE(contains(inf, "< 5e-06, but FAILED"));
  EXPECT_TRUE(contains(inf, "row 3 column 7"));

  EXPECT_TRUE(
      contains(describe_check(make_check(0.0, 5e-6, true, 0)), "no in-window element to compare"));
  EXPECT_TRUE(lacks(describe_check(make_check(0.0, 5e-6, true, 0)), "OK"));
}

// ---- the time left
// ----------------------------------------------------------------------------------

TEST(CliProgress, CallEtaSaysHowLongIsLeft) {
  CallEta unknown(3, std::nullopt);
  EXPECT_EQ(unknown.describe(), "call 1 of 3");
  EXPECT_EQ(unknown.describe(1.5), "call 1 of 3 (1.5 s in)");
  unknown.call_done(4.0);
  EXPECT_EQ(unknown.describe(), "call 2 of 3 (about 8.0 s left)");

  CallEta estimated(2, 10.0);
  EXPECT_EQ(estimated.describe(), "call 1 of 2 (about 20 s left)");
  EXPECT_EQ(estimated.describe(4.0), "call 1 of 2 (4.0 s in, about 16 s left)");
  EXPECT_EQ(estimated.describe(30.0), "call 1 of 2 (30 s in, about 10 s left)");  // overrun
  estimated.call_done(12.0);
  EXPECT_EQ(estimated.describe(2.0), "call 2 of 2 (2.0 s in, about 10 s left)");
}

TEST(CliProgress, FormatsDurations) {
  EXPECT_EQ(format_duration(0.42), "0.4 s");
  EXPECT_EQ(format_duration(12.3), "12 s");
  EXPECT_EQ(format_duration(200.0), "3 min 20 s");
}

// ---- the program itself
// -----------------------------------------------------------------------------

struct Outcome {
  int status = -1;
  std::string out;
  std::string err;
};

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string slurp(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// Runs the built program with stdout and stderr in files of their own.
Outcome run_cli(const std::vector<std::string>& args) {
  static std::atomic<int> counter{0};
  const std::string base = ::testing::TempDir() + "mqa_logits_cli_" + std::to_string(getpid()) +
                           "_" + std::to_string(counter++);
  std::string command = shell_quote(MQA_LOGITS_CLI_PATH);
  for (const std::string& arg : args) command += " " + shell_quote(arg);
  command += " </dev/null >" + shell_quote(base + ".out") + " 2>" + shell_quote(base + ".err");
  const int raw = std::system(command.c_str());
  Outcome outcome{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(base + ".out"),
                  slurp(base + ".err")};
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return outcome;
}

// A tiny case on the CPU: tests check the program, not the device.
std::vector<std::string> tiny(const char* operation, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {operation, "--device",      "cpu", "--iters",
                                   "2",       "--verify-rows", "4"};
  if (std::string(operation) == "prefill") {
    args.insert(args.end(), {"--seq-len", "16", "--seq-len-kv", "256"});
  } else {
    args.insert(args.end(), {"--batch", "2", "--context", "128"});
  }
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(CliProgram, RefusesBadOptionsBeforeMakingInputs) {
  for (const auto& [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"decode", "--next-n", "9"}, "--next-n 9: refused by the library"},
           {{"decode", "--block-kv", "48"}, "--block-kv 48: refused by the library"},
           {{"prefill", "--next-n", "2"}, "--next-n: a decode option; prefill does not take it"},
           {{"decode", "--windows", "full"},
            "--windows: a prefill option; decode does not take it"},
           {{"prefill", "--json", "/nonexistent-dir/out.json"}, "--json /nonexistent-dir/out.json"},
       }) {
    const Outcome outcome = run_cli(args);
    EXPECT_EQ(outcome.status, 2) << names;
    EXPECT_TRUE(contains(outcome.err, "mqa-logits: " + names));
    EXPECT_TRUE(lacks(outcome.err, "generating the"));  // no input was made
    EXPECT_EQ(outcome.out, "");
  }
}

TEST(CliProgram, PrintsTheHelpOfEachOperation) {
  const Outcome prefill = run_cli({"prefill", "--help"});
  EXPECT_EQ(prefill.status, 0);
  EXPECT_TRUE(contains(prefill.out, "--seq-len-kv"));
  EXPECT_TRUE(lacks(prefill.out, "--next-n"));
  const Outcome decode = run_cli({"decode", "--help"});
  EXPECT_EQ(decode.status, 0);
  EXPECT_TRUE(contains(decode.out, "--next-n"));
  EXPECT_TRUE(lacks(decode.out, "--seq-len-kv"));
  const Outcome all = run_cli({"--help"});
  EXPECT_EQ(all.status, 0);
  EXPECT_TRUE(contains(all.out, "--next-n"));
  EXPECT_TRUE(contains(all.out, "--seq-len-kv"));
}

TEST(CliProgram, JsonToStdoutLeavesTheReportOnStderr) {
  for (const char* operation : {"prefill", "decode"}) {
    const Outcome outcome = run_cli(tiny(operation, {"--json", "-"}));
    EXPECT_EQ(outcome.status, 0) << outcome.err;
    EXPECT_TRUE(outcome.out.starts_with("{\n")) << outcome.out;
    EXPECT_TRUE(outcome.out.ends_with("}\n")) << outcome.out;
    EXPECT_TRUE(contains(outcome.out, "\"result\": \"pass\""));
    EXPECT_TRUE(contains(outcome.out, "\"verified\": true"));
    EXPECT_TRUE(lacks(outcome.out, "mqa-logits "));
    EXPECT_TRUE(contains(outcome.err, std::string("mqa-logits ") + operation + "\n"));
    EXPECT_TRUE(contains(outcome.err, "result      PASS"));
  }
}

TEST(CliProgram, SkippedVerificationIsNotAPass) {
  const Outcome outcome = run_cli(tiny("prefill", {"--verify-rows", "0", "--json", "-"}));
  EXPECT_EQ(outcome.status, 0);
  EXPECT_TRUE(contains(outcome.err, "NOT VERIFIED (--verify-rows 0)"));
  EXPECT_TRUE(lacks(outcome.err, "PASS"));
  EXPECT_TRUE(contains(outcome.out, "\"verified\": false"));
  EXPECT_TRUE(contains(outcome.out, "\"result\": \"not verified\""));

  const Outcome empty = run_cli(tiny("prefill", {"--seq-len", "0"}));
  EXPECT_EQ(empty.status, 0);
  EXPECT_TRUE(contains(empty.out, "NOT VERIFIED: the output has no rows"));
}

TEST(CliProgram, VerifiedRunPassesWithEveryCheckLineOk) {
  const Outcome outcome = run_cli(tiny("decode"));
  EXPECT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_TRUE(contains(outcome.out, "quantized inputs: diff"));
  EXPECT_TRUE(lacks(outcome.out, "FAILED"));
  EXPECT_TRUE(contains(outcome.out, "result      PASS"));
  // In a log (stderr is a file here) each call is one line, with the time left once known.
  EXPECT_TRUE(contains(outcome.err, "decode: call 1 of 2\n"));
  EXPECT_TRUE(contains(outcome.err, "decode: call 2 of 2 (about "));
}

TEST(CliProgram, TopkRunsTimedAndChecked) {
  for (const char* operation : {"prefill", "decode"}) {
    const Outcome outcome = run_cli(tiny(operation, {"--topk", "40", "--json", "-"}));
    EXPECT_EQ(outcome.status, 0) << outcome.err;
    EXPECT_TRUE(contains(outcome.err, "k 40: ")) << outcome.err;
    const std::string rows = std::string(operation) == "prefill" ? "4 of 4" : "2 of 2";
    EXPECT_TRUE(contains(outcome.err, rows + " sampled rows identical")) << outcome.err;
    EXPECT_TRUE(contains(outcome.out, "\"rows_mismatched\": 0"));
  }
  const Outcome refused = run_cli({"prefill", "--topk", "5", "--max-seqlen-k", "64"});
  EXPECT_EQ(refused.status, 2);
  EXPECT_TRUE(contains(refused.err, "--topk: selects over whole rows"));
}

}  // namespace
}  // namespace mqa_logits::cli
