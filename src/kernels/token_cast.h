// The per-token 1x128 fp8 cast used by the fused epilogues of RMSNorm and SwiGLU. It applies the
// same scale rule as quant_per_token (quant.h: act_scale) and divides like it, so a fused op
// equals its unfused composition op -> bf16 -> quant_per_token, bit for bit (tests check this).
// Scalar and inline so the host and cpu backends produce the same bytes.
#pragma once

#include <deepinfer/dtype.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/quant.h"

namespace deepinfer::kernels {

// Casts one row of n fp32 values (already rounded to bf16) to e4m3:
// q [n] e4m3, scales [num_blocks(n)] f32, q = e4m3(v / scale) per 128-channel group.
inline void token_cast_row(const float* v, int64_t n, bool ue8m0, fp8_e4m3* q, float* scales) {
  for (int64_t g0 = 0, g = 0; g0 < n; g0 += kQuantBlock, ++g) {
    const int64_t g1 = std::min(n, g0 + kQuantBlock);
    float amax = 0.0f;
    for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float s = act_scale(amax, ue8m0);
    scales[g] = s;
    for (int64_t i = g0; i < g1; ++i) q[i] = f32_to_e4m3(v[i] / s);
  }
}

}  // namespace deepinfer::kernels
