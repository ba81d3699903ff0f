// Host GEMMs against hand-computed values and a float64 evaluation of the same formula.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/gemm.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

fp8_e4m3 code(float v) { return f32_to_e4m3(v); }

TEST(GemmHost, KnownFp8Products) {
  // out = 2·3 + 0.5·(−4) + 448·(−0.015625) = 6 − 2 − 7 = −3, scales 1.
  const fp8_e4m3 a[3] = {code(2.0f), code(0.5f), code(448.0f)};
  const fp8_e4m3 w[3] = {code(3.0f), code(-4.0f), code(-0.015625f)};
  const float sa[1] = {1.0f}, sw[1] = {1.0f};
  bf16 out[1];
  host::gemm_fp8(
      {.a = a, .a_scales = sa, .w = w, .w_scales = sw, .out = out, .m = 1, .n = 1, .k = 3});
  EXPECT_EQ(bf16_to_f32(out[0]), -3.0f);
}

TEST(GemmHost, BlockScalesApplyPerKBlockAndNBlock) {
  // k = 256 (two K blocks) of ones; n = 130 (two N blocks). Row dot per block = 128.
  // out[n<128] = 128·0.5·1 + 128·2·3 = 832; out[n>=128] = 128·0.5·0.25 + 128·2·0.5 = 144.
  const int64_t n = 130, k = 256;
  std::vector<fp8_e4m3> a(k, code(1.0f)), w(n * k, code(1.0f));
  const float sa[2] = {0.5f, 2.0f};
  const float sw[4] = {1.0f, 3.0f, 0.25f, 0.5f};  // [nb=2, kb=2]
  std::vector<bf16> out(n);
  std::vector<float> out_f32(n);
  host::gemm_fp8({.a = a.data(),
                  .a_scales = sa,
                  .w = w.data(),
                  .w_scales = sw,
                  .out = out.data(),
                  .m = 1,
                  .n = n,
                  .k = k});
  host::gemm_fp8({.a = a.data(),
                  .a_scales = sa,
                  .w = w.data(),
                  .w_scales = sw,
                  .out_f32 = out_f32.data(),
                  .m = 1,
                  .n = n,
                  .k = k});
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(bf16_to_f32(out[size_t(j)]), j < 128 ? 832.0f : 144.0f) << j;
    EXPECT_EQ(out_f32[size_t(j)], j < 128 ? 832.0f : 144.0f) << j;
  }
}

// The §2 formula in float64: Σ_kb (Σ_k a·w) · s_a · s_w.
double ref_fp8(const testing::Fp8Rows& a, const testing::Fp8Rows& w, int64_t r, int64_t j,
               int64_t w_row0 = 0, const float* w_scales = nullptr) {
  const int64_t k = a.k, kbs = num_blocks(k);
  const float* sw = w_scales ? w_scales : w.scales.data();
  double acc = 0;
  for (int64_t kb = 0; kb < kbs; ++kb) {
    double part = 0;
    for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c)
      part += double(e4m3_to_f32(a.q[size_t(r * k + c)])) *
              e4m3_to_f32(w.q[size_t((w_row0 + j) * k + c)]);
    acc += part * a.scales[size_t(r * kbs + kb)] * sw[(j / 128) * kbs + kb];
  }
  return acc;
}

TEST(GemmHost, MatchesFloat64WithinOneBf16Rounding) {
  const int64_t m = 5, n = 133, k = 300;
  const auto a = testing::random_fp8_activations(m, k, 1), w = testing::random_fp8_weights(n, k, 2);
  std::vector<bf16> out(m * n);
  std::vector<float> out_f32(m * n);
  GemmFp8Params p{.a = a.q.data(),
                  .a_scales = a.scales.data(),
                  .w = w.q.data(),
                  .w_scales = w.scales.data(),
                  .out = out.data(),
                  .m = m,
                  .n = n,
                  .k = k};
  host::gemm_fp8(p);
  p.out = nullptr;
  p.out_f32 = out_f32.data();
  host::gemm_fp8(p);
  double scale = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) scale = std::max(scale, std::fabs(ref_fp8(a, w, r, j)));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const double ref = ref_fp8(a, w, r, j);
      // fp32 summation error is far below the bf16 half-ulp (2^-9 relative).
      EXPECT_NEAR(bf16_to_f32(out[size_t(r * n + j)]), ref, std::fabs(ref) * 0x1p-8 + scale * 1e-6)
          << r << "," << j;
      EXPECT_NEAR(out_f32[size_t(r * n + j)], ref, scale * 1e-6) << r << "," << j;
    }
}

TEST(GemmHost, GroupedContiguousUsesEachRowsExpertAndZeroesPadding) {
  const int64_t experts = 3, n = 130, k = 256;
  const std::vector<int32_t> idx = {2, 2, -1, 0, -1, 1};
  const int64_t m = int64_t(idx.size());
  const auto a = testing::random_fp8_activations(m, k, 5);
  const auto w = testing::random_fp8_expert_weights(experts, n, k, 6);
  std::vector<bf16> out(m * n, f32_to_bf16(7.0f));
  host::gemm_fp8_grouped_contiguous({.a = a.q.data(),
                                     .a_scales = a.scales.data(),
                                     .w = w.q.data(),
                                     .w_scales = w.scales.data(),
                                     .m_indices = idx.data(),
                                     .out = out.data(),
                                     .m = m,
                                     .n = n,
                                     .k = k,
                                     .num_experts = experts});
  const int64_t ws = num_blocks(n) * num_blocks(k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float got = bf16_to_f32(out[size_t(r * n + j)]);
      if (idx[size_t(r)] < 0) {
        EXPECT_EQ(got, 0.0f);
        continue;
      }
      const int64_t e = idx[size_t(r)];
      const double ref = ref_fp8(a, w, r, j, e * n, w.scales.data() + e * ws);
      EXPECT_NEAR(got, ref, std::fabs(ref) * 0x1p-8 + 1e-6) << r << "," << j;
    }
}

TEST(GemmHost, GroupedMaskedComputesValidRowsAndZeroesTheRest) {
  const int64_t experts = 2, max_m = 3, n = 64, k = 128;
  const std::vector<int32_t> masked = {2, 0};
  const auto a = testing::random_fp8_activations(experts * max_m, k, 8);
  const auto w = testing::random_fp8_expert_weights(experts, n, k, 9);
  std::vector<bf16> out(experts * max_m * n, f32_to_bf16(7.0f));
  host::gemm_fp8_grouped_masked({.a = a.q.data(),
                                 .a_scales = a.scales.data(),
                                 .w = w.q.data(),
                                 .w_scales = w.scales.data(),
                                 .masked_m = masked.data(),
                                 .out = out.data(),
                                 .num_experts = experts,
                                 .max_m = max_m,
                                 .n = n,
                                 .k = k});
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < max_m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const float got = bf16_to_f32(out[size_t((e * max_m + r) * n + j)]);
        if (r >= masked[size_t(e)]) {
          EXPECT_EQ(got, 0.0f);
          continue;
        }
        const double ref = ref_fp8(a, w, e * max_m + r, j, e * n,
                                   w.scales.data() + e * num_blocks(n) * num_blocks(k));
        EXPECT_NEAR(got, ref, std::fabs(ref) * 0x1p-8 + 1e-6);
      }
}

TEST(GemmHost, Bf16MatchesFloat64) {
  const int64_t m = 3, n = 17, k = 1000;
  const auto a = testing::random_bf16(m * k, 1, -2, 2),
             w = testing::random_bf16(n * k, 2, -0.1f, 0.1f);
  std::vector<float> out(m * n);
  host::gemm_bf16({.a = a.data(), .w = w.data(), .out_f32 = out.data(), .m = m, .n = n, .k = k});
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double t =
            double(bf16_to_f32(a[size_t(r * k + c)])) * bf16_to_f32(w[size_t(j * k + c)]);
        ref += t;
        mag += std::fabs(t);
      }
      EXPECT_NEAR(out[size_t(r * n + j)], ref, mag * 1e-6);
    }
  // 1.5 · 1.5 = 2.25 exactly, then one bf16 rounding of 2.25 + 2^-10 -> 2.25.
  const bf16 a2[2] = {f32_to_bf16(1.5f), f32_to_bf16(1.0f)},
             w2[2] = {f32_to_bf16(1.5f), f32_to_bf16(0x1p-10f)};
  bf16 o2[1];
  host::gemm_bf16({.a = a2, .w = w2, .out = o2, .m = 1, .n = 1, .k = 2});
  EXPECT_EQ(bf16_to_f32(o2[0]), 2.25f);
}

}  // namespace
}  // namespace deepinfer::kernels
