// Router: hand-built cases for noaux_tc (bias selects but does not weigh, group top-2 sums,
// ties -> lower id), group_limited_greedy (group max), greedy/softmax; margins; and the cpu
// selection algorithm against host on many random tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/router.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

struct Out {
  std::vector<int64_t> idx;
  std::vector<float> w, margin;
};

Out run(RouterParams p, const std::vector<float>& logits, const std::vector<float>* bias,
        KernelBackend be = KernelBackend::host) {
  Out o;
  o.idx.resize(size_t(p.num_tokens * p.top_k));
  o.w.resize(o.idx.size());
  o.margin.resize(size_t(p.num_tokens));
  p.logits = logits.data();
  p.bias = bias ? bias->data() : nullptr;
  p.topk_idx = o.idx.data();
  p.topk_weights = o.w.data();
  p.margins = o.margin.data();
  ScopedBackend use(be);
  router(p);
  return o;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(RouterHost, NoauxTcHandCase) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2. Logits 0 -> s = 0.5 for all.
  // b = 0.5 + bias = [.5 .6 | .8 .5 | .5 .7 | .5 .5]: group top-2 sums 1.1, 1.3, 1.2, 1.0 ->
  // keep groups 1, 2 -> experts 2 (0.8), 5 (0.7). Weights: unbiased 0.5 each, normalised, x 2.5.
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    const std::vector<float> logits(8, 0.0f), bias = {0, 0.1f, 0.3f, 0, 0, 0.2f, 0, 0};
    const RouterParams p{.num_tokens = 1,
                         .num_experts = 8,
                         .top_k = 2,
                         .n_group = 4,
                         .topk_group = 2,
                         .routed_scaling_factor = 2.5f};
    const Out o = run(p, logits, &bias, be);
    EXPECT_EQ(o.idx, (std::vector<int64_t>{2, 5}));
    EXPECT_FLOAT_EQ(o.w[0], 1.25f);
    EXPECT_FLOAT_EQ(o.w[1], 1.25f);
    EXPECT_NEAR(o.margin[0], 0.2f, 1e-6);  // b(5) - b(3 or 4) among the kept groups
  }
}

TEST(RouterHost, BiasSelectsButWeightsAreUnbiased) {
  // Expert 0 has the larger logit but a bias of -0.5 pushes it below expert 1.
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, -2.0f}, bias = {-0.5f, 0, 0, 0};
  const RouterParams p{.num_tokens = 1,
                       .num_experts = 4,
                       .top_k = 2,
                       .norm_topk_prob = false,
                       .routed_scaling_factor = 1.0f};
  const Out o = run(p, logits, &bias);
  EXPECT_EQ(o.idx, (std::vector<int64_t>{1, 0}));  // b = [0.38, 0.73, 0.27, 0.12]
  EXPECT_FLOAT_EQ(o.w[0], sigmoid(1.0f));
  EXPECT_FLOAT_EQ(o.w[1], sigmoid(2.0f));
  // Normalised and scaled.
  RouterParams pn = p;
  pn.norm_topk_prob = true;
  pn.routed_scaling_factor = 2.5f;
  const Out on = run(pn, logits, &bias);
  EXPECT_FLOAT_EQ(on.w[0], float(2.5 * sigmoid(1.0f) / (double(sigmoid(1.0f)) + sigmoid(2.0f))));
}

TEST(RouterHost, TiesGoToLowerIds) {
  // All equal: experts and groups tie; the lower ids win everywhere. Groups of 2, keep 2 of 4.
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    const std::vector<float> logits(8, 0.3f), bias(8, 0.0f);
    const Out o =
        run({.num_tokens = 1, .num_experts = 8, .top_k = 3, .n_group = 4, .topk_group = 2}, logits,
            &bias, be);
    EXPECT_EQ(o.idx, (std::vector<int64_t>{0, 1, 2}));
    EXPECT_EQ(o.margin[0], 0.0f);
    const Out g = run({.num_tokens = 1,
                       .num_experts = 8,
                       .top_k = 2,
                       .scoring = ScoringFunc::softmax,
                       .method = TopkMethod::greedy,
                       .norm_topk_prob = false},
                      logits, nullptr, be);
    EXPECT_EQ(g.idx, (std::vector<int64_t>{0, 1}));
    EXPECT_FLOAT_EQ(g.w[0], 0.125f);
  }
}

TEST(RouterHost, GroupLimitedGreedyUsesGroupMax) {
  // Softmax scores; groups {0,1}, {2,3}. Group max: g0 = logit 3 (expert 0), g1 = logit 2.5.
  // Top-2 sum would prefer g1 (2.5 + 2.4 vs 3 + -5); group max keeps g0 -> experts 0, 1.
  const std::vector<float> logits = {3.0f, -5.0f, 2.5f, 2.4f};
  const RouterParams p{.num_tokens = 1,
                       .num_experts = 4,
                       .top_k = 2,
                       .n_group = 2,
                       .topk_group = 1,
                       .scoring = ScoringFunc::softmax,
                       .method = TopkMethod::group_limited_greedy,
                       .norm_topk_prob = false,
                       .routed_scaling_factor = 16.0f};
  const Out o = run(p, logits, nullptr);
  EXPECT_EQ(o.idx, (std::vector<int64_t>{0, 1}));
  double z = 0;
  for (float l : logits) z += std::exp(double(l) - 3.0);
  EXPECT_NEAR(o.w[0], 16.0 / z, 1e-5);
  EXPECT_NEAR(o.w[1], 16.0 * std::exp(-8.0) / z, 1e-6);
  EXPECT_EQ(o.margin[0], INFINITY);  // nothing left out of the kept group
}

TEST(RouterCpu, MatchesHostOnRandomTokens) {
  // V3 shape: 256 experts, 8 groups, keep 4, top-8.
  const int64_t T = 200, E = 256;
  const auto logits = testing::random_f32(T * E, 91, -4.0f, 4.0f);
  const auto bias = testing::random_f32(E, 92, -0.5f, 0.5f);
  const RouterParams p{.num_tokens = T,
                       .num_experts = E,
                       .top_k = 8,
                       .n_group = 8,
                       .topk_group = 4,
                       .routed_scaling_factor = 2.5f};
  const Out h = run(p, logits, &bias, KernelBackend::host),
            c = run(p, logits, &bias, KernelBackend::cpu);
  EXPECT_EQ(h.idx, c.idx);
  EXPECT_EQ(h.w, c.w);
  EXPECT_EQ(h.margin, c.margin);
  float wsum = 0;
  for (int k = 0; k < 8; ++k) wsum += h.w[size_t(k)];
  EXPECT_NEAR(wsum, 2.5f, 1e-5);
}

TEST(RouterHost, RejectsInconsistentConfigs) {
  const std::vector<float> logits(8, 0.0f), bias(8, 0.0f);
  EXPECT_THROW(run({.num_tokens = 1, .num_experts = 8, .top_k = 2, .n_group = 3}, logits, &bias),
               Error);
  EXPECT_THROW(run({.num_tokens = 1, .num_experts = 8, .top_k = 5, .n_group = 4, .topk_group = 2},
                   logits, &bias),
               Error);
  EXPECT_THROW(run({.num_tokens = 1, .num_experts = 8, .top_k = 2}, logits, nullptr),
               Error);  // noaux_tc, no bias
}

}  // namespace
}  // namespace deepinfer::kernels
