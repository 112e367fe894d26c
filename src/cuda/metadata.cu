// Device schedule metadata for both operations (kernels/metadata_kernel.cuh).
#include <cuda_runtime.h>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/launch.hpp"
#include "kernels/metadata_kernel.cuh"
#include "schedule.hpp"

namespace mqa_logits::cuda_backend {
namespace {

template <typename Units>
void launch_metadata(const Units& units, int workers, std::int32_t* out, cudaStream_t stream) {
  namespace mk = metadata_kernels;
  // Programmatic dependent launch on both sides: see metadata_kernel.cuh.
  launch_programmatic(&mk::schedule_metadata_kernel<Units>, dim3(1), dim3(mk::kMetadataThreads), 0,
                      stream, "schedule_metadata_kernel launch", units, workers, out);
}

}  // namespace

void prefill_metadata(int device, const std::int32_t* k_start, const std::int32_t* k_end,
                      std::int64_t seq_len, std::int64_t seq_len_kv, int num_heads, int workers,
                      std::int32_t* out, cudaStream_t stream) {
  const DeviceGuard guard(device);
  const metadata_kernels::PrefillUnits units{k_start, k_end, seq_len, seq_len_kv, num_heads,
                                             schedule::prefill_block_q(num_heads)};
  launch_metadata(units, workers, out, stream);
}

// In the varlen form every row is its own unit (schedule.hpp), so `indices` does not enter the
// metadata: the kernel groups rows that share a block-table row itself.
void paged_metadata(int device, const std::int32_t* context_lens, std::int64_t batch,
                    std::int64_t lens_cols, bool lens_2d, const std::int32_t* /*indices*/,
                    int workers, std::int32_t* out, cudaStream_t stream) {
  const DeviceGuard guard(device);
  const metadata_kernels::PagedUnits units{context_lens, batch, lens_cols, lens_2d};
  launch_metadata(units, workers, out, stream);
}

}  // namespace mqa_logits::cuda_backend
