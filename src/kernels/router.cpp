// MoE router: parameter checks, the shared scoring functions, dispatch.
#include "kernels/router.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels {

void RouterParams::validate() const {
  DI_CHECK(num_tokens >= 0, "router: num_tokens must be >= 0, got {}", num_tokens);
  DI_CHECK(num_experts > 0, "router: n_routed_experts must be > 0, got {}", num_experts);
  DI_CHECK(n_group > 0 && num_experts % n_group == 0,
           "router: n_group {} must divide n_routed_experts {}", n_group, num_experts);
  const bool grouped = method != TopkMethod::greedy && n_group > 1;
  if (grouped) {
    DI_CHECK(topk_group >= 1 && topk_group <= n_group,
             "router: topk_group {} must be in [1, n_group = {}]", topk_group, n_group);
    DI_CHECK(method != TopkMethod::noaux_tc || num_experts / n_group >= 2,
             "router: noaux_tc scores a group by its top-2, but groups have {} expert(s)",
             num_experts / n_group);
  }
  const int64_t available = grouped ? topk_group * (num_experts / n_group) : num_experts;
  DI_CHECK(top_k >= 1 && top_k <= available,
           "router: num_experts_per_tok {} must be in [1, {}] (experts left after group limiting)",
           top_k, available);
  DI_CHECK(std::isfinite(routed_scaling_factor), "router: routed_scaling_factor must be finite");
  DI_CHECK(num_tokens == 0 || (logits && topk_idx && topk_weights),
           "router: logits, topk_idx, topk_weights must be set");
  DI_CHECK(
      (method == TopkMethod::noaux_tc) == (bias != nullptr),
      "router: noaux_tc needs e_score_correction_bias and the other methods take none (bias {})",
      bias ? "given" : "missing");
}

void router_scores(ScoringFunc f, const float* logits, int64_t n, float* out) {
  if (f == ScoringFunc::sigmoid) {
    for (int64_t e = 0; e < n; ++e) out[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  if (f == ScoringFunc::sqrt_softplus) {
    for (int64_t e = 0; e < n; ++e)
      out[e] = std::sqrt(logits[e] > 20.0f ? logits[e] : std::log1p(std::exp(logits[e])));
    return;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) m = std::max(m, logits[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) sum += (out[e] = std::exp(logits[e] - m));
  for (int64_t e = 0; e < n; ++e) out[e] /= sum;
}

std::string_view to_string(TopkMethod m) {
  switch (m) {
    case TopkMethod::noaux_tc:
      return "noaux_tc";
    case TopkMethod::greedy:
      return "greedy";
    case TopkMethod::group_limited_greedy:
      return "group_limited_greedy";
  }
  return "?";
}

std::string_view to_string(ScoringFunc f) {
  switch (f) {
    case ScoringFunc::sigmoid:
      return "sigmoid";
    case ScoringFunc::softmax:
      return "softmax";
    case ScoringFunc::sqrt_softplus:
      return "sqrt_softplus";
  }
  return "?";
}

void router(const RouterParams& p) { dispatch(p, host::router, cpu::router); }

}  // namespace deepinfer::kernels
