#include "ep/row_math.h"

#include <deepinfer/dtype.h>

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define DI_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DI_ROW_CLONES
#endif

// -Wpsabi: the vector helpers below are inlined into each clone; no 64-byte vector crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"

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

// 16 columns at a time in GCC vector types (lowered per clone: one zmm, two ymm, or four xmm), so
// a row's sum stays in registers across its m addends.
typedef float V16f __attribute__((vector_size(64)));
typedef uint32_t V16u __attribute__((vector_size(64)));
typedef uint16_t V16h __attribute__((vector_size(32)));
[[gnu::always_inline]] inline V16f load_bf16(const uint16_t* p) {
  V16h h;
  std::memcpy(&h, p, sizeof(h));
  return reinterpret_cast<V16f>(__builtin_convertvector(h, V16u) << 16);
}
[[gnu::always_inline]] inline V16u bf16_bits(V16f f) {  // bf16_bits above, lane-wise
  const V16u x = reinterpret_cast<V16u>(f);
  const V16u rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const V16u quiet_nan = (x >> 16) | 0x40u;
  return (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// 32 bf16 as two f32 vectors without a widening step: the even elements (the low half of each
// 32-bit word, shifted up) and the odd ones (the high half, masked). Rows are summed element-wise,
// so the even/odd order is kept until the store puts the pairs back together.
struct EvenOdd {
  V16f even, odd;
};
[[gnu::always_inline]] inline EvenOdd load_bf16x32(const uint16_t* p) {
  V16u x;
  std::memcpy(&x, p, sizeof(x));
  return {reinterpret_cast<V16f>(x << 16), reinterpret_cast<V16f>(x & 0xffff0000u)};
}
[[gnu::always_inline]] inline V16u rounded_bits(V16f acc, bool canon) {
  const V16u bits = bf16_bits(acc);
  return canon ? (bits == 0x8000u ? V16u{} : bits) : bits;
}
// Stores 32 sums (as even/odd halves) as bf16 bits and/or their f32 values.
[[gnu::always_inline]] inline void store_sum32(V16f even, V16f odd, bool canon, uint16_t* out_bits, float* out_f32,
                                               size_t c) {
  const V16u e = rounded_bits(even, canon), o = rounded_bits(odd, canon);
  if (out_bits) {
    const V16u pairs = e | (o << 16);
    std::memcpy(out_bits + c, &pairs, sizeof(pairs));
  }
  if (out_f32) {
    const V16u fe = e << 16, fo = o << 16;
    const V16u lo = __builtin_shufflevector(fe, fo, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const V16u hi = __builtin_shufflevector(fe, fo, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    std::memcpy(out_f32 + c, &lo, sizeof(lo));
    std::memcpy(out_f32 + c + 16, &hi, sizeof(hi));
  }
}
// Stores 16 sums as bf16 bits and/or their f32 values.
[[gnu::always_inline]] inline void store_sum(V16f acc, bool canon, uint16_t* out_bits, float* out_f32, size_t c) {
  const V16u bits = rounded_bits(acc, canon);
  if (out_bits) {
    const V16h h = __builtin_convertvector(bits, V16h);
    std::memcpy(out_bits + c, &h, sizeof(h));
  }
  if (out_f32) {
    const V16u f = bits << 16;
    std::memcpy(out_f32 + c, &f, sizeof(f));
  }
}

DI_ROW_CLONES void weighted_sum(const float* w, const uint16_t* const* y, int m, size_t n, bool canon,
                                uint16_t* out_bits, float* out_f32) {
  size_t c = 0;
  for (; c + 64 <= n; c += 64) {  // four independent sums hide the add latency
    V16f e0 = {}, o0 = {}, e1 = {}, o1 = {};
    EvenOdd v0{}, v1{};
    for (int s = 0; s < m; ++s) {
      const float ws = w ? w[s] : 1.0f;
      // Without the expand layout a row's local slots share one y row: decoded once.
      if (s == 0 || y[s] != y[s - 1]) v0 = load_bf16x32(y[s] + c), v1 = load_bf16x32(y[s] + c + 32);
      e0 += ws * v0.even;
      o0 += ws * v0.odd;
      e1 += ws * v1.even;
      o1 += ws * v1.odd;
    }
    store_sum32(e0, o0, canon, out_bits, out_f32, c);
    store_sum32(e1, o1, canon, out_bits, out_f32, c + 32);
  }
  for (; c + 16 <= n; c += 16) {
    V16f acc = {};
    for (int s = 0; s < m; ++s) acc += (w ? w[s] : 1.0f) * load_bf16(y[s] + c);
    store_sum(acc, canon, out_bits, out_f32, c);
  }
  for (; c < n; ++c) {  // the last n % 16 columns, same arithmetic
    float acc = 0.0f;
    for (int s = 0; s < m; ++s) acc += (w ? w[s] : 1.0f) * from_bits(y[s][c]);
    uint32_t bits = bf16_bits(acc);
    if (canon && bits == 0x8000u) bits = 0;
    if (out_bits) out_bits[c] = uint16_t(bits);
    if (out_f32) out_f32[c] = std::bit_cast<float>(bits << 16);
  }
}
DI_ROW_CLONES void sum_of_partials(const float* w, const uint16_t* const* y, const int* group_end, int groups,
                                   size_t n, uint16_t* out_bits) {
  // A partial rounds to bf16 and comes back as f32 (bits << 16) without leaving its register.
  auto rounded = [](V16f p) { return reinterpret_cast<V16f>(rounded_bits(p, true) << 16); };
  size_t c = 0;
  for (; c + 64 <= n; c += 64) {
    V16f e0 = {}, o0 = {}, e1 = {}, o1 = {};
    EvenOdd v0{}, v1{};
    for (int g = 0, s = 0; g < groups; ++g) {
      V16f pe0 = {}, po0 = {}, pe1 = {}, po1 = {};
      for (; s < group_end[g]; ++s) {
        // Without the expand layout a rank's slots share one y row: decoded once per group.
        if (s == 0 || y[s] != y[s - 1]) v0 = load_bf16x32(y[s] + c), v1 = load_bf16x32(y[s] + c + 32);
        pe0 += w[s] * v0.even;
        po0 += w[s] * v0.odd;
        pe1 += w[s] * v1.even;
        po1 += w[s] * v1.odd;
      }
      e0 += rounded(pe0);
      o0 += rounded(po0);
      e1 += rounded(pe1);
      o1 += rounded(po1);
    }
    store_sum32(e0, o0, false, out_bits, nullptr, c);
    store_sum32(e1, o1, false, out_bits, nullptr, c + 32);
  }
  for (; c + 16 <= n; c += 16) {
    V16f acc = {};
    for (int g = 0, s = 0; g < groups; ++g) {
      V16f p = {};
      for (; s < group_end[g]; ++s) p += w[s] * load_bf16(y[s] + c);
      acc += rounded(p);
    }
    store_sum(acc, false, out_bits, nullptr, c);
  }
  for (; c < n; ++c) {
    float acc = 0.0f;
    for (int g = 0, s = 0; g < groups; ++g) {
      float p = 0.0f;
      for (; s < group_end[g]; ++s) p += w[s] * from_bits(y[s][c]);
      uint32_t bits = bf16_bits(p);
      if (bits == 0x8000u) bits = 0;
      acc += std::bit_cast<float>(bits << 16);
    }
    out_bits[c] = uint16_t(bf16_bits(acc));
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
