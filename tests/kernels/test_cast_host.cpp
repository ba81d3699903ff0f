// The FP4 / e5m6 / lossless / per-channel casts (kernels/cast.h) against hand-worked codes and
// the rules' closed forms, on both backends.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cast.h"
#include "kernels/quant.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

const KernelBackend kBoth[] = {KernelBackend::host, KernelBackend::cpu};

TEST(E2m1, CodesAndRounding) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), values[c]);
    EXPECT_EQ(e2m1_to_f32(uint8_t(c | 8)), -values[c]);
    EXPECT_EQ(f32_to_e2m1(values[c]), c);
    if (c) {
      EXPECT_EQ(f32_to_e2m1(-values[c]), c | 8);
    }
  }
  // Ties to the even code; above 6 saturates.
  const std::pair<float, float> ties[] = {{0.25f, 0}, {0.75f, 1},    {1.25f, 1}, {1.75f, 2},
                                          {2.5f, 2},  {3.5f, 4},     {5.0f, 4},  {7.0f, 6},
                                          {1e9f, 6},  {0.26f, 0.5f}, {5.01f, 6}};
  for (auto [x, want] : ties) EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
}

TEST(E2m1, BlockCastHandWorked) {
  // Block amax 3 -> sf = 2^ceil(log2(3/6)) = 0.5 (UE8M0 byte 126); x / 0.5: 3 -> 6, 1 -> 2,
  // -0.3 -> -0.6 -> -0.5. Second block all zero: sf from the clamp 6·2^-126 -> 2^-126 (byte 1).
  std::vector<float> xs(64, 0.0f);
  xs[0] = 3.0f, xs[1] = 1.0f, xs[2] = -0.3f;
  std::vector<bf16> x;
  for (float v : xs) x.push_back(f32_to_bf16(v));
  for (KernelBackend be : kBoth) {
    std::vector<uint8_t> q(32), sf(2);
    std::vector<float> back(64);
    ScopedBackend use(be);
    cast_e2m1({.x = x.data(), .q = q.data(), .sf = sf.data(), .m = 1, .k = 64});
    EXPECT_EQ(sf[0], 126) << to_string(be);
    EXPECT_EQ(sf[1], 1);
    EXPECT_EQ(q[0], 0x7 | 0x4 << 4);  // low nibble = element 0 (6), high = element 1 (2)
    EXPECT_EQ(q[1], 0x9);             // element 2: -0.5 = sign | code 1; element 3: 0
    cast_back_e2m1({.q = q.data(), .sf = sf.data(), .out_f32 = back.data(), .m = 1, .k = 64});
    EXPECT_EQ(back[0], 3.0f);
    EXPECT_EQ(back[1], 1.0f);
    EXPECT_EQ(back[2], -0.25f);
    EXPECT_EQ(back[40], 0.0f);
  }
}

TEST(E5m6, CodesFollowTheRule) {
  EXPECT_EQ(f32_to_e5m6(1.0f), 0x3c0);
  EXPECT_EQ(f32_to_e5m6(65024.0f), 0x7bf);
  EXPECT_EQ(f32_to_e5m6(-2.0f), 0xc00);
  EXPECT_EQ(f32_to_e5m6(1.0f + 0x1p-7f), 0x3c0);             // tie, lsb 0: stays
  EXPECT_EQ(f32_to_e5m6(1.0f + 3 * 0x1p-7f), 0x3c2);         // tie, lsb 1: up
  EXPECT_EQ(f32_to_e5m6(1.0f + 0x1p-7f + 0x1p-20f), 0x3c1);  // above the tie: up
  EXPECT_EQ(f32_to_e5m6(1e6f), 0x7bf);                       // saturates
  EXPECT_EQ(e5m6_to_f32(0x3c1), 1.0f + 0x1p-6f);
  EXPECT_EQ(e5m6_to_f32(0xc00), -2.0f);
  EXPECT_EQ(e5m6_to_f32(0x7bf), 65024.0f);
  EXPECT_EQ(e5m6_to_f32(0x001), 0x1p-20f);  // fp16 subnormal 16 · 2^-24
}

TEST(E5m6, PackingLayout) {
  // w0 = h0<<20 | h1<<8 | h2>>4, w1 = h2<<28 | h3<<16 | h4<<4 | h5>>8, w2 = h5<<24 | h6<<12 | h7.
  const uint16_t h[8] = {0x123, 0x456, 0x789, 0xabc, 0xdef, 0x012, 0x345, 0x678};
  uint8_t out[12];
  pack_e5m6(h, out);
  const uint8_t want[12] = {0x78, 0x56, 0x34, 0x12, 0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out[i], want[i]) << i;
  uint16_t back[8];
  unpack_e5m6(out, back);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], h[i]);
}

TEST(E5m6, RowCastRoundTrips) {
  const int64_t m = 3, k = 48;
  const auto x = testing::random_bf16(m * k, 5, -2.0f, 2.0f);
  for (KernelBackend be : kBoth)
    for (bool round_sf : {false, true}) {
      std::vector<uint8_t> q(size_t(m * k * 3 / 2));
      std::vector<float> sf(static_cast<size_t>(m)), back(size_t(m * k));
      ScopedBackend use(be);
      cast_e5m6(
          {.x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k, .round_sf = round_sf});
      cast_back_e5m6({.q = q.data(), .sf = sf.data(), .out_f32 = back.data(), .m = m, .k = k});
      for (int64_t r = 0; r < m; ++r) {
        float amax = 0;
        for (int64_t i = 0; i < k; ++i)
          amax = std::max(amax, std::fabs(bf16_to_f32(x[size_t(r * k + i)])));
        EXPECT_EQ(sf[size_t(r)], round_sf ? ue8m0_ceil(amax / 65024.0f) : amax / 65024.0f);
        for (int64_t i = 0; i < k; ++i) {
          const float v = bf16_to_f32(x[size_t(r * k + i)]);
          EXPECT_NEAR(back[size_t(r * k + i)], v, std::fabs(v) * 0x1p-7f + 1e-7f) << i;
        }
      }
    }
}

TEST(E2m1ToE4m3, LosslessAndItsLimit) {
  // Values spanning 2^6 across the 1x32 blocks of a 128 block re-block exactly.
  const int64_t m = 2, k = 256;
  std::vector<bf16> x(size_t(m * k));
  for (int64_t i = 0; i < m * k; ++i)
    x[size_t(i)] = f32_to_bf16(testing::uniform(7, uint64_t(i), -1.0f, 1.0f) *
                               std::ldexp(1.0f, int(i / 32 % 4) * 2));
  std::vector<uint8_t> q(size_t(m * k / 2)), sf(size_t(m * k / 32));
  host::cast_e2m1({.x = x.data(), .q = q.data(), .sf = sf.data(), .m = m, .k = k});
  std::vector<float> want(size_t(m * k));
  host::cast_back_e2m1({.q = q.data(), .sf = sf.data(), .out_f32 = want.data(), .m = m, .k = k});
  for (KernelBackend be : kBoth) {
    std::vector<fp8_e4m3> out(size_t(m * k));
    std::vector<float> osf(size_t(m * k / 128));
    ScopedBackend use(be);
    cast_e2m1_to_e4m3({.q = q.data(),
                       .sf = sf.data(),
                       .out = out.data(),
                       .out_sf = osf.data(),
                       .m = m,
                       .k = k,
                       .block = 128});
    for (int64_t i = 0; i < m * k; ++i)
      ASSERT_EQ(e4m3_to_f32(out[size_t(i)]) * osf[size_t(i / 128)], want[size_t(i)]) << i;
    // A block whose 1x32 scales differ by 2^20: the small values fall below e4m3's range.
    std::vector<uint8_t> wide = sf;
    wide[1] = uint8_t(wide[0] + 20);
    std::vector<uint8_t> q1 = q;
    q1[0] = 0x11;  // two nonzero small values in sub-block 0
    EXPECT_THROW(cast_e2m1_to_e4m3({.q = q1.data(),
                                    .sf = wide.data(),
                                    .out = out.data(),
                                    .out_sf = osf.data(),
                                    .m = m,
                                    .k = k,
                                    .block = 128}),
                 Error);
  }
}

TEST(PerChannelCast, ScalesPerChannelPer128RowsAndGather) {
  // T = 130 rows, H = 2: channel 0 = row index / 64 (amax 1 in block 0, 2 in block 1), channel 1
  // all zero (amax floor 1e-4). Gather: rows {129, -1, 0}: one block, row 1 zero.
  const int64_t T = 130, H = 2;
  std::vector<bf16> x(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) x[size_t(t * H)] = f32_to_bf16(float(t / 64));
  for (KernelBackend be : kBoth) {
    ScopedBackend use(be);
    std::vector<fp8_e4m3> q(size_t(T * H));
    std::vector<float> sf(4);
    per_channel_cast({.x = x.data(), .q = q.data(), .sf = sf.data(), .num_tokens = T, .hidden = H});
    EXPECT_EQ(sf[0], 1.0f / 448.0f) << to_string(be);
    EXPECT_EQ(sf[1], 1e-4f / 448.0f);
    EXPECT_EQ(sf[2], 2.0f / 448.0f);
    EXPECT_EQ(e4m3_to_f32(q[size_t(64 * H)]), 448.0f);
    EXPECT_EQ(e4m3_to_f32(q[size_t(129 * H)]), 448.0f);
    EXPECT_EQ(e4m3_to_f32(q[size_t(129 * H + 1)]), 0.0f);
    const std::vector<int32_t> pos = {129, -1, 0};
    std::vector<fp8_e4m3> qg(6);
    std::vector<float> sg(2);
    per_channel_cast({.x = x.data(),
                      .pos_to_token = pos.data(),
                      .q = qg.data(),
                      .sf = sg.data(),
                      .num_tokens = T,
                      .hidden = H,
                      .rows = 3,
                      .round_sf = true});
    EXPECT_EQ(sg[0], ue8m0_ceil(2.0f / 448.0f));
    EXPECT_EQ(e4m3_to_f32(qg[0]), e4m3_to_f32(f32_to_e4m3(2.0f / sg[0])));
    EXPECT_EQ(e4m3_to_f32(qg[2]), 0.0f);
    EXPECT_EQ(e4m3_to_f32(qg[4]), 0.0f);
  }
}

}  // namespace
}  // namespace deepinfer::kernels
