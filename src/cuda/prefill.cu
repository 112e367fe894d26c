// CUDA prefill entry: picks the kernel instance for (format, head dim, heads), then with
// clean_logits the -inf pass (kernels/prefill_clean_kernel.cuh). The dispatch code calls it only
// when there is an output element to write.
#include <algorithm>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/launch.hpp"
#include "kernels/prefill_clean_kernel.cuh"
#include "kernels/sm90/prefill_plan.cuh"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

template <Format kFormat, int kHeadDim, int kNumHeads>
void launch_prefill(const PrefillProblem& problem, cudaStream_t stream);

namespace {

// Whether a clean_logits CTA fits the registers and shared memory that a logits CTA of instance
// (D, H) leaves of its SM: the pass then runs beside the logits kernel (prefill_clean_kernel.cuh).
template <int kHeadDim, int kNumHeads>
constexpr bool clean_fits_beside_logits() {
  using Tiling = sm90::PrefillTiling<kHeadDim, kNumHeads>;
  constexpr int kStaticAndAlignment = 1024;  // prefill_segment, then the 1024-byte aligned base
  return Tiling::kThreads * sm90::launch_registers(Tiling::kThreads) +
                 kernels::kCleanThreads * kernels::kCleanRegisters <=
             sm90::kSmRegisters &&
         Tiling::kSmemBytes + kStaticAndAlignment + 2 * sm90::kCtaReservedSharedBytes <=
             sm90::kSmSharedBytes;
}

// After the logits kernel, with programmatic dependent launch (prefill_clean_kernel.cuh): one
// grid, or one per kMaxGridChunks chunks of the columns, each after the one before.
void launch_clean(const PrefillProblem& problem, cudaStream_t stream) {
  namespace k = kernels;
  k::PrefillCleanParams params{problem.logits,  problem.logits_row_stride,
                               problem.k_start, problem.k_end,
                               problem.seq_len, problem.seq_len_kv,
                               problem.out_cols, problem.logits_dtype == DType::kBFloat16,
                               problem.compressed, 0};
  const std::int64_t chunks = schedule::ceil_div(problem.out_cols, k::kCleanColumns);
  for (std::int64_t first = 0; first < chunks; first += k::kMaxGridChunks) {
    params.first_chunk = static_cast<unsigned>(first);
    const dim3 grid(
        static_cast<unsigned>(schedule::ceil_div(problem.seq_len, k::kCleanRowsPerCta)),
        static_cast<unsigned>(std::min(chunks - first, k::kMaxGridChunks)));
    launch_programmatic(&k::prefill_clean_kernel, grid, dim3(k::kCleanThreads), 0, stream,
                        "prefill_clean_kernel launch", params);
  }
}

}  // namespace

void run_prefill(const PrefillProblem& problem, cudaStream_t stream) {
  const DeviceGuard guard(problem.device.index);
  const auto launch = [&](auto format, auto dim, auto heads) {
    constexpr int kHeadDim = decltype(dim)::value, kNumHeads = decltype(heads)::value;
    static_assert(clean_fits_beside_logits<kHeadDim, kNumHeads>(),
                  "a clean_logits CTA fits beside a logits CTA");
    launch_prefill<decltype(format)::value, kHeadDim, kNumHeads>(problem, stream);
  };
  with_instance(problem.format, problem.head_dim, problem.num_heads, launch);
  if (problem.clean_logits) launch_clean(problem, stream);
}

}  // namespace mqa_logits::cuda_backend
