// The computational core shared by the CPU prefill and decode paths and by the oracle of
// support/reference.cpp: query rows and tiles of keys decoded to float64, the logits of one row
// against one tile, and the stores.
//
// Why float64 is fast enough and exact here: every e4m3 value is an integer multiple of 2^-9
// below 2^9, so a product of two is a multiple of 2^-18 below 2^18 and any sum of up to 2^16
// such products needs fewer than 53 significant bits; e2m1 values are multiples of 1/2 below 8.
// Hence every partial sum of a per-head (FP8) or per-block (MX) dot product is exact in float64,
// whatever the summation order, and the loops may be vectorized freely. Scales are powers of two
// (MX) or applied once (FP8); only the MX block sum, the head sum and the FP8 key scale round, in
// the order cpu_backend.hpp documents.
#pragma once

#include <cstdint>
#include <vector>

#include "problem.hpp"

namespace mqa_logits::cpu {

inline constexpr int kKeyTile = 8;     // keys computed together: the vectorized dimension
inline constexpr int kHeadPadding = 2;  // query heads are padded to a multiple of this

// The parts of a problem that describe how queries and weights are stored.
struct QueryLayout {
  Format format = Format::kFP8;
  std::int64_t num_heads = 0;
  std::int64_t head_dim = 0;
  const void* q = nullptr;
  const std::int32_t* q_scales = nullptr;
  const void* weights = nullptr;
  DType weights_dtype = DType::kFloat32;
  std::int64_t weights_row_stride = 0;
};

// One query row in float64: heads padded with zeros to a multiple of kHeadPadding.
class QueryRow {
 public:
  explicit QueryRow(const QueryLayout& layout);
  void load(std::int64_t row);  // decodes row `row` of the layout

  std::int64_t num_heads() const { return layout_.num_heads; }
  std::int64_t padded_heads() const { return padded_heads_; }
  const double* values() const { return values_.data(); }  // [padded_heads][D]
  const double* scales() const { return scales_.data(); }  // [padded_heads][blocks] (MX)
  double weight(std::int64_t head) const { return weights_[head]; }

 private:
  QueryLayout layout_;
  std::int64_t padded_heads_ = 0;
  std::int64_t blocks_ = 0;      // MX scale blocks per vector (1 for FP8: scale 1)
  std::vector<double> values_;   // [padded_heads][D]
  std::vector<double> scales_;   // [padded_heads][blocks]
  std::vector<double> weights_;  // [num_heads]
};

// kKeyTile keys in float64, transposed so that the lanes of one element are adjacent. Lanes a
// partial tile does not load keep earlier keys (or zeros): computed, never stored.
class KeyTile {
 public:
  KeyTile(Format format, std::int64_t head_dim);
  // Decodes one key: its element bytes and its 4-byte scale (fp32 for FP8, packed UE8M0 for MX).
  void load(int lane, const std::uint8_t* codes, const void* scale);

  // Logits of `query` against the tile's keys, per cpu_backend.hpp's order, before rounding.
  void logits(const QueryRow& query, double (&out)[kKeyTile]);

 private:
  Format format_;
  std::int64_t head_dim_;
  std::int64_t blocks_;               // scale blocks per key (1 for FP8)
  std::vector<double> values_;        // [D][kKeyTile]
  std::vector<double> block_scales_;  // [blocks][kKeyTile]: MX key scales (1 for FP8)
  double token_scales_[kKeyTile]{};   // FP8 key scales (1 for MX)
  std::vector<double> dots_;          // [padded_heads][kKeyTile]: s of every head and key
};

// The output as the stores see it.
struct LogitsOut {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t row_stride = 0;
  std::int64_t cols = 0;

  void store(std::int64_t row, std::int64_t col, double value) const;  // rounds once
  // -inf into columns [0, cols) of `row` outside [keep_begin, keep_end).
  void fill_outside(std::int64_t row, std::int64_t keep_begin, std::int64_t keep_end) const;
  void fill(std::int64_t row, std::int64_t begin, std::int64_t end) const;  // -inf
};

// Round-to-nearest-even of a double to bf16 bits, in one rounding step.
std::uint16_t double_to_bf16(double value);

}  // namespace mqa_logits::cpu
