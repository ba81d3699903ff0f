// Host reference: RoPE rotation, scalar, fp64 products, one rounding.
#include "kernels/rope.h"

#include <deepinfer/error.h>

#include <vector>

#include "core/check.h"

namespace deepinfer::kernels::host {

void rope(const RopeParams& p) {
  p.validate();
  const int64_t half = p.rope_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t pos = p.positions[t];
    DI_CHECK(
        pos >= 0 && pos < (int64_t(1) << 24),
        "rope: position {} of token {} is outside [0, 2^24) (fp32 angles need exact positions)",
        pos, t);
    rope_cos_sin(pos, p.inv_freq, half, p.attention_factor, c.data(), s.data());
    for (int64_t h = 0; h < p.num_heads; ++h) {
      bf16* v = p.x + t * p.token_stride + h * p.head_stride + p.offset;
      for (int64_t i = 0; i < half; ++i) {
        const double a = bf16_to_f32(v[2 * i]), b = bf16_to_f32(v[2 * i + 1]);
        const double ci = c[size_t(i)], si = s[size_t(i)];
        v[2 * i] = f32_to_bf16(float(a * ci - b * si));
        v[2 * i + 1] = f32_to_bf16(float(a * si + b * ci));
      }
    }
  }
}

}  // namespace deepinfer::kernels::host
