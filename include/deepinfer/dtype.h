// Element types and exact scalar conversions (docs/numerics.md §1, §2): bf16 and fp8 (e4m3fn,
// e5m2), round-to-nearest-even; e4m3fn saturates to ±448 (it has no inf) and keeps NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t { f32, f64, bf16, e4m3, e5m2, i8, u8, i32, i64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
      return 2;
    default:
      return 1;
  }
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::e4m3:
      return "e4m3";
    case DType::e5m2:
      return "e5m2";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

// bf16 / fp8 storage types: plain bits, converted explicitly.
struct bf16 {
  uint16_t bits = 0;
};
struct fp8_e4m3 {
  uint8_t bits = 0;
};
struct fp8_e5m2 {
  uint8_t bits = 0;
};

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8E5m2Max = 57344.0f;

inline float bf16_to_f32(bf16 v) { return std::bit_cast<float>(uint32_t(v.bits) << 16); }

inline bf16 f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((x >> 16) | 0x40u)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return bf16{uint16_t(x >> 16)};
}

namespace detail {
// Encodes |f| (finite, below the format's overflow threshold) as an fp8 magnitude with
// kExp exponent bits, kMan mantissa bits and bias kBias, round-to-nearest-even.
template <int kExp, int kMan, int kBias>
inline uint8_t fp8_encode_magnitude(float af) {
  const float min_normal = std::ldexp(1.0f, 1 - kBias);
  if (af < min_normal) {
    // Subnormal: count units of 2^(1-bias-man); exact scaling then RNE to an integer.
    // A result of 2^man lands exactly on the smallest normal's code.
    const float units = std::ldexp(af, kBias - 1 + kMan);
    return uint8_t(std::nearbyint(units));
  }
  uint32_t x = std::bit_cast<uint32_t>(af);
  constexpr int shift = 23 - kMan;
  x += (1u << (shift - 1)) - 1u + ((x >> shift) & 1u);
  return uint8_t((x >> shift) - (uint32_t(127 - kBias) << kMan));
}
}  // namespace detail

inline fp8_e4m3 f32_to_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const float af = std::fabs(f);
  if (std::isnan(f)) return fp8_e4m3{uint8_t(sign | 0x7f)};
  if (af >= kFp8E4m3Max) return fp8_e4m3{uint8_t(sign | 0x7e)};  // saturate, inf included
  return fp8_e4m3{uint8_t(sign | detail::fp8_encode_magnitude<4, 3, 7>(af))};
}

inline fp8_e5m2 f32_to_e5m2(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const float af = std::fabs(f);
  if (std::isnan(f)) return fp8_e5m2{uint8_t(sign | 0x7f)};
  // 61440 is the midpoint between the max (57344, odd mantissa) and 2^16: ties go to inf.
  if (af >= 61440.0f) return fp8_e5m2{uint8_t(sign | 0x7c)};  // IEEE-style overflow to inf
  return fp8_e5m2{uint8_t(sign | detail::fp8_encode_magnitude<5, 2, 15>(af))};
}

inline float e4m3_to_f32(fp8_e4m3 v) {
  const int e = (v.bits >> 3) & 0xf, m = v.bits & 7;
  const float s = (v.bits & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return std::copysign(NAN, s);
  if (e == 0) return s * std::ldexp(float(m), -9);
  return s * std::ldexp(float(8 + m), e - 10);
}

inline float e5m2_to_f32(fp8_e5m2 v) {
  const int e = (v.bits >> 2) & 0x1f, m = v.bits & 3;
  const float s = (v.bits & 0x80) ? -1.0f : 1.0f;
  if (e == 31) return m == 0 ? s * INFINITY : std::copysign(NAN, s);
  if (e == 0) return s * std::ldexp(float(m), -16);
  return s * std::ldexp(float(4 + m), e - 17);
}

// Round to bf16 and back: the "one rounding" every op applies to its bf16 output.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace deepinfer
