// mHC: checks, the shared per-token coefficients (sigmoids, Sinkhorn), dispatch.
#include "kernels/mhc.h"

#include <deepinfer/error.h>

#include <cmath>
#include <vector>

#include "kernels/norm.h"

namespace deepinfer::kernels {
namespace {

// The coefficients run in float64 from fp32 arguments and round once to fp32 (docs/numerics.md
// §8.1): the fp32 result then does not depend on the last bits of an exp, so the two backends and
// the reference agree bit for bit; mHC's stream is too sensitive to ulps for anything less.
double sigmoid64(float v) { return 1.0 / (1.0 + std::exp(-double(v))); }

void check_shape(const char* op, int64_t n, int64_t hc, int64_t d) {
  DI_CHECK(n >= 0 && hc >= 1 && d >= 1, "{}: bad shape n={} hc={} d={} (need hc >= 1, d >= 1)", op,
           n, hc, d);
}

}  // namespace

void MhcPreParams::validate() const {
  check_shape("mhc_pre", num_tokens, hc, dim);
  DI_CHECK(hc <= 8, "mhc_pre: hc_mult {} is above the 8 branches the kernels support", hc);
  DI_CHECK(num_tokens == 0 || (residual && fn && scale && base && x && post && comb),
           "mhc_pre: residual, fn, scale, base, x, post and comb must be set");
  DI_CHECK(sinkhorn_repeat >= 1, "mhc_pre: sinkhorn_repeat must be >= 1, got {}", sinkhorn_repeat);
  DI_CHECK(rms_eps >= 0 && sinkhorn_eps >= 0,
           "mhc_pre: rms_eps ({}) and sinkhorn_eps ({}) must be "
           ">= 0",
           rms_eps, sinkhorn_eps);
}

void MhcPostParams::validate() const {
  check_shape("mhc_post", num_tokens, hc, dim);
  DI_CHECK(num_tokens == 0 || (y && residual && post && comb && out),
           "mhc_post: y, residual, post, comb and out must be set");
  DI_CHECK(num_tokens == 0 || out != residual,
           "mhc_post: out must not alias residual (every new branch reads all old branches)");
}

void MhcHeadParams::validate() const {
  check_shape("mhc_head", num_tokens, hc, dim);
  DI_CHECK(num_tokens == 0 || (residual && fn && scale && base && out),
           "mhc_head: residual, fn, scale, base and out must be set");
}

void mhc_sinkhorn(double* c, int64_t n, int64_t repeat, double eps) {
  auto cols = [&] {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t m = 0; m < n; ++m) s += c[m * n + j];
      for (int64_t m = 0; m < n; ++m) c[m * n + j] /= s + eps;
    }
  };
  for (int64_t m = 0; m < n; ++m) {  // softmax over j, + eps
    double* r = c + m * n;
    double mx = r[0];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, r[j]);
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += (r[j] = std::exp(r[j] - mx));
    for (int64_t j = 0; j < n; ++j) r[j] = r[j] / s + eps;
  }
  cols();
  for (int64_t it = 1; it < repeat; ++it) {
    for (int64_t m = 0; m < n; ++m) {
      double* r = c + m * n;
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += r[j];
      for (int64_t j = 0; j < n; ++j) r[j] /= s + eps;
    }
    cols();
  }
}

void mhc_pre_coefficients(const MhcPreParams& p, const float* dots, double sumsq, float* pre,
                          float* post, float* comb) {
  const int64_t n = p.hc;
  const float r = float(rms_rstd(double(float(sumsq)), n * p.dim, p.rms_eps));  // fp32 Σ R²
  for (int64_t m = 0; m < n; ++m) {
    pre[m] = float(sigmoid64(dots[m] * r * p.scale[0] + p.base[m])) + p.pre_eps;
    post[m] = float(sigmoid64(dots[n + m] * r * p.scale[1] + p.base[n + m]) * double(p.post_mult));
  }
  double c[64];  // n <= 8 (validate)
  for (int64_t i = 0; i < n * n; ++i) c[i] = dots[2 * n + i] * r * p.scale[2] + p.base[2 * n + i];
  mhc_sinkhorn(c, n, p.sinkhorn_repeat, double(p.sinkhorn_eps));
  for (int64_t i = 0; i < n * n; ++i) comb[i] = float(c[i]);
}

void mhc_head_coefficients(const MhcHeadParams& p, const float* dots, double sumsq, float* h) {
  const float r = float(rms_rstd(double(float(sumsq)), p.hc * p.dim, p.rms_eps));
  for (int64_t m = 0; m < p.hc; ++m)
    h[m] = float(sigmoid64(dots[m] * r * p.scale[0] + p.base[m])) + p.eps;
}

void mhc_pre(const MhcPreParams& p) { dispatch(p, host::mhc_pre, cpu::mhc_pre); }
void mhc_post(const MhcPostParams& p) { dispatch(p, host::mhc_post, cpu::mhc_post); }
void mhc_head(const MhcHeadParams& p) { dispatch(p, host::mhc_head, cpu::mhc_head); }

}  // namespace deepinfer::kernels
