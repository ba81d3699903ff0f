// cpu: SwiGLU (+ row weight, fused 1x128 cast). Highway SIMD (fp32 exp from hwy/contrib/math),
// rows over kernel_pool().
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/swiglu.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on
#include "kernels/swiglu.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [t0, t1), channels [c0, c1) (the fused cast needs whole rows: c0 = 0, c1 = I).
void swiglu_block(const SwigluParams& p, int64_t t0, int64_t t1, int64_t c0, int64_t c1,
                  float* row) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df)), I = p.inter;
  const auto one = hn::Set(df, 1.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const bf16* g = p.gate + t * p.x_stride();
    const bf16* u = p.up + t * p.x_stride();
    const float w = p.row_weight ? p.row_weight[t] : 1.0f;
    const auto vw = hn::Set(df, w);
    bf16* y = p.y ? p.y + t * p.y_stride() : nullptr;
    int64_t i = c0;
    for (; i + N <= c1; i += N) {
      const auto gv = load_bf16(df, g + i);
      const auto silu = hn::Div(gv, hn::Add(one, hn::Exp(df, hn::Neg(gv))));
      const auto v = round_bf16_vec(df, hn::Mul(hn::Mul(silu, load_bf16(df, u + i)), vw));
      if (y) store_bf16(df, v, y + i);
      if (p.q) hn::StoreU(v, df, row + i);
    }
    for (; i < c1; ++i) {
      const float gv = bf16_to_f32(g[i]);
      const float v = round_bf16(gv / (1.0f + std::exp(-gv)) * bf16_to_f32(u[i]) * w);
      if (y) y[i] = f32_to_bf16(v);
      if (p.q) row[i] = v;
    }
    if (p.q) token_cast_row_simd(df, row, I, p.ue8m0, p.q + t * I, p.scales + t * num_blocks(I));
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(swiglu_block);

void swiglu(const SwigluParams& p) {
  p.validate();
  const int64_t I = p.inter;
  if (p.q || p.num_tokens >= 4 * kernel_pool().num_threads()) {
    const int64_t grain = std::max<int64_t>(1, 8192 / I);
    kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
      std::vector<float> row(static_cast<size_t>(I));
      HWY_DYNAMIC_DISPATCH(swiglu_block)(p, t0, t1, 0, I, row.data());
    });
    return;
  }
  // Few rows (decode), no cast: split the channels instead, in 256-channel chunks.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (I + kChunk - 1) / kChunk;
  kernel_pool().parallel_for(p.num_tokens * chunks, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t t = j / chunks, c0 = (j % chunks) * kChunk;
      HWY_DYNAMIC_DISPATCH(swiglu_block)(p, t, t + 1, c0, std::min(I, c0 + kChunk), nullptr);
    }
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
