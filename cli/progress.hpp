// Progress lines on stderr, so that stdout keeps only the results.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

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
  // Rewrites the current step's line on a terminal (a clock ticking within a step); a log gets
  // nothing, so that it keeps one line per step.
  void refresh(const std::string& step);
  void finish();  // clears the line on a terminal

  bool on_terminal() const { return terminal_; }

 private:
  void print(const std::string& step);

  std::chrono::steady_clock::time_point start_;
  bool terminal_ = false;
  bool line_open_ = false;
  std::mutex mutex_;  // a Ticker refreshes from its own thread
};

// While it lives, shows text() with Progress::refresh about twice a second from a thread of its
// own (only on a terminal: in a log it does nothing), so that a step that takes long, such as
// one CPU call, still shows its clock moving.
class Ticker {
 public:
  Ticker(Progress& progress, std::function<std::string()> text);

 private:
  std::jthread thread_;  // stopped and joined when the Ticker goes
};

// The time left in a series of calls timed one after the other: the mean of the calls done, or
// before the first one ends an estimate of one call's time (when there is one).
class CallEta {
 public:
  CallEta(int calls, std::optional<double> estimated_seconds);

  void call_done(double seconds);
  // "call 2 of 3 (1.5 s in, about 4.2 s left)" while the current call has run `running` seconds;
  // "call 1 of 3" when nothing is known yet.
  std::string describe(double running = 0.0) const;

 private:
  int calls_;
  int done_ = 0;
  double done_seconds_ = 0.0;
  std::optional<double> estimated_seconds_;
};

// "0.4 s", "12 s", "3 min 20 s".
std::string format_duration(double seconds);

}  // namespace mqa_logits::cli
