// Fast fp8 casts: Highway SIMD + kernel_pool(). Max, division and the RNE encoder are exact, so
// results equal host bit for bit (the harness checks with tolerance 0).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/quant.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/fp8_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// max |x| over n f32 values.
float AbsMax(const float* HWY_RESTRICT x, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  VF m = hn::Zero(df);
  int64_t i = 0;
  for (; i + L <= n; i += L) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
  float r = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < n; ++i) r = std::max(r, std::fabs(x[i]));
  return r;
}

// q[i] = e4m3(x[i] / s) for n values.
void EncodeDiv(const float* HWY_RESTRICT x, float s, uint8_t* HWY_RESTRICT q, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const VF vs = hn::Set(df, s);
  int64_t i = 0;
  for (; i + L <= n; i += L) EncodeE4m3(df, hn::Div(hn::LoadU(df, x + i), vs), q + i);
  for (; i < n; ++i) q[i] = f32_to_e4m3(x[i] / s).bits;
}

void Bf16ToF32(const bf16* HWY_RESTRICT x, float* HWY_RESTRICT out, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(DecodeBf16(df, reinterpret_cast<const uint16_t*>(x) + i), df, out + i);
  for (; i < n; ++i) out[i] = bf16_to_f32(x[i]);
}

void QuantPerToken(const QuantTokenParams& p) {
  const int64_t kbs = num_blocks(p.k);
  kernel_pool().parallel_for(p.m, 1, [&](int64_t m0, int64_t m1) {
    std::vector<float> row(size_t(p.k));
    for (int64_t m = m0; m < m1; ++m) {
      Bf16ToF32(p.x + m * p.k, row.data(), p.k);
      for (int64_t kb = 0; kb < kbs; ++kb) {
        const int64_t k0 = kb * kQuantBlock, len = std::min(kQuantBlock, p.k - k0);
        const float s = act_scale(AbsMax(row.data() + k0, len), p.ue8m0);
        p.scales[m * kbs + kb] = s;
        EncodeDiv(row.data() + k0, s, reinterpret_cast<uint8_t*>(p.q + m * p.k + k0), len);
      }
    }
  });
}

void QuantPerBlock(const QuantBlockParams& p) {
  const int64_t nbs = num_blocks(p.n), kbs = num_blocks(p.k);
  kernel_pool().parallel_for(nbs * kbs, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t nb = b / kbs, kb = b % kbs;
      const int64_t n0 = nb * kQuantBlock, n1 = std::min(p.n, n0 + kQuantBlock);
      const int64_t k0 = kb * kQuantBlock, len = std::min(kQuantBlock, p.k - k0);
      float amax = 0.0f;
      for (int64_t n = n0; n < n1; ++n) amax = std::max(amax, AbsMax(p.w + n * p.k + k0, len));
      const float s = weight_scale(amax, p.ue8m0);
      p.scales[b] = s;
      for (int64_t n = n0; n < n1; ++n)
        EncodeDiv(p.w + n * p.k + k0, s, reinterpret_cast<uint8_t*>(p.q + n * p.k + k0), len);
    }
  });
}

// out = f32(q) · s over n values with one scale; bf16 output rounded once (RNE).
void DecodeScale(const fp8_e4m3* HWY_RESTRICT q, float s, bf16* out, float* out_f32, int64_t n) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t L = int64_t(hn::Lanes(df));
  const VF vs = hn::Set(df, s);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const VF v = hn::Mul(DecodeE4m3(df, reinterpret_cast<const uint8_t*>(q) + i), vs);
    if (out_f32) hn::StoreU(v, df, out_f32 + i);
    if (out) {
      const auto x = hn::BitCast(du, v);  // finite: round to nearest even on the top 16 bits
      const auto r = hn::ShiftRight<16>(hn::Add(
          x, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u)))));
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DF>(), r)), d16,
                 reinterpret_cast<uint16_t*>(out) + i);
    }
  }
  for (; i < n; ++i) {
    const float v = e4m3_to_f32(q[i]) * s;
    if (out_f32) out_f32[i] = v;
    if (out) out[i] = f32_to_bf16(v);
  }
}

void DequantPerToken(const DequantTokenParams& p) {
  const int64_t kbs = num_blocks(p.k);
  kernel_pool().parallel_for(p.m, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t kb = 0; kb < kbs; ++kb) {
        const int64_t o = m * p.k + kb * kQuantBlock,
                      len = std::min(kQuantBlock, p.k - kb * kQuantBlock);
        DecodeScale(p.q + o, p.scales[m * kbs + kb], p.out ? p.out + o : nullptr,
                    p.out_f32 ? p.out_f32 + o : nullptr, len);
      }
  });
}

void DequantPerBlock(const DequantBlockParams& p) {
  const int64_t kbs = num_blocks(p.k);
  kernel_pool().parallel_for(p.n, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t kb = 0; kb < kbs; ++kb) {
        const int64_t o = n * p.k + kb * kQuantBlock,
                      len = std::min(kQuantBlock, p.k - kb * kQuantBlock);
        DecodeScale(p.q + o, p.scales[(n / kQuantBlock) * kbs + kb], p.out ? p.out + o : nullptr,
                    p.out_f32 ? p.out_f32 + o : nullptr, len);
      }
  });
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(QuantPerToken);
HWY_EXPORT(QuantPerBlock);
HWY_EXPORT(DequantPerToken);
HWY_EXPORT(DequantPerBlock);

void quant_per_token(const QuantTokenParams& p) { HWY_DYNAMIC_DISPATCH(QuantPerToken)(p); }
void quant_per_block(const QuantBlockParams& p) { HWY_DYNAMIC_DISPATCH(QuantPerBlock)(p); }
void dequant_per_token(const DequantTokenParams& p) { HWY_DYNAMIC_DISPATCH(DequantPerToken)(p); }
void dequant_per_block(const DequantBlockParams& p) { HWY_DYNAMIC_DISPATCH(DequantPerBlock)(p); }

}  // namespace deepinfer::kernels::cpu
#endif  // HWY_ONCE
