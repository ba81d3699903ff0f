// cpu: RoPE. cos/sin per token from the shared scalar table (bit-identical to host), the rotation
// vectorised over interleaved pairs (Reverse2 swaps each pair), tokens over kernel_pool().
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/rope.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include "kernels/rope.h"

#include <deepinfer/error.h>

#include <vector>

#include "core/check.h"
#include "kernels/cpu/activation_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens [t0, t1). cs: scratch of 2*d floats + 2*half for the table.
void rope_tokens(const RopeParams& p, int64_t t0, int64_t t1, float* scratch) {
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(dd)), d = p.rope_dim, half = d / 2;
  float* c = scratch;             // [half]
  float* s = scratch + half;      // [half]
  float* cdup = scratch + d;      // [d]: c0 c0 c1 c1 ...
  float* sdup = scratch + 2 * d;  // [d]: -s0 s0 -s1 s1 ...
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t pos = p.positions[t];
    DI_CHECK(
        pos >= 0 && pos < (int64_t(1) << 24),
        "rope: position {} of token {} is outside [0, 2^24) (fp32 angles need exact positions)",
        pos, t);
    rope_cos_sin(pos, p.inv_freq, half, p.attention_factor, c, s);
    for (int64_t i = 0; i < half; ++i) {
      cdup[2 * i] = cdup[2 * i + 1] = c[i];
      sdup[2 * i] = -s[i];
      sdup[2 * i + 1] = s[i];
    }
    for (int64_t h = 0; h < p.num_heads; ++h) {
      bf16* v = p.x + t * p.token_stride + h * p.head_stride + p.offset;
      // float64: bf16 × fp32 products are exact there, so each output is the exact a·c ∓ b·s
      // rounded once (docs/numerics.md §5), as on the host and in the reference.
      int64_t i = 0;
      for (; i + N <= d; i += N) {
        const auto x = load_bf16_f64(dd, v + i);
        const auto y = hn::MulAdd(x, load_f32_f64(dd, cdup + i),
                                  hn::Mul(hn::Reverse2(dd, x), load_f32_f64(dd, sdup + i)));
        store_f64_bf16(dd, y, v + i);
      }
      for (; i < d; i += 2) {
        const double a = bf16_to_f32(v[i]), b = bf16_to_f32(v[i + 1]);
        v[i] = f32_to_bf16(float(a * cdup[i] + b * sdup[i]));
        v[i + 1] = f32_to_bf16(float(b * cdup[i + 1] + a * sdup[i + 1]));
      }
    }
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(rope_tokens);

void rope(const RopeParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.num_heads * p.rope_dim));
  kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(static_cast<size_t>(3 * p.rope_dim));
    HWY_DYNAMIC_DISPATCH(rope_tokens)(p, t0, t1, scratch.data());
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
