// mqa_logits: lightning-indexer logits of DeepSeek-style sparse attention.
//
//   logit[i, j] = sum_h w[i, h] * relu(s(i, h, j)),   s = scaled dot product of query head and key
//
// Two operations (see docs/contract.md): `mqa_logits` (prefill: queries against one contiguous key
// sequence, a window [start, end) per query) and `paged_mqa_logits` (decode: next_n queries per
// sequence against a paged, fused FP8/MX KV cache). Each entry point dispatches on where its inputs
// live: host memory runs the CPU reference backend, CUDA device memory the GPU kernels. All inputs
// must live on one device. The caller owns every buffer; `*_output_layout` says what to allocate.
//
// Errors: invalid input throws mqa_logits::InvalidArgument (naming the argument, what was expected
// and what was given) before anything is launched or written; a failing CUDA call throws
// mqa_logits::CudaError.
#pragma once

#include <cstdint>
#include <optional>

#include "mqa_logits/errors.hpp"
#include "mqa_logits/tensor.hpp"

// The CUDA runtime's stream handle, declared here so this header needs no CUDA headers.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace mqa_logits {

// Where to allocate logits: `rows` x `cols` logical elements, rows `row_stride` elements apart.
// The stride is padded to a multiple of kLogitsRowAlignmentBytes; any row stride >= cols whose
// rows start 16-byte aligned is accepted too. The CUDA prefill kernel stores whole 16-byte
// granules: each row's elements past `cols` up to the next 16-byte boundary may be written (the
// row stride holds them), so a caller's own buffer must extend to that boundary after its last
// row, as rows x row_stride elements do.
inline constexpr std::int64_t kLogitsRowAlignmentBytes = 1024;
struct OutputLayout {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
};

// ---------------------------------------------------------------------------------------------
// Prefill
// ---------------------------------------------------------------------------------------------

struct MqaLogitsOptions {
  // Every element outside a row's window is exactly -inf. When false such elements are
  // unspecified (never written outside the output buffer).
  bool clean_logits = true;
  // > 0: compressed output [S, max_seqlen_k], element [i, c] = logit[i, start[i] + c].
  std::int64_t max_seqlen_k = 0;
  // Optional result of get_mqa_logits_metadata(); output is bitwise identical without it.
  // Without it the CUDA kernel computes the same even split itself at the start of each call
  // (a pass over the windows); with it that is done once for the calls sharing the windows.
  std::optional<TensorView> schedule_meta;
  // Check the inputs whose values validation does not read (block ids, context lengths, the
  // tables of varlen sequences, key scales, windows against max_seqlen_k, schedule metadata)
  // and refuse them with InvalidArgument. Unset: the backend's default. The CPU backend checks
  // them; the CUDA backend does not (docs/contract.md says what such inputs give), unless the
  // environment variable MQA_LOGITS_CHECK_INPUTS is 1 at the first call. On a CUDA device
  // checking copies them to the host and synchronizes the stream: a debugging mode. On a stream
  // capturing a CUDA graph true is refused (InvalidArgument naming check_inputs) and the
  // environment's default does not check. false on the CPU gives what the GPU gives.
  std::optional<bool> check_inputs;
  cudaStream_t stream = nullptr;
};

OutputLayout mqa_logits_output_layout(std::int64_t seq_len, std::int64_t seq_len_kv,
                                      std::int64_t max_seqlen_k, DType logits_dtype);

// q:       [S, H, D] e4m3 (FP8, MXFP8) or [S, H, D/2] bytes (MXFP4); scales [S, H] int32 (MX)
// kv:      [T, D] e4m3 or [T, D/2] bytes; scales [T] fp32 (FP8, non-negative: the backends
//          apply relu before the key scale) or [T] int32 (MX)
// weights: [S, H] fp32 or bf16, last dim contiguous
// k_start, k_end: [S] int32; row i covers keys max(start, 0) <= j < min(end, T)
// logits:  [S, T] (or [S, max_seqlen_k]) fp32 or bf16, last dim contiguous (see OutputLayout)
// On a CUDA device q, kv, the key scales, weights and logits start 16-byte aligned.
void mqa_logits(const QuantizedTensor& q, const QuantizedTensor& kv, const TensorView& weights,
                const TensorView& k_start, const TensorView& k_end, const TensorView& logits,
                const MqaLogitsOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Decode (paged KV cache)
// ---------------------------------------------------------------------------------------------

struct PagedMqaLogitsOptions {
  bool clean_logits = false;
  // Varlen form ([B] int32, next_n = 1; rows are tokens): sequence labels. Consecutive rows
  // with equal labels are one sequence and share key loads, so their block_table rows must hold
  // the same block ids over the sequence's keys (checked where inputs are checked).
  std::optional<TensorView> indices;
  // Check the inputs whose values validation does not read (block ids, context lengths, the
  // tables of varlen sequences, key scales, windows against max_seqlen_k, schedule metadata)
  // and refuse them with InvalidArgument. Unset: the backend's default. The CPU backend checks
  // them; the CUDA backend does not (docs/contract.md says what such inputs give), unless the
  // environment variable MQA_LOGITS_CHECK_INPUTS is 1 at the first call. On a CUDA device
  // checking copies them to the host and synchronizes the stream: a debugging mode. On a stream
  // capturing a CUDA graph true is refused (InvalidArgument naming check_inputs) and the
  // environment's default does not check. false on the CPU gives what the GPU gives.
  std::optional<bool> check_inputs;
  cudaStream_t stream = nullptr;
};

OutputLayout paged_mqa_logits_output_layout(std::int64_t num_rows, std::int64_t max_context_len,
                                            DType logits_dtype);

// q:            [B, N, H, D] e4m3 or [B, N, H, D/2] bytes; scales [B, N, H] int32 (MX)
// kv_cache:     [num_blocks, block_kv, 1, D + 4] (or D/2 + 4) bytes; block_kv 32 or 64. Each block
//               is block_kv token values followed by block_kv 4-byte scales; stride(0) any
//               multiple of 4 bytes at least block_kv * (D + 4).
// weights:      [B * N, H] fp32 or bf16
// context_lens: [B, N] (row b*N+t has L = lens[b, t]) or [B] (L = lens[b] - N + t + 1)
// block_table:  [B, max_blocks] int32 (a row per row of q in the varlen form), last dim
//               contiguous, row stride >= 0
// schedule_meta: get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms[, indices])
// logits:       [B * N, max_context_len] fp32 or bf16, last dim contiguous
void paged_mqa_logits(const QuantizedTensor& q, const TensorView& kv_cache,
                      const TensorView& weights, const TensorView& context_lens,
                      const TensorView& block_table, const TensorView& schedule_meta,
                      std::int64_t max_context_len, const TensorView& logits,
                      const PagedMqaLogitsOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Top-k (docs/contract.md, "Top-k"): per row, the indices of the `topk` keys of largest logit,
// ties to the lower key, keys whose logit is -inf (or NaN) never selected. A row selects its
// keys in ascending key order, then -1 where its window holds fewer than `topk` selectable keys
// (the values output holds -inf there). Any topk in [1, kMaxTopk].
// ---------------------------------------------------------------------------------------------

inline constexpr std::int64_t kMaxTopk = 2048;

struct TopkPerRowOptions {
  // Column c of row i holds key starts[i] + c (the compressed output of mqa_logits), instead of
  // key c.
  bool compressed = false;
  // Indices are keys; by default they are key - starts[i] (the column of compressed output).
  bool absolute_indices = false;
  // [R, topk] fp32, contiguous: the selected logits, aligned with the indices.
  std::optional<TensorView> values;
  cudaStream_t stream = nullptr;
};

// Selection over logits the caller holds: any layout mqa_logits and paged_mqa_logits return.
// logits:      [R, C] fp32 or bf16, last dim contiguous
// starts:      [R] int32, or none (every row starts at key 0: decode rows)
// ends:        [R] int32; row i selects among keys max(starts[i], 0) <= j < ends[i] that have a
//              column (decode rows: ends = the row lengths, e.g. 2-D context_lens viewed as
//              [B * N])
// topk_indices: [R, topk] int32, contiguous
void topk_per_row(const TensorView& logits, const std::optional<TensorView>& starts,
                  const TensorView& ends, std::int64_t topk, const TensorView& topk_indices,
                  const TopkPerRowOptions& options = {});

struct MqaTopkOptions {
  // Indices are keys; by default they are key - k_start[i].
  bool absolute_indices = false;
  // [S, topk] fp32, contiguous: the selected logits.
  std::optional<TensorView> values;
  std::optional<TensorView> schedule_meta;  // as MqaLogitsOptions
  std::optional<bool> check_inputs;         // as MqaLogitsOptions
  // The dtype of the logits the selection is over, as mqa_logits would return them: fp32 or
  // bf16 (bf16 weights need bf16). Unset: the weights' dtype.
  std::optional<DType> logits_dtype;
  cudaStream_t stream = nullptr;
};

// Bytes of the `workspace` that mqa_topk needs for this problem.
std::int64_t mqa_topk_workspace_bytes(std::int64_t seq_len, std::int64_t seq_len_kv,
                                      std::int64_t topk);

// The top-k of exactly the logits mqa_logits returns for the same inputs (fp32, or bf16 with
// bf16 weights). q, kv, weights, k_start and k_end as mqa_logits; topk_indices [S, topk] int32,
// contiguous; workspace: uint8 [>= mqa_topk_workspace_bytes(S, T, topk)] on the inputs' device,
// 16-byte aligned there, not read before the call.
void mqa_topk(const QuantizedTensor& q, const QuantizedTensor& kv, const TensorView& weights,
              const TensorView& k_start, const TensorView& k_end, std::int64_t topk,
              const TensorView& topk_indices, const TensorView& workspace,
              const MqaTopkOptions& options = {});

struct PagedMqaTopkOptions {
  // Indices are the cache slots block_table[b, p / block_kv] * block_kv + p % block_kv of the
  // selected positions p, which sparse decode attention reads; by default they are p.
  bool cache_slots = false;
  // [B * N, topk] fp32, contiguous: the selected logits.
  std::optional<TensorView> values;
  std::optional<TensorView> indices;  // the varlen form, as PagedMqaLogitsOptions
  std::optional<bool> check_inputs;   // as PagedMqaLogitsOptions
  std::optional<DType> logits_dtype;  // as MqaTopkOptions
  cudaStream_t stream = nullptr;
};

std::int64_t paged_mqa_topk_workspace_bytes(std::int64_t num_rows, std::int64_t max_context_len,
                                            std::int64_t topk);

// The top-k of exactly the logits paged_mqa_logits returns for the same inputs. Arguments as
// paged_mqa_logits; topk_indices [B * N, topk] int32, contiguous; workspace: uint8
// [>= paged_mqa_topk_workspace_bytes(B * N, max_context_len, topk)].
void paged_mqa_topk(const QuantizedTensor& q, const TensorView& kv_cache,
                    const TensorView& weights, const TensorView& context_lens,
                    const TensorView& block_table, const TensorView& schedule_meta,
                    std::int64_t max_context_len, std::int64_t topk,
                    const TensorView& topk_indices, const TensorView& workspace,
                    const PagedMqaTopkOptions& options = {});

// Context parallelism: R ranks each select over their shard of the keys and send their rows'
// candidates; merge_topk gives each row's top-k over all of them, with the rules above.
inline constexpr std::int64_t kMaxMergeCandidatesCuda = 16384;  // R * K a row on a CUDA device

struct MergeTopkOptions {
  // [S, topk] fp32, contiguous: the selected values.
  std::optional<TensorView> values;
  // Check that each list is in ascending index order, -1 after its last candidate, and that a
  // row's indices are distinct across the lists (InvalidArgument naming candidate_indices).
  // Unset: the backend's default (the CPU checks; the CUDA backend does not, and gives a
  // selection of in-bounds candidates for lists that break the rule).
  std::optional<bool> check_inputs;
  cudaStream_t stream = nullptr;
};

// candidate_values:  [R, S, K] fp32, contiguous: R candidate lists of K per row
// candidate_indices: [R, S, K] int32, contiguous: their keys (absolute), each list in ascending
//                    order with -1 after its last candidate, as the top-k operations return
//                    them; a row's keys distinct across the lists (disjoint shards)
// topk_indices:      [S, topk] int32, contiguous. On a CUDA device R * K <=
//                    kMaxMergeCandidatesCuda.
void merge_topk(const TensorView& candidate_values, const TensorView& candidate_indices,
                std::int64_t topk, const TensorView& topk_indices,
                const MergeTopkOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Schedule metadata: int32 [num_sms + 1, 2]. Each of num_sms workers gets one contiguous,
// equally sized (+-1) segment of the work items; row k holds the first item of worker k, row
// num_sms the end. Host inputs compute on the host, device inputs on the device (stream).
// ---------------------------------------------------------------------------------------------

std::int64_t schedule_meta_rows(int num_sms);  // num_sms + 1

// `out`: int32 [num_sms + 1, 2] on the device of `context_lens`.
void get_paged_mqa_logits_metadata(const TensorView& context_lens, int block_kv, int num_sms,
                                   const TensorView& out,
                                   const std::optional<TensorView>& indices = std::nullopt,
                                   cudaStream_t stream = nullptr);

// `out`: int32 [get_num_sms() + 1, 2] on the device of `k_start`.
void get_mqa_logits_metadata(const TensorView& k_start, const TensorView& k_end,
                             std::int64_t seq_len_kv, int num_heads, const TensorView& out,
                             cudaStream_t stream = nullptr);

// How many SMs the GPU kernels may use: the worker count of the schedule metadata. Defaults to
// the current CUDA device's SM count (on a machine without one, the hardware thread count). The
// CPU backend runs on every hardware thread whatever this is. set_num_sms(0) goes back to that
// default (as DeepGEMM's does).
int get_num_sms();
void set_num_sms(int num_sms);  // 0 <= num_sms <= the device's SM count

// True when this build has the CUDA backend and a device of compute capability 9.0 is visible.
bool cuda_backend_available();

}  // namespace mqa_logits
