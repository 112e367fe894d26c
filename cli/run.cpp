#include "run.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "support/topk_oracle.hpp"
#include "text.hpp"

namespace mqa_logits::cli {
namespace {

DType value_dtype(const Options& options) {
  return options.bf16 ? DType::kBFloat16 : DType::kFloat32;
}

std::string dtypes_and_cleaning(const Options& options) {
  return format_string("%s, %s weights and logits, %s", format_name(options.format),
                       dtype_name(value_dtype(options)),
                       options.clean_logits ? "clean" : "not clean");
}

// ---- the operation-specific parts, one overload per workload type ----------------------------

// What a prefill and a decode spec take alike from the command line.
template <class Spec>
Spec spec_of(const Options& options) {
  Spec spec;
  spec.format = options.format;
  spec.num_heads = options.head_count;
  spec.head_dim = options.head_dim;
  spec.weights_dtype = spec.logits_dtype = value_dtype(options);
  spec.clean_logits = options.clean_logits;
  spec.seed = options.seed;
  return spec;
}

support::PrefillSpec prefill_spec(const Options& options) {
  auto spec = spec_of<support::PrefillSpec>(options);
  spec.seq_len = options.seq_len;
  spec.seq_len_kv = options.seq_len_kv;
  spec.windows = options.windows;
  spec.request_lengths = options.request_lengths;
  spec.sliding_window = options.sliding_window;
  spec.max_seqlen_k = options.max_seqlen_k;
  return spec;
}

support::PagedSpec paged_spec(const Options& options) {
  auto spec = spec_of<support::PagedSpec>(options);
  spec.batch = options.batch;
  spec.next_n = options.next_n;
  spec.block_kv = options.block_kv;
  spec.avg_context = options.avg_context;
  spec.context_jitter = kContextJitter;
  return spec;
}

// "packed windows (3 requests)", "sliding windows of 2048 keys", "causal windows".
std::string describe_windows(const support::PrefillSpec& s) {
  switch (s.windows) {
    case support::WindowKind::kPacked:
      return format_string("packed windows (%zu requests)", s.request_lengths.size());
    case support::WindowKind::kSliding:
      return format_string("sliding windows of %lld keys",
                           static_cast<long long>(s.sliding_window));
    default:
      return std::string(support::window_kind_name(s.windows)) + " windows";
  }
}

std::string describe(const support::PrefillWorkload& w, const Options& options) {
  const auto& s = w.spec;
  const std::string compressed =
      s.max_seqlen_k > 0 ? format_string("output compressed to %lld columns, ",
                                         static_cast<long long>(s.max_seqlen_k))
                         : "";
  return format_string("prefill S=%lld T=%lld H=%lld D=%lld, %s, ",
                       static_cast<long long>(s.seq_len), static_cast<long long>(s.seq_len_kv),
                       static_cast<long long>(s.num_heads), static_cast<long long>(s.head_dim),
                       describe_windows(s).c_str()) +
         compressed + dtypes_and_cleaning(options) +
         (options.schedule ? "" : ", no schedule metadata");
}

std::string describe(const support::PagedWorkload& w, const Options& options) {
  const auto& s = w.spec;
  return format_string(
             "decode B=%lld N=%lld H=%lld D=%lld, contexts %lld +-%d%% (max %lld), block_kv=%d, ",
             static_cast<long long>(s.batch), static_cast<long long>(s.next_n),
             static_cast<long long>(s.num_heads), static_cast<long long>(s.head_dim),
             static_cast<long long>(s.avg_context), static_cast<int>(kContextJitter * 100),
             static_cast<long long>(w.max_context_len), s.block_kv) +
         dtypes_and_cleaning(options);
}

// An int32 [num_sms + 1, 2] schedule-metadata buffer in memory the executor owns.
TensorView allocate_metadata(Executor& executor, int num_sms) {
  const std::int64_t rows = schedule_meta_rows(num_sms);
  void* data = executor.allocate_poisoned(rows * 2 * sizeof(std::int32_t));
  return TensorView::contiguous(data, DType::kInt32, {rows, 2}, executor.device());
}

// Schedule metadata computed where the inputs live (prefill: none with --no-schedule).
std::optional<TensorView> schedule_metadata(const support::PrefillWorkload& w,
                                            const support::PrefillInputs& in, Executor& executor,
                                            const Options& options) {
  if (!options.schedule) return std::nullopt;
  const TensorView meta = allocate_metadata(executor, get_num_sms());
  get_mqa_logits_metadata(in.k_start, in.k_end, w.spec.seq_len_kv,
                          static_cast<int>(w.spec.num_heads), meta, executor.stream());
  return meta;
}

TensorView schedule_metadata(const support::PagedWorkload& w, const support::PagedInputs& in,
                             Executor& executor, const Options&) {
  const int num_sms = get_num_sms();
  const TensorView meta = allocate_metadata(executor, num_sms);
  get_paged_mqa_logits_metadata(in.context_lens, w.spec.block_kv, num_sms, meta, in.options.indices,
                                executor.stream());
  return meta;
}

void call(const support::PrefillWorkload&, const support::PrefillInputs& in,
          const std::optional<TensorView>& meta, const TensorView& logits, cudaStream_t stream) {
  MqaLogitsOptions options = in.options;
  options.schedule_meta = meta;
  options.stream = stream;
  mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, logits, options);
}

void call(const support::PagedWorkload& w, const support::PagedInputs& in, const TensorView& meta,
          const TensorView& logits, cudaStream_t stream) {
  PagedMqaLogitsOptions options = in.options;
  options.stream = stream;
  paged_mqa_logits(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                   w.max_context_len, logits, options);
}

void call_topk(const support::PrefillWorkload&, const support::PrefillInputs& in,
               const std::optional<TensorView>& meta, std::int64_t topk,
               const TensorView& indices, const TensorView& workspace, cudaStream_t stream) {
  MqaTopkOptions options;
  options.schedule_meta = meta;
  options.stream = stream;
  mqa_topk(in.q, in.kv, in.weights, in.k_start, in.k_end, topk, indices, workspace, options);
}

void call_topk(const support::PagedWorkload& w, const support::PagedInputs& in,
               const TensorView& meta, std::int64_t topk, const TensorView& indices,
               const TensorView& workspace, cudaStream_t stream) {
  PagedMqaTopkOptions options;
  options.indices = in.options.indices;
  options.stream = stream;
  paged_mqa_topk(in.q, in.kv_cache, in.weights, in.context_lens, in.block_table, meta,
                 w.max_context_len, topk, indices, workspace, options);
}

std::int64_t topk_workspace_bytes(const support::PrefillWorkload& w, std::int64_t topk) {
  return mqa_topk_workspace_bytes(w.spec.seq_len, w.spec.seq_len_kv, topk);
}

std::int64_t topk_workspace_bytes(const support::PagedWorkload& w, std::int64_t topk) {
  return paged_mqa_topk_workspace_bytes(w.num_rows, w.max_context_len, topk);
}

// The oracle's selection of one row of host logits (full rows), as the operation reports it.
std::vector<std::int64_t> expected_topk(const support::PrefillWorkload& w, const void* row_logits,
                                        std::int64_t row, std::int64_t topk) {
  const std::int64_t start = w.k_start()[static_cast<std::size_t>(row)];
  const std::int64_t first = std::clamp<std::int64_t>(start, 0, w.spec.seq_len_kv);
  const std::int64_t last =
      std::clamp<std::int64_t>(w.k_end()[static_cast<std::size_t>(row)], first, w.spec.seq_len_kv);
  auto columns = support::oracle_topk_columns(row_logits, w.spec.logits_dtype, first,
                                              last - first, topk);
  for (auto& c : columns) c -= start;
  return columns;
}

std::vector<std::int64_t> expected_topk(const support::PagedWorkload& w, const void* row_logits,
                                        std::int64_t row, std::int64_t topk) {
  const auto table = w.block_table();
  const std::int64_t table_row = w.table_row(row);
  const std::int64_t length = std::clamp<std::int64_t>(
      w.context_length(row), 0, std::min(w.max_context_len, w.max_blocks * w.spec.block_kv));
  return support::oracle_topk_columns(
      row_logits, w.spec.logits_dtype, 0, length, topk, [&](std::int64_t p) {
        const std::int32_t id =
            table[static_cast<std::size_t>(table_row * w.max_blocks + p / w.spec.block_kv)];
        return id < 0 || id >= w.num_blocks;
      });
}

// The top-k operation on the run's inputs: timed, and its sampled rows against the oracle over
// the logits the run read back.
template <typename Workload, typename Inputs, typename Meta>
TopkResult run_topk(const Workload& w, const Inputs& in, const Meta& meta,
                    const std::vector<std::byte>& host_logits, const Options& options,
                    Executor& executor, Progress& progress) {
  TopkResult result;
  result.topk = options.topk;
  const std::int64_t rows = w.layout.rows;
  const auto index_bytes = static_cast<std::size_t>(rows * options.topk) * sizeof(std::int32_t);
  void* indices = executor.allocate_poisoned(index_bytes);
  const auto workspace_bytes = topk_workspace_bytes(w, options.topk);
  void* workspace = executor.allocate_poisoned(static_cast<std::size_t>(workspace_bytes));
  const TensorView indices_view =
      TensorView::contiguous(indices, DType::kInt32, {rows, options.topk}, executor.device());
  const TensorView workspace_view =
      TensorView::contiguous(workspace, DType::kUInt8, {workspace_bytes}, executor.device());
  const auto enqueue = [&] {
    call_topk(w, in, meta, options.topk, indices_view, workspace_view, executor.stream());
  };
  const CallTiming timing = executor.time_calls(
      enqueue, options.iters.value_or(executor.default_iters()),
      {progress, std::string("top-k"), std::nullopt});
  std::vector<double> seconds = timing.seconds;
  std::sort(seconds.begin(), seconds.end());
  result.seconds_per_call = seconds[seconds.size() / 2];

  const std::vector<std::byte> host_indices = executor.read_back(indices, index_bytes);
  const auto* got = reinterpret_cast<const std::int32_t*>(host_indices.data());
  const std::size_t element = dtype_size(w.spec.logits_dtype);
  for (const std::int64_t row : support::sample_rows(rows, options.verify_rows, options.seed)) {
    const auto want = expected_topk(
        w, host_logits.data() + static_cast<std::size_t>(row * w.layout.row_stride) * element,
        row, options.topk);
    bool same = true;
    for (std::int64_t i = 0; i < options.topk; ++i) {
      const std::int64_t expected =
          i < static_cast<std::int64_t>(want.size()) ? want[static_cast<std::size_t>(i)] : -1;
      same = same && got[row * options.topk + i] == expected;
    }
    ++result.rows_checked;
    result.rows_mismatched += same ? 0 : 1;
  }
  return result;
}

// In-window elements of output rows [first, end).
std::int64_t count_pairs(const support::PrefillWorkload& w, std::int64_t first, std::int64_t end) {
  const auto starts = w.k_start();
  const auto ends = w.k_end();
  std::int64_t pairs = 0;
  for (std::int64_t i = first; i < end; ++i) {
    const std::int64_t lo = std::max<std::int64_t>(starts[i], 0);
    const std::int64_t hi = std::min<std::int64_t>(ends[i], w.spec.seq_len_kv);
    pairs += std::max<std::int64_t>(hi - lo, 0);
  }
  return pairs;
}

std::int64_t row_length(const support::PagedWorkload& w, std::int64_t row) {
  return std::clamp<std::int64_t>(w.context_length(row), 0, w.max_context_len);
}

std::int64_t count_pairs(const support::PagedWorkload& w, std::int64_t first, std::int64_t end) {
  std::int64_t pairs = 0;
  for (std::int64_t r = first; r < end; ++r) pairs += row_length(w, r);
  return pairs;
}

std::int64_t total_bytes(const std::vector<support::HostBuffer>& buffers) {
  std::int64_t bytes = 0;
  for (const auto& buffer : buffers) bytes += static_cast<std::int64_t>(buffer.bytes.size());
  return bytes;
}

// Bytes of input a call must read once: every buffer whole.
std::int64_t input_bytes(const support::PrefillWorkload& w) { return total_bytes(w.buffers); }

// Decode reads the keys of each sequence up to its longest row, not the whole cache (which holds
// unused blocks).
std::int64_t input_bytes(const support::PagedWorkload& w) {
  std::map<std::int64_t, std::int64_t> tokens_per_sequence;
  for (std::int64_t r = 0; r < w.num_rows; ++r) {
    auto& tokens = tokens_per_sequence[w.sequence(r)];
    tokens = std::max(tokens, row_length(w, r));
  }
  std::int64_t key_bytes = 0;
  for (const auto& [sequence, tokens] : tokens_per_sequence) {
    key_bytes += tokens * (w.token_bytes + static_cast<std::int64_t>(sizeof(float)));
  }
  const auto cache_bytes =
      static_cast<std::int64_t>(w.buffers[support::PagedWorkload::kKvCache].bytes.size());
  return total_bytes(w.buffers) - cache_bytes + key_bytes;
}

// ---- an estimate of one call's time, for the progress line (CPU) -----------------------------

// Less work than this ends within seconds on a CPU: the first call's own time will do.
constexpr double kEstimateAboveFlops = 1e10;
// The slice timed for the estimate: this fraction of the rows, or one per worker if more.
constexpr std::int64_t kSliceFraction = 32;

// Entries [first, first + count) of dim 0 of a view.
TensorView leading(TensorView view, std::int64_t first, std::int64_t count) {
  view.data = static_cast<std::byte*>(view.data) +
              first * view.strides[0] * static_cast<std::int64_t>(dtype_size(view.dtype));
  view.shape[0] = count;
  return view;
}

// A call's rows come in units that can be cut apart: prefill query rows, decode sequences (of
// next_n rows each, sharing a block-table row and a context length).
std::int64_t units(const support::PrefillWorkload& w) { return w.spec.seq_len; }
std::int64_t units(const support::PagedWorkload& w) { return w.spec.batch; }
std::int64_t rows_per_unit(const support::PrefillWorkload&) { return 1; }
std::int64_t rows_per_unit(const support::PagedWorkload& w) { return w.spec.next_n; }
const char* unit_name(const support::PrefillWorkload&) { return "query rows"; }
const char* unit_name(const support::PagedWorkload&) { return "sequences"; }

// The inputs of units [first, first + count): a call on them is a valid call of its own.
support::PrefillInputs slice(const support::PrefillInputs& in, std::int64_t first,
                             std::int64_t count) {
  support::PrefillInputs part = in;
  part.q.values = leading(in.q.values, first, count);
  if (in.q.scales) part.q.scales = leading(*in.q.scales, first, count);
  part.weights = leading(in.weights, first, count);
  part.k_start = leading(in.k_start, first, count);
  part.k_end = leading(in.k_end, first, count);
  return part;
}

support::PagedInputs slice(const support::PagedInputs& in, std::int64_t first, std::int64_t count) {
  const std::int64_t next_n = in.q.values.shape[1];
  support::PagedInputs part = in;
  part.q.values = leading(in.q.values, first, count);
  if (in.q.scales) part.q.scales = leading(*in.q.scales, first, count);
  part.weights = leading(in.weights, first * next_n, count * next_n);
  part.context_lens = leading(in.context_lens, first, count);
  part.block_table = leading(in.block_table, first, count);
  return part;
}

// Times one call on a slice from the middle of the rows (causal windows grow along the rows)
// and scales it by the in-window pairs: the CPU backend's time follows them. No estimate on a
// GPU (calls take microseconds) or for a problem that ends soon anyway.
template <typename Workload, typename Inputs>
std::optional<double> estimate_call_seconds(const Workload& w, const Inputs& in,
                                            const TensorView& logits, const RunResult& result,
                                            const Options& options, Executor& executor,
                                            Progress& progress) {
  if (executor.device().type != DeviceType::kCPU || result.flops < kEstimateAboveFlops) {
    return std::nullopt;
  }
  const std::int64_t total = units(w);
  const std::int64_t count = std::max<std::int64_t>(total / kSliceFraction, get_num_sms());
  if (2 * count > total) return std::nullopt;  // as dear as the call itself
  const std::int64_t first = (total - count) / 2;
  const std::int64_t rows = rows_per_unit(w);
  const std::int64_t pairs = count_pairs(w, first * rows, (first + count) * rows);
  if (pairs == 0) return std::nullopt;
  progress.update(format_string("%s: timing %lld of %lld %s to estimate the time per call",
                                operation_name(options.operation), static_cast<long long>(count),
                                static_cast<long long>(total), unit_name(w)));
  const Inputs part = slice(in, first, count);
  const auto meta = schedule_metadata(w, part, executor, options);
  const auto start = std::chrono::steady_clock::now();
  call(w, part, meta, leading(logits, first * rows, count * rows), executor.stream());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds * static_cast<double>(result.pairs) / static_cast<double>(pairs);
}

// ---- the shared flow ----------------------------------------------------------------------------

template <typename Workload>
std::vector<Check> verify(const Workload& workload, const std::vector<std::byte>& logits,
                          const Options& options, Progress& progress) {
  std::vector<Check> checks;
  if (options.verify_rows == 0) return checks;
  const auto rows = support::sample_rows(workload.layout.rows, options.verify_rows, options.seed);
  const auto& spec = workload.spec;
  for (const auto operands : {support::Operands::kQuantized, support::Operands::kUnquantized}) {
    progress.update(format_string("verifying %zu rows against the float64 formula on the %s inputs",
                                  rows.size(), support::operands_name(operands)));
    Check check{
        operands,
        support::spec_tolerance(spec.format, spec.weights_dtype, spec.logits_dtype, operands),
        {}};
    check.result = support::verify_rows(workload, logits.data(), rows, operands, check.tolerance);
    checks.push_back(std::move(check));
  }
  return checks;
}

template <typename Workload>
RunResult run_workload(const Workload& workload, const Options& options, Executor& executor,
                       Progress& progress) {
  RunResult result;
  result.shape = describe(workload, options);
  result.executor = executor.description();
  result.rows = workload.layout.rows;
  result.cols = workload.layout.cols;
  result.pairs = count_pairs(workload, 0, result.rows);
  result.flops = 2.0 * workload.spec.num_heads * workload.spec.head_dim * result.pairs;
  const std::int64_t written = options.clean_logits ? result.rows * result.cols : result.pairs;
  result.bytes = static_cast<double>(input_bytes(workload)) +
                 static_cast<double>(written) * dtype_size(workload.spec.logits_dtype);

  progress.update(
      format_string("placing the inputs in %s memory", device_name(executor.device().type)));
  const std::vector<void*> pointers = executor.place(workload.buffers);
  const auto inputs = workload.inputs(pointers, executor.device());
  const auto meta = schedule_metadata(workload, inputs, executor, options);
  void* logits = executor.allocate_poisoned(workload.logits_bytes());
  const TensorView logits_view = workload.logits_view(logits, executor.device());

  result.iters = options.iters.value_or(executor.default_iters());
  const CallsProgress calls_progress{
      progress, operation_name(options.operation),
      estimate_call_seconds(workload, inputs, logits_view, result, options, executor, progress)};
  const CallTiming timing =
      executor.time_calls([&] { call(workload, inputs, meta, logits_view, executor.stream()); },
                          result.iters, calls_progress);
  result.timing_method = timing.method;
  std::vector<double> seconds = timing.seconds;
  std::sort(seconds.begin(), seconds.end());
  result.seconds_per_call = seconds[seconds.size() / 2];
  result.min_seconds_per_call = seconds.front();

  result.rates = executor.measure_rates();
  // The buffer holds the last call's output; anything no call wrote is still NaN poison.
  const std::vector<std::byte> host_logits = executor.read_back(logits, workload.logits_bytes());
  result.checks = verify(workload, host_logits, options, progress);
  if (options.topk > 0) {
    result.topk = run_topk(workload, inputs, meta, host_logits, options, executor, progress);
  }
  progress.finish();
  return result;
}

template <typename MakeWorkload>
RunResult generate_and_run(const MakeWorkload& make_workload, const Options& options,
                           Executor& executor, Progress& progress) {
  progress.update(format_string("generating the %s inputs", operation_name(options.operation)));
  return run_workload(make_workload(), options, executor, progress);
}

// The call of run_workload, once, with no timing or verification: see probe_call().
template <typename Workload>
void call_once(const Workload& workload, const Options& options, Executor& executor) {
  const std::vector<void*> pointers = executor.place(workload.buffers);
  const auto inputs = workload.inputs(pointers, executor.device());
  const auto meta = schedule_metadata(workload, inputs, executor, options);
  void* logits = executor.allocate_poisoned(workload.logits_bytes());
  call(workload, inputs, meta, workload.logits_view(logits, executor.device()), executor.stream());
}

}  // namespace

Verdict RunResult::verdict() const {
  const auto failed = [](const Check& c) { return !c.result.ok; };
  const auto compared = [](const Check& c) { return c.result.elements_checked > 0; };
  if (std::any_of(checks.begin(), checks.end(), failed)) return Verdict::kFailed;
  if (topk && topk->rows_mismatched > 0) return Verdict::kFailed;
  if (checks.empty() || !std::all_of(checks.begin(), checks.end(), compared)) {
    return Verdict::kNotVerified;
  }
  return Verdict::kPassed;
}

std::optional<double> RunResult::floor_seconds() const {
  if (!rates || rates->peak_flops <= 0.0 || rates->copy_bandwidth <= 0.0) return std::nullopt;
  return std::max(flops / rates->peak_flops, bytes / rates->copy_bandwidth);
}

std::optional<double> RunResult::roofline_fraction() const {
  const auto floor = floor_seconds();
  if (!floor) return std::nullopt;
  return *floor / seconds_per_call;
}

RunResult run_case(const Options& options, Executor& executor, Progress& progress) {
  if (options.operation == Operation::kPrefill) {
    return generate_and_run([&] { return support::make_prefill_workload(prefill_spec(options)); },
                            options, executor, progress);
  }
  return generate_and_run([&] { return support::make_paged_workload(paged_spec(options)); },
                          options, executor, progress);
}

void probe_call(const Options& options, Executor& executor) {
  if (options.operation == Operation::kPrefill) {
    support::PrefillSpec spec = prefill_spec(options);
    spec.seq_len = spec.seq_len_kv = 1;
    spec.windows = support::WindowKind::kCausal;
    spec.request_lengths.clear();
    spec.sliding_window = 0;
    spec.max_seqlen_k = std::min<std::int64_t>(spec.max_seqlen_k, 1);
    call_once(support::make_prefill_workload(spec), options, executor);
    return;
  }
  support::PagedSpec spec = paged_spec(options);
  spec.batch = 1;
  spec.avg_context = spec.next_n;  // every row of the sequence then has a key
  spec.context_jitter = 0.0;
  call_once(support::make_paged_workload(spec), options, executor);
}

}  // namespace mqa_logits::cli
