#include "mqa_logits/formats.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "mqa_logits/errors.hpp"

namespace mqa_logits {
namespace {

// A sign-magnitude minifloat without infinities: e4m3 "fn" and e2m1 are both of this kind.
struct Minifloat {
  int mantissa_bits;
  int min_exponent;               // exponent of the smallest normal value (1 - bias)
  std::uint8_t sign_bit;
  std::uint8_t max_finite;        // largest finite magnitude code
  std::uint8_t nan_code;          // what NaN encodes to
};

constexpr Minifloat kE4M3{3, -6, 0x80, 0x7e, 0x7f};
constexpr Minifloat kE2M1{1, 0, 0x8, 0x7, 0x7};  // no NaN code: NaN saturates to +6

constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
constexpr int kUe8m0Bias = 127;
constexpr std::uint8_t kUe8m0Nan = 255;
constexpr std::size_t kMaxScaleBlocks = sizeof(std::int32_t);

float decode_minifloat(const Minifloat& format, std::uint8_t code) {
  const int magnitude = code & (format.sign_bit - 1);
  const int exponent_field = magnitude >> format.mantissa_bits;
  const int mantissa = magnitude & ((1 << format.mantissa_bits) - 1);
  // Exponent field 0 holds the subnormals: no implicit leading one, the smallest normal exponent.
  const int significand = exponent_field == 0 ? mantissa : mantissa + (1 << format.mantissa_bits);
  const int exponent = std::max(exponent_field, 1) - 1 + format.min_exponent;
  const float value = std::ldexp(static_cast<float>(significand), exponent - format.mantissa_bits);
  return (code & format.sign_bit) != 0 ? -value : value;
}

// Round to the nearest integer, ties to even, whatever the floating-point rounding mode is.
float round_half_even(float x) {
  const float lower = std::floor(x);
  const float fraction = x - lower;  // exact: x is small and non-negative here
  const bool round_up = fraction > 0.5f || (fraction == 0.5f && std::fmod(lower, 2.0f) != 0.0f);
  return round_up ? lower + 1.0f : lower;
}

std::uint8_t encode_minifloat(const Minifloat& format, float value) {
  if (std::isnan(value)) return format.nan_code;
  const std::uint8_t sign = std::signbit(value) ? format.sign_bit : 0;
  const float magnitude = std::fabs(value);
  if (!(magnitude < decode_minifloat(format, format.max_finite))) {
    return sign | format.max_finite;  // saturate, infinities included
  }
  if (magnitude == 0.0f) return sign;
  // Count in steps of the code spacing at the value's exponent (the subnormal spacing below the
  // normal range). The rescale is by a power of two, hence exact; rounding the step count to
  // even rounds the value to even, and a carry into the next binade lands on the right code
  // because codes of consecutive binades are consecutive integers.
  const int exponent = std::max(std::ilogb(magnitude), format.min_exponent);
  const float steps = round_half_even(std::ldexp(magnitude, format.mantissa_bits - exponent));
  const int code = ((exponent - format.min_exponent) << format.mantissa_bits) +
                   static_cast<int>(steps);
  return sign | static_cast<std::uint8_t>(code);
}

// Largest magnitude of x; quantizers refuse non-finite input, which has no meaningful scale.
float finite_amax(std::span<const float> x) {
  float amax = 0.0f;
  for (const float v : x) {
    if (!std::isfinite(v)) {
      throw InvalidArgument("x", "expected finite values, got " + std::to_string(v));
    }
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

void expect_span_size(std::size_t size, std::size_t expected, const char* argument) {
  if (size != expected) {
    throw InvalidArgument(argument, "expected " + std::to_string(expected) + " elements, got " +
                                        std::to_string(size));
  }
}

std::size_t mx_block_count(std::span<const float> x) {
  if (x.empty() || x.size() % kMxBlock != 0 || x.size() / kMxBlock > kMaxScaleBlocks) {
    throw InvalidArgument("x", "expected a length of 32, 64, 96 or 128, got " +
                                   std::to_string(x.size()));
  }
  return x.size() / kMxBlock;
}

// Exponent k of the smallest power-of-two scale 2^k with amax / 2^k <= element_max, within the
// UE8M0 range. An all-zero block gets the scale 1.
int mx_scale_exponent(float amax, float element_max) {
  if (amax == 0.0f) return 0;
  int k = std::ilogb(amax) - std::ilogb(element_max);  // within one of the answer
  while (std::ldexp(amax, -k) > element_max) ++k;
  while (std::ldexp(amax, -(k - 1)) <= element_max) --k;
  return std::max(k, -kUe8m0Bias);  // a larger scale than needed still fits the element range
}

// Quantizes each 32-element block of x with its own power-of-two scale; `store(i, v)` receives
// element i already divided by its scale. Every scale is found before the first store, so
// refused input leaves the output untouched. Returns the packed UE8M0 scales.
template <typename Store>
std::int32_t quantize_mx_blocks(std::span<const float> x, float element_max, Store store) {
  const std::size_t blocks = mx_block_count(x);
  std::array<int, kMaxScaleBlocks> exponents{};
  std::array<std::uint8_t, kMaxScaleBlocks> scale_codes{};
  for (std::size_t b = 0; b < blocks; ++b) {
    exponents[b] = mx_scale_exponent(finite_amax(x.subspan(b * kMxBlock, kMxBlock)), element_max);
    scale_codes[b] = static_cast<std::uint8_t>(exponents[b] + kUe8m0Bias);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    store(i, std::ldexp(x[i], -exponents[i / kMxBlock]));  // exact: a power-of-two rescale
  }
  return pack_scales(std::span(scale_codes).first(blocks));
}

}  // namespace

const char* format_name(Format format) {
  switch (format) {
    case Format::kFP8: return "FP8";
    case Format::kMXFP8: return "MXFP8";
    case Format::kMXFP4: return "MXFP4";
  }
  return "unknown format";
}

float decode_e4m3(std::uint8_t code) {
  if ((code & 0x7f) == kE4M3.nan_code) return std::numeric_limits<float>::quiet_NaN();
  return decode_minifloat(kE4M3, code);
}

std::uint8_t encode_e4m3(float value) { return encode_minifloat(kE4M3, value); }

float decode_e2m1(std::uint8_t nibble) { return decode_minifloat(kE2M1, nibble & 0xf); }

std::uint8_t encode_e2m1(float value) { return encode_minifloat(kE2M1, value); }

float decode_ue8m0(std::uint8_t code) {
  if (code == kUe8m0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, code - kUe8m0Bias);  // exact: 2^-127 is a float subnormal
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  // Truncating a NaN could clear every mantissa bit left and make it an infinity: force quiet.
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040);
  const std::uint32_t rounding_bias = 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

std::uint8_t packed_scale_byte(std::int32_t packed, int block) {
  if (block < 0 || block >= static_cast<int>(kMaxScaleBlocks)) {
    throw InvalidArgument("block", "expected 0 <= block < 4, got " + std::to_string(block));
  }
  return static_cast<std::uint8_t>(static_cast<std::uint32_t>(packed) >> (8 * block));
}

std::int32_t pack_scales(std::span<const std::uint8_t> codes) {
  if (codes.size() > kMaxScaleBlocks) {
    throw InvalidArgument("codes", "expected at most 4 scale codes, got " +
                                       std::to_string(codes.size()));
  }
  std::uint32_t packed = 0;
  for (std::size_t b = 0; b < codes.size(); ++b) {
    packed |= static_cast<std::uint32_t>(codes[b]) << (8 * b);
  }
  return std::bit_cast<std::int32_t>(packed);
}

float mxfp4_element(const std::uint8_t* packed, std::int64_t d) {
  return decode_e2m1(static_cast<std::uint8_t>(packed[d / 2] >> (4 * (d % 2))));
}

float quantize_fp8_token(std::span<const float> x, std::span<std::uint8_t> codes) {
  expect_span_size(codes.size(), x.size(), "codes");
  const float amax = finite_amax(x);
  // The floor keeps the scale positive when amax / 448 underflows (amax below ~6e-43).
  const float scale =
      amax == 0.0f ? 1.0f : std::max(amax / kE4M3Max, std::numeric_limits<float>::denorm_min());
  for (std::size_t i = 0; i < x.size(); ++i) codes[i] = encode_e4m3(x[i] / scale);
  return scale;
}

std::int32_t quantize_mxfp8_vector(std::span<const float> x, std::span<std::uint8_t> codes) {
  expect_span_size(codes.size(), x.size(), "codes");
  return quantize_mx_blocks(x, kE4M3Max,
                            [&](std::size_t i, float v) { codes[i] = encode_e4m3(v); });
}

std::int32_t quantize_mxfp4_vector(std::span<const float> x, std::span<std::uint8_t> packed) {
  expect_span_size(packed.size(), x.size() / 2, "packed");
  return quantize_mx_blocks(x, kE2M1Max, [&](std::size_t i, float v) {
    const int shift = 4 * static_cast<int>(i % 2);  // even elements in the low nibble
    const int kept = packed[i / 2] & (0xf0 >> shift);
    packed[i / 2] = static_cast<std::uint8_t>(kept | (encode_e2m1(v) << shift));
  });
}

}  // namespace mqa_logits
