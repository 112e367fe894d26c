// The decode kernel's epilogue (paged_kernel.cuh): from one chunk's wgmma accumulators to stored
// logits. Per thread: relu, weight and the sum over the heads it holds; across the 4 lanes of a
// quad: a reduce-scatter (QuadSums says which lane ends with which (row, key) sum); then the key
// scale and the store, or -inf, or nothing (the coverage rules of docs/design.md, "The decode
// kernel", Roles). Free of Hopper-only instructions, so that its lane arithmetic can be exercised
// anywhere.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/fill_row.cuh"
#include "kernels/sm90/paged_plan.cuh"

namespace mqa_logits::sm90::paged {

// What the epilogue needs of the tile besides the accumulators: the thread's first key (its
// second is 8 further), both keys' scales, whether their block was loaded, and whether the thread
// may store for them (their block was loaded, or clean_logits: -inf where it was not; the store
// row's range decides the rest).
struct TileScales {
  int key0 = 0;
  float first = 0.0f;
  float second = 0.0f;
  bool in_block = false;
  bool stores = false;
};

// Where the fp32 weight copy keeps head h of a row (rows weight_row_floats apart): grouped by the
// quad lane that reads it, so that a lane's heads 8j + 2q, 8j + 2q + 1 (j = 0, 1, ...) are
// contiguous and two blocks j come in one 16-byte load.
__host__ __device__ constexpr int weight_index(int head, int heads) {
  const int quad = head % 8 / 2;
  const int block = head / 8;
  return quad * weight_quad_floats(heads) + block * 2 + head % 2;
}

// A lane's weights of a group as the epilogue reads them, `four(row, i)` being its heads of blocks
// 2i and 2i + 1 of a row (weight_index): from the warpgroup's fp32 copy at every tile, or, where
// the instance has room (weights_in_registers), from registers filled once per group. Rows past
// the group's are read but never used.
template <int H, int kMmaRows, bool kInRegisters = weights_in_registers(kMmaRows, H)>
class LaneWeights {
 public:
  __device__ LaneWeights(const float* copy, int quad) : lane_(copy + quad * weight_quad_floats(H)) {}
  __device__ float4 four(int row, int i) const {
    return *reinterpret_cast<const float4*>(lane_ + row * weight_row_floats(H) + 4 * i);
  }
  __device__ float2 two(int row, int i) const {
    return *reinterpret_cast<const float2*>(lane_ + row * weight_row_floats(H) + 2 * i);
  }

 private:
  const float* lane_;
};

template <int H, int kMmaRows>
class LaneWeights<H, kMmaRows, true> {
 public:
  __device__ LaneWeights(const float* copy, int quad) {
    const LaneWeights<H, kMmaRows, false> shared(copy, quad);
#pragma unroll
    for (int r = 0; r < kMmaRows; ++r) {
#pragma unroll
      for (int i = 0; i < kFours; ++i) w_[r][i] = shared.four(r, i);
    }
  }
  __device__ float4 four(int row, int i) const { return w_[row][i]; }

 private:
  static constexpr int kFours = H / 16;
  float4 w_[kMmaRows][kFours];
};

// How a chunk of kRows rows leaves the quad reduction: each thread holds kValues partial sums
// (row t, key k) at v = 2t + k (rows padded to an even count), and after the reduction lane q of a
// quad keeps kKept of them, v = q * kKept + i; a single row is all-reduced instead, lane q
// keeping v = q / 2 and only even lanes storing.
template <int kRows>
struct QuadSums {
  static constexpr int kSlots = kRows == 1 ? 1 : (kRows + 1) / 2 * 2;
  static constexpr int kValues = 2 * kSlots;
  static constexpr int kKept = kValues >= 4 ? kValues / 4 : 1;
  __device__ static int value(int quad, int i) {
    return kValues >= 4 ? quad * kKept + i : quad / 2;
  }
  __device__ static bool stores(int quad) { return kValues >= 4 || quad % 2 == 0; }
};

// Sums N values over the 4 lanes of a quad as QuadSums describes: each exchange step sends the
// half this lane does not keep.
template <int N>
__device__ __forceinline__ void quad_reduce(const float (&in)[N], float (&out)[N >= 4 ? N / 4 : 1],
                                            int lane) {
  constexpr int kHalf = N / 2;
  float half[kHalf];
  const bool upper_half = (lane & 2) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper_half ? in[i] : in[kHalf + i];
    const float keep = upper_half ? in[kHalf + i] : in[i];
    half[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
  }
  if constexpr (N >= 4) {
    static_assert(N % 4 == 0);
    const bool upper_quarter = (lane & 1) != 0;
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float send = upper_quarter ? half[i] : half[N / 4 + i];
      const float keep = upper_quarter ? half[N / 4 + i] : half[i];
      out[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
  } else {
    out[0] = half[0] + __shfl_xor_sync(0xffffffffu, half[0], 1);
  }
}

// The row behind one of the sums a lane stores (QuadSums::value says which row and key): the
// address of its logit 0, its key count, and the key positions [lo, hi) it writes in this
// segment: its tiles, cut at max_context_len and, without clean_logits, at its key count (an
// empty range when the lane stores nothing there).
struct StoreRow {
  std::int64_t address = 0;
  int keys = 0;
  int lo = 0;
  int hi = 0;
};

// The store rows of chunk C of an instance for kMmaRows rows, for one group.
template <int H, int kMmaRows, int C>
struct ChunkRows {
  static constexpr int kRows = rows_in_chunk(kMmaRows, C, H);
  using Sums = QuadSums<kRows>;
  StoreRow row[Sums::kKept];

  __device__ ChunkRows(const PagedParams& p, const Group<kMmaRows, true>& g, int quad) {
#pragma unroll
    for (int i = 0; i < Sums::kKept; ++i) {
      const int t = Sums::value(quad, i) / 2;
      const int u = C * chunk_rows(H) + t;  // the group row
      const bool stores = Sums::stores(quad) && t < kRows;
#pragma unroll
      for (int r = 0; r < kMmaRows; ++r) {  // constant indices keep g in registers
        if (stores && r == u && r < g.rows) {
          row[i].address = reinterpret_cast<std::int64_t>(
              kernels::logits_row(p.logits, p.logits_row_stride, g.first_row + r, p.logits_bf16));
          row[i].keys = g.row[r].keys;
          row[i].lo = g.row[r].tile_lo * kTileKeys;
          std::int64_t end = std::min(static_cast<std::int64_t>(g.row[r].tile_hi) * kTileKeys,
                                      p.max_context_len);
          if (!p.clean_logits) end = std::min<std::int64_t>(end, g.row[r].keys);
          row[i].hi = static_cast<int>(end);
        }
      }
    }
  }
};

template <int H, int kMmaRows>
struct StoreRows {
  ChunkRows<H, kMmaRows, 0> first;
  ChunkRows<H, kMmaRows, chunk_count(kMmaRows, H) - 1> last;  // the same chunk when only one
  __device__ StoreRows(const PagedParams& p, const Group<kMmaRows, true>& g, int quad)
      : first(p, g, quad), last(p, g, quad) {}
  template <int C>
  __device__ const auto& chunk() const {
    if constexpr (C == 0) {
      return first;
    } else {
      return last;
    }
  }
};

// Stores the sum of key `key` of tile `tile` in `row` as a Logit (float or bf16), or -inf, or
// nothing (see the coverage rules at the top), deciding by predicates rather than branches.
template <typename Logit>
__device__ __forceinline__ void store_logit(const StoreRow& row, int tile, int key, float value,
                                            const TileScales& scales) {
  const int pos = tile * kTileKeys + key;
  const bool inside = pos < row.keys && scales.in_block;
  const bool write = pos >= row.lo && pos < row.hi && scales.stores;
  const float out = inside ? value : -INFINITY;
  if constexpr (std::is_same_v<Logit, __nv_bfloat16>) {
    if (write) reinterpret_cast<__nv_bfloat16*>(row.address)[pos] = __float2bfloat16_rn(out);
  } else {
    if (write) reinterpret_cast<float*>(row.address)[pos] = out;
  }
}

// The accumulators of a chunk whose MMA is issued in two parts (split_mma): its first 128
// columns and the rest, indexed as one array.
template <int kWidth>
struct SplitAccumulators {
  static constexpr int kFirst = 64;  // 128 columns
  float first[kFirst];
  float second[kWidth / 2 - kFirst];
  __device__ float operator[](int i) const { return i < kFirst ? first[i] : second[i - kFirst]; }
};

// relu, weight and head sum of chunk C's accumulators, the quad reduction and the stores.
// Accumulator layout (wgmma): acc[4j + 2r + e] is key key0 + 8r, column 8j + 2 * quad + e; with
// H >= 8 an 8-column block j lies in one row, t = j / (H / 8). With split_mma, `second_part`
// runs before the first row of the MMA's second part is read (it waits for that part); otherwise
// it runs first.
template <int H, int kMmaRows, int C, typename Logit, typename Accumulators, typename SecondPart>
__device__ __forceinline__ void chunk_epilogue(const Group<kMmaRows, true>& g,
                                               const StoreRows<H, kMmaRows>& rows_out,
                                               const Accumulators& acc,
                                               const LaneWeights<H, kMmaRows>& weights, int tile,
                                               const TileScales& scales, int lane,
                                               const SecondPart& second_part) {
  constexpr int kRows = rows_in_chunk(kMmaRows, C, H);
  constexpr int kFirstRow = C * chunk_rows(H);
  constexpr int kBlocksPerRow = H / 8;
  constexpr int kSecondPartRow = split_mma(kMmaRows, H) ? 128 / H : 0;
  constexpr int kMinGroupRows = min_group_rows(kMmaRows, H);
  static_assert(2 * sizeof(Accumulators) / sizeof(float) >= chunk_width(kRows, H));
  using Sums = QuadSums<kRows>;
  const int quad = lane % 4;
  const int rows = g.rows - kFirstRow;  // of this group in this chunk
  float part[Sums::kValues];
  // Row t's sums (keys key0 and key0 + 8) into part[2t] and part[2t + 1]; 0 for rows past the
  // group, but those below min_group_rows are summed whatever the group holds (StoreRows stores
  // only the group's rows).
  const auto sum_row = [&](int t) {
    float sum0 = 0.0f;
    float sum1 = 0.0f;
    // Rows every group has need no check, so that their FFMA chains can interleave.
    if (t < kRows && (kFirstRow + t < kMinGroupRows || t < rows)) {
      const auto add_block = [&](int jj, float w0, float w1) {
        const int j = t * kBlocksPerRow + jj;
        sum0 = fmaf(w0, fmaxf(acc[4 * j + 0], 0.0f), sum0);
        sum0 = fmaf(w1, fmaxf(acc[4 * j + 1], 0.0f), sum0);
        sum1 = fmaf(w0, fmaxf(acc[4 * j + 2], 0.0f), sum1);
        sum1 = fmaf(w1, fmaxf(acc[4 * j + 3], 0.0f), sum1);
      };
#pragma unroll
      for (int jj = 0; jj + 1 < kBlocksPerRow; jj += 2) {
        const float4 wj = weights.four(kFirstRow + t, jj / 2);
        add_block(jj, wj.x, wj.y);
        add_block(jj + 1, wj.z, wj.w);
      }
      if constexpr (kBlocksPerRow % 2 != 0) {  // H = 8: one block
        const float2 wj = weights.two(kFirstRow + t, kBlocksPerRow - 1);
        add_block(kBlocksPerRow - 1, wj.x, wj.y);
      }
    }
    part[2 * t] = sum0;
    part[2 * t + 1] = sum1;
  };
  // The first part's rows in a block of their own (under a condition every group meets), which
  // keeps the compiler from moving their FFMAs past the wait for the second part, off its MMA.
  if (rows > 0) {
#pragma unroll
    for (int t = 0; t < kSecondPartRow; ++t) sum_row(t);
  } else {
#pragma unroll
    for (int v = 0; v < 2 * kSecondPartRow; ++v) part[v] = 0.0f;
  }
  second_part();
#pragma unroll
  for (int t = kSecondPartRow; t < Sums::kSlots; ++t) sum_row(t);
  float sums[Sums::kKept];
  quad_reduce(part, sums, lane);
  const auto& chunk_rows_out = rows_out.template chunk<C>();
#pragma unroll
  for (int i = 0; i < Sums::kKept; ++i) {
    const int v = Sums::value(quad, i);
    const float scale = v % 2 == 0 ? scales.first : scales.second;  // no dynamic indexing
    store_logit<Logit>(chunk_rows_out.row[i], tile, scales.key0 + 8 * (v % 2), sums[i] * scale,
                       scales);
  }
}

}  // namespace mqa_logits::sm90::paged
