// The host executor: inputs stay where the workload made them, the CPU backend runs the calls.
#include <chrono>
#include <cstring>
#include <new>

#include "executor.hpp"

namespace mqa_logits::cli {
namespace {

// Output rows must start 16-byte aligned; a cache line is plenty.
constexpr std::align_val_t kAlignment{64};

struct AlignedDelete {
  void operator()(std::byte* p) const { ::operator delete[](p, kAlignment); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], AlignedDelete>;

class CpuExecutor final : public Executor {
 public:
  Device device() const override { return {}; }
  std::string description() const override {
    return "CPU reference backend, " + std::to_string(get_num_sms()) + " threads";
  }
  cudaStream_t stream() const override { return nullptr; }

  std::vector<void*> place(const std::vector<support::HostBuffer>& buffers) override {
    return support::host_pointers(buffers);
  }

  void* allocate_poisoned(std::size_t bytes) override {
    AlignedBuffer buffer(static_cast<std::byte*>(::operator new[](bytes, kAlignment)));
    std::memset(buffer.get(), 0xff, bytes);
    return buffers_.emplace_back(std::move(buffer)).get();
  }

  std::vector<std::byte> read_back(const void* data, std::size_t bytes) override {
    const auto* begin = static_cast<const std::byte*>(data);
    return {begin, begin + bytes};
  }

  // A CPU call is long and has nothing to warm up: every call is a sample. The calls can take
  // minutes on big shapes, so the line says how far the current call is and how long is left.
  CallTiming time_calls(const std::function<void()>& enqueue_call, int iters,
                        const CallsProgress& progress) override {
    CallTiming timing{{}, "wall clock per call"};
    CallEta eta(iters, progress.estimated_seconds);
    for (int i = 0; i < iters; ++i) {
      progress.line.update(progress.label + ": " + eta.describe());
      const auto start = std::chrono::steady_clock::now();
      const auto running = [start] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      {
        const Ticker ticker(progress.line,
                            [&] { return progress.label + ": " + eta.describe(running()); });
        enqueue_call();
      }
      timing.seconds.push_back(running());
      eta.call_done(timing.seconds.back());
    }
    return timing;
  }

  int default_iters() const override { return 3; }
  std::optional<DeviceRates> measure_rates() override { return std::nullopt; }

 private:
  std::vector<AlignedBuffer> buffers_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor() { return std::make_unique<CpuExecutor>(); }

}  // namespace mqa_logits::cli
