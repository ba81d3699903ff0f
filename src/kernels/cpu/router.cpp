// cpu: MoE router top-k. Same fp32 scores as host (router_scores), but one-pass selection: a
// running top-2 per group, repeated arg-max over groups, and a (K+1)-slot insertion list over the
// experts in id order (ties -> lower id for free). Tokens over kernel_pool().
#include "kernels/router.h"

#include <deepinfer/error.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels::cpu {
namespace {

void route_tokens(const RouterParams& p, int64_t t0, int64_t t1) {
  const int64_t E = p.num_experts, K = p.top_k, G = p.n_group, gsize = E / G;
  const bool grouped = p.method != TopkMethod::greedy && G > 1;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E)),
      gscore(static_cast<size_t>(G));
  std::vector<char> gkeep(static_cast<size_t>(G));
  std::vector<int64_t> top(static_cast<size_t>(K + 1));  // best first
  for (int64_t t = t0; t < t1; ++t) {
    const float* l = p.logits + t * E;
    for (int64_t e = 0; e < E; ++e)
      DI_CHECK(!std::isnan(l[e]), "router: logit [{}, {}] is NaN", t, e);
    router_scores(p.scoring, l, E, s.data());
    for (int64_t e = 0; e < E; ++e) b[size_t(e)] = p.bias ? s[size_t(e)] + p.bias[e] : s[size_t(e)];
    std::fill(gkeep.begin(), gkeep.end(), char(1));
    if (grouped) {
      for (int64_t g = 0; g < G; ++g) {
        float m1 = neg_inf, m2 = neg_inf;
        for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
          const float v = b[size_t(e)];
          if (v > m1)
            m2 = m1, m1 = v;
          else if (v > m2)
            m2 = v;
        }
        gscore[size_t(g)] = p.method == TopkMethod::noaux_tc ? m1 + m2 : m1;
      }
      std::fill(gkeep.begin(), gkeep.end(), char(0));
      for (int64_t i = 0; i < p.topk_group; ++i) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!gkeep[size_t(g)] && (best < 0 || gscore[size_t(g)] > gscore[size_t(best)])) best = g;
        gkeep[size_t(best)] = 1;
      }
    }
    int64_t n = 0;  // entries in top
    for (int64_t e = 0; e < E; ++e) {
      if (!gkeep[size_t(e / gsize)]) continue;
      const float v = b[size_t(e)];
      if (n == K + 1 && !(v > b[size_t(top[size_t(K)])])) continue;
      int64_t j = n < K + 1 ? n++ : K;
      while (j > 0 && v > b[size_t(top[size_t(j - 1)])]) {
        top[size_t(j)] = top[size_t(j - 1)];
        --j;
      }
      top[size_t(j)] = e;
    }
    double wsum = 0.0;
    for (int64_t k = 0; k < K; ++k) wsum += s[size_t(top[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = top[size_t(k)];
      double w = s[size_t(e)];
      if (p.norm_topk_prob) w /= wsum;
      p.topk_idx[t * K + k] = e;
      p.topk_weights[t * K + k] = float(w * double(p.routed_scaling_factor));
    }
    if (p.margins)
      p.margins[t] = n > K ? b[size_t(top[size_t(K - 1)])] - b[size_t(top[size_t(K)])]
                           : std::numeric_limits<float>::infinity();
  }
}

}  // namespace

void router(const RouterParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 8192 / p.num_experts);
  kernel_pool().parallel_for(p.num_tokens, grain,
                             [&](int64_t t0, int64_t t1) { route_tokens(p, t0, t1); });
}

}  // namespace deepinfer::kernels::cpu
