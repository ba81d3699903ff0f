// Host reference: SwiGLU with optional row weight and fused 1x128 cast. Scalar, fp64.
#include "kernels/swiglu.h"

#include <cmath>
#include <vector>

#include "kernels/token_cast.h"

namespace deepinfer::kernels::host {

void swiglu(const SwigluParams& p) {
  p.validate();
  const int64_t I = p.inter;
  std::vector<float> row(static_cast<size_t>(I));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const bf16* g = p.gate + t * p.x_stride();
    const bf16* u = p.up + t * p.x_stride();
    const double w = p.row_weight ? double(p.row_weight[t]) : 1.0;
    for (int64_t i = 0; i < I; ++i) {
      const double gv = bf16_to_f32(g[i]);
      const double silu = gv / (1.0 + std::exp(-gv));
      row[size_t(i)] = round_bf16(float(silu * double(bf16_to_f32(u[i])) * w));
    }
    if (p.y)
      for (int64_t i = 0; i < I; ++i) p.y[t * p.y_stride() + i] = f32_to_bf16(row[size_t(i)]);
    if (p.q) token_cast_row(row.data(), I, p.ue8m0, p.q + t * I, p.scales + t * num_blocks(I));
  }
}

}  // namespace deepinfer::kernels::host
