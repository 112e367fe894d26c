// A minimal thread pool-free parallel loop: `num_threads` std::threads take indices from a shared
// counter. Each index is processed by exactly one thread, so as long as `fn(index)` writes only
// what index owns, results do not depend on the thread count or on the order. Header-only and
// free of the rest of the library, so the test support code shares it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mqa_logits::cpu {

// The hardware's thread count (at least 1); what `num_threads <= 0` means below.
inline int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Calls fn(i) for every i in [0, count) on up to `num_threads` threads (<= 0: all hardware
// threads). The first exception thrown by fn stops the loop and is rethrown here.
template <class Fn>
void parallel_for(std::int64_t count, int num_threads, const Fn& fn) {
  if (num_threads <= 0) num_threads = hardware_threads();
  const auto workers = static_cast<int>(std::min<std::int64_t>(num_threads, count));
  if (workers <= 1) {
    for (std::int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (std::int64_t i = next++; i < count; i = next++) fn(i);
    } catch (...) {
      next = count;
      const std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mqa_logits::cpu
