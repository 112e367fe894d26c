// mqa-logits: runs one DeepSeek-shaped prefill or decode case end to end, verifies it against the
// float64 formula and reports its speed. See usage_text() in options.cpp.
#include <cstdio>
#include <exception>
#include <memory>
#include <string_view>

#include "executor.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "options.hpp"
#include "preflight.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "run.hpp"

namespace {

using namespace mqa_logits::cli;

enum ExitStatus : int { kPassed = 0, kVerificationFailed = 1, kUsageError = 2, kRuntimeError = 3 };

constexpr bool kBuiltWithCuda = MQA_LOGITS_CLI_WITH_CUDA != 0;

std::unique_ptr<Executor> select_executor(const Options& options, std::FILE* report) {
  if (options.device) {
    return *options.device == mqa_logits::DeviceType::kCUDA ? make_cuda_executor()
                                                            : make_cpu_executor();
  }
  if (mqa_logits::cuda_backend_available()) return make_cuda_executor();
  std::fprintf(report, "%s: running the CPU reference backend\n",
               kBuiltWithCuda ? "No GPU of compute capability 9.0 was found"
                              : "This build has no CUDA backend, so no GPU is used");
  return make_cpu_executor();
}

int run(const Options& options) {
  // With the JSON on stdout, everything meant for a person goes to stderr.
  std::FILE* report = options.json_to_stdout() ? stderr : stdout;
  check_json_destination(options);
  check_with_library(options);
  const std::unique_ptr<Executor> executor = select_executor(options, report);
  check_on_device(options, *executor);
  RunResult result;
  {
    Progress progress;
    result = run_case(options, *executor, progress);
  }
  print_report(report, options, result);
  if (!options.json_path.empty()) write_json(options.json_path, options, result);
  return result.verdict() == Verdict::kFailed ? kVerificationFailed : kPassed;
}

// "mqa-logits decode --help" when the command line named an operation.
std::string help_hint(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "prefill" || arg == "decode") {
      return "mqa-logits " + std::string(arg) + " --help lists its options";
    }
  }
  return "mqa-logits --help lists the options";
}

int usage_error(const std::exception& e, int argc, const char* const* argv) {
  std::fprintf(stderr, "mqa-logits: %s\n(%s)\n", e.what(), help_hint(argc, argv).c_str());
  return kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const UsageError& e) {
    return usage_error(e, argc, argv);
  }
  if (options.help) {
    std::printf(
        "%s", usage_text(options.operation_given ? std::optional(options.operation) : std::nullopt)
                  .c_str());
    return kPassed;
  }
  try {
    return run(options);
  } catch (const UsageError& e) {
    return usage_error(e, argc, argv);
  } catch (const mqa_logits::InvalidArgument& e) {
    std::fprintf(stderr, "mqa-logits: the library refused the input: %s\n", e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mqa-logits: error: %s\n", e.what());
    return kRuntimeError;
  }
}
