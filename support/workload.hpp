// Random, reproducible workloads in host memory for the tests, the CLI and the benchmark.
//
// A workload owns every input of one call as raw bytes in exactly the layout the library reads
// (`buffers`, indexed by the workload's Slot enum), the unquantized values they were quantized
// from (for the contract's second accuracy check), and what the call needs besides (output layout,
// options). `inputs(pointers, device)` builds the call's views over copies of the buffers living
// anywhere, e.g. on a GPU:
//
//   const auto w = make_prefill_workload(spec);
//   std::vector<void*> dev;  // dev[k]: a device copy of w.buffers[k].bytes
//   const auto in = w.inputs(dev, {DeviceType::kCUDA, 0});
//   mqa_logits(in.q, in.kv, in.weights, in.k_start, in.k_end, w.logits_view(out, device),
//              in.options);
//
// Randomness: std::mt19937_64, one engine per (seed, stream, row) so that generation order and
// threading never change the data. Distributions are written out (see workload.cpp) and use only
// exact integer/float arithmetic, so the data is bitwise the same on every platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mqa_logits/formats.hpp"
#include "mqa_logits/mqa_logits.hpp"
#include "mqa_logits/tensor.hpp"

namespace mqa_logits::support {

// One input of a call: its name (as the API argument) and its bytes.
struct HostBuffer {
  std::string name;
  std::vector<std::byte> bytes;
};

// The host pointers of a workload's buffers (what `inputs` takes for host calls).
std::vector<void*> host_pointers(const std::vector<HostBuffer>& buffers);

// Element [i, j] of a logits buffer of `layout` (fp32 or bf16) as a double.
double read_logit(const void* logits, DType dtype, const OutputLayout& layout, std::int64_t row,
                  std::int64_t col);

// ---------------------------------------------------------------------------------------------
// Prefill
// ---------------------------------------------------------------------------------------------

// The key window of every query row (T = seq_len_kv, S = seq_len).
enum class WindowKind : std::uint8_t {
  kCausal,  // row i sees [0, T - S + i + 1): the last S keys are the queries' own tokens
  kRandom,  // random start and end, including empty, inverted, negative starts and ends past T
  kFull,    // every row sees [0, T)
  // Context-parallel shard: the sequence is cut into 2R chunks of S/2 tokens (R = T / S, at
  // least 1) and this rank holds chunks r and 2R-1-r (r = R/3, the zigzag split). Row i of the
  // first half sees [0, r*S/2 + i + 1), row i of the second half [0, (2R-1-r)*S/2 + i + 1).
  kContextParallel,
  // Several requests packed into one call, as vLLM and SGLang batch prefills: the keys of all
  // requests in one buffer and each request's queries are its own tokens, so S == T == the sum of
  // PrefillSpec::request_lengths. Row i of the request whose first token is o sees [o, i + 1):
  // block-diagonal causal, mostly short windows.
  kPacked,
  // Causal with a sliding window of W = PrefillSpec::sliding_window keys: row i sees
  // [max(0, e - W), e) with e = T - S + i + 1.
  kSliding,
};
const char* window_kind_name(WindowKind kind);

struct PrefillSpec {
  Format format = Format::kFP8;
  std::int64_t seq_len = 0;     // S
  std::int64_t seq_len_kv = 0;  // T
  std::int64_t num_heads = 64;  // H
  std::int64_t head_dim = 128;  // D
  DType weights_dtype = DType::kFloat32;
  DType logits_dtype = DType::kFloat32;
  bool clean_logits = true;
  std::int64_t max_seqlen_k = 0;  // > 0: compressed output [S, max_seqlen_k]
  WindowKind windows = WindowKind::kCausal;
  // kPacked only (and required there): tokens per request, each >= 1, summing to S and to T.
  std::vector<std::int64_t> request_lengths = {};
  std::int64_t sliding_window = 0;  // kSliding only (and required there): W >= 1 keys per window
  std::int64_t weights_row_stride = 0;  // elements between weight rows; 0 = H (contiguous)
  std::uint64_t seed = 0;
};

struct PrefillInputs {
  QuantizedTensor q;
  QuantizedTensor kv;
  TensorView weights;
  TensorView k_start;
  TensorView k_end;
  MqaLogitsOptions options;  // clean_logits and max_seqlen_k of the spec
};

struct PrefillWorkload {
  enum Slot : std::size_t { kQ, kQScales, kKv, kKvScales, kWeights, kStart, kEnd, kNumSlots };

  PrefillSpec spec;
  std::vector<HostBuffer> buffers;  // kNumSlots entries; kQScales is empty for FP8

  // Unquantized inputs (all bf16-representable): q [S, H, D], kv [T, D], weights [S, H]. The
  // stored weights hold these exact values in either dtype.
  std::vector<float> q_float;
  std::vector<float> kv_float;
  std::vector<float> weights_float;

  OutputLayout layout;  // mqa_logits_output_layout of the spec

  // Views of the inputs with buffer k at pointers[k] on `device`.
  PrefillInputs inputs(std::span<void* const> pointers, Device device) const;
  PrefillInputs host_inputs() const;  // over `buffers` (the library only reads them)

  std::size_t logits_bytes() const;  // layout.rows * layout.row_stride elements
  TensorView logits_view(void* data, Device device = {}) const;

  std::span<const std::int32_t> k_start() const;
  std::span<const std::int32_t> k_end() const;
  std::int64_t out_cols() const { return layout.cols; }
};

// Throws std::invalid_argument on a spec whose window fields do not fit together (see
// PrefillSpec) or whose weights_row_stride is below num_heads.
PrefillWorkload make_prefill_workload(const PrefillSpec& spec);

// Recomputes k_start and k_end from workload.spec after a caller changed only its window fields
// (windows, request_lengths, sliding_window): window patterns of one shape then share the
// expensive queries and keys. Throws as make_prefill_workload does.
void rewrite_windows(PrefillWorkload& workload);

// `count` request lengths in [min_length, max_length] summing to `total`, for packed calls as
// engines see them: many short prompts and a few long ones. Lengths are drawn log-uniformly (an
// octave [min * 2^k, min * 2^(k+1)] uniformly, then a length uniformly in it), scaled to the
// total, clamped to the bounds, and what the rounding and clamping left over is spread evenly over
// the requests with room. Needs 1 <= min_length <= max_length and
// count * min_length <= total <= count * max_length.
std::vector<std::int64_t> uneven_request_lengths(std::int64_t count, std::int64_t total,
                                                 std::uint64_t seed, std::int64_t min_length,
                                                 std::int64_t max_length);

// ---------------------------------------------------------------------------------------------
// Decode (paged KV cache)
// ---------------------------------------------------------------------------------------------

struct PagedSpec {
  Format format = Format::kFP8;
  std::int64_t batch = 1;   // B: sequences, or tokens (rows) in the varlen form
  std::int64_t next_n = 1;  // N (1 in the varlen form)
  std::int64_t num_heads = 64;
  std::int64_t head_dim = 128;
  int block_kv = 64;
  std::int64_t avg_context = 1024;
  double context_jitter = 0.0;  // sequence contexts uniform in [(1-j)avg, (1+j)avg]
  bool lens_2d = false;         // context_lens [B, N] instead of [B]
  // Varlen form: rows are tokens; runs of 1 to 4 consecutive rows form one sequence
  // (indices[r] = its sequence; each row's block-table row holds the sequence's blocks) with
  // causal lengths base, base+1, ...
  bool varlen_indices = false;
  std::int64_t extra_block_stride_bytes = 0;  // multiple of 4: blocks spaced wider than needed
  DType weights_dtype = DType::kFloat32;
  DType logits_dtype = DType::kFloat32;
  bool clean_logits = false;
  std::int64_t max_context_len = 0;  // output columns; 0 = the longest row
  std::uint64_t seed = 0;
  // When not empty: the context_lens tensor itself ([B], or [B * N] when lens_2d), overriding
  // avg_context and jitter (values may be 0 or negative).
  std::vector<std::int32_t> explicit_context_lens;
};

struct PagedInputs {
  QuantizedTensor q;
  TensorView kv_cache;
  TensorView weights;
  TensorView context_lens;
  TensorView block_table;
  PagedMqaLogitsOptions options;  // clean_logits, and indices in the varlen form
};

// The cache holds the blocks of every sequence in a random permutation among ~25% unused blocks.
// Key slots of used blocks past a sequence's length hold valid random keys (as a real cache
// would); unused blocks, the padding between blocks and block-table entries past a sequence's
// last block hold 0xff bytes / -1 (NaN in every format; an invalid block id), so reading them
// shows up in the output.
struct PagedWorkload {
  enum Slot : std::size_t {
    kQ, kQScales, kKvCache, kWeights, kContextLens, kBlockTable, kIndices, kNumSlots
  };

  PagedSpec spec;
  std::vector<HostBuffer> buffers;  // kNumSlots entries; kQScales (FP8), kIndices may be empty

  std::int64_t num_rows = 0;    // B * N
  std::int64_t num_blocks = 0;  // blocks in the cache
  std::int64_t token_bytes = 0;         // D, or D / 2 for MXFP4
  std::int64_t block_stride_bytes = 0;  // block_kv * (token_bytes + 4) + extra
  std::int64_t table_rows = 0;          // B: sequences, or tokens (rows) in the varlen form
  std::int64_t max_blocks = 0;          // block-table columns
  std::int64_t max_context_len = 0;     // output columns

  // Unquantized inputs (bf16-representable): q [B, N, H, D], keys [num_blocks, block_kv, D]
  // (zero in unused blocks), weights [B * N, H].
  std::vector<float> q_float;
  std::vector<float> kv_float;
  std::vector<float> weights_float;

  OutputLayout layout;

  PagedInputs inputs(std::span<void* const> pointers, Device device) const;
  PagedInputs host_inputs() const;

  std::size_t logits_bytes() const;
  TensorView logits_view(void* data, Device device = {}) const;

  std::span<const std::int32_t> context_lens() const;
  std::span<const std::int32_t> block_table() const;  // [table_rows, max_blocks]
  std::span<const std::int32_t> indices() const;      // empty unless varlen
  const std::uint8_t* kv_cache() const;

  // Block-table row of output row r, its sequence, and its context length as the contract
  // defines it (before the clamping rules of src/problem.hpp).
  std::int64_t table_row(std::int64_t row) const;
  std::int64_t sequence(std::int64_t row) const;
  std::int64_t context_length(std::int64_t row) const;
};

PagedWorkload make_paged_workload(const PagedSpec& spec);

// Changes a generated workload's next_n in place, as make_paged_workload would have built it with
// that next_n: every sequence's longest row is its drawn context for any N, so the block table
// and the cache (the expensive part) stay; lengths, queries, weights and layout are rebuilt.
// Throws std::invalid_argument for the varlen form or explicit context lengths.
void rewrite_next_n(PagedWorkload& workload, std::int64_t next_n);

}  // namespace mqa_logits::support
