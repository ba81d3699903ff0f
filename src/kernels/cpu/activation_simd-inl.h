// Highway helpers for bf16 activation rows, shared by the norm, rope, swiglu and attention cpu
// kernels: bf16 <-> f32, the e4m3 encode and the 1x128 token cast, bit-identical to the scalar
// conversions in <deepinfer/dtype.h>.
// Per-target -inl header: include it after <hwy/highway.h> inside a foreach_target file.
#if defined(DEEPINFER_KERNELS_CPU_ACTIVATION_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DEEPINFER_KERNELS_CPU_ACTIVATION_SIMD_INL_H_
#undef DEEPINFER_KERNELS_CPU_ACTIVATION_SIMD_INL_H_
#else
#define DEEPINFER_KERNELS_CPU_ACTIVATION_SIMD_INL_H_
#endif

#include <deepinfer/dtype.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/quant.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) bf16 values at p, widened exactly to f32.
template <class DF>
HWY_INLINE hn::Vec<DF> load_bf16(DF df, const bf16* p) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::PromoteTo(du32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(df, hn::ShiftLeft<16>(bits));
}

// Stores Lanes(df) values as bf16, round-to-nearest-even, NaN kept quiet (as f32_to_bf16).
template <class DF>
HWY_INLINE void store_bf16(DF df, hn::Vec<DF> v, bf16* p) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto u = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  auto r = hn::ShiftRight<16>(hn::Add(u, hn::Add(lsb, hn::Set(du32, 0x7fffu))));
  const auto nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du32, 0x40u));
  r = hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), nan, r);
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, r)), d16, reinterpret_cast<uint16_t*>(p));
}

// v rounded to bf16 precision (RNE, as round_bf16), kept as f32.
// Lanes(dd) bf16 / fp32 values widened exactly to f64, and f64 values rounded to fp32 and then
// to bf16 (the reference's bf16() of a float64 value): the float64 paths of the Engram and mHC
// kernels (docs/numerics.md §8.1).
template <class DD>
HWY_INLINE hn::Vec<DD> load_bf16_f64(DD dd, const bf16* p) {
  return hn::PromoteTo(dd, load_bf16(hn::Rebind<float, DD>(), p));
}
template <class DD>
HWY_INLINE hn::Vec<DD> load_f32_f64(DD dd, const float* p) {
  return hn::PromoteTo(dd, hn::LoadU(hn::Rebind<float, DD>(), p));
}
template <class DD>
HWY_INLINE void store_f64_bf16(DD dd, hn::Vec<DD> v, bf16* p) {
  const hn::Rebind<float, DD> df;
  store_bf16(df, hn::DemoteTo(df, v), p);
}

template <class DF>
HWY_INLINE hn::Vec<DF> round_bf16_vec(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto u = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto r =
      hn::And(hn::Add(u, hn::Add(lsb, hn::Set(du32, 0x7fffu))), hn::Set(du32, 0xffff0000u));
  return hn::IfThenElse(hn::IsNaN(v), v, hn::BitCast(df, r));
}

// e4m3 codes of Lanes(df) values, RNE, saturating to +-448, NaN -> 0x7f|sign (as f32_to_e4m3).
template <class DF>
HWY_INLINE void store_e4m3(DF df, hn::Vec<DF> v, fp8_e4m3* p) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto u = hn::BitCast(du32, v);
  const auto sign = hn::And(hn::ShiftRight<24>(u), hn::Set(du32, 0x80u));
  const auto a = hn::Abs(v);
  const auto au = hn::BitCast(du32, a);
  // Normal: round the f32 mantissa to 3 bits (RNE) and rebias 127 -> 7.
  const auto lsb = hn::And(hn::ShiftRight<20>(au), hn::Set(du32, 1u));
  const auto rounded = hn::Add(au, hn::Add(lsb, hn::Set(du32, (1u << 19) - 1u)));
  const auto normal = hn::Sub(hn::ShiftRight<20>(rounded), hn::Set(du32, uint32_t(127 - 7) << 3));
  // Subnormal (|v| < 2^-6): units of 2^-9, RNE to an integer (2^3 lands on the min normal code).
  const auto sub =
      hn::BitCast(du32, hn::ConvertTo(di32, hn::Round(hn::Mul(a, hn::Set(df, 512.0f)))));
  auto code = hn::IfThenElse(hn::RebindMask(du32, hn::Lt(a, hn::Set(df, 0.015625f))), sub, normal);
  code = hn::IfThenElse(hn::RebindMask(du32, hn::Ge(a, hn::Set(df, kFp8E4m3Max))),
                        hn::Set(du32, 0x7eu), code);
  code = hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), hn::Set(du32, 0x7fu), code);
  code = hn::Or(code, sign);
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di32, code)), d8, reinterpret_cast<uint8_t*>(p));
}

// The 1x128 cast of one row of bf16-rounded f32 values (token_cast_row, vectorised):
// q [n] e4m3, scales [num_blocks(n)] f32.
template <class DF>
HWY_INLINE void token_cast_row_simd(DF df, const float* v, int64_t n, bool ue8m0, fp8_e4m3* q,
                                    float* scales) {
  const int64_t N = int64_t(hn::Lanes(df));
  for (int64_t g0 = 0, g = 0; g0 < n; g0 += kQuantBlock, ++g) {
    const int64_t g1 = std::min(n, g0 + kQuantBlock);
    auto vmax = hn::Zero(df);
    int64_t i = g0;
    for (; i + N <= g1; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, v + i)));
    float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (; i < g1; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float s = act_scale(amax, ue8m0);
    scales[g] = s;
    const auto vs = hn::Set(df, s);
    i = g0;
    for (; i + N <= g1; i += N) store_e4m3(df, hn::Div(hn::LoadU(df, v + i), vs), q + i);
    for (; i < g1; ++i) q[i] = f32_to_e4m3(v[i] / s);
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
