// MoE layout kernels and the router's sqrt-softplus scoring against hand-worked answers from the
// rules in docs/kernels.md (both backends).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/moe.h"
#include "kernels/router.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

const KernelBackend kBoth[] = {KernelBackend::host, KernelBackend::cpu};

TEST(FusedMapping, HandWorkedWithAlignmentAndPadding) {
  // T=3, K=2, E=3, alignment 4: counts 2, 0, 3 -> segments [0,4) [4,4) [4,8), rows bound 16.
  const std::vector<int64_t> idx = {2, 0, 0, -1, 2, 2};
  ASSERT_EQ(fused_rows_bound(3, 2, 3, 4), 16);
  for (KernelBackend be : kBoth) {
    std::vector<int32_t> pe(16), pt(16), ptk(16), ttp(6), st(3), en(3), cnt(3);
    ScopedBackend use(be);
    fused_mapping({.topk_idx = idx.data(),
                   .pos_to_expert = pe.data(),
                   .pos_to_token = pt.data(),
                   .pos_to_token_topk = ptk.data(),
                   .token_topk_to_pos = ttp.data(),
                   .expert_start = st.data(),
                   .expert_end = en.data(),
                   .num_tokens_per_expert = cnt.data(),
                   .num_tokens = 3,
                   .top_k = 2,
                   .num_experts = 3,
                   .num_rows = 16,
                   .alignment = 4});
    const std::vector<int32_t> m8(8, -1);
    auto with_tail = [&](std::vector<int32_t> v) {
      v.insert(v.end(), m8.begin(), m8.end());
      return v;
    };
    EXPECT_EQ(st, (std::vector<int32_t>{0, 4, 4})) << to_string(be);
    EXPECT_EQ(en, (std::vector<int32_t>{2, 4, 7}));
    EXPECT_EQ(cnt, (std::vector<int32_t>{4, 0, 4}));
    EXPECT_EQ(ttp, (std::vector<int32_t>{4, 0, 1, -1, 5, 6}));
    EXPECT_EQ(pe, with_tail({0, 0, -1, -1, 2, 2, 2, -1}));
    EXPECT_EQ(pt, with_tail({0, 1, -1, -1, 0, 2, 2, -1}));
    EXPECT_EQ(ptk, with_tail({1, 2, -1, -1, 0, 4, 5, -1}));
    // Too few rows is a clear error.
    EXPECT_THROW(fused_mapping({.topk_idx = idx.data(),
                                .pos_to_expert = pe.data(),
                                .pos_to_token = pt.data(),
                                .pos_to_token_topk = ptk.data(),
                                .token_topk_to_pos = ttp.data(),
                                .expert_start = st.data(),
                                .expert_end = en.data(),
                                .num_tokens_per_expert = cnt.data(),
                                .num_tokens = 3,
                                .top_k = 2,
                                .num_experts = 3,
                                .num_rows = 7,
                                .alignment = 4}),
                 std::exception);
  }
}

TEST(FusedLayout, ExpandThenReduceIsTheWeightedSum) {
  // Token rows expanded into the layout, then reduced with weights w: out[t] = bf16(x[t] · Σ w)
  // when the weights are powers of two (exact sums); padding rows are zero; sf scales once more.
  const int64_t T = 3, K = 2, E = 3, H = 5;
  const std::vector<int64_t> idx = {2, 0, 0, -1, 2, 2};
  std::vector<int32_t> pe(16), pt(16), ptk(16), ttp(6), st(3), en(3), cnt(3);
  host::fused_mapping({.topk_idx = idx.data(),
                       .pos_to_expert = pe.data(),
                       .pos_to_token = pt.data(),
                       .pos_to_token_topk = ptk.data(),
                       .token_topk_to_pos = ttp.data(),
                       .expert_start = st.data(),
                       .expert_end = en.data(),
                       .num_tokens_per_expert = cnt.data(),
                       .num_tokens = T,
                       .top_k = K,
                       .num_experts = E,
                       .num_rows = 16,
                       .alignment = 4});
  const auto x = testing::random_bf16(T * H, 3);
  const std::vector<float> w = {0.5f, 0.25f, 2.0f, 8.0f, 1.0f, 0.125f};
  const float sf = 4.0f;
  for (KernelBackend be : kBoth) {
    ScopedBackend use(be);
    std::vector<bf16> fused(16 * H, f32_to_bf16(9.0f));
    expand_to_fused({.x = reinterpret_cast<const uint8_t*>(x.data()),
                     .token_topk_to_pos = ttp.data(),
                     .pos_to_expert = pe.data(),
                     .out = reinterpret_cast<uint8_t*>(fused.data()),
                     .num_tokens = T,
                     .top_k = K,
                     .num_rows = 16,
                     .row_bytes = H * 2});
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t h = 0; h < H; ++h)
        EXPECT_EQ(bf16_to_f32(fused[size_t(r * H + h)]),
                  pe[size_t(r)] < 0 ? 0.0f : bf16_to_f32(x[size_t(pt[size_t(r)] * H + h)]));
    std::vector<bf16> out(T * H);
    reduce_fused({.x = fused.data(),
                  .weights = w.data(),
                  .token_topk_to_pos = ttp.data(),
                  .sf = &sf,
                  .out = out.data(),
                  .num_tokens = T,
                  .top_k = K,
                  .num_rows = 16,
                  .hidden = H});
    const float wsum[] = {0.75f, 2.0f, 1.125f};  // token 1's slot 1 is -1: its weight is skipped
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        EXPECT_EQ(bf16_to_f32(out[size_t(t * H + h)]),
                  round_bf16(bf16_to_f32(x[size_t(t * H + h)]) * wsum[t] * sf))
            << to_string(be) << " t " << t;
  }
}

TEST(TopkGate, DescendingTiesToTheSmallerIndex) {
  const std::vector<float> scores = {0.5f, 0.9f, 0.5f, 0.9f, 0.1f};
  for (KernelBackend be : kBoth) {
    std::vector<int64_t> idx(3);
    ScopedBackend use(be);
    topk_gate({.scores = scores.data(),
               .idx = idx.data(),
               .num_tokens = 1,
               .num_experts = 5,
               .top_k = 3});
    EXPECT_EQ(idx, (std::vector<int64_t>{1, 3, 0})) << to_string(be);
  }
}

TEST(TopkGroup, SumOfTopOneOrTwo) {
  // Groups of 3: {1,5,2} {4,4,0} {6,0,0} {3,3,1}: top-2 sums 7 8 6 6, top-1 5 4 6 3.
  const std::vector<float> scores = {1, 5, 2, 4, 4, 0, 6, 0, 0, 3, 3, 1};
  for (KernelBackend be : kBoth) {
    std::vector<int64_t> g3(3), g2(2);
    ScopedBackend use(be);
    topk_group({.scores = scores.data(),
                .group_idx = g3.data(),
                .num_tokens = 1,
                .num_groups = 4,
                .group_size = 3,
                .topk_group = 3,
                .sum_top = 2});
    EXPECT_EQ(g3, (std::vector<int64_t>{1, 0, 2})) << to_string(be);  // 6 vs 6: group 2 first
    topk_group({.scores = scores.data(),
                .group_idx = g2.data(),
                .num_tokens = 1,
                .num_groups = 4,
                .group_size = 3,
                .topk_group = 2,
                .sum_top = 1});
    EXPECT_EQ(g2, (std::vector<int64_t>{2, 0})) << to_string(be);
  }
}

TEST(NormalizeWeight, DenominatorHasTheEpsilon) {
  const std::vector<float> w = {1, 3, 0, 0};
  for (KernelBackend be : kBoth) {
    std::vector<float> d(2), out(4);
    ScopedBackend use(be);
    normalize_weight(
        {.w = w.data(), .denom = d.data(), .out = out.data(), .num_tokens = 2, .top_k = 2});
    EXPECT_EQ(d[0], 4.0f) << to_string(be);
    EXPECT_EQ(out[0], 0.25f);
    EXPECT_EQ(out[1], 0.75f);
    EXPECT_EQ(d[1], 1e-20f);  // an all-zero row divides by 1e-20: zeros, not NaN
    EXPECT_EQ(out[2], 0.0f);
  }
}

TEST(GroupCount, Histogram) {
  const std::vector<int64_t> idx = {0, 2, 2, -1, 1, 2};
  for (KernelBackend be : kBoth) {
    std::vector<int32_t> c(4, 77);
    ScopedBackend use(be);
    group_count({.idx = idx.data(), .counts = c.data(), .n = 6, .num_groups = 4});
    EXPECT_EQ(c, (std::vector<int32_t>{1, 1, 3, 0})) << to_string(be);
    const std::vector<int64_t> bad = {4};
    EXPECT_THROW(group_count({.idx = bad.data(), .counts = c.data(), .n = 1, .num_groups = 4}),
                 std::exception);
  }
}

TEST(MaskIndicesByTp, KeepsThisTpRanksExpertsRenamed) {
  // 8 experts over n_ep = 4 (2 each), n_tp = 2, tp_rank = 1: EP ranks 1 and 3 are ours; their
  // experts 2, 3, 6, 7 become 0, 1, 2, 3. In place as well.
  std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 6, 7, -1};
  const std::vector<int64_t> want = {-1, -1, 0, 1, -1, -1, 2, 3, -1};
  for (KernelBackend be : kBoth) {
    std::vector<int64_t> out(idx.size()), io = idx;
    ScopedBackend use(be);
    mask_indices_by_tp({.idx = idx.data(),
                        .out = out.data(),
                        .n = 9,
                        .num_experts = 8,
                        .n_ep = 4,
                        .tp_rank = 1,
                        .n_tp = 2});
    EXPECT_EQ(out, want) << to_string(be);
    mask_indices_by_tp({.idx = io.data(),
                        .out = io.data(),
                        .n = 9,
                        .num_experts = 8,
                        .n_ep = 4,
                        .tp_rank = 1,
                        .n_tp = 2});
    EXPECT_EQ(io, want) << to_string(be);
  }
}

TEST(RouterSqrtSoftplus, HandWorked) {
  // s = sqrt(softplus(l)), softplus = l above 20: l = (0, 1, 2, 30) -> top-2 = experts 3, 2,
  // weights s / (s3 + s2) * 1.5.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 30.0f}, bias(4, 0.0f);
  const double s2 = std::sqrt(std::log1p(std::exp(2.0))), s3 = std::sqrt(30.0);
  for (KernelBackend be : kBoth) {
    std::vector<int64_t> idx(2);
    std::vector<float> w(2);
    ScopedBackend use(be);
    router({.logits = logits.data(),
            .bias = bias.data(),
            .topk_idx = idx.data(),
            .topk_weights = w.data(),
            .num_tokens = 1,
            .num_experts = 4,
            .top_k = 2,
            .scoring = ScoringFunc::sqrt_softplus,
            .routed_scaling_factor = 1.5f});
    EXPECT_EQ(idx, (std::vector<int64_t>{3, 2})) << to_string(be);
    EXPECT_NEAR(w[0], s3 / (s3 + s2) * 1.5, 1e-6);
    EXPECT_NEAR(w[1], s2 / (s3 + s2) * 1.5, 1e-6);
  }
}

}  // namespace
}  // namespace deepinfer::kernels
