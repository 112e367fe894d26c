// Exhaustive and randomized checks of the number-format codecs and quantizers (formats.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mqa_logits/errors.hpp"
#include "mqa_logits/formats.hpp"

namespace mqa_logits {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Textbook value of a sign-magnitude minifloat code, written independently of the library.
double reference_minifloat(unsigned code, int exponent_bits, int mantissa_bits, int bias) {
  const unsigned sign = code >> (exponent_bits + mantissa_bits) & 1;
  const unsigned exponent = code >> mantissa_bits & ((1u << exponent_bits) - 1);
  const unsigned mantissa = code & ((1u << mantissa_bits) - 1);
  const double fraction = static_cast<double>(mantissa) / (1u << mantissa_bits);
  const double magnitude = exponent == 0 ? fraction * std::pow(2.0, 1 - bias)
                                         : (1.0 + fraction) * std::pow(2.0, int(exponent) - bias);
  return sign ? -magnitude : magnitude;
}

// Largest-magnitude codes: e4m3 0x7e (0x7f is NaN), e2m1 0x7.
constexpr unsigned kE4M3MaxCode = 0x7e;
constexpr unsigned kE2M1MaxCode = 0x7;

std::mt19937 rng(std::uint32_t seed) { return std::mt19937(seed); }

// Random values spanning several orders of magnitude, never all zero.
std::vector<float> random_values(std::mt19937& gen, std::size_t n, float log2_spread = 8.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-log2_spread, log2_spread);
  const float magnitude = std::exp2(exponent(gen));
  std::vector<float> values(n);
  for (float& v : values) v = normal(gen) * magnitude;
  return values;
}

// ---- e4m3 ----

TEST(E4M3, DecodesEveryCodeToItsTextbookValue) {
  for (unsigned code = 0; code < 256; ++code) {
    const float value = decode_e4m3(static_cast<std::uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(value, reference_minifloat(code, 4, 3, 7)) << code;
    EXPECT_EQ(std::signbit(value), code >= 0x80) << code;
  }
  EXPECT_EQ(decode_e4m3(0x7e), 448.0f);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(decode_e4m3(0x38), 1.0f);
}

TEST(E4M3, EncodeInvertsDecodeIncludingSignedZero) {
  for (unsigned code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(encode_e4m3(decode_e4m3(static_cast<std::uint8_t>(code))), code) << code;
  }
  EXPECT_EQ(encode_e4m3(0.0f), 0x00);
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
}

// For every pair of neighbouring codes: the midpoint goes to the code with an even mantissa,
// and anything off the midpoint to the nearer code.
template <typename Decode, typename Encode>
void expect_round_to_nearest_even(unsigned max_code, unsigned sign_bit, Decode decode,
                                  Encode encode) {
  for (unsigned low = 0; low < max_code; ++low) {
    const float a = decode(static_cast<std::uint8_t>(low));
    const float b = decode(static_cast<std::uint8_t>(low + 1));
    const float mid = (a + b) / 2;  // exact: the codes have few significant bits
    ASSERT_EQ(mid - a, b - mid);
    const unsigned even = low % 2 == 0 ? low : low + 1;
    EXPECT_EQ(encode(mid), even) << "between codes " << low << " and " << low + 1;
    EXPECT_EQ(encode(-mid), even | sign_bit) << low;
    EXPECT_EQ(encode(std::nextafter(mid, 0.0f)), low) << low;
    EXPECT_EQ(encode(std::nextafter(mid, kInf)), low + 1) << low;
  }
}

TEST(E4M3, RoundsTiesToEven) {
  expect_round_to_nearest_even(kE4M3MaxCode, 0x80, decode_e4m3, encode_e4m3);
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // halfway to the smallest subnormal
  EXPECT_EQ(encode_e4m3(1.0f + 1.0f / 16), 0x38);       // halfway 1 .. 1.125: even is 1
  EXPECT_EQ(encode_e4m3(1.0f + 3.0f / 16), 0x3a);       // halfway 1.125 .. 1.25: even is 1.25
}

TEST(E4M3, SaturatesAndMapsNaN) {
  for (const float big : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 3e38f, kInf}) {
    EXPECT_EQ(encode_e4m3(big), 0x7e) << big;
    EXPECT_EQ(encode_e4m3(-big), 0xfe) << big;
  }
  EXPECT_EQ(encode_e4m3(kNaN), 0x7f);
  EXPECT_EQ(encode_e4m3(-kNaN), 0x7f);
  EXPECT_EQ(encode_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// ---- e2m1 ----

TEST(E2M1, DecodesAllSixteenNibbles) {
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (unsigned nibble = 0; nibble < 16; ++nibble) {
    const float value = decode_e2m1(static_cast<std::uint8_t>(nibble));
    const float magnitude = expected[nibble & 7];
    EXPECT_EQ(value, nibble & 8 ? -magnitude : magnitude) << nibble;
    EXPECT_EQ(value, reference_minifloat(nibble, 2, 1, 1)) << nibble;
    EXPECT_EQ(std::signbit(value), nibble >= 8) << nibble;
    // Only the low four bits count.
    EXPECT_EQ(decode_e2m1(static_cast<std::uint8_t>(nibble | 0xa0)), value) << nibble;
    EXPECT_EQ(encode_e2m1(value), nibble) << nibble;
  }
}

TEST(E2M1, RoundsTiesToEvenAndSaturates) {
  expect_round_to_nearest_even(kE2M1MaxCode, 0x8, decode_e2m1, encode_e2m1);
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);
  EXPECT_EQ(encode_e2m1(1.25f), 0x2);  // 1.0 has the even mantissa
  EXPECT_EQ(encode_e2m1(2.5f), 0x4);
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);
  for (const float big : {6.0f, 6.5f, 7.0f, 100.0f, kInf}) {
    EXPECT_EQ(encode_e2m1(big), 0x7) << big;
    EXPECT_EQ(encode_e2m1(-big), 0xf) << big;
  }
}

// ---- UE8M0 ----

TEST(UE8M0, DecodesEveryCode) {
  for (unsigned code = 0; code < 255; ++code) {
    const float value = decode_ue8m0(static_cast<std::uint8_t>(code));
    EXPECT_EQ(value, std::pow(2.0, int(code) - 127)) << code;
    if (code > 0) EXPECT_EQ(value, 2 * decode_ue8m0(static_cast<std::uint8_t>(code - 1)));
  }
  EXPECT_EQ(decode_ue8m0(127), 1.0f);
  EXPECT_GT(decode_ue8m0(0), 0.0f);
  EXPECT_TRUE(std::isnan(decode_ue8m0(255)));
}

// ---- bf16 ----

TEST(BF16, EveryPatternRoundTrips) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto pattern = static_cast<std::uint16_t>(bits);
    const float value = bf16_to_float(pattern);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(value), bits << 16);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value)))) << bits;
    } else {
      EXPECT_EQ(float_to_bf16(value), pattern) << bits;
    }
  }
}

TEST(BF16, RoundsTiesToEven) {
  auto gen = rng(7);
  std::uniform_int_distribution<std::uint32_t> pattern(0, 0x7f7e);  // finite, below the largest
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t low = pattern(gen) | (i % 2 ? 0x8000u : 0u);
    const std::uint32_t base = low << 16;
    const std::uint16_t even = static_cast<std::uint16_t>(low % 2 == 0 ? low : low + 1);
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(base | 0x8000)), even) << low;
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(base | 0x7fff)), low) << low;
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>(base | 0x8001)), low + 1) << low;
  }
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to +inf
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // tie: even is 1.0
}

TEST(BF16, KeepsNaNsNaN) {
  // Payload only in the bits truncation drops: a naive conversion would give infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0xff800001u)))));
  EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
}

// ---- scale packing and MXFP4 element access ----

TEST(PackedScales, LittleEndianBytes) {
  EXPECT_EQ(pack_scales(std::vector<std::uint8_t>{1, 2, 3, 4}), 0x04030201);
  EXPECT_EQ(pack_scales(std::vector<std::uint8_t>{0x7f, 0x80}), 0x807f);
  auto gen = rng(11);
  std::uniform_int_distribution<int> byte(0, 254);
  for (int i = 0; i < 1000; ++i) {
    const std::size_t count = 1 + i % 4;
    std::vector<std::uint8_t> codes(count);
    for (auto& c : codes) c = static_cast<std::uint8_t>(byte(gen));
    const std::int32_t packed = pack_scales(codes);
    for (std::size_t b = 0; b < 4; ++b) {
      EXPECT_EQ(packed_scale_byte(packed, static_cast<int>(b)), b < count ? codes[b] : 0);
    }
  }
}

TEST(PackedScales, RefusesOutOfRange) {
  EXPECT_THROW(pack_scales(std::vector<std::uint8_t>(5, 127)), InvalidArgument);
  EXPECT_THROW(packed_scale_byte(0, 4), InvalidArgument);
  EXPECT_THROW(packed_scale_byte(0, -1), InvalidArgument);
}

TEST(Mxfp4Element, LowNibbleIsEvenElement) {
  auto gen = rng(13);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::uint8_t> packed(64);
  for (auto& b : packed) b = static_cast<std::uint8_t>(byte(gen));
  for (std::int64_t d = 0; d < 128; ++d) {
    const std::uint8_t b = packed[static_cast<std::size_t>(d / 2)];
    const std::uint8_t nibble = d % 2 == 0 ? b & 0xf : b >> 4;
    EXPECT_EQ(mxfp4_element(packed.data(), d), decode_e2m1(nibble)) << d;
  }
}

// ---- quantizers ----

// Distance from `target` to the nearest of the first `codes` non-negative codes (by magnitude).
template <typename Decode>
float nearest_distance(float target, unsigned codes, Decode decode) {
  float best = kInf;
  for (unsigned c = 0; c < codes; ++c) {
    best = std::min(best, std::fabs(std::fabs(target) - decode(static_cast<std::uint8_t>(c))));
  }
  return best;
}

TEST(QuantizeFp8Token, ScaleIsAmaxOver448AndCodesAreNearest) {
  auto gen = rng(17);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> x = random_values(gen, 128);
    std::vector<std::uint8_t> codes(x.size());
    const float scale = quantize_fp8_token(x, codes);
    float amax = 0.0f;
    for (const float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(scale, amax / 448.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float scaled = x[i] / scale;
      const float decoded = decode_e4m3(codes[i]);
      EXPECT_EQ(std::fabs(scaled - decoded),
                nearest_distance(scaled, kE4M3MaxCode + 1, decode_e4m3));
      EXPECT_TRUE(decoded == 0.0f || std::signbit(decoded) == std::signbit(x[i]));
      if (std::fabs(x[i]) == amax) EXPECT_EQ(codes[i] & 0x7f, kE4M3MaxCode);
      // Dequantized error: half a code step (relative 2^-4, or 2^-10 of the scale among
      // subnormals), plus the float rounding of x / scale (relative 2^-24).
      const double error = std::fabs(double(decoded) * double(scale) - double(x[i]));
      const double half_step =
          std::max(std::fabs(double(x[i])) / 16, std::ldexp(double(scale), -10));
      EXPECT_LE(error, half_step + std::fabs(double(x[i])) * std::ldexp(1.0, -24));
    }
  }
}

TEST(QuantizeFp8Token, ZeroVectorHasUnitScale) {
  const std::vector<float> x(64, 0.0f);
  std::vector<std::uint8_t> codes(64, 0xaa);
  EXPECT_EQ(quantize_fp8_token(x, codes), 1.0f);
  for (const auto c : codes) EXPECT_EQ(c, 0);
}

struct MxCase {
  const char* name;
  float element_max;
  unsigned max_code;
  float (*decode)(std::uint8_t);
  // Quantizes x; returns packed scales and element codes (one per element).
  std::int32_t (*quantize)(const std::vector<float>&, std::vector<std::uint8_t>&);
};

std::int32_t quantize_mxfp8(const std::vector<float>& x, std::vector<std::uint8_t>& codes) {
  codes.assign(x.size(), 0);
  return quantize_mxfp8_vector(x, codes);
}

std::int32_t quantize_mxfp4(const std::vector<float>& x, std::vector<std::uint8_t>& codes) {
  std::vector<std::uint8_t> packed(x.size() / 2, 0x5a);  // junk: every nibble must be written
  const std::int32_t scales = quantize_mxfp4_vector(x, packed);
  codes.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    codes[i] = static_cast<std::uint8_t>(packed[i / 2] >> (4 * (i % 2)) & 0xf);
  }
  return scales;
}

const MxCase kMxCases[] = {
    {"MXFP8", 448.0f, kE4M3MaxCode, decode_e4m3, quantize_mxfp8},
    {"MXFP4", 6.0f, kE2M1MaxCode, decode_e2m1, quantize_mxfp4},
};

// Per-block magnitudes differ by up to 2^20, so each block needs its own scale.
std::vector<float> random_blocks(std::mt19937& gen, std::size_t dim) {
  std::vector<float> x;
  for (std::size_t b = 0; b < dim / kMxBlock; ++b) {
    const auto block = random_values(gen, kMxBlock, 10.0f);
    x.insert(x.end(), block.begin(), block.end());
  }
  return x;
}

TEST(QuantizeMx, SmallestPowerOfTwoScalesAndNearestCodes) {
  auto gen = rng(19);
  for (const MxCase& mx : kMxCases) {
    for (const std::size_t dim : {32u, 64u, 128u}) {
      for (int trial = 0; trial < 30; ++trial) {
        const std::vector<float> x = random_blocks(gen, dim);
        std::vector<std::uint8_t> codes;
        const std::int32_t packed = mx.quantize(x, codes);
        for (std::size_t b = 0; b < dim / kMxBlock; ++b) {
          const std::uint8_t scale_code = packed_scale_byte(packed, static_cast<int>(b));
          const float scale = decode_ue8m0(scale_code);
          float amax = 0.0f;
          for (std::size_t i = b * kMxBlock; i < (b + 1) * kMxBlock; ++i) {
            amax = std::max(amax, std::fabs(x[i]));
          }
          EXPECT_LE(amax / scale, mx.element_max) << mx.name;
          EXPECT_GT(amax / (scale / 2), mx.element_max) << mx.name << ": scale not the smallest";
          for (std::size_t i = b * kMxBlock; i < (b + 1) * kMxBlock; ++i) {
            const float scaled = x[i] / scale;  // exact: power of two
            const float decoded = mx.decode(codes[i]);
            EXPECT_EQ(std::fabs(scaled - decoded),
                      nearest_distance(scaled, mx.max_code + 1, mx.decode))
                << mx.name << " element " << i;
            EXPECT_TRUE(decoded == 0.0f || std::signbit(decoded) == std::signbit(x[i]));
          }
        }
        for (std::size_t b = dim / kMxBlock; b < 4; ++b) {
          EXPECT_EQ(packed_scale_byte(packed, static_cast<int>(b)), 0) << mx.name;
        }
      }
    }
  }
}

// Codes and packed scales of a vector quantized as one MX format, before and after a change.
struct Requantized {
  std::vector<std::uint8_t> before, after;
  std::int32_t scales_before = 0, scales_after = 0;
};

// Quantizes x as `mx`, lets `change` edit x, and quantizes it again.
template <class Change>
Requantized requantize(const MxCase& mx, std::vector<float> x, Change change) {
  Requantized q;
  q.scales_before = mx.quantize(x, q.before);
  change(x);
  q.scales_after = mx.quantize(x, q.after);
  return q;
}

TEST(QuantizeMx, BlocksAreIndependent) {
  auto gen = rng(23);
  for (const MxCase& mx : kMxCases) {
    const Requantized q = requantize(mx, random_blocks(gen, 128), [&](std::vector<float>& x) {
      // Replace block 2 with data of a very different magnitude.
      const auto replacement = random_values(gen, kMxBlock, 0.0f);
      for (std::size_t i = 0; i < kMxBlock; ++i) x[2 * kMxBlock + i] = replacement[i] * 1e6f;
    });
    for (int b = 0; b < 4; ++b) {
      if (b == 2) continue;  // the replaced block
      EXPECT_EQ(packed_scale_byte(q.scales_after, b), packed_scale_byte(q.scales_before, b));
      const auto first = static_cast<std::size_t>(b * kMxBlock);
      for (std::size_t i = first; i < first + kMxBlock; ++i) {
        EXPECT_EQ(q.after[i], q.before[i]) << mx.name << " element " << i;
      }
    }
    EXPECT_NE(packed_scale_byte(q.scales_after, 2), packed_scale_byte(q.scales_before, 2));
  }
}

TEST(QuantizeMx, ScalingABlockByAPowerOfTwoShiftsOnlyItsScale) {
  auto gen = rng(29);
  for (const MxCase& mx : kMxCases) {
    const Requantized q = requantize(mx, random_blocks(gen, 64), [](std::vector<float>& x) {
      for (std::size_t i = 0; i < kMxBlock; ++i) x[i] *= 8.0f;
    });
    EXPECT_EQ(packed_scale_byte(q.scales_after, 0), packed_scale_byte(q.scales_before, 0) + 3);
    EXPECT_EQ(packed_scale_byte(q.scales_after, 1), packed_scale_byte(q.scales_before, 1));
    EXPECT_EQ(q.after, q.before) << mx.name;
  }
}

TEST(QuantizeMx, ZeroBlockHasUnitScale) {
  std::vector<float> x(64, 0.0f);
  x[40] = 3.0f;  // block 1 non-zero, block 0 all zero
  std::vector<std::uint8_t> codes(64);
  const std::int32_t packed = quantize_mxfp8_vector(x, codes);
  EXPECT_EQ(packed_scale_byte(packed, 0), 127);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0);
}

TEST(Quantizers, RefuseBadSizesAndNonFiniteInput) {
  std::vector<float> x(48, 1.0f);
  std::vector<std::uint8_t> codes(48);
  EXPECT_THROW(quantize_mxfp8_vector(x, codes), InvalidArgument);  // not a multiple of 32
  x.assign(160, 1.0f);
  codes.assign(160, 0);
  EXPECT_THROW(quantize_mxfp8_vector(x, codes), InvalidArgument);  // more than 4 blocks
  x.assign(64, 1.0f);
  codes.assign(63, 0);
  EXPECT_THROW(quantize_mxfp8_vector(x, codes), InvalidArgument);
  EXPECT_THROW(quantize_fp8_token(x, codes), InvalidArgument);
  codes.assign(64, 0);
  EXPECT_THROW(quantize_mxfp4_vector(x, codes), InvalidArgument);  // needs 32 bytes
  x[5] = kNaN;
  const std::vector<std::uint8_t> untouched(64, 0x11);
  codes = untouched;
  EXPECT_THROW(quantize_fp8_token(x, codes), InvalidArgument);
  EXPECT_THROW(quantize_mxfp8_vector(x, codes), InvalidArgument);
  EXPECT_EQ(codes, untouched);
  x[5] = kInf;
  EXPECT_THROW(quantize_fp8_token(x, codes), InvalidArgument);
}

}  // namespace
}  // namespace mqa_logits
