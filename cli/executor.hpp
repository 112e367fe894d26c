// Where the calls of a run execute: host memory and the CPU backend, or CUDA device memory and
// the GPU kernels. An executor places inputs, owns every buffer it hands out, and times calls.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"
#include "progress.hpp"
#include "support/workload.hpp"

namespace mqa_logits::cli {

// What the hardware can do at best, for the roofline.
struct DeviceRates {
  double peak_flops = 0.0;      // nominal dense FP8 tensor-core rate, FLOP/s
  double copy_bandwidth = 0.0;  // measured device-to-device copy, bytes/s (read + write)
};

struct CallTiming {
  std::vector<double> seconds;  // per call, one sample per timed repetition
  std::string method;           // how the samples were taken
};

// Where time_calls reports its steps: `label` (the operation) starts each line, and
// `estimated_seconds` (one call's time, from a call on a slice of the rows; unset when not
// measured) lets an executor that runs the calls one at a time say how long is left before the
// first call ends.
struct CallsProgress {
  Progress& line;
  std::string label;
  std::optional<double> estimated_seconds;
};

class Executor {
 public:
  virtual ~Executor() = default;

  virtual Device device() const = 0;
  virtual std::string description() const = 0;  // e.g. "CPU backend, 2 threads"
  virtual cudaStream_t stream() const = 0;

  // Pointers to copies of the buffers on the device (slot k at position k; empty buffers null).
  virtual std::vector<void*> place(const std::vector<support::HostBuffer>& buffers) = 0;
  // `bytes` of device memory filled with 0xff (NaN in fp32 and bf16), so that an element the
  // call does not write cannot pass for a result.
  virtual void* allocate_poisoned(std::size_t bytes) = 0;
  virtual std::vector<std::byte> read_back(const void* data, std::size_t bytes) = 0;

  // Times `enqueue_call` (one library call on stream()): `iters` samples of the time per call,
  // after a warm-up where the device needs one.
  virtual CallTiming time_calls(const std::function<void()>& enqueue_call, int iters,
                                const CallsProgress& progress) = 0;
  virtual int default_iters() const = 0;
  // Rates of the hardware; none on the CPU.
  virtual std::optional<DeviceRates> measure_rates() = 0;
};

std::unique_ptr<Executor> make_cpu_executor();
// Throws std::runtime_error when this build has no CUDA support or no CUDA device is visible.
std::unique_ptr<Executor> make_cuda_executor();

}  // namespace mqa_logits::cli
