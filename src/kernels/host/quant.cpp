// Reference fp8 casts: scalar, one element at a time, exactly docs/numerics.md §2.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>

namespace deepinfer::kernels::host {

void quant_per_token(const QuantTokenParams& p) {
  const int64_t kb_count = num_blocks(p.k);
  for (int64_t m = 0; m < p.m; ++m) {
    const bf16* x = p.x + m * p.k;  // [k]
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t k0 = kb * kQuantBlock, k1 = std::min(p.k, k0 + kQuantBlock);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(bf16_to_f32(x[k])));
      const float s = act_scale(amax, p.ue8m0);
      p.scales[m * kb_count + kb] = s;
      for (int64_t k = k0; k < k1; ++k) p.q[m * p.k + k] = f32_to_e4m3(bf16_to_f32(x[k]) / s);
    }
  }
}

void quant_per_block(const QuantBlockParams& p) {
  const int64_t nb_count = num_blocks(p.n), kb_count = num_blocks(p.k);
  for (int64_t nb = 0; nb < nb_count; ++nb) {
    const int64_t n0 = nb * kQuantBlock, n1 = std::min(p.n, n0 + kQuantBlock);
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t k0 = kb * kQuantBlock, k1 = std::min(p.k, k0 + kQuantBlock);
      float amax = 0.0f;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(p.w[n * p.k + k]));
      const float s = weight_scale(amax, p.ue8m0);
      p.scales[nb * kb_count + kb] = s;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) p.q[n * p.k + k] = f32_to_e4m3(p.w[n * p.k + k] / s);
    }
  }
}

void dequant_per_token(const DequantTokenParams& p) {
  const int64_t kb_count = num_blocks(p.k);
  for (int64_t m = 0; m < p.m; ++m)
    for (int64_t k = 0; k < p.k; ++k) {
      const float v = e4m3_to_f32(p.q[m * p.k + k]) * p.scales[m * kb_count + k / kQuantBlock];
      if (p.out) p.out[m * p.k + k] = f32_to_bf16(v);
      if (p.out_f32) p.out_f32[m * p.k + k] = v;
    }
}

void dequant_per_block(const DequantBlockParams& p) {
  const int64_t kb_count = num_blocks(p.k);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < p.k; ++k) {
      const float v =
          e4m3_to_f32(p.q[n * p.k + k]) * p.scales[(n / kQuantBlock) * kb_count + k / kQuantBlock];
      if (p.out) p.out[n * p.k + k] = f32_to_bf16(v);
      if (p.out_f32) p.out_f32[n * p.k + k] = v;
    }
}

}  // namespace deepinfer::kernels::host
