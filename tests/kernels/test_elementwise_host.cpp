// RMSNorm, residual add and SwiGLU (+ zero-sized calls of norm, rope, swiglu, attention, router
// and sampling): host against hand values and fp64 closed forms; the fused fp8 epilogues against
// their unfused composition (rms_norm / swiglu -> quant_per_token), on both backends.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/norm.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

float bf(float v) { return round_bf16(v); }

TEST(RmsNormHost, HandValues) {
  // x = [3, 4], w = [1, 2], eps = 0: mean(x^2) = 12.5, r = 1/sqrt(12.5).
  const std::vector<bf16> x = {f32_to_bf16(3), f32_to_bf16(4)},
                          w = {f32_to_bf16(1), f32_to_bf16(2)};
  std::vector<bf16> y(2);
  host::rms_norm(
      {.x = x.data(), .w = w.data(), .y = y.data(), .num_tokens = 1, .hidden = 2, .eps = 0.0f});
  const double r = 1.0 / std::sqrt(12.5);
  EXPECT_EQ(bf16_to_f32(y[0]), bf(float(3 * r)));      // 0.8485 -> 0.84765625
  EXPECT_EQ(bf16_to_f32(y[1]), bf(float(4 * r * 2)));  // 2.2627 -> 2.265625
  EXPECT_EQ(bf16_to_f32(y[0]), 0.84765625f);
  EXPECT_EQ(bf16_to_f32(y[1]), 2.265625f);
}

TEST(RmsNormHost, ConstantRowAndEps) {
  // A constant row c with w = 1 gives c / sqrt(c^2 + eps); eps = 1 makes it visible.
  const int64_t H = 37;
  std::vector<bf16> x(H, f32_to_bf16(1.0f)), w(H, f32_to_bf16(1.0f)), y(H);
  host::rms_norm(
      {.x = x.data(), .w = w.data(), .y = y.data(), .num_tokens = 1, .hidden = H, .eps = 1.0f});
  for (auto v : y) EXPECT_EQ(bf16_to_f32(v), bf(float(1.0 / std::sqrt(2.0))));
}

TEST(RmsNormHost, MatchesFp64AndHonoursStrides) {
  // The kv norm: the first 512 of 576 channels, output into a 576-wide row; the rest untouched.
  const int64_t T = 3, H = 512, S = 576;
  const auto x = testing::random_bf16(T * S, 11, -3.0f, 3.0f);
  const auto w = testing::random_bf16(H, 12, 0.5f, 1.5f);
  std::vector<bf16> y(T * S, f32_to_bf16(7.0f));
  host::rms_norm({.x = x.data(),
                  .w = w.data(),
                  .y = y.data(),
                  .num_tokens = T,
                  .hidden = H,
                  .in_stride = S,
                  .out_stride = S});
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += std::pow(double(bf16_to_f32(x[t * S + i])), 2);
    const double r = 1.0 / std::sqrt(ss / H + 1e-6);
    for (int64_t i = 0; i < H; ++i) {
      const double want = bf16_to_f32(x[t * S + i]) * r * bf16_to_f32(w[i]);
      EXPECT_NEAR(bf16_to_f32(y[t * S + i]), want, std::fabs(want) * 0x1p-8 + 1e-30)
          << t << "," << i;
    }
    for (int64_t i = H; i < S; ++i) EXPECT_EQ(bf16_to_f32(y[t * S + i]), 7.0f);
  }
}

TEST(RmsNormFused, EqualsNormThenQuantOnBothBackends) {
  const int64_t T = 5, H = 300;  // a partial last 1x128 group
  const auto x = testing::random_bf16(T * H, 21, -4.0f, 4.0f);
  const auto w = testing::random_bf16(H, 22, -2.0f, 2.0f);
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu})
    for (bool ue8m0 : {false, true}) {
      ScopedBackend use(be);
      std::vector<bf16> y(T * H), y2(T * H);
      std::vector<fp8_e4m3> q(T * H), q_ref(T * H);
      std::vector<float> s(T * num_blocks(H)), s_ref(T * num_blocks(H));
      rms_norm({.x = x.data(), .w = w.data(), .y = y.data(), .num_tokens = T, .hidden = H});
      host::quant_per_token({.x = y.data(),
                             .q = q_ref.data(),
                             .scales = s_ref.data(),
                             .m = T,
                             .k = H,
                             .ue8m0 = ue8m0});
      rms_norm({.x = x.data(),
                .w = w.data(),
                .y = y2.data(),
                .q = q.data(),
                .scales = s.data(),
                .num_tokens = T,
                .hidden = H,
                .ue8m0 = ue8m0});
      for (int64_t i = 0; i < T * H; ++i) {
        ASSERT_EQ(q[i].bits, q_ref[i].bits)
            << "backend " << to_string(be) << " ue8m0 " << ue8m0 << " at " << i;
        ASSERT_EQ(y[i].bits, y2[i].bits);
      }
      for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], s_ref[i]);
    }
}

TEST(ResidualAddHost, RoundsOnceToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1). 1 + 3*2^-8 -> 1 + 2^-6.
  const std::vector<bf16> a = {f32_to_bf16(1.0f), f32_to_bf16(1.0f), f32_to_bf16(-2.5f)};
  const std::vector<bf16> b = {f32_to_bf16(0x1p-8f), f32_to_bf16(0x1.8p-7f), f32_to_bf16(2.5f)};
  std::vector<bf16> out(3);
  host::residual_add({.a = a.data(), .b = b.data(), .out = out.data(), .n = 3});
  EXPECT_EQ(bf16_to_f32(out[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(out[1]), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_f32(out[2]), 0.0f);
  // In place (out aliases a), cpu too.
  std::vector<bf16> a2 = a;
  ScopedBackend use(KernelBackend::cpu);
  residual_add({.a = a2.data(), .b = b.data(), .out = a2.data(), .n = 3});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a2[size_t(i)].bits, out[size_t(i)].bits);
}

TEST(BiasAdd, RoundsOnceOnBothBackends) {
  // x = 1 + 2^-8 (an f32 tie between bf16 1 and 1 + 2^-7) plus 2^-12 is past the tie: one
  // rounding gives 1 + 2^-7 (rounding x to bf16 first would give 1). 2.5 + -2.5 = 0; 3 + 0.25.
  const std::vector<float> x = {1.0f + 0x1p-8f, 2.5f, 3.0f, 1.0f + 0x1p-8f, 2.5f, 3.0f};
  const std::vector<bf16> b = {f32_to_bf16(0x1p-12f), f32_to_bf16(-2.5f), f32_to_bf16(0.25f)};
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    ScopedBackend use(be);
    std::vector<bf16> out(6);
    bias_add({.x = x.data(), .bias = b.data(), .out = out.data(), .rows = 2, .cols = 3});
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(bf16_to_f32(out[size_t(r * 3)]), 1.0f + 0x1p-7f);
      EXPECT_EQ(bf16_to_f32(out[size_t(r * 3 + 1)]), 0.0f);
      EXPECT_EQ(bf16_to_f32(out[size_t(r * 3 + 2)]), 3.25f);
    }
  }
}

TEST(SwigluHost, HandValues) {
  // silu(0) = 0; silu(1) = 1/(1+e^-1) = 0.7310585786; silu(-20) ~ -4.1e-8; row weight 0.5.
  const int64_t I = 3;
  const std::vector<bf16> gu = {f32_to_bf16(0), f32_to_bf16(1), f32_to_bf16(-20),
                                f32_to_bf16(5), f32_to_bf16(2), f32_to_bf16(1)};
  const float rw = 0.5f;
  std::vector<bf16> y(I);
  host::swiglu({.gate = gu.data(),
                .up = gu.data() + I,
                .row_weight = &rw,
                .y = y.data(),
                .num_tokens = 1,
                .inter = I});
  EXPECT_EQ(bf16_to_f32(y[0]), 0.0f);
  EXPECT_EQ(bf16_to_f32(y[1]), bf(float(0.7310585786300049 * 2 * 0.5)));
  EXPECT_EQ(bf16_to_f32(y[2]), bf(float(-20.0 / (1 + std::exp(20.0)) * 1 * 0.5)));
}

TEST(SwigluFused, EqualsSwigluThenQuantOnBothBackends) {
  const int64_t T = 4, I = 200;
  const auto gu = testing::random_bf16(T * 2 * I, 31, -6.0f, 6.0f);
  const auto rw = testing::random_f32(T, 32, 0.0f, 1.0f);
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    ScopedBackend use(be);
    std::vector<bf16> y(T * I);
    std::vector<fp8_e4m3> q(T * I), q_ref(T * I);
    std::vector<float> s(T * num_blocks(I)), s_ref(T * num_blocks(I));
    swiglu({.gate = gu.data(),
            .up = gu.data() + I,
            .row_weight = rw.data(),
            .y = y.data(),
            .num_tokens = T,
            .inter = I});
    host::quant_per_token(
        {.x = y.data(), .q = q_ref.data(), .scales = s_ref.data(), .m = T, .k = I});
    swiglu({.gate = gu.data(),
            .up = gu.data() + I,
            .row_weight = rw.data(),
            .q = q.data(),
            .scales = s.data(),
            .num_tokens = T,
            .inter = I});
    for (int64_t i = 0; i < T * I; ++i)
      ASSERT_EQ(q[i].bits, q_ref[i].bits) << to_string(be) << " at " << i;
    for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], s_ref[i]);
  }
}

TEST(OpsBParams, RejectBadShapesWithMessages) {
  std::vector<bf16> x(4), w(4), y(4);
  EXPECT_THROW(host::rms_norm({.x = x.data(), .w = w.data(), .num_tokens = 1, .hidden = 4}),
               Error);  // no output
  EXPECT_THROW(host::rms_norm({.x = x.data(),
                               .w = w.data(),
                               .y = y.data(),
                               .num_tokens = 1,
                               .hidden = 4,
                               .in_stride = 2}),
               Error);
  EXPECT_THROW(
      host::swiglu({.gate = x.data(), .up = x.data(), .y = y.data(), .num_tokens = 1, .inter = 0}),
      Error);
}

TEST(OpsBParams, ZeroSizedCallsWriteNothingOnBothBackends) {
  // T = 0 / n = 0 / B = 0 with null buffers: a valid no-op (a rank with no tokens still calls).
  const std::vector<float> inv(32, 1.0f);
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    ScopedBackend use(be);
    EXPECT_NO_THROW(rms_norm({.num_tokens = 0, .hidden = 64}));
    EXPECT_NO_THROW(residual_add({.n = 0}));
    EXPECT_NO_THROW(swiglu({.num_tokens = 0, .inter = 128}));
    EXPECT_NO_THROW(rope({.inv_freq = inv.data(),
                          .num_tokens = 0,
                          .num_heads = 4,
                          .token_stride = 768,
                          .head_stride = 192,
                          .offset = 128}));
    EXPECT_NO_THROW(router({.bias = inv.data(), .num_tokens = 0, .num_experts = 32, .top_k = 2}));
    EXPECT_NO_THROW(sample({.batch = 0, .vocab = 10}));
    EXPECT_NO_THROW(mla_decode({.batch = 0, .num_heads = 16, .softmax_scale = 0.1f}));
    const int32_t cu[1] = {0};
    EXPECT_NO_THROW(mla_prefill({.cu_seqlens_q = cu,
                                 .cu_seqlens_k = cu,
                                 .num_seqs = 0,
                                 .num_heads = 2,
                                 .head_dim = 8,
                                 .head_dim_v = 4,
                                 .softmax_scale = 0.1f}));
  }
}

}  // namespace
}  // namespace deepinfer::kernels
