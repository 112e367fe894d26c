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

void launch_topk(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return;
  if (on_cuda(problem.device)) {
    cuda_backend::run_topk(problem, stream);
  } else {
    cpu::run_topk(problem, cpu_workers());
  }
}

// The logits of the fused operations live in the workspace, in the dtype asked for (validated
// with the weights as the logits operations validate it), by default the weights' (fp32 for
// anything but bf16, which validation then refuses by name).
DType workspace_logits_dtype(const TensorView& weights, const std::optional<DType>& asked) {
  if (asked) {
    if (*asked != DType::kFloat32 && *asked != DType::kBFloat16) {
      checks::refuse("logits_dtype", std::string("expected float32 or bfloat16, got ") +
                                         dtype_name(*asked));
    }
    if (weights.dtype == DType::kBFloat16 && *asked != DType::kBFloat16) {
      checks::refuse("logits_dtype", "expected bfloat16 (weights are bfloat16), got float32");
    }
    return *asked;
  }
  return weights.dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

// The selection over the logits a validated logits problem writes (to the workspace), into the
// call's outputs; the windows are the caller's to fill in.
template <class LogitsProblem>
TopkProblem workspace_selection(const LogitsProblem& logits, std::int64_t topk,
                                const TensorView& topk_indices,
                                const std::optional<TensorView>& values) {
  TopkProblem selection;
  selection.device = logits.device;
  selection.logits = logits.logits;
  selection.logits_dtype = logits.logits_dtype;
  selection.logits_row_stride = logits.logits_row_stride;
  selection.topk = topk;
  selection.indices = static_cast<std::int32_t*>(topk_indices.data);
  selection.values = values ? static_cast<float*>(values->data) : nullptr;
  return selection;
}

std::int64_t fp32_layout_bytes(const OutputLayout& layout) {
  return layout.rows * layout.row_stride * static_cast<std::int64_t>(sizeof(float));
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

void topk_per_row(const TensorView& logits, const std::optional<TensorView>& starts,
                  const TensorView& ends, std::int64_t topk, const TensorView& topk_indices,
                  const TopkPerRowOptions& options) {
  launch_topk(validate_topk_per_row(logits, starts, ends, topk, topk_indices, options),
              options.stream);
}

std::int64_t mqa_topk_workspace_bytes(std::int64_t seq_len, std::int64_t seq_len_kv,
                                      std::int64_t topk) {
  topk_checks::expect_topk(topk);
  return fp32_layout_bytes(mqa_logits_output_layout(seq_len, seq_len_kv, 0, DType::kFloat32));
}

void mqa_topk(const QuantizedTensor& q, const QuantizedTensor& kv, const TensorView& weights,
              const TensorView& k_start, const TensorView& k_end, std::int64_t topk,
              const TensorView& topk_indices, const TensorView& workspace,
              const MqaTopkOptions& options) {
  topk_checks::expect_workspace_form(workspace);
  MqaLogitsOptions logits_options;
  logits_options.clean_logits = false;  // selection reads the windows only
  logits_options.schedule_meta = options.schedule_meta;
  logits_options.check_inputs = options.check_inputs;
  logits_options.stream = options.stream;
  const TensorView logits = topk_checks::workspace_logits(
      workspace, workspace_logits_dtype(weights, options.logits_dtype), q.values.shape[0],
      kv.values.shape[0]);
  const PrefillProblem problem = validate_prefill(q, kv, weights, k_start, k_end, logits,
                                                  logits_options, "workspace");
  topk_checks::expect_topk(topk);
  topk_checks::expect_workspace_bytes(
      workspace, mqa_topk_workspace_bytes(problem.seq_len, problem.seq_len_kv, topk));
  topk_checks::expect_selection_outputs(
      checks::Placement({q.values, "q"}), problem.seq_len, topk, topk_indices, options.values,
      {{q.values, "q"}, {checks::view_or_empty(q.scales), "q_scales"}, {kv.values, "kv"},
       {*kv.scales, "kv_scales"}, {weights, "weights"}, {k_start, "k_start"},
       {k_end, "k_end"}, {workspace, "workspace"},
       {checks::view_or_empty(options.schedule_meta), "schedule_meta"}});

  TopkProblem selection = workspace_selection(problem, topk, topk_indices, options.values);
  selection.rows = problem.seq_len;
  selection.cols = problem.out_cols;
  selection.starts = problem.k_start;
  selection.ends = problem.k_end;
  selection.key_limit = problem.seq_len_kv;
  selection.absolute_indices = options.absolute_indices;
  launch_prefill(problem, options.check_inputs, options.stream);
  launch_topk(selection, options.stream);
}

std::int64_t paged_mqa_topk_workspace_bytes(std::int64_t num_rows, std::int64_t max_context_len,
                                            std::int64_t topk) {
  topk_checks::expect_topk(topk);
  return fp32_layout_bytes(
      paged_mqa_logits_output_layout(num_rows, max_context_len, DType::kFloat32));
}

void paged_mqa_topk(const QuantizedTensor& q, const TensorView& kv_cache,
                    const TensorView& weights, const TensorView& context_lens,
                    const TensorView& block_table, const TensorView& schedule_meta,
                    std::int64_t max_context_len, std::int64_t topk,
                    const TensorView& topk_indices, const TensorView& workspace,
                    const PagedMqaTopkOptions& options) {
  topk_checks::expect_workspace_form(workspace);
  PagedMqaLogitsOptions logits_options;
  logits_options.clean_logits = false;
  logits_options.indices = options.indices;
  logits_options.check_inputs = options.check_inputs;
  logits_options.stream = options.stream;
  std::int64_t rows = 0;  // B * N as q gives them; validate_paged checks q's shape
  if (__builtin_mul_overflow(q.values.shape[0], q.values.shape[1], &rows)) rows = 0;
  const TensorView logits = topk_checks::workspace_logits(
      workspace, workspace_logits_dtype(weights, options.logits_dtype), rows, max_context_len);
  const PagedProblem problem =
      validate_paged(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                     max_context_len, logits, logits_options, "workspace");
  rows = problem.batch * problem.next_n;
  topk_checks::expect_topk(topk);
  topk_checks::expect_workspace_bytes(
      workspace, paged_mqa_topk_workspace_bytes(rows, max_context_len, topk));
  topk_checks::expect_selection_outputs(
      checks::Placement({q.values, "q"}), rows, topk, topk_indices, options.values,
      {{q.values, "q"}, {checks::view_or_empty(q.scales), "q_scales"}, {kv_cache, "kv_cache"},
       {weights, "weights"}, {context_lens, "context_lens"}, {block_table, "block_table"},
       {schedule_meta, "schedule_meta"}, {workspace, "workspace"},
       {checks::view_or_empty(options.indices), "indices"}});

  TopkProblem selection = workspace_selection(problem, topk, topk_indices, options.values);
  selection.rows = rows;
  selection.cols = problem.max_context_len;
  selection.key_limit =
      schedule::paged_key_cap(problem.max_context_len, problem.max_blocks, problem.block_kv);
  selection.context_lens = problem.context_lens;
  selection.lens_2d = problem.context_lens_2d;
  selection.next_n = static_cast<int>(problem.next_n);
  selection.block_table = problem.block_table;
  selection.block_table_row_stride = problem.block_table_row_stride;
  selection.block_kv = problem.block_kv;
  selection.num_blocks = problem.num_blocks;
  selection.cache_slots = options.cache_slots;
  launch_paged(problem, options.check_inputs, options.stream);
  launch_topk(selection, options.stream);
}

void merge_topk(const TensorView& candidate_values, const TensorView& candidate_indices,
                std::int64_t topk, const TensorView& topk_indices,
                const MergeTopkOptions& options) {
  const MergeProblem problem =
      validate_merge_topk(candidate_values, candidate_indices, topk, topk_indices, options);
  if (problem.rows == 0) return;
  const bool check = checks_inputs(options.check_inputs, problem.device, options.stream);
  if (on_cuda(problem.device)) {
    if (check) cuda_backend::check_merge_inputs(problem, options.stream);
    cuda_backend::run_merge(problem, options.stream);
  } else {
    if (check) input_checks::check_merge(problem, problem.indices);
    cpu::run_merge(problem, cpu_workers());
  }
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
