// Presenting a run: a human-readable summary on stdout and, on request, a JSON file.
#pragma once

#include <string>

#include "options.hpp"
#include "run.hpp"

namespace mqa_logits::cli {

void print_report(const Options& options, const RunResult& result);
// Throws std::runtime_error when the file cannot be written.
void write_json(const std::string& path, const Options& options, const RunResult& result);

}  // namespace mqa_logits::cli
