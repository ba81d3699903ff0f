// Host fp8 casts against closed forms and hand-computed values (docs/numerics.md §2).
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/quant.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

TEST(QuantHost, ScaleRules) {
  EXPECT_EQ(act_scale(448.0f, false), 1.0f);
  EXPECT_EQ(act_scale(0.0f, false), 1e-4f / 448.0f);  // the amax floor
  EXPECT_EQ(act_scale(896.0f, false), 2.0f);
  EXPECT_EQ(ue8m0_ceil(1.0f), 1.0f);
  EXPECT_EQ(ue8m0_ceil(0.75f), 1.0f);
  EXPECT_EQ(ue8m0_ceil(3.0f), 4.0f);
  EXPECT_EQ(ue8m0_ceil(std::ldexp(1.5f, -20)), std::ldexp(1.0f, -19));
  EXPECT_EQ(act_scale(300.0f, true), 1.0f);  // 300/448 -> 2^0
  EXPECT_EQ(weight_scale(0.0f, false), 1.0f);
  EXPECT_EQ(weight_scale(44.8f, false), 44.8f / 448.0f);
}

TEST(QuantHost, PerTokenHandValues) {
  // Row 0, block 0: amax 448 -> scale 1, codes are the values. Block 1 (partial, 2 channels):
  // amax 1 -> scale 1/448, 1.0 -> 448 and -0.5 -> -224. Row 1: all zero -> floor scale, zero codes.
  const int64_t k = 130;
  std::vector<bf16> x(2 * k, bf16{0});
  x[0] = f32_to_bf16(448.0f);
  x[1] = f32_to_bf16(-3.0f);
  x[2] = f32_to_bf16(0.3f);
  x[128] = f32_to_bf16(1.0f);
  x[129] = f32_to_bf16(-0.5f);
  std::vector<fp8_e4m3> q(2 * k);
  std::vector<float> s(2 * 2);
  host::quant_per_token({.x = x.data(), .q = q.data(), .scales = s.data(), .m = 2, .k = k});
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f / 448.0f);
  EXPECT_EQ(s[2], 1e-4f / 448.0f);
  EXPECT_EQ(s[3], 1e-4f / 448.0f);
  EXPECT_EQ(q[0].bits, 0x7e);  // 448
  EXPECT_EQ(e4m3_to_f32(q[1]), -3.0f);
  EXPECT_EQ(e4m3_to_f32(q[2]), 0.3125f);  // 0.3 (bf16 0.30078125) rounds to 1.25·2^-2
  EXPECT_EQ(e4m3_to_f32(q[128]), 448.0f);
  EXPECT_EQ(e4m3_to_f32(q[129]), -224.0f);
  for (int64_t i = k; i < 2 * k; ++i) EXPECT_EQ(q[size_t(i)].bits, 0);
}

TEST(QuantHost, PerTokenRoundTripWithinFp8Precision) {
  const int64_t m = 4, k = 300;
  const std::vector<bf16> x = testing::random_bf16(m * k, 3, -5.0f, 5.0f);
  std::vector<fp8_e4m3> q(m * k);
  std::vector<float> s(m * num_blocks(k)), back(m * k);
  for (bool ue8m0 : {false, true}) {
    host::quant_per_token(
        {.x = x.data(), .q = q.data(), .scales = s.data(), .m = m, .k = k, .ue8m0 = ue8m0});
    host::dequant_per_token(
        {.q = q.data(), .scales = s.data(), .out_f32 = back.data(), .m = m, .k = k});
    for (int64_t r = 0; r < m; ++r)
      for (int64_t kb = 0; kb < num_blocks(k); ++kb) {
        const float sc = s[size_t(r * num_blocks(k) + kb)];
        if (ue8m0) {
          EXPECT_EQ(sc, ue8m0_ceil(sc)) << "scale is not a power of two";
        }
        for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c) {
          const float v = bf16_to_f32(x[size_t(r * k + c)]), b = back[size_t(r * k + c)];
          // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; subnormals absolute
          // 2^-10·s.
          EXPECT_LE(std::fabs(b - v),
                    std::max(std::fabs(v) * 0.0625f, std::ldexp(sc, -10)) * 1.0001f)
              << "row " << r << " col " << c;
        }
      }
  }
}

TEST(QuantHost, PerBlockScalesMatchBlockAmax) {
  const int64_t n = 130, k = 200;  // partial blocks in both dims
  std::vector<float> w = testing::random_f32(n * k, 4, -0.3f, 0.3f);
  w[size_t(129 * k + 199)] = 2.0f;  // the corner block's amax
  std::vector<fp8_e4m3> q(n * k);
  std::vector<float> s(2 * 2), back(n * k);
  host::quant_per_block({.w = w.data(), .q = q.data(), .scales = s.data(), .n = n, .k = k});
  for (int64_t nb = 0; nb < 2; ++nb)
    for (int64_t kb = 0; kb < 2; ++kb) {
      float amax = 0;
      for (int64_t r = nb * 128; r < std::min(n, nb * 128 + 128); ++r)
        for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(w[size_t(r * k + c)]));
      EXPECT_EQ(s[size_t(nb * 2 + kb)], amax / 448.0f);
    }
  EXPECT_EQ(s[3], 2.0f / 448.0f);
  EXPECT_EQ(q[size_t(129 * k + 199)].bits, 0x7e);  // the amax element lands on 448
  host::dequant_per_block(
      {.q = q.data(), .scales = s.data(), .out_f32 = back.data(), .n = n, .k = k});
  for (int64_t i = 0; i < n * k; ++i)
    EXPECT_LE(std::fabs(back[size_t(i)] - w[size_t(i)]),
              std::max(std::fabs(w[size_t(i)]) * 0.0625f, 0.3f / 448 / 512));
}

TEST(QuantHost, DequantRoundsOnceToBf16) {
  // 1.125 (e4m3 0x39) · 1.0009765625 = 1.1260986328125: f32 exact; bf16 rounds to 1.125.
  const fp8_e4m3 q[2] = {fp8_e4m3{0x39}, fp8_e4m3{0xb9}};
  const float s[1] = {1.0009765625f};
  bf16 out[2];
  float out_f32[2];
  host::dequant_per_token({.q = q, .scales = s, .out = out, .out_f32 = out_f32, .m = 1, .k = 2});
  EXPECT_EQ(out_f32[0], 1.1260986328125f);
  EXPECT_EQ(out_f32[1], -1.1260986328125f);
  EXPECT_EQ(bf16_to_f32(out[0]), 1.125f);
  EXPECT_EQ(bf16_to_f32(out[1]), -1.125f);
}

}  // namespace
}  // namespace deepinfer::kernels
