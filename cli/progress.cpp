#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace mqa_logits::cli {

Progress::Progress()
    : start_(std::chrono::steady_clock::now()), terminal_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { finish(); }

void Progress::update(const std::string& step) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K[%6.1f s] %s", elapsed, step.c_str());
    line_open_ = true;
  } else {
    std::fprintf(stderr, "[%6.1f s] %s\n", elapsed, step.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (line_open_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    line_open_ = false;
  }
}

}  // namespace mqa_logits::cli
