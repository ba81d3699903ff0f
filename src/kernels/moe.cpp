// MoE layout kernels: checks, the shared per-id rules, dispatch.
#include "kernels/moe.h"

#include <deepinfer/error.h>

#include <cmath>
#include <limits>

namespace deepinfer::kernels {

int64_t fused_rows_bound(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                         int64_t alignment) {
  DI_CHECK(alignment >= 1, "fused_rows_bound: alignment must be >= 1, got {}", alignment);
  const int64_t n = num_tokens * top_k + (alignment - 1) * num_experts;
  return (n + alignment - 1) / alignment * alignment;
}

void FusedMappingParams::validate() const {
  DI_CHECK(num_tokens >= 0 && top_k >= 1 && num_experts >= 1 && alignment >= 1 && num_rows >= 0,
           "fused_mapping: bad shape t={} k={} e={} align={} rows={}", num_tokens, top_k,
           num_experts, alignment, num_rows);
  DI_CHECK(num_rows < (int64_t(1) << 31) && num_tokens * top_k < (int64_t(1) << 31),
           "fused_mapping: {} rows / {} slots do not fit int32 positions", num_rows,
           num_tokens * top_k);
  DI_CHECK(topk_idx && pos_to_expert && pos_to_token && pos_to_token_topk && token_topk_to_pos &&
               expert_start && expert_end && num_tokens_per_expert,
           "fused_mapping: every buffer must be set");
}

void ExpandToFusedParams::validate() const {
  DI_CHECK(num_tokens >= 0 && top_k >= 1 && num_rows >= 0 && row_bytes >= 0 && sf_cols >= 0,
           "expand_to_fused: bad shape t={} k={} rows={} row_bytes={} sf_cols={}", num_tokens,
           top_k, num_rows, row_bytes, sf_cols);
  DI_CHECK((x_sf == nullptr) == (out_sf == nullptr),
           "expand_to_fused: x_sf and out_sf must be given together");
  DI_CHECK(
      (num_tokens == 0 || (x && token_topk_to_pos)) && (num_rows == 0 || (pos_to_expert && out)),
      "expand_to_fused: x, token_topk_to_pos, pos_to_expert and out must be set");
}

void ReduceFusedParams::validate() const {
  DI_CHECK(num_tokens >= 0 && top_k >= 1 && num_rows >= 0 && hidden >= 1,
           "reduce_fused: bad shape t={} k={} rows={} h={}", num_tokens, top_k, num_rows, hidden);
  DI_CHECK(num_tokens == 0 || (token_topk_to_pos && out && (num_rows == 0 || x)),
           "reduce_fused: x, token_topk_to_pos and out must be set");
}

void TopkGateParams::validate() const {
  DI_CHECK(num_tokens >= 0 && num_experts >= 1 && top_k >= 1 && top_k <= num_experts,
           "topk_gate: bad shape t={} e={} k={} (need 1 <= k <= e)", num_tokens, num_experts,
           top_k);
  DI_CHECK(num_tokens == 0 || (scores && idx), "topk_gate: scores and idx must be set");
}

void TopkGroupParams::validate() const {
  DI_CHECK(num_tokens >= 0 && num_groups >= 1 && group_size >= 1 && topk_group >= 1 &&
               topk_group <= num_groups,
           "topk_group: bad shape t={} groups={} size={} kg={} (need 1 <= kg <= groups)",
           num_tokens, num_groups, group_size, topk_group);
  DI_CHECK((sum_top == 1 || sum_top == 2) && sum_top <= group_size,
           "topk_group: sum_top must be 1 or 2 and at most the group size {}, got {}", group_size,
           sum_top);
  DI_CHECK(num_tokens == 0 || (scores && group_idx),
           "topk_group: scores and group_idx must be set");
}

float TopkGroupParams::group_score(const float* g) const {
  float m1 = -std::numeric_limits<float>::infinity(), m2 = m1;
  for (int64_t e = 0; e < group_size; ++e) {
    DI_CHECK(!std::isnan(g[e]), "topk_group: score {} of a group is NaN", e);
    if (g[e] > m1)
      m2 = m1, m1 = g[e];
    else if (g[e] > m2)
      m2 = g[e];
  }
  return sum_top == 1 ? m1 : m1 + m2;
}

void NormalizeWeightParams::validate() const {
  DI_CHECK(num_tokens >= 0 && top_k >= 1, "normalize_weight: bad shape t={} k={}", num_tokens,
           top_k);
  DI_CHECK(num_tokens == 0 || (w && denom && out),
           "normalize_weight: w, denom and out must be set");
}

void GroupCountParams::validate() const {
  DI_CHECK(n >= 0 && num_groups >= 1, "group_count: bad shape n={} groups={}", n, num_groups);
  DI_CHECK(counts && (n == 0 || idx), "group_count: idx and counts must be set");
}

void MaskIndicesByTpParams::validate() const {
  DI_CHECK(n >= 0 && n_ep >= 1 && n_tp >= 1 && tp_rank >= 0 && tp_rank < n_tp,
           "mask_indices_by_tp: bad n={} n_ep={} tp_rank={} n_tp={}", n, n_ep, tp_rank, n_tp);
  DI_CHECK(num_experts >= n_ep && num_experts % n_ep == 0,
           "mask_indices_by_tp: num_experts {} must be a multiple of n_ep {}", num_experts, n_ep);
  DI_CHECK(n == 0 || (idx && out), "mask_indices_by_tp: idx and out must be set");
}

int64_t MaskIndicesByTpParams::map(int64_t e) const {
  if (e < 0) return -1;
  DI_CHECK(e < num_experts, "mask_indices_by_tp: id {} >= num_experts {}", e, num_experts);
  const int64_t per = num_experts / n_ep, rank = e / per;
  return rank % n_tp == tp_rank ? (rank / n_tp) * per + e % per : -1;
}

void fused_count(const FusedMappingParams& p, int64_t s0, int64_t s1, int64_t* count) {
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t e = p.topk_idx[s];
    DI_CHECK(e >= -1 && e < p.num_experts, "fused_mapping: topk_idx[{}] = {} is outside [-1, {})",
             s, e, p.num_experts);
    if (e >= 0) ++count[e];
  }
}

int64_t fused_segments(const FusedMappingParams& p, const int64_t* total) {
  int64_t row = 0;
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const int64_t aligned = (total[e] + p.alignment - 1) / p.alignment * p.alignment;
    p.expert_start[e] = int32_t(row);
    p.expert_end[e] = int32_t(row + total[e]);
    p.num_tokens_per_expert[e] = int32_t(aligned);
    row += aligned;
  }
  DI_CHECK(row <= p.num_rows,
           "fused_mapping: the layout needs {} rows but {} were given (size it with "
           "fused_rows_bound)",
           row, p.num_rows);
  return row;
}

void fused_place(const FusedMappingParams& p, int64_t s0, int64_t s1, int64_t* next) {
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t e = p.topk_idx[s];
    if (e < 0) {
      p.token_topk_to_pos[s] = -1;
      continue;
    }
    const int64_t r = next[e]++;
    p.token_topk_to_pos[s] = int32_t(r);
    p.pos_to_expert[r] = int32_t(e);
    p.pos_to_token[r] = int32_t(s / p.top_k);
    p.pos_to_token_topk[r] = int32_t(s);
  }
}

void fused_mapping(const FusedMappingParams& p) {
  dispatch(p, host::fused_mapping, cpu::fused_mapping);
}
void expand_to_fused(const ExpandToFusedParams& p) {
  dispatch(p, host::expand_to_fused, cpu::expand_to_fused);
}
void reduce_fused(const ReduceFusedParams& p) {
  dispatch(p, host::reduce_fused, cpu::reduce_fused);
}
void topk_gate(const TopkGateParams& p) { dispatch(p, host::topk_gate, cpu::topk_gate); }
void topk_group(const TopkGroupParams& p) { dispatch(p, host::topk_group, cpu::topk_group); }
void normalize_weight(const NormalizeWeightParams& p) {
  dispatch(p, host::normalize_weight, cpu::normalize_weight);
}
void group_count(const GroupCountParams& p) { dispatch(p, host::group_count, cpu::group_count); }
void mask_indices_by_tp(const MaskIndicesByTpParams& p) {
  dispatch(p, host::mask_indices_by_tp, cpu::mask_indices_by_tp);
}

}  // namespace deepinfer::kernels
