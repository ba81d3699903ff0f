// Harness cases (cpu vs host) for the router and sampling. Both backends share the fp32 scoring
// and follow the same arithmetic in a different selection algorithm, so indices and tokens must
// match exactly and weights to fp32 rounding.
#include <fmt/format.h>

#include <vector>

#include "kernels/router.h"
#include "kernels/sampling.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

CaseResult run_router(RouterParams p, uint64_t seed) {
  const auto logits = random_f32(p.num_tokens * p.num_experts, seed, -5.0f, 5.0f);
  const auto bias = random_f32(p.num_experts, seed + 1, -0.3f, 0.3f);
  std::vector<int64_t> idx(size_t(p.num_tokens * p.top_k));
  std::vector<float> w(idx.size()), margins(size_t(p.num_tokens));
  p.logits = logits.data();
  p.bias = p.method == TopkMethod::noaux_tc ? bias.data() : nullptr;
  p.topk_idx = idx.data();
  p.topk_weights = w.data();
  p.margins = margins.data();
  return compare_backends(router, p, Tolerance{.rel_l2 = 1e-6, .int_mismatch_frac = 0});
}

CaseResult run_sample(int64_t B, int64_t V, uint64_t seed) {
  const auto logits = random_f32(B * V, seed, -8.0f, 8.0f);
  std::vector<float> temp(static_cast<size_t>(B)), tp(static_cast<size_t>(B));
  std::vector<int32_t> tk(static_cast<size_t>(B)), tokens(static_cast<size_t>(B));
  std::vector<int64_t> sd(static_cast<size_t>(B)), ctr(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {  // greedy, plain, top-k, top-p, both
    const int kind = int(b % 5);
    temp[size_t(b)] = kind == 0 ? 0.0f : 0.7f + 0.05f * float(b % 9);
    tk[size_t(b)] = kind == 2 || kind == 4 ? int32_t(1 + hash64(seed, uint64_t(b)) % 64) : 0;
    tp[size_t(b)] = kind == 3 || kind == 4 ? 0.5f + 0.1f * float(b % 5) : 1.0f;
    sd[size_t(b)] = int64_t(hash64(seed + 1, uint64_t(b)));
    ctr[size_t(b)] = b;
  }
  return compare_backends(sample,
                          SamplingParams{.logits = logits.data(),
                                         .temperature = temp.data(),
                                         .top_k = tk.data(),
                                         .top_p = tp.data(),
                                         .seed = sd.data(),
                                         .counter = ctr.data(),
                                         .tokens = tokens.data(),
                                         .batch = B,
                                         .vocab = V},
                          Tolerance{.rel_l2 = 0, .int_mismatch_frac = 0});
}

}  // namespace

DEEPINFER_KERNEL_CASES(router_cases) {
  struct C {
    const char* name;
    RouterParams p;
    bool quick;
  };
  const C all[] = {
      {"v3 noaux_tc t=64 e=256 k=8 g=8/4",
       {.num_tokens = 64,
        .num_experts = 256,
        .top_k = 8,
        .n_group = 8,
        .topk_group = 4,
        .routed_scaling_factor = 2.5f},
       true},
      {"v2 group_limited_greedy t=33 e=160 k=6 g=8/3",
       {.num_tokens = 33,
        .num_experts = 160,
        .top_k = 6,
        .n_group = 8,
        .topk_group = 3,
        .scoring = ScoringFunc::softmax,
        .method = TopkMethod::group_limited_greedy,
        .norm_topk_prob = false,
        .routed_scaling_factor = 16.0f},
       true},
      {"v2-lite greedy t=17 e=64 k=6",
       {.num_tokens = 17,
        .num_experts = 64,
        .top_k = 6,
        .scoring = ScoringFunc::softmax,
        .method = TopkMethod::greedy,
        .norm_topk_prob = false},
       true},
      {"sqrt_softplus noaux_tc t=40 e=64 k=6 g=8/4",
       {.num_tokens = 40,
        .num_experts = 64,
        .top_k = 6,
        .n_group = 8,
        .topk_group = 4,
        .scoring = ScoringFunc::sqrt_softplus,
        .routed_scaling_factor = 1.5f},
       true},
      {"odd noaux_tc t=5 e=12 k=3 g=3/2",
       {.num_tokens = 5, .num_experts = 12, .top_k = 3, .n_group = 3, .topk_group = 2},
       true},
      {"v3 t=4096",
       {.num_tokens = 4096,
        .num_experts = 256,
        .top_k = 8,
        .n_group = 8,
        .topk_group = 4,
        .routed_scaling_factor = 2.5f},
       false},
  };
  for (const C& c : all)
    cases.push_back({"router", c.name, c.quick, [p = c.p] { return run_router(p, 77); }});
}

DEEPINFER_KERNEL_CASES(sample_cases) {
  cases.push_back({"sample", "b=10 v=37", true, [] { return run_sample(10, 37, 1); }});
  cases.push_back({"sample", "b=5 v=129280", true, [] { return run_sample(5, 129280, 2); }});
  cases.push_back({"sample", "b=64 v=129280", false, [] { return run_sample(64, 129280, 4); }});
}

}  // namespace deepinfer::kernels::testing
