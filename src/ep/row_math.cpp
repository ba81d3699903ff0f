#include "ep/row_math.h"

#include <deepinfer/dtype.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/cpu_clones.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DI_BF16_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512bf16")))
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
// The first 32 of 64 columns from c, prefetching the row kPrefetch columns ahead. A token's rows
// are read side by side, several streams at once, and the hardware prefetcher alone leaves the
// loads stalling (docs/performance.md §3.3). Past the row's end the prefetch reaches the peer's
// next row, mostly the next token's.
constexpr size_t kPrefetch = 1024;
[[gnu::always_inline]] inline EvenOdd load_row64(const uint16_t* row, size_t c) {
  __builtin_prefetch(row + c + kPrefetch);
  __builtin_prefetch(row + c + kPrefetch + 32);
  return load_bf16x32(row + c);
}
// 32·kBlocks columns of a row from c, decoded, prefetching ahead (kBlocks even).
template <int kBlocks>
[[gnu::always_inline]] inline void load_blocks(EvenOdd* v, const uint16_t* row, size_t c) {
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; b += 2)
    v[b] = load_row64(row, c + 32 * size_t(b)),
    v[b + 1] = load_bf16x32(row + c + 32 * size_t(b + 1));
}
[[gnu::always_inline]] inline V16u rounded_bits(V16f acc, bool canon) {
  const V16u bits = bf16_bits(acc);
  return canon ? (bits == 0x8000u ? V16u{} : bits) : bits;
}
// Stores 32 sums (as even/odd halves) as bf16 bits and/or their f32 values.
[[gnu::always_inline]] inline void store_sum32(V16f even, V16f odd, bool canon, uint16_t* out_bits,
                                               float* out_f32, size_t c) {
  const V16u e = rounded_bits(even, canon), o = rounded_bits(odd, canon);
  if (out_bits) {
    const V16u pairs = e | (o << 16);
    std::memcpy(out_bits + c, &pairs, sizeof(pairs));
  }
  if (out_f32) {
    const V16u fe = e << 16, fo = o << 16;
    const V16u lo =
        __builtin_shufflevector(fe, fo, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const V16u hi = __builtin_shufflevector(fe, fo, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29,
                                            14, 30, 15, 31);
    std::memcpy(out_f32 + c, &lo, sizeof(lo));
    std::memcpy(out_f32 + c + 16, &hi, sizeof(hi));
  }
}
// Stores 16 sums as bf16 bits and/or their f32 values.
[[gnu::always_inline]] inline void store_sum(V16f acc, bool canon, uint16_t* out_bits,
                                             float* out_f32, size_t c) {
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

// 32·kBlocks columns from c of weighted_sum; eight independent sums (kBlocks = 4) keep both add
// pipes busy where four wait on the add latency (see sum_of_partials_block).
template <int kBlocks>
[[gnu::always_inline]] inline void weighted_sum_block(const float* w, const uint16_t* const* y,
                                                      int m, size_t c, bool canon,
                                                      uint16_t* out_bits, float* out_f32) {
  V16f e[2 * kBlocks] = {};
  EvenOdd v[kBlocks] = {};
  for (int s = 0; s < m; ++s) {
    const float ws = w ? w[s] : 1.0f;
    // Without the expand layout a row's local slots share one y row: decoded once.
    if (s == 0 || y[s] != y[s - 1]) load_blocks<kBlocks>(v, y[s], c);
#pragma GCC unroll 4
    for (int b = 0; b < kBlocks; ++b) {
      e[2 * b] += ws * v[b].even;
      e[2 * b + 1] += ws * v[b].odd;
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b)
    store_sum32(e[2 * b], e[2 * b + 1], canon, out_bits, out_f32, c + 32 * size_t(b));
}

DI_CPU_CLONES void weighted_sum(const float* w, const uint16_t* const* y, int m, size_t n,
                                bool canon, uint16_t* out_bits, float* out_f32) {
  size_t c = 0;
  for (; c + 128 <= n; c += 128) weighted_sum_block<4>(w, y, m, c, canon, out_bits, out_f32);
  for (; c + 64 <= n; c += 64) weighted_sum_block<2>(w, y, m, c, canon, out_bits, out_f32);
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
// bf16(p) back in f32 for a partial of the fast combine, four vectors at a time. Its -0 stays -0:
// the partials' sum starts at +0, and +0 + -0 = +0 (nearest even), so canon changes no sum.
struct IntegerRounding {  // as bf16_bits, then the low 16 bits cleared
  [[gnu::always_inline]] static V16f round(V16f p) {
    const V16u x = reinterpret_cast<V16u>(p);
    const V16u r =
        (x & 0x7fffffffu) > 0x7f800000u ? (x | 0x400000u) : x + 0x7fffu + ((x >> 16) & 1u);
    return reinterpret_cast<V16f>(r & 0xffff0000u);
  }
  [[gnu::always_inline]] static void round4(V16f& a, V16f& b, V16f& c, V16f& d) {
    a = round(a), b = round(b), c = round(c), d = round(d);
  }
  // The final sums of 32 columns (even/odd halves) as bf16.
  [[gnu::always_inline]] static void store32(V16f even, V16f odd, uint16_t* out) {
    store_sum32(even, odd, false, out, nullptr, 0);
  }
};
#ifdef DI_BF16_TARGET
// VCVTNEPS2BF16 rounds like bf16_bits in one instruction, but reads a denormal input as zero;
// four vectors with any denormal lane (rare: |p| < 2^-126) take IntegerRounding instead.
struct Bf16InstructionRounding {
  static constexpr int kDenormal = 0x20;  // VFPCLASSPS category
  DI_BF16_TARGET static V16f round(V16f p) {
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(p)));
    // The maskz forms: GCC 12 warns on the plain ones' undefined pass-through operand.
    return reinterpret_cast<V16f>(
        _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
  }
  DI_BF16_TARGET static void round4(V16f& a, V16f& b, V16f& c, V16f& d) {
    const __mmask16 any = _mm512_fpclass_ps_mask(reinterpret_cast<__m512>(a), kDenormal) |
                          _mm512_fpclass_ps_mask(reinterpret_cast<__m512>(b), kDenormal) |
                          _mm512_fpclass_ps_mask(reinterpret_cast<__m512>(c), kDenormal) |
                          _mm512_fpclass_ps_mask(reinterpret_cast<__m512>(d), kDenormal);
    if (__builtin_expect(any != 0, 0)) return IntegerRounding::round4(a, b, c, d);
    a = round(a), b = round(b), c = round(c), d = round(d);
  }
  // Both halves in one conversion, then the columns put back in order (one word permute):
  // 5 instructions against 12 for the integer rounding's pack.
  DI_BF16_TARGET static void store32(V16f even, V16f odd, uint16_t* out) {
    if (__builtin_expect((_mm512_fpclass_ps_mask(reinterpret_cast<__m512>(even), kDenormal) |
                          _mm512_fpclass_ps_mask(reinterpret_cast<__m512>(odd), kDenormal)) != 0,
                         0))
      return IntegerRounding::store32(even, odd, out);
    // Words 0..15 are the even columns' bf16, 16..31 the odd ones'; column 2i is even i.
    const __m512i h = reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(reinterpret_cast<__m512>(odd), reinterpret_cast<__m512>(even)));
    const __m512i order =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi16(order, h));
  }
};
#endif

// 32·kBlocks columns from c: per group the partials (each in its register: decoded once per group
// where a rank's slots share one y row, without the expand layout), rounded, then summed. Eight
// independent sums (kBlocks = 4) keep both add pipes busy; four leave them waiting on the add
// latency (docs/performance.md §3.3).
template <class Rounding, int kBlocks>
[[gnu::always_inline]] inline void sum_of_partials_block(const float* w, const uint16_t* const* y,
                                                         const int* group_end, int groups, size_t c,
                                                         uint16_t* out_bits) {
  static_assert(kBlocks % 2 == 0,
                "partials are rounded four vectors at a time, rows loaded 64 columns");
  V16f e[2 * kBlocks] = {};
  EvenOdd v[kBlocks] = {};
  for (int g = 0, s = 0; g < groups; ++g) {
    V16f p[2 * kBlocks] = {};
    for (; s < group_end[g]; ++s) {
      if (s == 0 || y[s] != y[s - 1]) load_blocks<kBlocks>(v, y[s], c);
#pragma GCC unroll 4
      for (int b = 0; b < kBlocks; ++b) {
        p[2 * b] += w[s] * v[b].even;
        p[2 * b + 1] += w[s] * v[b].odd;
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 2 * kBlocks; i += 4) Rounding::round4(p[i], p[i + 1], p[i + 2], p[i + 3]);
#pragma GCC unroll 8
    for (int i = 0; i < 2 * kBlocks; ++i) e[i] += p[i];
  }
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b)
    Rounding::store32(e[2 * b], e[2 * b + 1], out_bits + c + 32 * size_t(b));
}

template <class Rounding>
[[gnu::always_inline]] inline void sum_of_partials_loop(const float* w, const uint16_t* const* y,
                                                        const int* group_end, int groups, size_t n,
                                                        uint16_t* out_bits) {
  size_t c = 0;
  for (; c + 128 <= n; c += 128)
    sum_of_partials_block<Rounding, 4>(w, y, group_end, groups, c, out_bits);
  for (; c + 64 <= n; c += 64)
    sum_of_partials_block<Rounding, 2>(w, y, group_end, groups, c, out_bits);
  for (; c + 16 <= n; c += 16) {
    V16f acc = {};
    for (int g = 0, s = 0; g < groups; ++g) {
      V16f p = {};
      for (; s < group_end[g]; ++s) p += w[s] * load_bf16(y[s] + c);
      acc += IntegerRounding::round(p);
    }
    store_sum(acc, false, out_bits, nullptr, c);
  }
  for (; c < n; ++c) {
    float acc = 0.0f;
    for (int g = 0, s = 0; g < groups; ++g) {
      float p = 0.0f;
      for (; s < group_end[g]; ++s) p += w[s] * from_bits(y[s][c]);
      acc += std::bit_cast<float>(bf16_bits(p) << 16);
    }
    out_bits[c] = uint16_t(bf16_bits(acc));
  }
}

namespace {
DI_CPU_CLONES void sum_of_partials_portable(const float* w, const uint16_t* const* y,
                                            const int* group_end, int groups, size_t n,
                                            uint16_t* out_bits) {
  sum_of_partials_loop<IntegerRounding>(w, y, group_end, groups, n, out_bits);
}
#ifdef DI_BF16_TARGET
// flatten: Bf16InstructionRounding inlines here, where its instructions are allowed.
DI_BF16_TARGET [[gnu::flatten]] void sum_of_partials_avx512bf16(const float* w,
                                                                const uint16_t* const* y,
                                                                const int* group_end, int groups,
                                                                size_t n, uint16_t* out_bits) {
  sum_of_partials_loop<Bf16InstructionRounding>(w, y, group_end, groups, n, out_bits);
}
#endif
}  // namespace

std::vector<SumOfPartialsVersion> sum_of_partials_versions() {
  std::vector<SumOfPartialsVersion> v{{"portable", sum_of_partials_portable}};
#ifdef DI_BF16_TARGET
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16"))
    v.push_back({"avx512bf16", sum_of_partials_avx512bf16});
#endif
  return v;
}
void sum_of_partials(const float* w, const uint16_t* const* y, const int* group_end, int groups,
                     size_t n, uint16_t* out_bits) {
  static const SumOfPartialsFn best = sum_of_partials_versions().back().fn;
  best(w, y, group_end, groups, n, out_bits);
}
DI_CPU_CLONES void scale_bf16(float w, const uint16_t* y, float* dst, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] = canon(w * from_bits(y[c]));
}
DI_CPU_CLONES void add_f32(const float* src, float* acc, size_t n) {
  for (size_t c = 0; c < n; ++c) acc[c] += src[c];
}
DI_CPU_CLONES void to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] = uint16_t(bf16_bits(src[c]));
}

}  // namespace deepinfer::ep::rows
