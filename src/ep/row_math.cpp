#include "ep/row_math.h"

#include <deepinfer/dtype.h>

#include <algorithm>
#include <bit>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define DI_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DI_ROW_CLONES
#endif

namespace deepinfer::ep::rows {
namespace {
inline float from_bits(uint16_t b) { return bf16_to_f32(bf16{b}); }
// f32_to_bf16 (dtype.h) written as selects, so the loops around it vectorise.
inline uint32_t bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}
}  // namespace

DI_ROW_CLONES void weighted_sum(const float* w, const uint16_t* const* y, int m, size_t n, bool canon,
                                uint16_t* out_bits, float* out_f32) {
  constexpr size_t kChunk = 256;  // columns summed in registers / L1 before rounding
  float acc[kChunk];
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t len = std::min(kChunk, n - c0);
    for (size_t c = 0; c < len; ++c) acc[c] = 0.0f;
    for (int s = 0; s < m; ++s) {
      const uint16_t* ys = y[s] + c0;
      const float ws = w ? w[s] : 1.0f;
      for (size_t c = 0; c < len; ++c) acc[c] += ws * from_bits(ys[c]);
    }
    uint32_t bits[kChunk];
    for (size_t c = 0; c < len; ++c) bits[c] = bf16_bits(acc[c]);
    if (canon)
      for (size_t c = 0; c < len; ++c) bits[c] = bits[c] == 0x8000u ? 0u : bits[c];
    if (out_bits)
      for (size_t c = 0; c < len; ++c) out_bits[c0 + c] = uint16_t(bits[c]);
    if (out_f32)
      for (size_t c = 0; c < len; ++c) out_f32[c0 + c] = std::bit_cast<float>(bits[c] << 16);
  }
}
DI_ROW_CLONES void scale_bf16(float w, const uint16_t* y, float* dst, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] = canon(w * from_bits(y[c]));
}
DI_ROW_CLONES void add_f32(const float* src, float* acc, size_t n) {
  for (size_t c = 0; c < n; ++c) acc[c] += src[c];
}
DI_ROW_CLONES void to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] = uint16_t(bf16_bits(src[c]));
}

}  // namespace deepinfer::ep::rows
