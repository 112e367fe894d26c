// -inf over a column range of one logits row: the clean_logits fill of both kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mqa_logits::kernels {

// Row `row` of a logits buffer whose rows are `row_stride` elements (fp32 or bf16) apart.
__device__ inline void* logits_row(void* logits, std::int64_t row_stride, std::int64_t row,
                                   bool bf16) {
  return static_cast<char*>(logits) + row * row_stride * (bf16 ? 2 : 4);
}

// -inf into elements [begin, end) of the logits row starting at `row` (16-byte aligned, as every
// output layout's rows are; fp32 or bf16 elements): 16-byte stores over the aligned body, single
// elements before and after it. Thread `thread` of `threads` takes every threads-th store.
__device__ inline void fill_row_negative_infinity(void* row, bool bf16, std::int64_t begin,
                                                  std::int64_t end, int thread, int threads) {
  const int shift = bf16 ? 3 : 2;  // log2(elements per 16 bytes)
  const std::int64_t mask = (std::int64_t{1} << shift) - 1;
  const std::int64_t body_begin = min(end, (begin + mask) & ~mask);
  const std::int64_t body_end = max(body_begin, end & ~mask);
  const std::uint32_t word = bf16 ? 0xff80ff80u : 0xff800000u;  // -inf, in either dtype
  const auto store_one = [&](std::int64_t i) {
    if (bf16) {
      static_cast<std::uint16_t*>(row)[i] = static_cast<std::uint16_t>(word);
    } else {
      static_cast<std::uint32_t*>(row)[i] = word;
    }
  };
  for (std::int64_t i = begin + thread; i < body_begin; i += threads) store_one(i);
  for (std::int64_t i = body_end + thread; i < end; i += threads) store_one(i);
  const uint4 pattern = make_uint4(word, word, word, word);
  auto* vectors = reinterpret_cast<uint4*>(static_cast<char*>(row) + (body_begin << (bf16 ? 1 : 2)));
  const std::int64_t count = (body_end - body_begin) >> shift;
  for (std::int64_t v = thread; v < count; v += threads) vectors[v] = pattern;
}

}  // namespace mqa_logits::kernels
