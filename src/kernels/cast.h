// Low-precision casts of the TileKernels family (docs/kernels.md §Casts), beside the e4m3 casts of
// quant.h:
//   cast_e2m1            bf16 [M, K] -> FP4 e2m1 (2 per byte, low nibble first) with one UE8M0
//                        scale byte (2^(b-127)) per 1×32 block: amax clamped to 6·2^-126,
//                        sf = 2^ceil(log2(amax / 6)), code = e2m1(x / sf) round-to-nearest-even,
//                        saturating at ±6.
//   cast_back_e2m1       the inverse: x = e2m1 value · 2^(b-127).
//   cast_e5m6            bf16 [M, K] -> 12-bit e5m6 (the top 12 bits of an IEEE half) packed 8
//                        codes per 3 words, one fp32 scale per row: amax clamped to 1e-4,
//                        sf = amax / 65024 (or rounded up to 2^e), data = x · (65024 / amax)
//                        (or x · 2^-e); encoding: fp16 round-toward-zero, keep its top 12 bits, +1
//                        if lsb + (low 17 bits of the fp32) > 0x10000.
//   cast_back_e5m6       code << 4 as fp16 bits, × sf.
//   cast_e2m1_to_e4m3    lossless re-blocking: FP4 with 1×32 UE8M0 scales -> e4m3 with one
//                        power-of-two fp32 scale per 1×block (block a multiple of 32): the block
//                        scale is 2^(max sub-block exponent - 6) and each sub-block's offset moves
//                        into the e4m3 values; a value e4m3 cannot hold exactly is an error.
//   per_channel_cast     bf16 [T, H] (rows optionally gathered through pos_to_token, -1 = a zero
//                        row) -> e4m3 with one fp32 scale per channel per 128 rows:
//                        sf = max(amax, 1e-4) / 448 (optionally rounded up to 2^e), q = e4m3(x /
//                        sf).
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

constexpr int64_t kE2m1Block = 32;
constexpr float kE2m1Max = 6.0f;
constexpr float kE5m6Max = 65024.0f;
constexpr int64_t kPerChannelRows = 128;

// Scalar codecs shared by both backends (and the tests' closed forms).
uint8_t f32_to_e2m1(float f);     // 4-bit code: sign << 3 | magnitude
float e2m1_to_f32(uint8_t code);  // low 4 bits
uint16_t f32_to_e5m6(float f);    // 12-bit code, the rule above
float e5m6_to_f32(uint16_t code);
// Packs 8 codes into 12 bytes (3 little-endian 32-bit words) and back.
void pack_e5m6(const uint16_t* h, uint8_t* out);
void unpack_e5m6(const uint8_t* in, uint16_t* h);

struct CastE2m1Params {
  const bf16* x = nullptr;  // [M, K]
  uint8_t* q = nullptr;     // [M, K/2]
  uint8_t* sf = nullptr;    // [M, K/32] UE8M0 bytes
  int64_t m = 0, k = 0;
  void validate() const;
};

struct CastBackE2m1Params {
  const uint8_t* q = nullptr;   // [M, K/2]
  const uint8_t* sf = nullptr;  // [M, K/32]
  bf16* out = nullptr;          // [M, K] or null
  float* out_f32 = nullptr;     // [M, K] or null
  int64_t m = 0, k = 0;
  void validate() const;
};

struct CastE5m6Params {
  const bf16* x = nullptr;  // [M, K]
  uint8_t* q = nullptr;     // [M, 3K/2]
  float* sf = nullptr;      // [M]
  int64_t m = 0, k = 0;
  bool round_sf = false;
  void validate() const;
};

struct CastBackE5m6Params {
  const uint8_t* q = nullptr;  // [M, 3K/2]
  const float* sf = nullptr;   // [M]
  bf16* out = nullptr;         // [M, K] or null
  float* out_f32 = nullptr;    // [M, K] or null
  int64_t m = 0, k = 0;
  void validate() const;
};

struct CastE2m1ToE4m3Params {
  const uint8_t* q = nullptr;   // [M, K/2]
  const uint8_t* sf = nullptr;  // [M, K/32]
  fp8_e4m3* out = nullptr;      // [M, K]
  float* out_sf = nullptr;      // [M, K/block]
  int64_t m = 0, k = 0, block = 128;
  void validate() const;
};

struct PerChannelCastParams {
  const bf16* x = nullptr;                // [T, H]
  const int32_t* pos_to_token = nullptr;  // [rows] or null (then rows = T)
  fp8_e4m3* q = nullptr;                  // [rows, H]
  float* sf = nullptr;                    // [ceil(rows/128), H]
  int64_t num_tokens = 0, hidden = 0, rows = 0;
  bool round_sf = false;
  int64_t out_rows() const { return pos_to_token ? rows : num_tokens; }
  int64_t sf_rows() const { return (out_rows() + kPerChannelRows - 1) / kPerChannelRows; }
  void validate() const;
};

// One row (or one 128-row block for per_channel_cast) of each cast: the backends differ only in
// how they spread rows over threads.
void cast_e2m1_row(const CastE2m1Params& p, int64_t r);
void cast_back_e2m1_row(const CastBackE2m1Params& p, int64_t r);
void cast_e5m6_row(const CastE5m6Params& p, int64_t r);
void cast_back_e5m6_row(const CastBackE5m6Params& p, int64_t r);
void cast_e2m1_to_e4m3_row(const CastE2m1ToE4m3Params& p, int64_t r);
void per_channel_cast_block(const PerChannelCastParams& p, int64_t block, int64_t h0, int64_t h1);

void cast_e2m1(const CastE2m1Params& p);
void cast_back_e2m1(const CastBackE2m1Params& p);
void cast_e5m6(const CastE5m6Params& p);
void cast_back_e5m6(const CastBackE5m6Params& p);
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p);
void per_channel_cast(const PerChannelCastParams& p);

namespace host {
void cast_e2m1(const CastE2m1Params& p);
void cast_back_e2m1(const CastBackE2m1Params& p);
void cast_e5m6(const CastE5m6Params& p);
void cast_back_e5m6(const CastBackE5m6Params& p);
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p);
void per_channel_cast(const PerChannelCastParams& p);
}  // namespace host
namespace cpu {
void cast_e2m1(const CastE2m1Params& p);
void cast_back_e2m1(const CastBackE2m1Params& p);
void cast_e5m6(const CastE5m6Params& p);
void cast_back_e5m6(const CastBackE5m6Params& p);
void cast_e2m1_to_e4m3(const CastE2m1ToE4m3Params& p);
void per_channel_cast(const PerChannelCastParams& p);
}  // namespace cpu

template <>
struct OpSpec<CastE2m1Params> {
  static constexpr const char* name = "cast_e2m1";
  static std::string shape(const CastE2m1Params& p) { return fmt::format("m={} k={}", p.m, p.k); }
  template <class V>
  static void visit(CastE2m1Params& p, V& v) {
    v.in("x", p.x, p.m * p.k);
    v.out("q", p.q, p.m * p.k / 2);
    v.out("sf", p.sf, p.m * p.k / kE2m1Block);
  }
};

template <>
struct OpSpec<CastBackE2m1Params> {
  static constexpr const char* name = "cast_back_e2m1";
  static std::string shape(const CastBackE2m1Params& p) {
    return fmt::format("m={} k={}", p.m, p.k);
  }
  template <class V>
  static void visit(CastBackE2m1Params& p, V& v) {
    v.in("q", p.q, p.m * p.k / 2);
    v.in("sf", p.sf, p.m * p.k / kE2m1Block);
    v.out("out", p.out, p.m * p.k);
    v.out("out_f32", p.out_f32, p.m * p.k);
  }
};

template <>
struct OpSpec<CastE5m6Params> {
  static constexpr const char* name = "cast_e5m6";
  static std::string shape(const CastE5m6Params& p) {
    return fmt::format("m={} k={}{}", p.m, p.k, p.round_sf ? " round_sf" : "");
  }
  template <class V>
  static void visit(CastE5m6Params& p, V& v) {
    v.in("x", p.x, p.m * p.k);
    v.out("q", p.q, p.m * p.k * 3 / 2);
    v.out("sf", p.sf, p.m);
  }
};

template <>
struct OpSpec<CastBackE5m6Params> {
  static constexpr const char* name = "cast_back_e5m6";
  static std::string shape(const CastBackE5m6Params& p) {
    return fmt::format("m={} k={}", p.m, p.k);
  }
  template <class V>
  static void visit(CastBackE5m6Params& p, V& v) {
    v.in("q", p.q, p.m * p.k * 3 / 2);
    v.in("sf", p.sf, p.m);
    v.out("out", p.out, p.m * p.k);
    v.out("out_f32", p.out_f32, p.m * p.k);
  }
};

template <>
struct OpSpec<CastE2m1ToE4m3Params> {
  static constexpr const char* name = "cast_e2m1_to_e4m3";
  static std::string shape(const CastE2m1ToE4m3Params& p) {
    return fmt::format("m={} k={} block={}", p.m, p.k, p.block);
  }
  template <class V>
  static void visit(CastE2m1ToE4m3Params& p, V& v) {
    v.in("q", p.q, p.m * p.k / 2);
    v.in("sf", p.sf, p.m * p.k / kE2m1Block);
    v.out("out", p.out, p.m * p.k);
    v.out("out_sf", p.out_sf, p.block > 0 ? p.m * p.k / p.block : 0);
  }
};

template <>
struct OpSpec<PerChannelCastParams> {
  static constexpr const char* name = "per_channel_cast";
  static std::string shape(const PerChannelCastParams& p) {
    return fmt::format("t={} h={} rows={}{}{}", p.num_tokens, p.hidden, p.out_rows(),
                       p.pos_to_token ? " gather" : "", p.round_sf ? " round_sf" : "");
  }
  template <class V>
  static void visit(PerChannelCastParams& p, V& v) {
    v.in("x", p.x, p.num_tokens * p.hidden);
    v.in("pos_to_token", p.pos_to_token, p.rows);
    v.out("q", p.q, p.out_rows() * p.hidden);
    v.out("sf", p.sf, p.sf_rows() * p.hidden);
  }
};

}  // namespace deepinfer::kernels
