// MoE router top-k (docs/numerics.md §7): noaux_tc (V3) and
// the V2 variants greedy / group_limited_greedy, sigmoid or softmax scoring.
//
// Per token, all fp32: s = sigmoid(l), softmax(l) or sqrt(softplus(l)) (softplus = l above 20);
// selection score b = s + bias (noaux_tc; the bias only affects selection). With n_group > 1, group
// score = sum of the group's top-2 b (noaux_tc) or the group max (group_limited_greedy); the
// topk_group best groups are kept (ties
// -> lower group id) and every other expert is excluded (-inf). top_k of b, ordered by b
// descending, ties -> lower expert id. Weights = s[idx] (unbiased), divided by their sum if
// norm_topk_prob, times routed_scaling_factor.
// The official code scales always; HF V2 skips the scale when it normalises (no published
// config hits the difference).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

enum class ScoringFunc : uint8_t { sigmoid, softmax, sqrt_softplus };
enum class TopkMethod : uint8_t { noaux_tc, greedy, group_limited_greedy };

struct RouterParams {
  const float* logits = nullptr;  // [T, E] f32
  const float* bias = nullptr;  // [E] f32 e_score_correction_bias: required for noaux_tc, else null
  int64_t* topk_idx = nullptr;  // [T, K] i64, slots ordered by selection score descending
  float* topk_weights = nullptr;  // [T, K] f32
  float* margins = nullptr;       // [T] f32 or null: b(K-th) - b((K+1)-th) among the experts left
                                  // after group limiting (+inf when none is left out)
  int64_t num_tokens = 0;         // T
  int64_t num_experts = 0;        // E (n_routed_experts)
  int64_t top_k = 0;              // K (num_experts_per_tok)
  int64_t n_group = 1;            // groups of E / n_group contiguous experts
  int64_t topk_group = 1;         // groups kept
  ScoringFunc scoring = ScoringFunc::sigmoid;
  TopkMethod method = TopkMethod::noaux_tc;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  void validate() const;
};

void router(const RouterParams& p);

namespace host {
void router(const RouterParams& p);
}
namespace cpu {
void router(const RouterParams& p);
}

// Scores of one token, fp32 (shared by the backends so their selections agree bit for bit):
// out [n] = sigmoid(l), softmax(l) (max-subtracted, fp32 exp, fp32 sum in index order) or
// sqrt(softplus(l)) with softplus(l) = l for l > 20, else log1p(exp(l)).
void router_scores(ScoringFunc f, const float* logits, int64_t n, float* out);

std::string_view to_string(TopkMethod m);
std::string_view to_string(ScoringFunc f);

template <>
struct OpSpec<RouterParams> {
  static constexpr const char* name = "router";
  static std::string shape(const RouterParams& p) {
    return fmt::format("t={} e={} k={} groups={}/{} {} {}", p.num_tokens, p.num_experts, p.top_k,
                       p.topk_group, p.n_group, to_string(p.method), to_string(p.scoring));
  }
  template <class V>
  static void visit(RouterParams& p, V& v) {
    v.in("logits", p.logits, p.num_tokens * p.num_experts);
    v.in("bias", p.bias, p.num_experts);
    v.out("topk_idx", p.topk_idx, p.num_tokens * p.top_k);
    v.out("topk_weights", p.topk_weights, p.num_tokens * p.top_k);
    v.out("margins", p.margins, p.num_tokens);
  }
};

}  // namespace deepinfer::kernels
