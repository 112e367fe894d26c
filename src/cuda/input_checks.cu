// The checking mode of the CUDA backend: the inputs that the checks of input_checks.hpp read are
// copied to the host (the key scales of a paged cache as one strided copy of every block's scale
// run, ~3% of the cache), the stream is synchronized, and the CPU backend's checks run on the
// copies. A debugging mode: it costs a round trip and cannot run inside CUDA-graph capture.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_guard.hpp"
#include "input_checks.hpp"
#include "schedule.hpp"

namespace mqa_logits::cuda_backend {
namespace {

// A host copy of `count` elements at `device` (none when it is null), queued on `stream`.
template <typename T>
std::vector<T> download(const T* device, std::int64_t count, cudaStream_t stream) {
  std::vector<T> host(device != nullptr ? static_cast<std::size_t>(count) : 0);
  if (!host.empty()) {
    check_cuda(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync (checking mode)");
  }
  return host;
}

template <typename T>
const T* data_or_null(const std::vector<T>& host) {
  return host.empty() ? nullptr : host.data();
}

std::int64_t metadata_ints(int workers) {
  return (std::int64_t{workers} + 1) * schedule::kMetaCols;
}

}  // namespace

bool stream_capturing(int device, cudaStream_t stream) {
  const DeviceGuard guard(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(stream, &status);
  if (error == cudaErrorStreamCaptureImplicit) {
    static_cast<void>(cudaGetLastError());  // the query's own error, not the caller's
    return true;
  }
  check_cuda(error, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

void check_merge_inputs(const MergeProblem& problem, cudaStream_t stream) {
  const DeviceGuard guard(problem.device.index);
  const auto indices =
      download(problem.indices, problem.lists * problem.rows * problem.candidates, stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (checking mode)");
  input_checks::check_merge(problem, data_or_null(indices));
}

void check_prefill_inputs(const PrefillProblem& problem, cudaStream_t stream) {
  const DeviceGuard guard(problem.device.index);
  const auto start = download(problem.k_start, problem.seq_len, stream);
  const auto end = download(problem.k_end, problem.seq_len, stream);
  const auto scales = download(problem.format == Format::kFP8
                                   ? static_cast<const float*>(problem.kv_scales)
                                   : nullptr,
                               problem.seq_len_kv, stream);
  const auto meta =
      download(problem.schedule_meta, metadata_ints(problem.schedule_workers), stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (checking mode)");

  PrefillProblem mirror = problem;
  mirror.k_start = start.data();
  mirror.k_end = end.data();
  mirror.kv_scales = data_or_null(scales);
  mirror.schedule_meta = data_or_null(meta);
  input_checks::check_prefill(mirror);
}

void check_paged_inputs(const PagedProblem& problem, cudaStream_t stream) {
  const DeviceGuard guard(problem.device.index);
  const std::int64_t rows = problem.batch * problem.next_n;
  const auto lens = download(problem.context_lens,
                             problem.context_lens_2d ? rows : problem.batch, stream);
  // The table's rows up to the last column of its last row (row stride >= 0).
  const std::int64_t table_ints =
      problem.batch > 0 && problem.max_blocks > 0
          ? (problem.batch - 1) * problem.block_table_row_stride + problem.max_blocks
          : 0;
  const auto table = download(problem.block_table, table_ints, stream);
  const auto indices = download(problem.indices, problem.batch, stream);
  const auto meta =
      download(problem.schedule_meta, metadata_ints(problem.schedule_workers), stream);
  std::vector<float> scales;
  if (problem.format == Format::kFP8 && problem.num_blocks > 0) {
    const std::size_t run_bytes = static_cast<std::size_t>(problem.block_kv) * sizeof(float);
    scales.resize(static_cast<std::size_t>(problem.num_blocks * problem.block_kv));
    check_cuda(cudaMemcpy2DAsync(scales.data(), run_bytes,
                                 problem.kv_cache + problem.block_kv * problem.token_bytes,
                                 static_cast<std::size_t>(problem.block_stride_bytes), run_bytes,
                                 static_cast<std::size_t>(problem.num_blocks),
                                 cudaMemcpyDeviceToHost, stream),
               "cudaMemcpy2DAsync (checking mode)");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (checking mode)");

  PagedProblem mirror = problem;
  mirror.context_lens = lens.data();
  mirror.block_table = data_or_null(table);
  mirror.indices = data_or_null(indices);
  mirror.schedule_meta = meta.data();
  input_checks::check_paged(mirror, {data_or_null(scales), problem.block_kv});
}

}  // namespace mqa_logits::cuda_backend
