// cpu: mHC pre / post / head. Per token: the residual row widened to f32 once, the mix dot
// products with Highway (fixed lane order per row: batch-invariant), the shared scalar
// coefficients (kernels/mhc.h), and SIMD weighted branch sums. Tokens over kernel_pool().
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/mhc.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include "kernels/mhc.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
float dot_f32(DF df, const float* a, const float* b, int64_t n) {
  const int64_t N = int64_t(hn::Lanes(df));
  auto s0 = hn::Zero(df), s1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// row [hc*d] f32 = R[t]; dots[i] = row · fn[i]; returns sum(row²).
float mix_dots(const bf16* r, const float* fn, int64_t rows, int64_t width, float* row,
               float* dots) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t k = 0;
  for (; k + N <= width; k += N) hn::StoreU(load_bf16(df, r + k), df, row + k);
  for (; k < width; ++k) row[k] = bf16_to_f32(r[k]);
  for (int64_t i = 0; i < rows; ++i) dots[i] = dot_f32(df, row, fn + i * width, width);
  return dot_f32(df, row, row, width);
}

// out = bf16(sum_m w[m] * row[m]) with row the widened branches, m order.
void weighted_sum(const float* row, const float* w, int64_t hc, int64_t dim, bf16* out) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t d = 0;
  for (; d + N <= dim; d += N) {
    auto s = hn::Mul(hn::Set(df, w[0]), hn::LoadU(df, row + d));
    for (int64_t m = 1; m < hc; ++m)
      s = hn::MulAdd(hn::Set(df, w[m]), hn::LoadU(df, row + m * dim + d), s);
    store_bf16(df, s, out + d);
  }
  for (; d < dim; ++d) {
    float s = w[0] * row[d];
    for (int64_t m = 1; m < hc; ++m) s = std::fma(w[m], row[m * dim + d], s);
    out[d] = f32_to_bf16(s);
  }
}

void mhc_pre_rows(const MhcPreParams& p, int64_t t0, int64_t t1) {
  const int64_t n = p.hc, W = n * p.dim;
  std::vector<float> row(static_cast<size_t>(W)), dots(size_t(p.num_mixes())),
      pre(static_cast<size_t>(n));
  for (int64_t t = t0; t < t1; ++t) {
    const float ss = mix_dots(p.residual + t * W, p.fn, p.num_mixes(), W, row.data(), dots.data());
    mhc_pre_coefficients(p, dots.data(), ss, pre.data(), p.post + t * n, p.comb + t * n * n);
    if (p.pre)
      for (int64_t m = 0; m < n; ++m) p.pre[t * n + m] = pre[size_t(m)];
    weighted_sum(row.data(), pre.data(), n, p.dim, p.x + t * p.dim);
  }
}

void mhc_head_rows(const MhcHeadParams& p, int64_t t0, int64_t t1) {
  const int64_t n = p.hc, W = n * p.dim;
  std::vector<float> row(static_cast<size_t>(W)), dots(static_cast<size_t>(n)),
      h(static_cast<size_t>(n));
  for (int64_t t = t0; t < t1; ++t) {
    const float ss = mix_dots(p.residual + t * W, p.fn, n, W, row.data(), dots.data());
    mhc_head_coefficients(p, dots.data(), ss, h.data());
    weighted_sum(row.data(), h.data(), n, p.dim, p.out + t * p.dim);
  }
}

void mhc_post_rows(const MhcPostParams& p, int64_t t0, int64_t t1) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df)), n = p.hc, D = p.dim;
  for (int64_t t = t0; t < t1; ++t) {
    const bf16 *r = p.residual + t * n * D, *y = p.y + t * D;
    const float *post = p.post + t * n, *comb = p.comb + t * n * n;
    for (int64_t j = 0; j < n; ++j) {
      bf16* out = p.out + (t * n + j) * D;
      int64_t d = 0;
      for (; d + N <= D; d += N) {
        auto s = hn::Mul(hn::Set(df, post[j]), load_bf16(df, y + d));
        for (int64_t m = 0; m < n; ++m)
          s = hn::MulAdd(hn::Set(df, comb[m * n + j]), load_bf16(df, r + m * D + d), s);
        store_bf16(df, s, out + d);
      }
      for (; d < D; ++d) {
        float s = post[j] * bf16_to_f32(y[d]);
        for (int64_t m = 0; m < n; ++m) s = std::fma(comb[m * n + j], bf16_to_f32(r[m * D + d]), s);
        out[d] = f32_to_bf16(s);
      }
    }
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(mhc_pre_rows);
HWY_EXPORT(mhc_head_rows);
HWY_EXPORT(mhc_post_rows);

void mhc_pre(const MhcPreParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.num_tokens, 1, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(mhc_pre_rows)(p, t0, t1);
  });
}

void mhc_post(const MhcPostParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 4096 / (p.hc * p.dim));
  kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(mhc_post_rows)(p, t0, t1);
  });
}

void mhc_head(const MhcHeadParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.num_tokens, 1, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(mhc_head_rows)(p, t0, t1);
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
