// FP4 e2m1 / e5m6 / lossless re-blocking / per-channel casts: codecs, checks, one-row bodies,
// dispatch. Both backends run the same row bodies (bytes identical by construction); the cpu one
// spreads rows over kernel_pool(). The tests check the rows against the rules in cast.h.
#include "kernels/cast.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/quant.h"

namespace deepinfer::kernels {

uint8_t f32_to_e2m1(float f) {
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  const float af = std::fabs(f);
  if (!(af < kE2m1Max)) return uint8_t(sign | 0x7);  // saturate (NaN included)
  return uint8_t(sign | deepinfer::detail::fp8_encode_magnitude<2, 1, 1>(af));
}

float e2m1_to_f32(uint8_t code) {
  const int mag = code & 0x7, e = mag >> 1, m = mag & 1;
  const float v = e == 0 ? 0.5f * float(m) : std::ldexp(1.0f + 0.5f * float(m), e - 1);
  return (code & 0x8) ? -v : v;
}

uint16_t f32_to_e5m6(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 20) & 0x800u);
  const float af = std::min(std::fabs(f), kE5m6Max);
  const uint32_t a = std::bit_cast<uint32_t>(af);
  const int e = int((a >> 23) & 0xffu) - 127;
  uint32_t h = 0;  // fp16 bits of af, rounded toward zero
  if (af == 0.0f) {
    h = 0;
  } else if (e >= -14) {
    h = (uint32_t(e + 15) << 10) | ((a >> 13) & 0x3ffu);
  } else {
    const int shift = 13 + (-14 - e);
    h = shift < 32 ? ((0x800000u | (a & 0x7fffffu)) >> shift) : 0u;
  }
  uint32_t code = h >> 4;
  if ((code & 1u) + (a & 0x1ffffu) > 0x10000u) code += 1;
  return uint16_t(sign | code);
}

float e5m6_to_f32(uint16_t code) {
  const uint32_t h = uint32_t(code & 0xfffu) << 4;
  const int e = int((h >> 10) & 0x1fu), m = int(h & 0x3ffu);
  float v = 0;
  if (e == 0)
    v = std::ldexp(float(m), -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(float(1024 + m), e - 25);
  return (h & 0x8000u) ? -v : v;
}

void pack_e5m6(const uint16_t* h, uint8_t* out) {
  auto c = [&](int i) { return uint32_t(h[i] & 0xfffu); };
  const uint32_t w[3] = {c(0) << 20 | c(1) << 8 | c(2) >> 4,
                         c(2) << 28 | c(3) << 16 | c(4) << 4 | c(5) >> 8,
                         c(5) << 24 | c(6) << 12 | c(7)};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 4; ++b) out[4 * i + b] = uint8_t(w[i] >> (8 * b));
}

void unpack_e5m6(const uint8_t* in, uint16_t* h) {
  uint32_t w[3];
  for (int i = 0; i < 3; ++i)
    w[i] = uint32_t(in[4 * i]) | uint32_t(in[4 * i + 1]) << 8 | uint32_t(in[4 * i + 2]) << 16 |
           uint32_t(in[4 * i + 3]) << 24;
  h[0] = uint16_t(w[0] >> 20);
  h[1] = uint16_t((w[0] >> 8) & 0xfffu);
  h[2] = uint16_t(((w[0] & 0xffu) << 4) | (w[1] >> 28));
  h[3] = uint16_t((w[1] >> 16) & 0xfffu);
  h[4] = uint16_t((w[1] >> 4) & 0xfffu);
  h[5] = uint16_t(((w[1] & 0xfu) << 8) | (w[2] >> 24));
  h[6] = uint16_t((w[2] >> 12) & 0xfffu);
  h[7] = uint16_t(w[2] & 0xfffu);
}

namespace {
void check_mk(const char* op, int64_t m, int64_t k, int64_t multiple) {
  DI_CHECK(m >= 0 && k >= 0 && k % multiple == 0, "{}: k = {} must be a multiple of {} (m = {})",
           op, k, multiple, m);
}
}  // namespace

void CastE2m1Params::validate() const {
  check_mk("cast_e2m1", m, k, kE2m1Block);
  DI_CHECK(m * k == 0 || (x && q && sf), "cast_e2m1: x, q and sf must be set");
}
void CastBackE2m1Params::validate() const {
  check_mk("cast_back_e2m1", m, k, kE2m1Block);
  DI_CHECK(m * k == 0 || (q && sf && (out || out_f32)),
           "cast_back_e2m1: q, sf and an output must "
           "be set");
}
void CastE5m6Params::validate() const {
  check_mk("cast_e5m6", m, k, 8);
  DI_CHECK(m * k == 0 || (x && q && sf), "cast_e5m6: x, q and sf must be set");
}
void CastBackE5m6Params::validate() const {
  check_mk("cast_back_e5m6", m, k, 8);
  DI_CHECK(m * k == 0 || (q && sf && (out || out_f32)),
           "cast_back_e5m6: q, sf and an output must "
           "be set");
}
void CastE2m1ToE4m3Params::validate() const {
  DI_CHECK(block >= kE2m1Block && block % kE2m1Block == 0,
           "cast_e2m1_to_e4m3: block {} must be a multiple of 32", block);
  check_mk("cast_e2m1_to_e4m3", m, k, block);
  DI_CHECK(m * k == 0 || (q && sf && out && out_sf), "cast_e2m1_to_e4m3: every buffer must be set");
}
void PerChannelCastParams::validate() const {
  DI_CHECK(num_tokens >= 0 && hidden >= 1 && rows >= 0,
           "per_channel_cast: bad shape t={} h={} rows={}", num_tokens, hidden, rows);
  DI_CHECK(pos_to_token || rows == 0, "per_channel_cast: rows is only for a pos_to_token gather");
  DI_CHECK(out_rows() == 0 || ((x || num_tokens == 0) && q && sf),
           "per_channel_cast: x, q and sf must be set");
}

void cast_e2m1_row(const CastE2m1Params& p, int64_t r) {
  const bf16* x = p.x + r * p.k;
  uint8_t* q = p.q + r * p.k / 2;
  for (int64_t b = 0; b < p.k / kE2m1Block; ++b) {
    float amax = 0;
    for (int64_t i = b * kE2m1Block; i < (b + 1) * kE2m1Block; ++i)
      amax = std::max(amax, std::fabs(bf16_to_f32(x[i])));
    const float sf = ue8m0_ceil(std::max(amax, kE2m1Max * std::ldexp(1.0f, -126)) / kE2m1Max);
    const int e = int((std::bit_cast<uint32_t>(sf) >> 23) & 0xffu);
    p.sf[r * (p.k / kE2m1Block) + b] = uint8_t(e);
    for (int64_t i = b * kE2m1Block; i < (b + 1) * kE2m1Block; i += 2) {
      const uint8_t lo = f32_to_e2m1(std::ldexp(bf16_to_f32(x[i]), 127 - e));
      const uint8_t hi = f32_to_e2m1(std::ldexp(bf16_to_f32(x[i + 1]), 127 - e));
      q[i / 2] = uint8_t(lo | hi << 4);
    }
  }
}

void cast_back_e2m1_row(const CastBackE2m1Params& p, int64_t r) {
  for (int64_t i = 0; i < p.k; ++i) {
    const uint8_t byte = p.q[(r * p.k + i) / 2];
    const int e = p.sf[r * (p.k / kE2m1Block) + i / kE2m1Block];
    const float v = std::ldexp(e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xf), e - 127);
    if (p.out) p.out[r * p.k + i] = f32_to_bf16(v);
    if (p.out_f32) p.out_f32[r * p.k + i] = v;
  }
}

void cast_e5m6_row(const CastE5m6Params& p, int64_t r) {
  const bf16* x = p.x + r * p.k;
  float amax = 0;
  for (int64_t i = 0; i < p.k; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(x[i])));
  amax = std::max(amax, kActAmaxFloor);
  float sf = amax / kE5m6Max, inv = kE5m6Max / amax;
  if (p.round_sf) {
    sf = ue8m0_ceil(sf);
    inv = 1.0f / sf;  // exact: a power of two
  }
  p.sf[r] = sf;
  uint16_t h[8];
  for (int64_t g = 0; g < p.k / 8; ++g) {
    for (int j = 0; j < 8; ++j) h[j] = f32_to_e5m6(bf16_to_f32(x[g * 8 + j]) * inv);
    pack_e5m6(h, p.q + r * p.k * 3 / 2 + g * 12);
  }
}

void cast_back_e5m6_row(const CastBackE5m6Params& p, int64_t r) {
  uint16_t h[8];
  for (int64_t g = 0; g < p.k / 8; ++g) {
    unpack_e5m6(p.q + r * p.k * 3 / 2 + g * 12, h);
    for (int j = 0; j < 8; ++j) {
      const float v = e5m6_to_f32(h[j]) * p.sf[r];
      const int64_t i = r * p.k + g * 8 + j;
      if (p.out) p.out[i] = f32_to_bf16(v);
      if (p.out_f32) p.out_f32[i] = v;
    }
  }
}

void cast_e2m1_to_e4m3_row(const CastE2m1ToE4m3Params& p, int64_t r) {
  const int64_t subs = p.block / kE2m1Block, kb = p.k / kE2m1Block;
  for (int64_t b = 0; b < p.k / p.block; ++b) {
    const uint8_t* sf = p.sf + r * kb + b * subs;
    const int emax = *std::max_element(sf, sf + subs);
    p.out_sf[r * (p.k / p.block) + b] = std::ldexp(1.0f, emax - 127 - 6);
    for (int64_t i = b * p.block; i < (b + 1) * p.block; ++i) {
      const uint8_t byte = p.q[(r * p.k + i) / 2];
      const int shift = int(sf[(i - b * p.block) / kE2m1Block]) - emax + 6;
      const float v = std::ldexp(e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xf), shift);
      const fp8_e4m3 c = f32_to_e4m3(v);
      if (e4m3_to_f32(c) != v)
        DI_FAIL(
            "cast_e2m1_to_e4m3: row {} element {} ({} x 2^{}) does not fit e4m3 exactly: the "
            "1x32 scales of its {}-wide block span more than e4m3's range; use a smaller block",
            r, i, e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xf), shift, p.block);
      p.out[r * p.k + i] = c;
    }
  }
}

void per_channel_cast_block(const PerChannelCastParams& p, int64_t block, int64_t h0, int64_t h1) {
  const int64_t r0 = block * kPerChannelRows, r1 = std::min(p.out_rows(), r0 + kPerChannelRows),
                H = p.hidden;
  auto src = [&](int64_t r) -> const bf16* {
    const int64_t t = p.pos_to_token ? p.pos_to_token[r] : r;
    DI_CHECK(t >= -1 && t < p.num_tokens,
             "per_channel_cast: pos_to_token[{}] = {} is outside "
             "[-1, {})",
             r, t, p.num_tokens);
    return t < 0 ? nullptr : p.x + t * H;
  };
  for (int64_t h = h0; h < h1; ++h) {
    float amax = 0;
    for (int64_t r = r0; r < r1; ++r)
      if (const bf16* x = src(r)) amax = std::max(amax, std::fabs(bf16_to_f32(x[h])));
    const float s = act_scale(amax, p.round_sf);
    p.sf[block * H + h] = s;
    for (int64_t r = r0; r < r1; ++r) {
      const bf16* x = src(r);
      p.q[r * H + h] = f32_to_e4m3(x ? bf16_to_f32(x[h]) / s : 0.0f);
    }
  }
}

void cast_e2m1(const CastE2m1Params& p) { dispatch(p, host::cast_e2m1, cpu::cast_e2m1); }
void cast_back_e2m1(const CastBackE2m1Params& p) {
  dispatch(p, host::cast_back_e2m1, cpu::cast_back_e2m1);
}
void cast_e5m6(const CastE5m6Params& p) { dispatch(p, host::cast_e5m6, cpu::cast_e5m6); }
void cast_back_e5m6(const CastBackE5m6Params& p) {
  dispatch(p, host::cast_back_e5m6, cpu::cast_back_e5m6);
}
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p) {
  dispatch(p, host::cast_e2m1_to_e4m3, cpu::cast_e2m1_to_e4m3);
}
void per_channel_cast(const PerChannelCastParams& p) {
  dispatch(p, host::per_channel_cast, cpu::per_channel_cast);
}

}  // namespace deepinfer::kernels
