// cpu: RMSNorm (+ fused 1x128 cast) and residual add. Highway SIMD, rows over kernel_pool().
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/norm.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [t0, t1). row: scratch of H floats (the bf16-rounded y for the fused cast). float64 sum of
// squares and products, one rounding, as the host and the reference (docs/numerics.md §4): the
// norm is a few flops per byte, so the exact form costs nothing measurable.
void rms_norm_rows(const RmsNormParams& p, int64_t t0, int64_t t1, float* row) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t N = int64_t(hn::Lanes(dd)), H = p.hidden;
  for (int64_t t = t0; t < t1; ++t) {
    const bf16* x = p.x + t * p.x_stride();
    auto s0 = hn::Zero(dd), s1 = hn::Zero(dd);
    int64_t i = 0;
    for (; i + 2 * N <= H; i += 2 * N) {
      const auto a = load_bf16_f64(dd, x + i), b = load_bf16_f64(dd, x + i + N);
      s0 = hn::MulAdd(a, a, s0);
      s1 = hn::MulAdd(b, b, s1);
    }
    for (; i + N <= H; i += N) {
      const auto a = load_bf16_f64(dd, x + i);
      s0 = hn::MulAdd(a, a, s0);
    }
    double ss = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)));
    for (; i < H; ++i) ss += double(bf16_to_f32(x[i])) * bf16_to_f32(x[i]);
    const double r = rms_rstd(ss, H, p.eps);
    const auto vr = hn::Set(dd, r);
    bf16* y = p.y ? p.y + t * p.y_stride() : nullptr;
    i = 0;
    for (; i + N <= H; i += N) {
      const auto v = round_bf16_vec(
          df, hn::DemoteTo(
                  df, hn::Mul(hn::Mul(load_bf16_f64(dd, x + i), vr), load_bf16_f64(dd, p.w + i))));
      if (y) store_bf16(df, v, y + i);
      if (p.q) hn::StoreU(v, df, row + i);
    }
    for (; i < H; ++i) {
      const float v =
          round_bf16(float(double(bf16_to_f32(x[i])) * r * double(bf16_to_f32(p.w[i]))));
      if (y) y[i] = f32_to_bf16(v);
      row[i] = v;
    }
    if (p.q)
      token_cast_row_simd(hn::ScalableTag<float>(), row, H, p.ue8m0, p.q + t * H,
                          p.scales + t * num_blocks(H));
  }
}

void residual_add_range(const ResidualAddParams& p, int64_t i0, int64_t i1) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t i = i0;
  for (; i + N <= i1; i += N)
    store_bf16(df, hn::Add(load_bf16(df, p.a + i), load_bf16(df, p.b + i)), p.out + i);
  for (; i < i1; ++i) p.out[i] = f32_to_bf16(bf16_to_f32(p.a[i]) + bf16_to_f32(p.b[i]));
}

void bias_add_rows(const BiasAddParams& p, int64_t t0, int64_t t1) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df)), C = p.cols;
  for (int64_t t = t0; t < t1; ++t) {
    const float* x = p.x + t * C;
    bf16* o = p.out + t * C;
    int64_t j = 0;
    for (; j + N <= C; j += N)
      store_bf16(df, hn::Add(hn::LoadU(df, x + j), load_bf16(df, p.bias + j)), o + j);
    for (; j < C; ++j) o[j] = f32_to_bf16(x[j] + bf16_to_f32(p.bias[j]));
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(rms_norm_rows);
HWY_EXPORT(residual_add_range);
HWY_EXPORT(bias_add_rows);

void rms_norm(const RmsNormParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 16384 / p.hidden);
  kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(size_t(p.hidden + 64));
    HWY_DYNAMIC_DISPATCH(rms_norm_rows)(p, t0, t1, row.data());
  });
}

void residual_add(const ResidualAddParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.n, 1 << 15, [&](int64_t i0, int64_t i1) {
    HWY_DYNAMIC_DISPATCH(residual_add_range)(p, i0, i1);
  });
}

void bias_add(const BiasAddParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.rows, std::max<int64_t>(1, 32768 / p.cols),
                             [&](int64_t t0, int64_t t1) {
                               HWY_DYNAMIC_DISPATCH(bias_add_rows)(p, t0, t1);
                             });
}

}  // namespace deepinfer::kernels::cpu
#endif
