// Exact codecs of the number formats (docs/contract.md, "What is computed") and quantizers from
// float. Usable on the host by anyone: tests, benchmarks, users preparing inputs.
#pragma once

#include <cstdint>
#include <span>

namespace mqa_logits {

enum class Format : std::uint8_t { kFP8, kMXFP8, kMXFP4 };
const char* format_name(Format format);

inline constexpr int kMxBlock = 32;  // elements per UE8M0 scale

// ---- element codecs (exact) ----
float decode_e4m3(std::uint8_t code);   // OCP E4M3 "fn": finite, max 448; 0x7f/0xff are NaN
std::uint8_t encode_e4m3(float value);  // round to nearest even, saturate to +-448; NaN -> 0x7f
float decode_e2m1(std::uint8_t nibble);  // low 4 bits; bit 3 is the sign
std::uint8_t encode_e2m1(float value);   // round to nearest even, saturate to +-6
float decode_ue8m0(std::uint8_t code);   // 2^(code - 127); 255 is NaN
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);  // round to nearest even (NaN stays NaN)

// Packed UE8M0 scales: block b of one vector in byte b of an int32 (little-endian).
std::uint8_t packed_scale_byte(std::int32_t packed, int block);
std::int32_t pack_scales(std::span<const std::uint8_t> codes);  // at most 4 codes

// Element d of an MXFP4 vector stored as bytes (low nibble = even element).
float mxfp4_element(const std::uint8_t* packed, std::int64_t d);

// ---- quantizers from float ----
// FP8, one vector (a key token): scale = amax / 448 (1 when amax is 0), codes = x / scale.
float quantize_fp8_token(std::span<const float> x, std::span<std::uint8_t> codes);

// MX: per 32-element block the smallest power-of-two scale with |x| / scale within the element
// range (448 for e4m3, 6 for e2m1). Returns the packed scales of the vector (D/32 blocks).
// MXFP8 writes D codes; MXFP4 writes D/2 bytes.
std::int32_t quantize_mxfp8_vector(std::span<const float> x, std::span<std::uint8_t> codes);
std::int32_t quantize_mxfp4_vector(std::span<const float> x, std::span<std::uint8_t> packed);

}  // namespace mqa_logits
