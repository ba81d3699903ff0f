// Host reference: RMSNorm (+ fused cast) and residual add. Scalar, fp64.
#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "kernels/token_cast.h"

namespace deepinfer::kernels::host {

void rms_norm(const RmsNormParams& p) {
  p.validate();
  const int64_t H = p.hidden;
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const bf16* x = p.x + t * p.x_stride();
    double ss = 0.0;
    for (int64_t i = 0; i < H; ++i) ss += double(bf16_to_f32(x[i])) * double(bf16_to_f32(x[i]));
    const double r = rms_rstd(ss, H, p.eps);
    for (int64_t i = 0; i < H; ++i)
      row[size_t(i)] =
          round_bf16(float(double(bf16_to_f32(x[i])) * r * double(bf16_to_f32(p.w[i]))));
    if (p.y)
      for (int64_t i = 0; i < H; ++i) p.y[t * p.y_stride() + i] = f32_to_bf16(row[size_t(i)]);
    if (p.q) token_cast_row(row.data(), H, p.ue8m0, p.q + t * H, p.scales + t * num_blocks(H));
  }
}

void residual_add(const ResidualAddParams& p) {
  p.validate();
  for (int64_t i = 0; i < p.n; ++i)
    p.out[i] = f32_to_bf16(bf16_to_f32(p.a[i]) + bf16_to_f32(p.b[i]));
}

void bias_add(const BiasAddParams& p) {
  p.validate();
  for (int64_t t = 0; t < p.rows; ++t)
    for (int64_t j = 0; j < p.cols; ++j)
      p.out[t * p.cols + j] =
          f32_to_bf16(float(double(p.x[t * p.cols + j]) + double(bf16_to_f32(p.bias[j]))));
}

}  // namespace deepinfer::kernels::host
