// The public entry points: validate, then hand the descriptor to the backend of its device.
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include "cpu/cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"
#include "input_checks.hpp"
#include "metadata.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "schedule.hpp"
#include "validate.hpp"
#include "validate_checks.hpp"

namespace mqa_logits {
namespace {

constexpr int kMaxWorkersWithoutDevice = 4096;

// 0 until set_num_sms(): the default then follows the current CUDA device.
std::atomic<int> configured_num_sms{0};

// The CPU backend splits rows over every hardware thread; the SM setting is for GPUs.
int cpu_workers() {
  const unsigned threads = std::thread::hardware_concurrency();
  return threads == 0 ? 1 : static_cast<int>(threads);
}

bool on_cuda(const Device& device) { return device.type == DeviceType::kCUDA; }

// `rows` (named `rows_argument`) x `cols` in padded rows; refuses a layout whose bytes do not fit
// 64 bits (no buffer could hold it, and its size would wrap).
OutputLayout padded_layout(const char* rows_argument, std::int64_t rows, std::int64_t cols,
                           DType logits_dtype) {
  if (logits_dtype != DType::kFloat32 && logits_dtype != DType::kBFloat16) {
    checks::refuse("logits_dtype", std::string("expected float32 or bfloat16, got ") +
                                       dtype_name(logits_dtype));
  }
  const std::int64_t row_unit =
      kLogitsRowAlignmentBytes / static_cast<std::int64_t>(dtype_size(logits_dtype));
  const std::int64_t row_stride = schedule::ceil_div(cols, row_unit) * row_unit;
  const std::int64_t row_bytes = row_stride * static_cast<std::int64_t>(dtype_size(logits_dtype));
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(rows, row_bytes, &bytes)) {
    checks::refuse(rows_argument, "expected rows whose padded output (" +
                                      std::to_string(row_stride) + " elements a row) fits 2^63 "
                                      "bytes, got " + std::to_string(rows));
  }
  return {rows, cols, row_stride};
}

// Whether a call checks its inputs (input_checks.hpp): as it asks, else the CPU backend does and
// the CUDA backend does when MQA_LOGITS_CHECK_INPUTS=1 (read at the first call). On a CUDA
// device the checks copy inputs to the host and synchronize the stream, which a stream capturing
// a CUDA graph cannot do (it would invalidate the capture): asked for there, they are refused;
// from the environment, such calls run unchecked.
bool checks_inputs(const std::optional<bool>& requested, const Device& device,
                   cudaStream_t stream) {
  static const bool from_environment = [] {
    const char* value = std::getenv("MQA_LOGITS_CHECK_INPUTS");
    return value != nullptr && std::string_view(value) == "1";
  }();
  if (device.type == DeviceType::kCPU) return requested.value_or(true);
  const bool check = requested.value_or(from_environment);
  if (!check || !cuda_backend::stream_capturing(device.index, stream)) return check;
  if (requested.has_value()) {
    checks::refuse("check_inputs",
                   "expected a stream that is not capturing a CUDA graph (the checks copy device "
                   "inputs to the host and synchronize), got one that is");
  }
  return false;
}

void launch_prefill(const PrefillProblem& problem, const std::optional<bool>& check_inputs,
                    cudaStream_t stream) {
  if (problem.seq_len == 0 || problem.out_cols == 0) return;  // no output element to write
  const bool check = checks_inputs(check_inputs, problem.device, stream);
  if (on_cuda(problem.device)) {
    if (check) cuda_backend::check_prefill_inputs(problem, stream);
    cuda_backend::run_prefill(problem, stream);
  } else {
    if (check) input_checks::check_prefill(problem);
    cpu::run_prefill(problem, cpu_workers());
  }
}

void launch_paged(const PagedProblem& problem, const std::optional<bool>& check_inputs,
                  cudaStream_t stream) {
  if (problem.batch * problem.next_n == 0 || problem.max_context_len == 0) return;
  const bool check = checks_inputs(check_inputs, problem.device, stream);
  if (on_cuda(problem.device)) {
    if (check) cuda_backend::check_paged_inputs(problem, stream);
    cuda_backend::run_paged(problem, stream);
  } else {
    if (check) input_checks::check_paged(problem, input_checks::host_paged_scales(problem));
    cpu::run_paged(problem, cpu_workers());
  }
}

}  // namespace

OutputLayout mqa_logits_output_layout(std::int64_t seq_len, std::int64_t seq_len_kv,
                                      std::int64_t max_seqlen_k, DType logits_dtype) {
  checks::expect_at_least("seq_len", "seq_len", seq_len, 0);
  checks::expect_in_range("seq_len_kv", "seq_len_kv", seq_len_kv, 0, checks::kMaxColumns);
  checks::expect_in_range("max_seqlen_k", "max_seqlen_k", max_seqlen_k, 0, checks::kMaxColumns);
  return padded_layout("seq_len", seq_len, max_seqlen_k > 0 ? max_seqlen_k : seq_len_kv,
                       logits_dtype);
}

void mqa_logits(const QuantizedTensor& q, const QuantizedTensor& kv, const TensorView& weights,
                const TensorView& k_start, const TensorView& k_end, const TensorView& logits,
                const MqaLogitsOptions& options) {
  launch_prefill(validate_prefill(q, kv, weights, k_start, k_end, logits, options),
                 options.check_inputs, options.stream);
}

OutputLayout paged_mqa_logits_output_layout(std::int64_t num_rows, std::int64_t max_context_len,
                                            DType logits_dtype) {
  checks::expect_at_least("num_rows", "num_rows", num_rows, 0);
  checks::expect_in_range("max_context_len", "max_context_len", max_context_len, 0, checks::kMaxColumns);
  return padded_layout("num_rows", num_rows, max_context_len, logits_dtype);
}

void paged_mqa_logits(const QuantizedTensor& q, const TensorView& kv_cache,
                      const TensorView& weights, const TensorView& context_lens,
                      const TensorView& block_table, const TensorView& schedule_meta,
                      std::int64_t max_context_len, const TensorView& logits,
                      const PagedMqaLogitsOptions& options) {
  launch_paged(validate_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                              max_context_len, logits, options),
               options.check_inputs, options.stream);
}

std::int64_t schedule_meta_rows(int num_sms) {
  checks::expect_in_range("num_sms", "num_sms", num_sms, 1, checks::kMaxWorkers);
  return static_cast<std::int64_t>(num_sms) + 1;
}

void get_paged_mqa_logits_metadata(const TensorView& context_lens, int block_kv, int num_sms,
                                   const TensorView& out,
                                   const std::optional<TensorView>& indices,
                                   cudaStream_t stream) {
  const PagedMetadataRequest r =
      validate_paged_metadata(context_lens, block_kv, num_sms, out, indices);
  if (on_cuda(r.device)) {
    cuda_backend::paged_metadata(r.device.index, r.context_lens, r.batch, r.lens_cols, r.lens_2d,
                                 r.indices, r.workers, r.out, stream);
  } else {
    host::paged_metadata(r.context_lens, r.batch, r.lens_cols, r.lens_2d, r.indices, r.workers,
                         r.out);
  }
}

void get_mqa_logits_metadata(const TensorView& k_start, const TensorView& k_end,
                             std::int64_t seq_len_kv, int num_heads, const TensorView& out,
                             cudaStream_t stream) {
  const PrefillMetadataRequest r =
      validate_prefill_metadata(k_start, k_end, seq_len_kv, num_heads, get_num_sms(), out);
  if (on_cuda(r.device)) {
    cuda_backend::prefill_metadata(r.device.index, r.k_start, r.k_end, r.seq_len, r.seq_len_kv,
                                   r.num_heads, r.workers, r.out, stream);
  } else {
    host::prefill_metadata(r.k_start, r.k_end, r.seq_len, r.seq_len_kv, r.num_heads, r.workers,
                           r.out);
  }
}

int get_num_sms() {
  const int configured = configured_num_sms.load(std::memory_order_relaxed);
  if (configured > 0) return configured;
  if (!cuda_backend::any_device()) return cpu_workers();
  return cuda_backend::device_limits(cuda_backend::current_device()).sm_count;
}

void set_num_sms(int num_sms) {
  const bool device = cuda_backend::any_device();
  const int current = device ? cuda_backend::current_device() : 0;
  const int limit =
      device ? cuda_backend::device_limits(current).sm_count : kMaxWorkersWithoutDevice;
  if (num_sms < 0 || num_sms > limit) {
    const std::string bound = device ? " (the SMs of cuda:" + std::to_string(current) + ")"
                                     : " (no CUDA device is visible)";
    checks::refuse("num_sms", "expected 0 <= num_sms <= " + std::to_string(limit) + bound +
                                  ", got " + std::to_string(num_sms));
  }
  configured_num_sms.store(num_sms, std::memory_order_relaxed);
}

bool cuda_backend_available() { return cuda_backend::available(); }

}  // namespace mqa_logits
