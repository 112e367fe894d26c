#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>

#include "text.hpp"

namespace mqa_logits::cli {

Progress::Progress()
    : start_(std::chrono::steady_clock::now()), terminal_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { finish(); }

void Progress::update(const std::string& step) {
  const std::lock_guard lock(mutex_);
  print(step);
}

void Progress::refresh(const std::string& step) {
  const std::lock_guard lock(mutex_);
  if (terminal_) print(step);
}

void Progress::print(const std::string& step) {
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
  const std::lock_guard lock(mutex_);
  if (line_open_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    line_open_ = false;
  }
}

Ticker::Ticker(Progress& progress, std::function<std::string()> text) {
  if (!progress.on_terminal()) return;
  thread_ = std::jthread([&progress, text = std::move(text)](std::stop_token stop) {
    constexpr auto kTick = std::chrono::milliseconds(500);
    std::mutex mutex;
    std::condition_variable_any wake;  // only the stop request wakes it early
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, stop, kTick, [&] { return stop.stop_requested(); })) {
      progress.refresh(text());
    }
  });
}

CallEta::CallEta(int calls, std::optional<double> estimated_seconds)
    : calls_(calls), estimated_seconds_(estimated_seconds) {}

void CallEta::call_done(double seconds) {
  ++done_;
  done_seconds_ += seconds;
}

std::string CallEta::describe(double running) const {
  std::string text = format_string("call %d of %d", std::min(done_ + 1, calls_), calls_);
  const std::optional<double> per_call =
      done_ > 0 ? std::optional(done_seconds_ / done_) : estimated_seconds_;
  std::string clock = running > 0.0 ? format_duration(running) + " in" : "";
  if (per_call) {
    // A call that overruns the estimate is taken to be about to end, not to have negative time.
    const double left = std::max(*per_call - running, 0.0) + (calls_ - done_ - 1) * *per_call;
    clock += (clock.empty() ? "" : ", ") + std::string("about ") + format_duration(left) + " left";
  }
  return clock.empty() ? text : text + " (" + clock + ")";
}

std::string format_duration(double seconds) {
  if (seconds < 10.0) return format_string("%.1f s", seconds);
  if (seconds < 120.0) return format_string("%.0f s", seconds);
  const double whole = std::round(seconds);
  return format_string("%.0f min %02.0f s", std::floor(whole / 60.0), std::fmod(whole, 60.0));
}

}  // namespace mqa_logits::cli
