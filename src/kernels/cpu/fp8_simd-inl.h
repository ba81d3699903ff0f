// Highway helpers shared by the cpu kernels: exact e4m3/bf16 -> f32 decoding and the RNE
// f32 -> e4m3 encoder. Included inside HWY_NAMESPACE by per-target code (foreach_target), so
// there is no include guard, only the per-target toggle.
#if defined(DEEPINFER_FP8_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DEEPINFER_FP8_SIMD_INL_H_
#undef DEEPINFER_FP8_SIMD_INL_H_
#else
#define DEEPINFER_FP8_SIMD_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) e4m3 codes -> f32, exact. Normal codes: the 7 magnitude bits shifted to bits 26..20
// plus 120 in the exponent field give the f32 value. Subnormal codes (exponent 0): m · 2^-9 via an
// int->float convert (an f32-denormal multiply trick would hit the slow microcode path). The sign
// bit goes to bit 31. Codes 0x7f/0xff (NaN) decode as ±480: quantised data never holds them.
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeE4m3(DF df, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::RebindToSigned<DF> di;
  const auto v = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  const auto mag = hn::And(v, hn::Set(di, 0x7f));
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(mag), hn::Set(di, 120 << 23)));
  const auto sub = hn::Mul(hn::ConvertTo(df, mag), hn::Set(df, 0x1p-9f));
  const auto r = hn::IfThenElse(hn::RebindMask(df, hn::Lt(mag, hn::Set(di, 8))), sub, normal);
  return hn::Or(r,
                hn::BitCast(df, hn::And(hn::ShiftLeft<24>(v), hn::Set(di, int32_t(0x80000000u)))));
}

// Lanes(df) bf16 -> f32 (exact: the bits move up 16).
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeBf16(DF df, const uint16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// f32 -> e4m3 codes (RNE, saturating to ±448), same as f32_to_e4m3 for every non-NaN input.
// Writes Lanes(df) bytes.
template <class DF>
HWY_INLINE void EncodeE4m3(DF df, hn::Vec<DF> v, uint8_t* HWY_RESTRICT out) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const auto a = hn::Abs(v);
  const auto bits = hn::BitCast(di, a);
  // Normal: round the f32 mantissa to 3 bits (ties to even), rebias the exponent 127 -> 7.
  const auto lsb = hn::And(hn::ShiftRight<20>(bits), hn::Set(di, 1));
  auto normal = hn::ShiftRight<20>(hn::Add(bits, hn::Add(hn::Set(di, (1 << 19) - 1), lsb)));
  normal = hn::Sub(normal, hn::Set(di, 120 << 3));
  // Subnormal (|v| < 2^-6): units of 2^-9, rounded to nearest even.
  const auto sub = hn::ConvertTo(di, hn::Round(hn::Mul(a, hn::Set(df, 512.0f))));
  auto code = hn::IfThenElse(hn::RebindMask(di, hn::Lt(a, hn::Set(df, 0x1p-6f))), sub, normal);
  code = hn::Min(code, hn::Set(di, 0x7e));  // saturate (448, 480 rounding, inf)
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(di, v)), hn::Set(di, 0x80));
  hn::StoreU(hn::DemoteTo(d8, hn::Or(code, sign)), d8, out);
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
