// Presenting a run: a human-readable summary and, on request, JSON (a file, or stdout).
#pragma once

#include <cstdio>
#include <string>

#include "options.hpp"
#include "run.hpp"

namespace mqa_logits::cli {

// The report, to `out`: stdout, or stderr when the JSON goes to stdout.
void print_report(std::FILE* out, const Options& options, const RunResult& result);
// "-" writes to stdout. Throws std::runtime_error when the file cannot be written.
void write_json(const std::string& path, const Options& options, const RunResult& result);

// One verification line: the rows and elements compared, the diff against its bound and the
// check's verdict, which always agree with each other (a diff shown as "<" the bound is below
// it; FAILED with the diff below the bound says what failed instead).
std::string describe_check(const Check& check);
// `diff` with as many digits as it takes for the printed value to compare with `bound` as the
// value does ("4.9996e-06", not "5.00e-06", for a diff below 5e-06).
std::string format_diff(double diff, double bound);
const char* verdict_name(Verdict verdict);  // "pass", "fail", "not verified"

}  // namespace mqa_logits::cli
