// CUDA decode entry: picks the kernel instance for (head dim, heads, MMA rows).
#include <string>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/dispatch.hpp"
#include "kernels/sm90/paged_plan.cuh"
#include "mqa_logits/errors.hpp"
#include "problem.hpp"

namespace mqa_logits::cuda_backend {

template <int kHeadDim, int kNumHeads, int kMmaRows>
void launch_paged(const PagedProblem& problem, cudaStream_t stream);

namespace {

namespace paged = sm90::paged;

// The instances of (D, H) are the row counts mma_rows_for maps to itself.
template <int kHeadDim, int kNumHeads, int... kRows>
void dispatch_rows(const PagedProblem& problem, int mma_rows, cudaStream_t stream,
                   std::integer_sequence<int, kRows...>) {
  const auto launch_if = [&]<int kMmaRows>() {
    if constexpr (paged::mma_rows_for(kMmaRows, kNumHeads) == kMmaRows) {
      if (mma_rows == kMmaRows) {
        launch_paged<kHeadDim, kNumHeads, kMmaRows>(problem, stream);
        return true;
      }
    }
    return false;
  };
  if (!(launch_if.template operator()<kRows + 1>() || ...)) {
    throw InvalidArgument("q", "no decode kernel for " + std::to_string(mma_rows) + " rows");
  }
}

template <int kHeadDim, int kNumHeads>
void dispatch_group(const PagedProblem& problem, cudaStream_t stream) {
  const int group_rows = problem.indices != nullptr ? paged::varlen_group_rows(kNumHeads)
                                                    : static_cast<int>(problem.next_n);
  dispatch_rows<kHeadDim, kNumHeads>(problem, paged::mma_rows_for(group_rows, kNumHeads), stream,
                                     std::make_integer_sequence<int, paged::kMaxGroupRows>{});
}

}  // namespace

void run_paged(const PagedProblem& problem, cudaStream_t stream) {
  if (problem.format != Format::kFP8) {
    throw InvalidArgument("q", std::string("the CUDA backend runs the FP8 format; got ") +
                                   format_name(problem.format));
  }
  if (problem.schedule_workers < 1) {
    throw InvalidArgument("schedule_meta", "expected at least one worker row, got " +
                                               std::to_string(problem.schedule_workers));
  }
  // Nothing to write: no rows, or no columns.
  if (problem.batch == 0 || problem.max_context_len == 0) return;
  const DeviceGuard guard(problem.device.index);
  with_instance(problem.head_dim, problem.num_heads, [&](auto dim, auto heads) {
    dispatch_group<decltype(dim)::value, decltype(heads)::value>(problem, stream);
  });
}

}  // namespace mqa_logits::cuda_backend
