// Host reference: mHC pre / post / head. fp64 dot products, one token at a time.
#include "kernels/mhc.h"

#include <cmath>
#include <vector>

namespace deepinfer::kernels::host {
namespace {

// dots[i] = R_flat · fn[i] for i < rows (fp64 sums), returns sum(R_flat²) (fp64).
double mix_dots(const bf16* r, const float* fn, int64_t rows, int64_t width, float* dots) {
  double ss = 0;
  for (int64_t k = 0; k < width; ++k) ss += double(bf16_to_f32(r[k])) * bf16_to_f32(r[k]);
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t k = 0; k < width; ++k) s += double(bf16_to_f32(r[k])) * fn[i * width + k];
    dots[i] = float(s);
  }
  return ss;
}

// out[d] = bf16(sum_m w[m] * R[m, d]), fp32 in m order.
void weighted_sum(const bf16* r, const float* w, int64_t hc, int64_t dim, bf16* out) {
  for (int64_t d = 0; d < dim; ++d) {
    float s = 0;
    for (int64_t m = 0; m < hc; ++m) s += w[m] * bf16_to_f32(r[m * dim + d]);
    out[d] = f32_to_bf16(s);
  }
}

}  // namespace

void mhc_pre(const MhcPreParams& p) {
  p.validate();
  const int64_t n = p.hc, W = n * p.dim;
  std::vector<float> dots(size_t(p.num_mixes())), pre(static_cast<size_t>(n));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const bf16* r = p.residual + t * W;
    const double ss = mix_dots(r, p.fn, p.num_mixes(), W, dots.data());
    mhc_pre_coefficients(p, dots.data(), ss, pre.data(), p.post + t * n, p.comb + t * n * n);
    if (p.pre)
      for (int64_t m = 0; m < n; ++m) p.pre[t * n + m] = pre[size_t(m)];
    weighted_sum(r, pre.data(), n, p.dim, p.x + t * p.dim);
  }
}

void mhc_post(const MhcPostParams& p) {
  p.validate();
  const int64_t n = p.hc, D = p.dim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const bf16 *r = p.residual + t * n * D, *y = p.y + t * D;
    const float *post = p.post + t * n, *comb = p.comb + t * n * n;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < D; ++d) {
        float s = post[j] * bf16_to_f32(y[d]);
        for (int64_t m = 0; m < n; ++m) s += comb[m * n + j] * bf16_to_f32(r[m * D + d]);
        p.out[(t * n + j) * D + d] = f32_to_bf16(s);
      }
  }
}

void mhc_head(const MhcHeadParams& p) {
  p.validate();
  const int64_t n = p.hc, W = n * p.dim;
  std::vector<float> dots(static_cast<size_t>(n)), h(static_cast<size_t>(n));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const bf16* r = p.residual + t * W;
    const double ss = mix_dots(r, p.fn, n, W, dots.data());
    mhc_head_coefficients(p, dots.data(), ss, h.data());
    weighted_sum(r, h.data(), n, p.dim, p.out + t * p.dim);
  }
}

}  // namespace deepinfer::kernels::host
