// Progress lines on stderr, so that stdout keeps only the results.
#pragma once

#include <chrono>
#include <string>

namespace mqa_logits::cli {

class Progress {
 public:
  Progress();
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Reports the step that starts now, with the time since the run began. On a terminal the line
  // is rewritten in place; in a log each step is one line.
  void update(const std::string& step);
  void finish();  // clears the line on a terminal

 private:
  std::chrono::steady_clock::time_point start_;
  bool terminal_ = false;
  bool line_open_ = false;
};

}  // namespace mqa_logits::cli
