// RMSNorm (+ fused per-token fp8 cast) and the residual add: docs/numerics.md §4,
// docs/architecture.md §5.
//
// Numerics: y = bf16(x * rsqrt(mean(x^2) + eps) * w), computed in fp32 (host: fp64), rounded
// once. The fused cast quantizes that bf16 y 1x128 exactly as quant_per_token does
// (token_cast.h), so the fused op equals rms_norm -> quant_per_token bit for bit.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/quant.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// 1 / sqrt(sumsq / n + eps) in fp64: the RMS factor of every fp64 norm (RMSNorm on both backends,
// the Engram gate and conv norm, mHC's mixes); callers round it where their op does
// (docs/numerics.md §4, §8.1).
inline double rms_rstd(double sumsq, int64_t n, double eps) {
  return 1.0 / std::sqrt(sumsq / double(n) + eps);
}

// Set y, or q + scales (fused cast), or all three.
struct RmsNormParams {
  const bf16* x = nullptr;  // [T, in_stride] bf16, first H channels used
  const bf16* w = nullptr;  // [H] bf16
  bf16* y = nullptr;        // [T, out_stride] bf16 (first H written) or null
  fp8_e4m3* q = nullptr;    // [T, H] e4m3 (row stride H) or null
  float* scales = nullptr;  // [T, num_blocks(H)] f32, with q
  int64_t num_tokens = 0;   // T
  int64_t hidden = 0;       // H: channels normalised (the kv norm: the first 512 of 576)
  int64_t in_stride = 0;    // elements between rows of x (0 = H)
  int64_t out_stride = 0;   // elements between rows of y (0 = H)
  float eps = 1e-6f;
  bool ue8m0 = false;  // fused cast: power-of-two scales

  int64_t x_stride() const { return in_stride ? in_stride : hidden; }
  int64_t y_stride() const { return out_stride ? out_stride : hidden; }
  void validate() const;  // throws Error naming the bad field
};

// out = bf16(a + b), elementwise; out may alias a or b.
struct ResidualAddParams {
  const bf16* a = nullptr;  // [n] bf16
  const bf16* b = nullptr;  // [n] bf16
  bf16* out = nullptr;      // [n] bf16
  int64_t n = 0;
  void validate() const;
};

// out[t, j] = bf16(x[t, j] + bias[j]): a linear's bias on its fp32 GEMM output, one rounding
// (the Engram projections, docs/kernels.md §1.6).
struct BiasAddParams {
  const float* x = nullptr;    // [rows, cols] f32
  const bf16* bias = nullptr;  // [cols] bf16
  bf16* out = nullptr;         // [rows, cols] bf16
  int64_t rows = 0, cols = 0;
  void validate() const;
};

void rms_norm(const RmsNormParams& p);
void residual_add(const ResidualAddParams& p);
void bias_add(const BiasAddParams& p);

namespace host {
void rms_norm(const RmsNormParams& p);
void residual_add(const ResidualAddParams& p);
void bias_add(const BiasAddParams& p);
}  // namespace host

namespace cpu {
void rms_norm(const RmsNormParams& p);
void residual_add(const ResidualAddParams& p);
void bias_add(const BiasAddParams& p);
}  // namespace cpu

template <>
struct OpSpec<RmsNormParams> {
  static constexpr const char* name = "rms_norm";
  static std::string shape(const RmsNormParams& p) {
    return fmt::format("t={} h={}{}{}", p.num_tokens, p.hidden, p.q ? " fp8" : "",
                       p.ue8m0 ? " ue8m0" : "");
  }
  template <class V>
  static void visit(RmsNormParams& p, V& v) {
    const int64_t rows = p.num_tokens;
    v.in("x", p.x, rows ? (rows - 1) * p.x_stride() + p.hidden : 0);
    v.in("w", p.w, p.hidden);
    v.out("y", p.y, rows ? (rows - 1) * p.y_stride() + p.hidden : 0);
    v.out("q", p.q, rows * p.hidden);
    v.out("scales", p.scales, rows * num_blocks(p.hidden));
  }
};

template <>
struct OpSpec<ResidualAddParams> {
  static constexpr const char* name = "residual_add";
  static std::string shape(const ResidualAddParams& p) { return fmt::format("n={}", p.n); }
  template <class V>
  static void visit(ResidualAddParams& p, V& v) {
    v.in("a", p.a, p.n);
    v.in("b", p.b, p.n);
    v.out("out", p.out, p.n);
  }
};

template <>
struct OpSpec<BiasAddParams> {
  static constexpr const char* name = "bias_add";
  static std::string shape(const BiasAddParams& p) {
    return fmt::format("rows={} cols={}", p.rows, p.cols);
  }
  template <class V>
  static void visit(BiasAddParams& p, V& v) {
    v.in("x", p.x, p.rows * p.cols);
    v.in("bias", p.bias, p.cols);
    v.out("out", p.out, p.rows * p.cols);
  }
};

}  // namespace deepinfer::kernels
