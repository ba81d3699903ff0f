// RoPE / YaRN: frequency tables and scales against the closed forms of the reference
// (docs/numerics.md §5), the host rotation against fp64 cos/sin, and the property
// that makes RoPE what it is: q.k depends only on the position difference.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/rope.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

RopeConfig v3_rope() {
  RopeConfig c;
  c.rope_dim = 64;
  c.theta = 10000.0;
  c.yarn = true;
  c.scaling = {.factor = 40.0f,
               .original_max_position_embeddings = 4096,
               .beta_fast = 32.0f,
               .beta_slow = 1.0f,
               .mscale = 1.0f,
               .mscale_all_dim = 1.0f};
  return c;
}

TEST(RopeHost, PlainFrequencies) {
  RopeConfig c;
  const auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f[0], 1.0f);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(f[size_t(i)], std::pow(10000.0, -2.0 * i / 64), 1e-7 * f[size_t(i)]) << i;
  EXPECT_NEAR(f[1], 0.7498942093324559, 1e-7);
}

TEST(RopeHost, YarnRangeRampAndScales) {
  const RopeConfig c = v3_rope();
  const YarnRange r = yarn_correction_range(c);
  EXPECT_EQ(r.lo, 10);  // floor(64 ln(4096/(2 pi 32)) / (2 ln 10000)) = floor(10.2)
  EXPECT_EQ(r.hi, 23);  // ceil(22.2)
  const auto f = rope_inv_freq(c);
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 64);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    const double want = base * (1 - ramp) + base / 40.0 * ramp;
    EXPECT_NEAR(f[size_t(i)], want, 2e-7 * want) << i;
  }
  EXPECT_EQ(f[3], rope_inv_freq(RopeConfig{})[3]);  // below lo: untouched
  EXPECT_NEAR(yarn_get_mscale(40.0, 1.0), 1.0 + 0.1 * std::log(40.0), 1e-15);
  EXPECT_NEAR(yarn_get_mscale(40.0, 1.0), 1.368888, 1e-6);
  EXPECT_EQ(yarn_get_mscale(1.0, 1.0), 1.0);
  EXPECT_EQ(rope_attention_factor(c), 1.0f);  // mscale == mscale_all_dim
  EXPECT_NEAR(mla_softmax_scale(192, c), 0.1352338, 1e-6);
  RopeConfig lite = c;
  lite.scaling.mscale = lite.scaling.mscale_all_dim = 0.707f;
  EXPECT_NEAR(mla_softmax_scale(192, lite), 0.1147214, 1e-6);
  EXPECT_EQ(mla_softmax_scale(192, RopeConfig{}), float(1.0 / std::sqrt(192.0)));
  RopeConfig only_mscale = c;
  only_mscale.scaling.mscale_all_dim = 0.0f;  // HF: attention_factor = mscale(factor)
  EXPECT_NEAR(rope_attention_factor(only_mscale), 1.368888, 1e-6);
}

TEST(RopeHost, RotationMatchesFp64) {
  // Unit vectors (1, 0) per pair rotate to (cos phi, sin phi) with phi = p * f_i (fp32 angle).
  const RopeConfig c = v3_rope();
  const auto f = rope_inv_freq(c);
  const int64_t d = 64, T = 4;
  const std::vector<int64_t> pos = {0, 1, 4095, 100000};
  std::vector<bf16> x(T * d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = f32_to_bf16(i % 2 == 0 ? 1.0f : 0.0f);
  host::rope({.x = x.data(),
              .positions = pos.data(),
              .inv_freq = f.data(),
              .num_tokens = T,
              .num_heads = 1,
              .rope_dim = d,
              .token_stride = d,
              .head_stride = d});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double phi = double(float(pos[t]) * f[size_t(i)]);
      EXPECT_NEAR(bf16_to_f32(x[t * d + 2 * i]), std::cos(phi), 0x1p-8) << t << "," << i;
      EXPECT_NEAR(bf16_to_f32(x[t * d + 2 * i + 1]), std::sin(phi), 0x1p-8) << t << "," << i;
    }
  for (int64_t i = 0; i < d; ++i)
    EXPECT_EQ(bf16_to_f32(x[i]), i % 2 == 0 ? 1.0f : 0.0f);  // position 0: identity
}

TEST(RopeHost, OnlyTheRopeSliceOfEachHeadMoves) {
  // q [T, H, 192] with rope at offset 128: the nope channels are untouched.
  const int64_t T = 2, H = 3, D = 192;
  auto x = testing::random_bf16(T * H * D, 5);
  const auto before = x;
  const auto f = rope_inv_freq(v3_rope());
  const std::vector<int64_t> pos = {7, 8};
  host::rope({.x = x.data(),
              .positions = pos.data(),
              .inv_freq = f.data(),
              .num_tokens = T,
              .num_heads = H,
              .rope_dim = 64,
              .token_stride = H * D,
              .head_stride = D,
              .offset = 128});
  int changed = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < D; ++c) {
        const size_t i = size_t((t * H + h) * D + c);
        if (c < 128) {
          EXPECT_EQ(x[i].bits, before[i].bits);
        }
        changed += x[i].bits != before[i].bits;
      }
  EXPECT_GT(changed,
            T * H * 20);  // small angles at high pair indices leave some bf16 values as they were
}

TEST(RopeHost, DotProductDependsOnlyOnPositionDifference) {
  const auto f = rope_inv_freq(v3_rope());
  const int64_t d = 64;
  const auto q = testing::random_bf16(d, 41), k = testing::random_bf16(d, 42);
  auto roped_dot = [&](int64_t pq, int64_t pk) {
    std::vector<bf16> a = q, b = k;
    host::rope({.x = a.data(),
                .positions = &pq,
                .inv_freq = f.data(),
                .num_tokens = 1,
                .rope_dim = d,
                .token_stride = d,
                .head_stride = d});
    host::rope({.x = b.data(),
                .positions = &pk,
                .inv_freq = f.data(),
                .num_tokens = 1,
                .rope_dim = d,
                .token_stride = d,
                .head_stride = d});
    double s = 0;
    for (int64_t i = 0; i < d; ++i)
      s += double(bf16_to_f32(a[size_t(i)])) * bf16_to_f32(b[size_t(i)]);
    return s;
  };
  double norm = 0;
  for (int64_t i = 0; i < d; ++i)
    norm += std::fabs(bf16_to_f32(q[size_t(i)]) * bf16_to_f32(k[size_t(i)]));
  const double base = roped_dot(10, 3);
  EXPECT_NEAR(roped_dot(17, 10), base, 0.02 * norm);
  EXPECT_NEAR(roped_dot(1007, 1000), base, 0.02 * norm);
}

}  // namespace
}  // namespace deepinfer::kernels
