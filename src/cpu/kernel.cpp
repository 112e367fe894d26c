#include "cpu/kernel.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace mqa_logits::cpu {
namespace {

// Every e4m3 code and every e2m1 nibble decoded once.
const std::array<double, 256>& e4m3_table() {
  static const auto table = [] {
    std::array<double, 256> t{};
    for (int code = 0; code < 256; ++code) t[code] = decode_e4m3(static_cast<std::uint8_t>(code));
    return t;
  }();
  return table;
}

const std::array<double, 16>& e2m1_table() {
  static const auto table = [] {
    std::array<double, 16> t{};
    for (int nibble = 0; nibble < 16; ++nibble) t[nibble] = decode_e2m1(static_cast<std::uint8_t>(nibble));
    return t;
  }();
  return table;
}

std::int64_t element_bytes(Format format, std::int64_t head_dim) {
  return format == Format::kMXFP4 ? head_dim / 2 : head_dim;
}

// Decodes the head_dim elements of one vector into out[d * stride].
void decode_elements(Format format, const std::uint8_t* codes, std::int64_t head_dim,
                     double* out, std::int64_t stride) {
  if (format == Format::kMXFP4) {
    const auto& table = e2m1_table();
    for (std::int64_t k = 0; k < head_dim / 2; ++k) {
      out[(2 * k) * stride] = table[codes[k] & 0xf];
      out[(2 * k + 1) * stride] = table[codes[k] >> 4];
    }
    return;
  }
  const auto& table = e4m3_table();
  for (std::int64_t d = 0; d < head_dim; ++d) out[d * stride] = table[codes[d]];
}

// Decodes the UE8M0 scales of one MX vector into out[b * stride].
void decode_block_scales(std::int32_t packed, std::int64_t blocks, double* out,
                         std::int64_t stride) {
  for (std::int64_t b = 0; b < blocks; ++b) {
    out[b * stride] = decode_ue8m0(packed_scale_byte(packed, static_cast<int>(b)));
  }
}

std::int64_t scale_blocks(Format format, std::int64_t head_dim) {
  return format == Format::kFP8 ? 1 : head_dim / kMxBlock;
}

// ---- scaled dot products -----------------------------------------------------------------------
//
// The hot loop: s[h][j] for every head h of a query row and key j of a tile. Only exact
// operations happen here (see kernel.hpp): per-block dot products, and for MX their products with
// power-of-two scales summed over blocks in order, where fusing a multiply into the add cannot
// change a result either. So the loop may be vectorized and compiled with FMA; the rounding head
// sum stays outside it.

struct DotsArgs {
  const double* q;         // [heads][head_dim]
  const double* q_scales;  // [heads][blocks] (MX)
  const double* k;         // [head_dim][kKeyTile]
  const double* k_scales;  // [blocks][kKeyTile] (MX)
  std::int64_t heads;      // a multiple of kHeadPadding
  std::int64_t head_dim;
  std::int64_t blocks;
  bool mx;
  double* s;  // [heads][kKeyTile]
};

// Four doubles: the GCC/Clang vector extension, lowered to whatever vector ISA is enabled. Only
// passed by reference, so the baseline and AVX2 code never disagree on how it is passed.
using Vec4 = double __attribute__((vector_size(32)));
constexpr int kVecs = kKeyTile / 4;

[[gnu::always_inline]] inline void load4(Vec4& v, const double* p) { std::memcpy(&v, p, sizeof(v)); }
[[gnu::always_inline]] inline void store4(double* p, const Vec4& v) { std::memcpy(p, &v, sizeof(v)); }

// Heads [h_begin, h_end) against the whole tile, `kGroup` heads at a time with their
// accumulators in registers; h_end - h_begin is a multiple of kGroup.
template <int kGroup>
[[gnu::always_inline]] inline void dots_range(const DotsArgs& a, std::int64_t h_begin,
                                              std::int64_t h_end) {
  const std::int64_t block_len = a.head_dim / a.blocks;
  for (std::int64_t h0 = h_begin; h0 < h_end; h0 += kGroup) {
    const double* q = a.q + h0 * a.head_dim;
    Vec4 s[kGroup][kVecs] = {};
    for (std::int64_t b = 0; b < a.blocks; ++b) {
      Vec4 part[kGroup][kVecs] = {};
      for (std::int64_t d = b * block_len; d < (b + 1) * block_len; ++d) {
        Vec4 k[kVecs];
        for (int v = 0; v < kVecs; ++v) load4(k[v], a.k + d * kKeyTile + 4 * v);
        for (int g = 0; g < kGroup; ++g) {
          const double qd = q[g * a.head_dim + d];  // scalar * vector: a broadcast load
          for (int v = 0; v < kVecs; ++v) part[g][v] += qd * k[v];
        }
      }
      for (int g = 0; g < kGroup; ++g) {
        const double q_scale = a.mx ? a.q_scales[(h0 + g) * a.blocks + b] : 1.0;
        for (int v = 0; v < kVecs; ++v) {
          Vec4 k_scale = {1, 1, 1, 1};
          if (a.mx) load4(k_scale, a.k_scales + b * kKeyTile + 4 * v);
          s[g][v] += part[g][v] * (q_scale * k_scale);
        }
      }
    }
    for (int g = 0; g < kGroup; ++g) {
      for (int v = 0; v < kVecs; ++v) store4(a.s + (h0 + g) * kKeyTile + 4 * v, s[g][v]);
    }
  }
}

// Baseline ISA: two heads (8 accumulators) at a time fit SSE2's 16 registers.
static_assert(kHeadPadding % 2 == 0);
void dots_baseline(const DotsArgs& a) { dots_range<2>(a, 0, a.heads); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AVX2 with FMA (exact here, see above): six heads (12 accumulators, enough independent chains
// to hide the FMA latency) at a time in the 16 ymm registers, the rest two at a time.
[[gnu::target("avx2,fma")]] void dots_avx2(const DotsArgs& a) {
  const std::int64_t wide = a.heads / 6 * 6;
  dots_range<6>(a, 0, wide);
  dots_range<2>(a, wide, a.heads);
}

using DotsFn = void (*)(const DotsArgs&);
DotsFn select_dots() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 ? dots_avx2 : dots_baseline;
}
void compute_dots(const DotsArgs& a) {
  static const DotsFn fn = select_dots();
  fn(a);
}
#else
void compute_dots(const DotsArgs& a) { dots_baseline(a); }
#endif

double load_weight(const void* weights, DType dtype, std::int64_t index) {
  if (dtype == DType::kBFloat16) return bf16_to_float(static_cast<const std::uint16_t*>(weights)[index]);
  return static_cast<const float*>(weights)[index];
}

}  // namespace

// ---- QueryRow ----------------------------------------------------------------------------------

QueryRow::QueryRow(const QueryLayout& layout)
    : layout_(layout),
      padded_heads_((layout.num_heads + kHeadPadding - 1) / kHeadPadding * kHeadPadding),
      blocks_(scale_blocks(layout.format, layout.head_dim)),
      values_(padded_heads_ * layout.head_dim, 0.0),
      scales_(padded_heads_ * blocks_, 1.0),
      weights_(layout.num_heads, 0.0) {}

void QueryRow::load(std::int64_t row) {
  const std::int64_t heads = layout_.num_heads;
  const std::int64_t dim = layout_.head_dim;
  const std::int64_t bytes = element_bytes(layout_.format, dim);
  const auto* q = static_cast<const std::uint8_t*>(layout_.q);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t vector = row * heads + h;
    decode_elements(layout_.format, q + vector * bytes, dim, &values_[h * dim], 1);
    if (layout_.format != Format::kFP8) {
      decode_block_scales(layout_.q_scales[vector], blocks_, &scales_[h * blocks_], 1);
    }
    weights_[h] = load_weight(layout_.weights, layout_.weights_dtype,
                              row * layout_.weights_row_stride + h);
  }
}

// ---- KeyTile -----------------------------------------------------------------------------------

KeyTile::KeyTile(Format format, std::int64_t head_dim)
    : format_(format),
      head_dim_(head_dim),
      blocks_(scale_blocks(format, head_dim)),
      values_(head_dim * kKeyTile, 0.0),
      block_scales_(blocks_ * kKeyTile, 1.0) {
  std::fill(std::begin(token_scales_), std::end(token_scales_), 1.0);
}

void KeyTile::load(int lane, const std::uint8_t* codes, const void* scale) {
  decode_elements(format_, codes, head_dim_, &values_[lane], kKeyTile);
  if (format_ == Format::kFP8) {
    float s = 0.0f;
    std::memcpy(&s, scale, sizeof(s));
    token_scales_[lane] = s;
  } else {
    std::int32_t packed = 0;
    std::memcpy(&packed, scale, sizeof(packed));
    decode_block_scales(packed, blocks_, &block_scales_[lane], kKeyTile);
  }
}

void KeyTile::logits(const QueryRow& query, double (&out)[kKeyTile]) {
  dots_.resize(query.padded_heads() * kKeyTile);
  compute_dots({query.values(), query.scales(), values_.data(), block_scales_.data(),
                query.padded_heads(), head_dim_, blocks_, format_ != Format::kFP8,
                dots_.data()});
  // The head sum rounds: it runs in this function, compiled for the baseline ISA, where nothing
  // fuses the multiply into the add. A local accumulator (no aliasing) lets it vectorize.
  double sum[kKeyTile] = {};
  for (std::int64_t h = 0; h < query.num_heads(); ++h) {
    const double w = query.weight(h);
    const double* s = &dots_[h * kKeyTile];
    for (int j = 0; j < kKeyTile; ++j) sum[j] += w * std::max(s[j], 0.0);
  }
  const bool fp8 = format_ == Format::kFP8;
  for (int j = 0; j < kKeyTile; ++j) out[j] = fp8 ? sum[j] * token_scales_[j] : sum[j];
}

// ---- stores ------------------------------------------------------------------------------------

std::uint16_t double_to_bf16(double value) {
  // Round to float with round-to-odd (truncate, then set the last bit when inexact): the float
  // keeps 16 more bits than bf16, so its round-to-nearest-even to bf16 equals the direct one.
  float f = static_cast<float>(value);
  if (!std::isnan(value) && static_cast<double>(f) != value) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);
    f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
  }
  return float_to_bf16(f);
}

void LogitsOut::store(std::int64_t row, std::int64_t col, double value) const {
  const std::int64_t index = row * row_stride + col;
  if (dtype == DType::kBFloat16) {
    static_cast<std::uint16_t*>(data)[index] = double_to_bf16(value);
  } else {
    static_cast<float*>(data)[index] = static_cast<float>(value);
  }
}

void LogitsOut::fill(std::int64_t row, std::int64_t begin, std::int64_t end) const {
  begin = std::clamp<std::int64_t>(begin, 0, cols);
  end = std::clamp<std::int64_t>(end, begin, cols);
  if (dtype == DType::kBFloat16) {
    constexpr std::uint16_t kMinusInfBf16 = 0xff80;
    auto* out = static_cast<std::uint16_t*>(data) + row * row_stride;
    std::fill(out + begin, out + end, kMinusInfBf16);
  } else {
    auto* out = static_cast<float*>(data) + row * row_stride;
    std::fill(out + begin, out + end, -std::numeric_limits<float>::infinity());
  }
}

void LogitsOut::fill_outside(std::int64_t row, std::int64_t keep_begin,
                             std::int64_t keep_end) const {
  if (keep_end <= keep_begin) {
    fill(row, 0, cols);
    return;
  }
  fill(row, 0, keep_begin);
  fill(row, keep_end, cols);
}

}  // namespace mqa_logits::cpu
