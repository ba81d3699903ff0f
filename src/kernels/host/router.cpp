// Host reference: MoE router top-k. Full stable sorts, one token at a time.
#include "kernels/router.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels::host {

void router(const RouterParams& p) {
  p.validate();
  const int64_t E = p.num_experts, K = p.top_k, G = p.n_group, gsize = E / G;
  const bool grouped = p.method != TopkMethod::greedy && G > 1;
  std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E)),
      gscore(static_cast<size_t>(G));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* l = p.logits + t * E;
    for (int64_t e = 0; e < E; ++e)
      DI_CHECK(!std::isnan(l[e]), "router: logit [{}, {}] is NaN", t, e);
    router_scores(p.scoring, l, E, s.data());
    for (int64_t e = 0; e < E; ++e) b[size_t(e)] = p.bias ? s[size_t(e)] + p.bias[e] : s[size_t(e)];
    std::vector<bool> keep(size_t(E), true);
    if (grouped) {
      for (int64_t g = 0; g < G; ++g) {
        std::vector<float> v(b.begin() + g * gsize, b.begin() + (g + 1) * gsize);
        std::sort(v.begin(), v.end(), std::greater<>());
        gscore[size_t(g)] = p.method == TopkMethod::noaux_tc ? v[0] + v[1] : v[0];
      }
      std::vector<int64_t> order(static_cast<size_t>(G));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return gscore[size_t(x)] > gscore[size_t(y)]; });
      std::vector<bool> gkeep(size_t(G), false);
      for (int64_t i = 0; i < p.topk_group; ++i) gkeep[size_t(order[size_t(i)])] = true;
      for (int64_t e = 0; e < E; ++e) keep[size_t(e)] = gkeep[size_t(e / gsize)];
    }
    std::vector<int64_t> cand;
    for (int64_t e = 0; e < E; ++e)
      if (keep[size_t(e)]) cand.push_back(e);
    std::stable_sort(cand.begin(), cand.end(),
                     [&](int64_t x, int64_t y) { return b[size_t(x)] > b[size_t(y)]; });
    double wsum = 0.0;
    for (int64_t k = 0; k < K; ++k) wsum += s[size_t(cand[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = cand[size_t(k)];
      p.topk_idx[t * K + k] = e;
      double w = s[size_t(e)];
      if (p.norm_topk_prob) w /= wsum;
      p.topk_weights[t * K + k] = float(w * double(p.routed_scaling_factor));
    }
    if (p.margins)
      p.margins[t] = int64_t(cand.size()) > K
                         ? b[size_t(cand[size_t(K - 1)])] - b[size_t(cand[size_t(K)])]
                         : std::numeric_limits<float>::infinity();
  }
}

}  // namespace deepinfer::kernels::host
