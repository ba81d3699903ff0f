// cpu: mHC pre / post / head. The mix dot products (float64) in blocks of 4 tokens × 6 fn rows
// (each fn vector loaded once per block; the order per token and row is fixed: batch-invariant),
// the shared scalar coefficients (kernels/mhc.h), and SIMD weighted branch sums with the
// reference's roundings. Tokens over kernel_pool().
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

// The mix dots and the sum of squares are float64 (docs/numerics.md §8.1): bf16 × fp32 products
// are exact there, so each dot is the exact sum rounded once, whatever the order; an fp32 sum
// over hc·d terms would move the coefficients by ulps that the stream amplifies.
// dots[t][i] = R_t · fn[i] for TB tokens and IB consecutive fn rows, over `width` elements: one
// float64 accumulator per (token, row), k ascending, then the lane sum, then the scalar tail,
// rounded once to fp32. Blocking only lets each fn vector serve TB tokens; a token's result never
// depends on the tokens blocked with it.
template <int TB, int IB>
void dots_block(const bf16* const* r, const float* fn, int64_t width, float* dots,
                int64_t dots_stride) {
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(dd));
  hn::Vec<decltype(dd)> acc[TB][IB];
  for (int t = 0; t < TB; ++t)
    for (int i = 0; i < IB; ++i) acc[t][i] = hn::Zero(dd);
  int64_t k = 0;
  for (; k + N <= width; k += N) {
    hn::Vec<decltype(dd)> f[IB];
    for (int i = 0; i < IB; ++i) f[i] = load_f32_f64(dd, fn + i * width + k);
    for (int t = 0; t < TB; ++t) {
      const auto x = load_bf16_f64(dd, r[t] + k);
      for (int i = 0; i < IB; ++i) acc[t][i] = hn::MulAdd(x, f[i], acc[t][i]);
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int i = 0; i < IB; ++i) {
      double v = hn::GetLane(hn::SumOfLanes(dd, acc[t][i]));
      for (int64_t kk = k; kk < width; ++kk)
        v += double(bf16_to_f32(r[t][kk])) * fn[i * width + kk];
      dots[t * dots_stride + i] = float(v);
    }
}

// Sum of squares of one residual row, float64.
double sum_squares(const bf16* r, int64_t width) {
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(dd));
  auto acc = hn::Zero(dd);
  int64_t k = 0;
  for (; k + N <= width; k += N) {
    const auto x = load_bf16_f64(dd, r + k);
    acc = hn::MulAdd(x, x, acc);
  }
  double s = hn::GetLane(hn::SumOfLanes(dd, acc));
  for (; k < width; ++k) s += double(bf16_to_f32(r[k])) * bf16_to_f32(r[k]);
  return s;
}

// dots [nt, rows] of tokens [t0, t0 + nt) (nt <= 4) against fn [rows, width]: blocks of 4 tokens ×
// 6 rows (31 of AVX-512's 32 vector registers), smaller blocks at the edges.
void mix_dots(const bf16* residual, int64_t t0, int64_t nt, const float* fn, int64_t rows,
              int64_t width, float* dots) {
  const bf16* r[4];
  for (int64_t t = 0; t < nt; ++t) r[t] = residual + (t0 + t) * width;
  int64_t i = 0;
  for (; i + 6 <= rows; i += 6) {
    const float* f = fn + i * width;
    if (nt == 4)
      dots_block<4, 6>(r, f, width, dots + i, rows);
    else
      for (int64_t t = 0; t < nt; ++t) dots_block<1, 6>(r + t, f, width, dots + t * rows + i, rows);
  }
  for (; i < rows; ++i)
    for (int64_t t = 0; t < nt; ++t)
      dots_block<1, 1>(r + t, fn + i * width, width, dots + t * rows + i, rows);
}

// out = bf16(sum_m w[m] * R[m]): fp32, m ascending, one multiply and one add per term (no FMA,
// as the reference; this file is built with -ffp-contract=off).
void weighted_sum(const bf16* r, const float* w, int64_t hc, int64_t dim, bf16* out) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t d = 0;
  for (; d + N <= dim; d += N) {
    auto s = hn::Mul(hn::Set(df, w[0]), load_bf16(df, r + d));
    for (int64_t m = 1; m < hc; ++m)
      s = hn::Add(s, hn::Mul(hn::Set(df, w[m]), load_bf16(df, r + m * dim + d)));
    store_bf16(df, s, out + d);
  }
  for (; d < dim; ++d) {
    float s = w[0] * bf16_to_f32(r[d]);
    for (int64_t m = 1; m < hc; ++m) s += w[m] * bf16_to_f32(r[m * dim + d]);
    out[d] = f32_to_bf16(s);
  }
}

void mhc_pre_rows(const MhcPreParams& p, int64_t t0, int64_t t1) {
  const int64_t n = p.hc, W = n * p.dim, M = p.num_mixes();
  std::vector<float> dots(size_t(4 * M)), pre(static_cast<size_t>(n));
  for (int64_t tb = t0; tb < t1; tb += 4) {
    const int64_t nt = std::min<int64_t>(4, t1 - tb);
    mix_dots(p.residual, tb, nt, p.fn, M, W, dots.data());
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t t = tb + j;
      const bf16* r = p.residual + t * W;
      mhc_pre_coefficients(p, dots.data() + j * M, sum_squares(r, W), pre.data(), p.post + t * n,
                           p.comb + t * n * n);
      if (p.pre)
        for (int64_t m = 0; m < n; ++m) p.pre[t * n + m] = pre[size_t(m)];
      weighted_sum(r, pre.data(), n, p.dim, p.x + t * p.dim);
    }
  }
}

void mhc_head_rows(const MhcHeadParams& p, int64_t t0, int64_t t1) {
  const int64_t n = p.hc, W = n * p.dim;
  std::vector<float> dots(size_t(4 * n)), h(static_cast<size_t>(n));
  for (int64_t tb = t0; tb < t1; tb += 4) {
    const int64_t nt = std::min<int64_t>(4, t1 - tb);
    mix_dots(p.residual, tb, nt, p.fn, n, W, dots.data());
    for (int64_t j = 0; j < nt; ++j) {
      const bf16* r = p.residual + (tb + j) * W;
      mhc_head_coefficients(p, dots.data() + j * n, sum_squares(r, W), h.data());
      weighted_sum(r, h.data(), n, p.dim, p.out + (tb + j) * p.dim);
    }
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
          s = hn::Add(s, hn::Mul(hn::Set(df, comb[m * n + j]), load_bf16(df, r + m * D + d)));
        store_bf16(df, s, out + d);
      }
      for (; d < D; ++d) {
        float s = post[j] * bf16_to_f32(y[d]);
        for (int64_t m = 0; m < n; ++m) s += comb[m * n + j] * bf16_to_f32(r[m * D + d]);
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
  kernel_pool().parallel_for(p.num_tokens, 4, [&](int64_t t0, int64_t t1) {
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
  kernel_pool().parallel_for(p.num_tokens, 4, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(mhc_head_rows)(p, t0, t1);
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
