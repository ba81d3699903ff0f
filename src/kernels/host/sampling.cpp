// Host reference: sampling with full stable sorts, one row at a time (the rule in sampling.h).
#include "kernels/sampling.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels::host {

void sample(const SamplingParams& p) {
  p.validate();
  const int64_t V = p.vocab;
  for (int64_t b = 0; b < p.batch; ++b) {
    const float* l = p.logits + b * p.stride();
    const float temperature = p.temperature ? p.temperature[b] : 0.0f;
    const int32_t top_k = p.top_k ? p.top_k[b] : 0;
    const float top_p = p.top_p ? p.top_p[b] : 1.0f;
    for (int64_t i = 0; i < V; ++i)
      DI_CHECK(!std::isnan(l[i]), "sample: row {} logit {} is NaN", b, i);
    // Every order below is (value descending, id ascending): stable sorts of ascending ids.
    std::vector<int64_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    if (temperature <= 0.0f || top_k == 1) {
      std::stable_sort(ids.begin(), ids.end(), [&](int64_t x, int64_t y) { return l[x] > l[y]; });
      p.tokens[b] = int32_t(ids[0]);
      continue;
    }
    std::vector<float> x(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) x[size_t(i)] = l[i] / temperature;
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int64_t a, int64_t c) { return x[size_t(a)] > x[size_t(c)]; });
    const int64_t n_cand = top_k > 0 && top_k < V ? top_k : V;
    const float m = x[size_t(ids[0])];
    DI_CHECK(std::isfinite(m), "sample: row {} has no finite logit to sample from (max {})", b, m);
    std::vector<double> e(size_t(V), 0.0);
    std::vector<bool> kept(size_t(V), false);
    for (int64_t j = 0; j < n_cand; ++j) kept[size_t(ids[size_t(j)])] = true;
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i)
      if (kept[size_t(i)]) total += (e[size_t(i)] = std::exp(double(x[size_t(i)]) - double(m)));
    if (top_p < 1.0f) {
      std::fill(kept.begin(), kept.end(), false);
      const double target = double(top_p) * total;
      double cum = 0.0;
      for (int64_t j = 0; j < n_cand; ++j) {
        kept[size_t(ids[size_t(j)])] = true;
        cum += e[size_t(ids[size_t(j)])];
        if (cum >= target) break;
      }
    }
    double kept_total = 0.0;
    int64_t last = -1;
    for (int64_t i = 0; i < V; ++i)
      if (kept[size_t(i)]) kept_total += e[size_t(i)], last = i;
    const double r =
        sampling_uniform(uint64_t(p.seed ? p.seed[b] : 0), uint64_t(p.counter ? p.counter[b] : 0)) *
        kept_total;
    double cum = 0.0;
    int64_t tok = last;
    for (int64_t i = 0; i < V; ++i) {
      if (!kept[size_t(i)]) continue;
      cum += e[size_t(i)];
      if (cum > r) {
        tok = i;
        break;
      }
    }
    p.tokens[b] = int32_t(tok);
  }
}

}  // namespace deepinfer::kernels::host
