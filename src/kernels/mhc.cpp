// mHC: checks, the shared per-token coefficients (sigmoids, Sinkhorn), dispatch.
#include "kernels/mhc.h"

#include <deepinfer/error.h>

#include <cmath>
#include <vector>

namespace deepinfer::kernels {
namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

void check_shape(const char* op, int64_t n, int64_t hc, int64_t d) {
  DI_CHECK(n >= 0 && hc >= 1 && d >= 1, "{}: bad shape n={} hc={} d={} (need hc >= 1, d >= 1)", op,
           n, hc, d);
}

}  // namespace

void MhcPreParams::validate() const {
  check_shape("mhc_pre", num_tokens, hc, dim);
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

void mhc_sinkhorn(float* c, int64_t n, int64_t repeat, float eps) {
  auto cols = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t m = 0; m < n; ++m) s += c[m * n + j];
      for (int64_t m = 0; m < n; ++m) c[m * n + j] /= s + eps;
    }
  };
  for (int64_t m = 0; m < n; ++m) {  // softmax over j, + eps
    float* r = c + m * n;
    float mx = r[0];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, r[j]);
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += (r[j] = std::exp(r[j] - mx));
    for (int64_t j = 0; j < n; ++j) r[j] = r[j] / s + eps;
  }
  cols();
  for (int64_t it = 1; it < repeat; ++it) {
    for (int64_t m = 0; m < n; ++m) {
      float* r = c + m * n;
      float s = 0;
      for (int64_t j = 0; j < n; ++j) s += r[j];
      for (int64_t j = 0; j < n; ++j) r[j] /= s + eps;
    }
    cols();
  }
}

void mhc_pre_coefficients(const MhcPreParams& p, const float* dots, float sumsq, float* pre,
                          float* post, float* comb) {
  const int64_t n = p.hc;
  const float r = 1.0f / std::sqrt(sumsq / float(n * p.dim) + p.rms_eps);
  for (int64_t m = 0; m < n; ++m) {
    pre[m] = sigmoid(dots[m] * r * p.scale[0] + p.base[m]) + p.pre_eps;
    post[m] = sigmoid(dots[n + m] * r * p.scale[1] + p.base[n + m]) * p.post_mult;
  }
  for (int64_t i = 0; i < n * n; ++i)
    comb[i] = dots[2 * n + i] * r * p.scale[2] + p.base[2 * n + i];
  mhc_sinkhorn(comb, n, p.sinkhorn_repeat, p.sinkhorn_eps);
}

void mhc_head_coefficients(const MhcHeadParams& p, const float* dots, float sumsq, float* h) {
  const float r = 1.0f / std::sqrt(sumsq / float(p.hc * p.dim) + p.rms_eps);
  for (int64_t m = 0; m < p.hc; ++m) h[m] = sigmoid(dots[m] * r * p.scale[0] + p.base[m]) + p.eps;
}

void mhc_pre(const MhcPreParams& p) { dispatch(p, host::mhc_pre, cpu::mhc_pre); }
void mhc_post(const MhcPostParams& p) { dispatch(p, host::mhc_post, cpu::mhc_post); }
void mhc_head(const MhcHeadParams& p) { dispatch(p, host::mhc_head, cpu::mhc_head); }

}  // namespace deepinfer::kernels
