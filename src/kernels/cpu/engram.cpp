// cpu: Engram hash (Lemire's fastmod with a precomputed 128-bit reciprocal per head instead of a
// division), gate, conv norm and short conv (Highway SIMD, float64 where the reference rounds once:
// docs/numerics.md §8.1; one order per row: batch-invariant). Tokens over kernel_pool().
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/engram.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on
#include "kernels/engram.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"
#include "kernels/norm.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows (token, branch) [r0, r1) of the gate. The three sums in float64 (the products are exact
// there), the gate from the shared float64 formula, the gated row in fp32 without FMA: the
// reference's roundings (docs/numerics.md §8.1).
void engram_gate_rows(const EngramGateParams& p, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(df)), ND = int64_t(hn::Lanes(dd)), D = p.dim;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t t = row / p.hc, i = row % p.hc;
    const bf16 *x = p.x + row * D, *k = p.k + row * D, *v = p.v + t * D;
    const float* w = p.w_fused + i * D;
    auto vr = hn::Zero(dd), vx = hn::Zero(dd), vk = hn::Zero(dd);
    int64_t d = 0;
    for (; d + ND <= D; d += ND) {
      const auto a = load_bf16_f64(dd, x + d), b = load_bf16_f64(dd, k + d);
      vr = hn::MulAdd(hn::Mul(a, load_f32_f64(dd, w + d)), b, vr);
      vx = hn::MulAdd(a, a, vx);
      vk = hn::MulAdd(b, b, vk);
    }
    double raw = hn::GetLane(hn::SumOfLanes(dd, vr)), sx = hn::GetLane(hn::SumOfLanes(dd, vx)),
           sk = hn::GetLane(hn::SumOfLanes(dd, vk));
    for (; d < D; ++d) {
      const double a = bf16_to_f32(x[d]), b = bf16_to_f32(k[d]);
      raw += a * w[d] * b;
      sx += a * a;
      sk += b * b;
    }
    const float rx = float(rms_rstd(sx, D, p.eps)), rk = float(rms_rstd(sk, D, p.eps));
    const float g = engram_gate_value(float(raw), rx, rk, D, p.clamp);
    const auto vg = hn::Set(df, g);
    bf16* out = p.out + row * D;
    d = 0;
    for (; d + N <= D; d += N)
      store_bf16(df, hn::Add(load_bf16(df, x + d), hn::Mul(vg, load_bf16(df, v + d))), out + d);
    for (; d < D; ++d) out[d] = f32_to_bf16(bf16_to_f32(x[d]) + g * bf16_to_f32(v[d]));
    if (p.raw) p.raw[row] = float(raw);
    if (p.gate) p.gate[row] = g;
    if (p.rstd_x) p.rstd_x[row] = rx;
    if (p.rstd_k) p.rstd_k[row] = rk;
  }
}

// Rows (token, branch) [r0, r1) of the conv norm: u = bf16(g·v) in fp32, then the RMSNorm in
// float64 with one rounding, as every RMSNorm of the reference. u: scratch of d floats.
void engram_conv_norm_rows(const EngramConvNormParams& p, int64_t r0, int64_t r1, float* u) {
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(df)), ND = int64_t(hn::Lanes(dd)), D = p.dim;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t t = row / p.hc, i = row % p.hc;
    const bf16* v = p.v + t * D;
    const float g = p.gate[row];
    const auto vg = hn::Set(df, g);
    int64_t d = 0;
    for (; d + N <= D; d += N)
      hn::StoreU(round_bf16_vec(df, hn::Mul(vg, load_bf16(df, v + d))), df, u + d);
    for (; d < D; ++d) u[d] = round_bf16(g * bf16_to_f32(v[d]));
    auto ss = hn::Zero(dd);
    for (d = 0; d + ND <= D; d += ND) {
      const auto x = load_f32_f64(dd, u + d);
      ss = hn::MulAdd(x, x, ss);
    }
    double sum = hn::GetLane(hn::SumOfLanes(dd, ss));
    for (; d < D; ++d) sum += double(u[d]) * u[d];
    const double r = rms_rstd(sum, D, p.eps);
    const auto vr = hn::Set(dd, r);
    const bf16* w = p.w + i * D;
    bf16* o = p.out + row * D;
    for (d = 0; d + ND <= D; d += ND)
      store_f64_bf16(dd, hn::Mul(hn::Mul(load_f32_f64(dd, u + d), vr), load_bf16_f64(dd, w + d)),
                     o + d);
    for (; d < D; ++d) o[d] = f32_to_bf16(float(double(u[d]) * r * double(bf16_to_f32(w[d]))));
  }
}

// Tokens [t0, t1) of the short conv: channels in lanes, taps in order. The conv in float64 (its
// bf16 × bf16 products and their sum are exact), rounded once to fp32; SiLU in float64 from that
// fp32 value. wt: the weight transposed to [K, C] floats.
void engram_short_conv_rows(const EngramShortConvParams& p, const float* wt, int64_t t0,
                            int64_t t1) {
  const hn::ScalableTag<double> dd;
  const int64_t N = int64_t(hn::Lanes(dd)), C = p.channels, K = p.kernel_size;
  const auto one = hn::Set(dd, 1.0);
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t* taps = p.taps + t * K;
    bf16* o = p.out + t * C;
    int64_t c = 0;
    for (; c + N <= C; c += N) {
      auto acc = hn::Zero(dd);
      for (int64_t j = 0; j < K; ++j)
        if (taps[j] >= 0)
          acc = hn::MulAdd(load_f32_f64(dd, wt + j * C + c),
                           load_bf16_f64(dd, p.x + taps[j] * C + c), acc);
      const auto conv = hn::PromoteTo(dd, hn::DemoteTo(hn::Rebind<float, decltype(dd)>(), acc));
      store_f64_bf16(dd, hn::Div(conv, hn::Add(one, hn::Exp(dd, hn::Neg(conv)))), o + c);
    }
    for (; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j)
        if (taps[j] >= 0) acc += double(wt[j * C + c]) * bf16_to_f32(p.x[taps[j] * C + c]);
      o[c] = f32_to_bf16(float(engram_silu(acc)));
    }
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {
namespace {

using u128 = unsigned __int128;

// a mod d for any 64-bit a and d < 2^63 (Lemire, Kaser, Kurz 2019: M = ceil(2^128 / d)).
struct FastMod {
  u128 m;
  uint64_t d;
  explicit FastMod(uint64_t div) : m(~u128(0) / div + 1), d(div) {}
  uint64_t mod(uint64_t a) const {
    const u128 low = m * a;  // mod 2^128
    const u128 lo = u128(uint64_t(low)) * d, hi = u128(uint64_t(low >> 64)) * d;
    return uint64_t((hi + (lo >> 64)) >> 64);
  }
  // Non-negative remainder of a signed value (Python's %).
  uint64_t mod_signed(int64_t a) const {
    if (a >= 0) return mod(uint64_t(a));
    const uint64_t r = mod(uint64_t(0) - uint64_t(a));
    return r == 0 ? 0 : d - r;
  }
};

}  // namespace

HWY_EXPORT(engram_gate_rows);
HWY_EXPORT(engram_conv_norm_rows);
HWY_EXPORT(engram_short_conv_rows);

void engram_hash(const EngramHashParams& p) {
  p.validate();
  const int64_t G = p.max_ngram, H = p.heads(), N = p.num_tokens, L = p.num_layers;
  std::vector<FastMod> mods;
  mods.reserve(size_t(L * H));
  for (int64_t i = 0; i < L * H; ++i) mods.emplace_back(uint64_t(p.vocab_sizes[i]));
  kernel_pool().parallel_for(N, 256, [&](int64_t t0, int64_t t1) {
    std::vector<uint64_t> mix(static_cast<size_t>(G));
    for (int64_t t = t0; t < t1; ++t) {
      p.check_ids(t);
      const int32_t* ids = p.ngram_ids + t * G;
      for (int64_t l = 0; l < L; ++l) {
        int32_t* o = p.out + (l * N + t) * H;
        if (ids[0] == -1) {
          std::fill(o, o + H, -1);
          continue;
        }
        // mix[n] = XOR of the first n + 1 products (the running hash of order n + 1).
        uint64_t acc = uint64_t(int64_t(ids[0])) * uint64_t(p.multipliers[l * G]);
        for (int64_t k = 1; k < G; ++k) {
          acc ^= uint64_t(int64_t(ids[k])) * uint64_t(p.multipliers[l * G + k]);
          mix[size_t(k)] = acc;
        }
        for (int64_t h = 0; h < H; ++h) {
          const uint64_t m = mix[size_t(1 + h / p.heads_per_ngram)];
          o[h] = int32_t(int64_t(mods[size_t(l * H + h)].mod_signed(int64_t(m))) +
                         p.offsets[l * H + h]);
        }
      }
    }
  });
}

void engram_gate(const EngramGateParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 8192 / p.dim);
  kernel_pool().parallel_for(p.num_tokens * p.hc, grain, [&](int64_t r0, int64_t r1) {
    HWY_DYNAMIC_DISPATCH(engram_gate_rows)(p, r0, r1);
  });
}

void engram_conv_norm(const EngramConvNormParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 8192 / p.dim);
  kernel_pool().parallel_for(p.num_tokens * p.hc, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> u(size_t(p.dim));
    HWY_DYNAMIC_DISPATCH(engram_conv_norm_rows)(p, r0, r1, u.data());
  });
}

void engram_short_conv(const EngramShortConvParams& p) {
  p.validate();
  const int64_t C = p.channels, K = p.kernel_size;
  std::vector<float> wt(size_t(K * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[size_t(j * C + c)] = bf16_to_f32(p.w[c * K + j]);
  const int64_t grain = std::max<int64_t>(1, 16384 / (C * K));
  kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(engram_short_conv_rows)(p, wt.data(), t0, t1);
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
