// Validated problem descriptors: what validation produces from the public tensor views and what
// every backend (CPU reference, CUDA kernels) consumes. Pointers live on `device`; all shapes and
// strides are checked, so backends index without further checks.
#pragma once

#include <cstdint>

#include "mqa_logits/formats.hpp"
#include "mqa_logits/tensor.hpp"

namespace mqa_logits {

struct PrefillProblem {
  Format format = Format::kFP8;
  Device device{};
  std::int64_t seq_len = 0;     // S
  std::int64_t num_heads = 0;   // H
  std::int64_t head_dim = 0;    // D (elements; MXFP4 rows hold D / 2 bytes)
  std::int64_t seq_len_kv = 0;  // T

  const void* q = nullptr;                 // [S, H, D] e4m3 or [S, H, D/2] bytes, contiguous
  const std::int32_t* q_scales = nullptr;  // [S, H] packed UE8M0 (MX only)
  const void* kv = nullptr;                // [T, D] e4m3 or [T, D/2] bytes, contiguous
  const void* kv_scales = nullptr;         // [T] fp32 (FP8) or int32 packed UE8M0 (MX)
  const void* weights = nullptr;           // [S, H] fp32 or bf16
  DType weights_dtype = DType::kFloat32;
  std::int64_t weights_row_stride = 0;     // elements
  const std::int32_t* k_start = nullptr;   // [S]
  const std::int32_t* k_end = nullptr;     // [S]

  void* logits = nullptr;  // [S, out_cols]
  DType logits_dtype = DType::kFloat32;
  std::int64_t logits_row_stride = 0;  // elements, >= out_cols
  std::int64_t out_cols = 0;           // T, or max_seqlen_k when compressed
  bool compressed = false;             // column c of row i is key start[i] + c
  bool clean_logits = true;

  const std::int32_t* schedule_meta = nullptr;  // [num_workers + 1, 2] or null
  int schedule_workers = 0;                     // rows of schedule_meta minus one
};

struct PagedProblem {
  Format format = Format::kFP8;
  Device device{};
  std::int64_t batch = 0;      // B (rows of q's first dim)
  std::int64_t next_n = 0;     // N
  std::int64_t num_heads = 0;  // H
  std::int64_t head_dim = 0;   // D

  const void* q = nullptr;                 // [B, N, H, D] e4m3 or [B, N, H, D/2] bytes
  const std::int32_t* q_scales = nullptr;  // [B, N, H] (MX only)

  // Fused cache: block k starts at kv_cache + k * block_stride_bytes; token values first
  // (block_kv * token_bytes), then block_kv 4-byte scales.
  const std::uint8_t* kv_cache = nullptr;
  std::int64_t num_blocks = 0;
  int block_kv = 64;
  std::int64_t token_bytes = 0;         // D (e4m3) or D / 2 (MXFP4)
  std::int64_t block_stride_bytes = 0;  // multiple of 4, >= block_kv * (token_bytes + 4)

  const void* weights = nullptr;  // [B * N, H]
  DType weights_dtype = DType::kFloat32;

  const std::int32_t* context_lens = nullptr;  // [B, N] or [B]
  bool context_lens_2d = false;
  const std::int32_t* block_table = nullptr;  // [batch, max_blocks]
  std::int64_t max_blocks = 0;
  std::int64_t block_table_row_stride = 0;  // elements
  const std::int32_t* indices = nullptr;    // [B] or null (varlen form, N == 1): sequence labels

  const std::int32_t* schedule_meta = nullptr;  // [num_workers + 1, 2]
  int schedule_workers = 0;

  void* logits = nullptr;  // [B * N, max_context_len]
  DType logits_dtype = DType::kFloat32;
  std::int64_t logits_row_stride = 0;
  std::int64_t max_context_len = 0;
  bool clean_logits = false;
};

// Row r = b * N + t of a paged problem covers key positions [0, paged_effective_length): its
// context length, clamped to the output width and to the keys its block-table row can address.
// Key position p lives in block block_table[table_row(r)][p / block_kv], table_row(r) being b (r
// in the varlen form, whose rows are tokens). Varlen rows with equal consecutive indices are one
// sequence (a run) and share key loads: a row may read its keys through the block-table row of
// an earlier row of its run, so a run's rows must address the same blocks (input_checks.hpp).
// Keys in a block whose id is outside [0, num_blocks) are treated as outside the window.

}  // namespace mqa_logits
