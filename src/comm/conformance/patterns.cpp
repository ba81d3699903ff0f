#include "comm/conformance/patterns.h"

#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <limits>

#include "core/check.h"

namespace deepinfer::conformance {

namespace {

// i32: 7 in 8 within 2^24 of INT32_MAX or INT32_MIN (|v| >= 2^24 always), 1 in 8 any value.
uint32_t pattern_i32(uint64_t h) {
  if (((h >> 56) & 7) == 0) return uint32_t(h >> 8);
  const uint32_t off = uint32_t(h & 0xffffff);
  return (h >> 63) ? uint32_t(std::numeric_limits<int32_t>::min()) + off
                   : uint32_t(std::numeric_limits<int32_t>::max()) - off;
}

// IEEE bits with `mant_bits` mantissa and `exp_bits` exponent bits: category from the top
// three bits of h, mantissa and sign from the low bits.
uint64_t pattern_float(uint64_t h, int mant_bits, int exp_bits) {
  const uint64_t mant = h & ((uint64_t(1) << mant_bits) - 1);
  const uint64_t exp_max = (uint64_t(1) << exp_bits) - 1;  // all ones: inf/NaN
  const uint64_t sign = ((h >> 60) & 1) << (mant_bits + exp_bits);
  const uint64_t r = h >> mant_bits;  // bits for the exponent choice
  uint64_t exp = 0;
  switch (h >> 61) {
    case 0:
      exp = 0;
      break;  // denormal (or ±0)
    case 1:
      return uint64_t(1) << (mant_bits + exp_bits);  // -0
    case 2:
      exp = exp_max - 1 - (r & 7);
      break;  // large magnitude
    case 3:
      exp = exp_max;
      break;  // inf / NaN payload
    default:
      exp = 1 + r % (exp_max - 1);
      break;  // any normal
  }
  return sign | (exp << mant_bits) | mant;
}

}  // namespace

uint64_t pattern_bits(DType dtype, uint64_t key) {
  const uint64_t h = mix64(key);
  switch (dtype) {
    case DType::i32:
      return pattern_i32(h);
    case DType::i64:
      return h;
    case DType::f32:
      return pattern_float(h, 23, 8);
    case DType::f64:
      return pattern_float(h, 52, 11);
    case DType::bf16:
      return h & 0xffff;
    default:
      return (h ^ (h >> 29)) & 0xff;  // u8, i8, e4m3, e5m2
  }
}

void fill_pattern(void* dst, size_t n, DType dtype, uint64_t seed) {
  auto* p = static_cast<std::byte*>(dst);
  const size_t es = dtype_size(dtype);
  switch (es) {
    case 8:
      for (size_t i = 0; i < n; ++i) store_bits(p + i * 8, 8, pattern_bits(dtype, seed + i));
      break;
    case 4:
      for (size_t i = 0; i < n; ++i) store_bits(p + i * 4, 4, pattern_bits(dtype, seed + i));
      break;
    case 2:
      for (size_t i = 0; i < n; ++i) store_bits(p + i * 2, 2, pattern_bits(dtype, seed + i));
      break;
    default:
      for (size_t i = 0; i < n; ++i) store_bits(p + i, 1, pattern_bits(dtype, seed + i));
      break;
  }
}

std::string format_bits(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::i32:
      return fmt::format("{}", int32_t(uint32_t(bits)));
    case DType::i64:
      return fmt::format("{}", int64_t(bits));
    case DType::f32: {
      const float f = std::bit_cast<float>(uint32_t(bits));
      return fmt::format("{} (0x{:08x})", f, uint32_t(bits));
    }
    case DType::f64: {
      const double d = std::bit_cast<double>(bits);
      return fmt::format("{} (0x{:016x})", d, bits);
    }
    case DType::bf16:
      return fmt::format("{} (0x{:04x})", bf16_to_f32(bf16{uint16_t(bits)}), uint16_t(bits));
    default:
      return fmt::format("0x{:02x}", uint8_t(bits));
  }
}

}  // namespace deepinfer::conformance
