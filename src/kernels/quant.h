// FP8 (e4m3fn) casts (docs/numerics.md §2): per-token 1×128 for activations, per-block 128×128 for
// weights, and the casts back. Scales are fp32 multipliers: x ≈ fp8_value · scale. Edge blocks are
// partial (K or N not a multiple of 128): the partial block's amax covers only its real elements,
// which is the same as zero-padding it to 128 first (the checkpoint quantizer's rule).
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

constexpr int64_t kQuantBlock = 128;    // channels per scale (activations and weights)
constexpr float kActAmaxFloor = 1e-4f;  // activation amax clamp (DSV3 act_quant, 2025-08)

constexpr int64_t num_blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

// 2^ceil(log2 s) for a positive normal fp32 s, by bit arithmetic as DeepGEMM does (exponent +
// (mantissa != 0)); the result is an exact power of two (UE8M0).
inline float ue8m0_ceil(float s) {
  const uint32_t x = std::bit_cast<uint32_t>(s);
  uint32_t e = (x >> 23) & 0xffu;
  if (x & 0x7fffffu) e += 1;
  if (e < 1) e = 1;
  if (e > 254) e = 254;
  return std::bit_cast<float>(e << 23);
}

// Activation scale of one 1×128 group: max(amax, 1e-4) / 448, optionally rounded up to 2^n.
inline float act_scale(float amax, bool ue8m0) {
  const float s = std::max(amax, kActAmaxFloor) / kFp8E4m3Max;
  return ue8m0 ? ue8m0_ceil(s) : s;
}
// Weight scale of one 128×128 block: amax / 448 (checkpoint quantizer); an all-zero block gets 1
// (its codes are all zero either way) so no 0/0 appears.
inline float weight_scale(float amax, bool ue8m0) {
  if (amax == 0.0f) return 1.0f;
  const float s = amax / kFp8E4m3Max;
  return ue8m0 ? ue8m0_ceil(s) : s;
}

// q = e4m3(x / s) per 1×128 group of each row.
struct QuantTokenParams {
  const bf16* x = nullptr;  // [m, k]
  fp8_e4m3* q = nullptr;    // [m, k]
  float* scales = nullptr;  // [m, num_blocks(k)] (row-major, token-major)
  int64_t m = 0, k = 0;
  bool ue8m0 = false;  // power-of-two scales
};

// q = e4m3(w / S) per 128×128 block.
struct QuantBlockParams {
  const float* w = nullptr;  // [n, k] f32 (bf16 weights convert exactly)
  fp8_e4m3* q = nullptr;     // [n, k]
  float* scales = nullptr;   // [num_blocks(n), num_blocks(k)]
  int64_t n = 0, k = 0;
  bool ue8m0 = false;
};

// Cast back: out = f32(q) · s, rounded once to bf16 (or kept f32). Set one or both outputs.
struct DequantTokenParams {
  const fp8_e4m3* q = nullptr;    // [m, k]
  const float* scales = nullptr;  // [m, num_blocks(k)]
  bf16* out = nullptr;            // [m, k] or null
  float* out_f32 = nullptr;       // [m, k] or null
  int64_t m = 0, k = 0;
};

struct DequantBlockParams {
  const fp8_e4m3* q = nullptr;    // [n, k]
  const float* scales = nullptr;  // [num_blocks(n), num_blocks(k)]
  bf16* out = nullptr;            // [n, k] or null
  float* out_f32 = nullptr;       // [n, k] or null
  int64_t n = 0, k = 0;
};

void quant_per_token(const QuantTokenParams& p);
void quant_per_block(const QuantBlockParams& p);
void dequant_per_token(const DequantTokenParams& p);
void dequant_per_block(const DequantBlockParams& p);

namespace host {
void quant_per_token(const QuantTokenParams& p);
void quant_per_block(const QuantBlockParams& p);
void dequant_per_token(const DequantTokenParams& p);
void dequant_per_block(const DequantBlockParams& p);
}  // namespace host

namespace cpu {
void quant_per_token(const QuantTokenParams& p);
void quant_per_block(const QuantBlockParams& p);
void dequant_per_token(const DequantTokenParams& p);
void dequant_per_block(const DequantBlockParams& p);
}  // namespace cpu

template <>
struct OpSpec<QuantTokenParams> {
  static constexpr const char* name = "quant_per_token";
  static std::string shape(const QuantTokenParams& p) {
    return fmt::format("m={} k={}{}", p.m, p.k, p.ue8m0 ? " ue8m0" : "");
  }
  template <class V>
  static void visit(QuantTokenParams& p, V& v) {
    v.in("x", p.x, p.m * p.k);
    v.out("q", p.q, p.m * p.k);
    v.out("scales", p.scales, p.m * num_blocks(p.k));
  }
};

template <>
struct OpSpec<QuantBlockParams> {
  static constexpr const char* name = "quant_per_block";
  static std::string shape(const QuantBlockParams& p) {
    return fmt::format("n={} k={}{}", p.n, p.k, p.ue8m0 ? " ue8m0" : "");
  }
  template <class V>
  static void visit(QuantBlockParams& p, V& v) {
    v.in("w", p.w, p.n * p.k);
    v.out("q", p.q, p.n * p.k);
    v.out("scales", p.scales, num_blocks(p.n) * num_blocks(p.k));
  }
};

template <>
struct OpSpec<DequantTokenParams> {
  static constexpr const char* name = "dequant_per_token";
  static std::string shape(const DequantTokenParams& p) {
    return fmt::format("m={} k={}", p.m, p.k);
  }
  template <class V>
  static void visit(DequantTokenParams& p, V& v) {
    v.in("q", p.q, p.m * p.k);
    v.in("scales", p.scales, p.m * num_blocks(p.k));
    v.out("out", p.out, p.m * p.k);
    v.out("out_f32", p.out_f32, p.m * p.k);
  }
};

template <>
struct OpSpec<DequantBlockParams> {
  static constexpr const char* name = "dequant_per_block";
  static std::string shape(const DequantBlockParams& p) {
    return fmt::format("n={} k={}", p.n, p.k);
  }
  template <class V>
  static void visit(DequantBlockParams& p, V& v) {
    v.in("q", p.q, p.n * p.k);
    v.in("scales", p.scales, num_blocks(p.n) * num_blocks(p.k));
    v.out("out", p.out, p.n * p.k);
    v.out("out_f32", p.out_f32, p.n * p.k);
  }
};

}  // namespace deepinfer::kernels
