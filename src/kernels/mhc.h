// mHC (manifold-constrained hyper-connections) kernels, inference form (docs/kernels.md §mHC).
// The residual stream is hc copies R[t, m, :] of width d. Per token, with R_flat = R[t] as hc*d:
//   mixes = (R_flat · fnᵀ) * rsqrt(mean(R_flat²) + rms_eps)
// mhc_pre (fn has hc(hc+2) rows):
//   pre_m  = sigmoid(mixes[m] * scale[0] + base[m]) + pre_eps
//   post_m = sigmoid(mixes[hc + m] * scale[1] + base[hc + m]) * post_mult
//   comb   = Sinkhorn(mixes[2hc + m*hc + j] * scale[2] + base[2hc + m*hc + j])   (hc × hc)
//   x      = bf16(sum_m pre_m * R[t, m])                   (the sub-layer's input)
// mhc_post: R'[t, j] = bf16(post_j * y[t] + sum_m comb[m, j] * R[t, m])
// mhc_head (fn has hc rows): h_m = sigmoid(mixes[m] * scale[0] + base[m]) + eps,
//   out = bf16(sum_m h_m * R[t, m])                      (feeds the final norm and LM head)
// Sinkhorn(c): softmax over j, + eps, divide columns by (column sum + eps), then repeat-1 times
// {rows by (row sum + eps), columns by (column sum + eps)}.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

struct MhcPreParams {
  const bf16* residual = nullptr;  // [N, hc, d]
  const float* fn = nullptr;       // [hc(hc+2), hc*d] (any RMSNorm weight already folded in)
  const float* scale = nullptr;    // [3]
  const float* base = nullptr;     // [hc(hc+2)]
  bf16* x = nullptr;               // [N, d] sub-layer input
  float* post = nullptr;           // [N, hc]
  float* comb = nullptr;           // [N, hc, hc] comb[m, j]: weight of branch m in new branch j
  float* pre = nullptr;            // [N, hc] or null
  int64_t num_tokens = 0, hc = 4, dim = 0;
  float rms_eps = 1e-6f, pre_eps = 1e-6f, sinkhorn_eps = 1e-6f, post_mult = 2.0f;
  int64_t sinkhorn_repeat = 10;
  int64_t num_mixes() const { return hc * (hc + 2); }
  void validate() const;
};

struct MhcPostParams {
  const bf16* y = nullptr;         // [N, d] sub-layer output
  const bf16* residual = nullptr;  // [N, hc, d]
  const float* post = nullptr;     // [N, hc]
  const float* comb = nullptr;     // [N, hc, hc]
  bf16* out = nullptr;             // [N, hc, d] the new residual (may not alias residual)
  int64_t num_tokens = 0, hc = 4, dim = 0;
  void validate() const;
};

struct MhcHeadParams {
  const bf16* residual = nullptr;  // [N, hc, d]
  const float* fn = nullptr;       // [hc, hc*d]
  const float* scale = nullptr;    // [1]
  const float* base = nullptr;     // [hc]
  bf16* out = nullptr;             // [N, d]
  int64_t num_tokens = 0, hc = 4, dim = 0;
  float rms_eps = 1e-6f, eps = 1e-6f;
  void validate() const;
};

// The per-token scalar tail shared by both backends, from the raw dot products `dots`
// [num_mixes] (R_flat · fnᵀ, before the RMS factor, each one fp32 rounding of the exact sum) and
// the sum of squares of R_flat (float64; rounded to fp32 here): writes pre [hc], post [hc],
// comb [hc*hc]. Sigmoids and Sinkhorn run in float64 and round once (docs/numerics.md §8.1).
void mhc_pre_coefficients(const MhcPreParams& p, const float* dots, double sumsq, float* pre,
                          float* post, float* comb);
// mhc_head's weights h [hc] from its dots [hc].
void mhc_head_coefficients(const MhcHeadParams& p, const float* dots, double sumsq, float* h);
// In place on c [n*n] (row-major [m][j]), float64.
void mhc_sinkhorn(double* c, int64_t n, int64_t repeat, double eps);

void mhc_pre(const MhcPreParams& p);
void mhc_post(const MhcPostParams& p);
void mhc_head(const MhcHeadParams& p);

namespace host {
void mhc_pre(const MhcPreParams& p);
void mhc_post(const MhcPostParams& p);
void mhc_head(const MhcHeadParams& p);
}  // namespace host
namespace cpu {
void mhc_pre(const MhcPreParams& p);
void mhc_post(const MhcPostParams& p);
void mhc_head(const MhcHeadParams& p);
}  // namespace cpu

template <>
struct OpSpec<MhcPreParams> {
  static constexpr const char* name = "mhc_pre";
  static std::string shape(const MhcPreParams& p) {
    return fmt::format("n={} hc={} d={} repeat={}", p.num_tokens, p.hc, p.dim, p.sinkhorn_repeat);
  }
  template <class V>
  static void visit(MhcPreParams& p, V& v) {
    v.in("residual", p.residual, p.num_tokens * p.hc * p.dim);
    v.in("fn", p.fn, p.num_mixes() * p.hc * p.dim);
    v.in("scale", p.scale, 3);
    v.in("base", p.base, p.num_mixes());
    v.out("x", p.x, p.num_tokens * p.dim);
    v.out("post", p.post, p.num_tokens * p.hc);
    v.out("comb", p.comb, p.num_tokens * p.hc * p.hc);
    v.out("pre", p.pre, p.num_tokens * p.hc);
  }
};

template <>
struct OpSpec<MhcPostParams> {
  static constexpr const char* name = "mhc_post";
  static std::string shape(const MhcPostParams& p) {
    return fmt::format("n={} hc={} d={}", p.num_tokens, p.hc, p.dim);
  }
  template <class V>
  static void visit(MhcPostParams& p, V& v) {
    v.in("y", p.y, p.num_tokens * p.dim);
    v.in("residual", p.residual, p.num_tokens * p.hc * p.dim);
    v.in("post", p.post, p.num_tokens * p.hc);
    v.in("comb", p.comb, p.num_tokens * p.hc * p.hc);
    v.out("out", p.out, p.num_tokens * p.hc * p.dim);
  }
};

template <>
struct OpSpec<MhcHeadParams> {
  static constexpr const char* name = "mhc_head";
  static std::string shape(const MhcHeadParams& p) {
    return fmt::format("n={} hc={} d={}", p.num_tokens, p.hc, p.dim);
  }
  template <class V>
  static void visit(MhcHeadParams& p, V& v) {
    v.in("residual", p.residual, p.num_tokens * p.hc * p.dim);
    v.in("fn", p.fn, p.hc * p.hc * p.dim);
    v.in("scale", p.scale, 1);
    v.in("base", p.base, p.hc);
    v.out("out", p.out, p.num_tokens * p.dim);
  }
};

}  // namespace deepinfer::kernels
