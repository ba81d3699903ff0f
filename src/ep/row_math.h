// Row arithmetic of combine: element-wise, in the order docs/ep.md §5 pins. Each function is built
// for several CPUs (function multiversioning) so the loops vectorise; products and sums stay
// separate operations (no FMA contraction in ep/), so every version gives the scalar bits.
// sum_of_partials has one more version, for AVX512-BF16 (its rounding instruction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer::ep::rows {

// -0 -> +0 before transport, so a sum with zeros from other ranks is exact (docs/ep.md §5.1).
inline float canon(float v) { return v == 0.0f ? 0.0f : v; }

// s[c] = ((0 + w[0]·y[0][c]) + w[1]·y[1][c]) + ... in f32 (w null: unit weights, the products
// are then exact), rounded to bf16 (nearest even); canon: -0 -> +0 after rounding. One pass over
// the m rows, written as bf16 bits (out_bits) and/or as their f32 values (out_f32).
void weighted_sum(const float* w, const uint16_t* const* y, int m, size_t n, bool canon,
                  uint16_t* out_bits, float* out_f32);
// The fast combine's partials and their sum in one pass: groups of addends (group g ends before
// addend group_end[g]), p_g = canon(bf16(Σ_{s in g} w[s]·y[s][c])) as weighted_sum forms it, and
// s[c] = bf16(((0 + p_0) + p_1) + ...) in f32, written as bf16 bits.
void sum_of_partials(const float* w, const uint16_t* const* y, const int* group_end, int groups,
                     size_t n, uint16_t* out_bits);
// sum_of_partials' versions this CPU runs, the one it uses last (for tests, which check each).
using SumOfPartialsFn = void (*)(const float*, const uint16_t* const*, const int*, int, size_t,
                                 uint16_t*);
struct SumOfPartialsVersion {
  const char* name;
  SumOfPartialsFn fn;
};
std::vector<SumOfPartialsVersion> sum_of_partials_versions();
// dst[c] = canon(w · y[c])  (-0 -> +0)
void scale_bf16(float w, const uint16_t* y, float* dst, size_t n);
// acc[c] += src[c]
void add_f32(const float* src, float* acc, size_t n);
// dst[c] = bf16(src[c]), round to nearest even
void to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace deepinfer::ep::rows
