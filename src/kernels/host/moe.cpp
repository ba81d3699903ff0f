// Host reference: MoE layout kernels, one slot / row at a time.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace deepinfer::kernels::host {

void fused_mapping(const FusedMappingParams& p) {
  p.validate();
  const int64_t E = p.num_experts, S = p.num_tokens * p.top_k;
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  fused_count(p, 0, S, count.data());
  fused_segments(p, count.data());
  for (int64_t r = 0; r < p.num_rows; ++r)
    p.pos_to_expert[r] = p.pos_to_token[r] = p.pos_to_token_topk[r] = -1;
  std::vector<int64_t> next(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) next[size_t(e)] = p.expert_start[e];
  fused_place(p, 0, S, next.data());
}

void expand_to_fused(const ExpandToFusedParams& p) {
  p.validate();
  for (int64_t r = 0; r < p.num_rows; ++r)
    if (p.pos_to_expert[r] < 0) {
      std::memset(p.out + r * p.row_bytes, 0, size_t(p.row_bytes));
      for (int64_t c = 0; c < p.sf_cols && p.out_sf; ++c) p.out_sf[r * p.sf_cols + c] = 0.0f;
    }
  for (int64_t s = 0; s < p.num_tokens * p.top_k; ++s) {
    const int64_t r = p.token_topk_to_pos[s], t = s / p.top_k;
    if (r < 0) continue;
    DI_CHECK(r < p.num_rows, "expand_to_fused: position {} of slot {} >= rows {}", r, s,
             p.num_rows);
    std::memcpy(p.out + r * p.row_bytes, p.x + t * p.row_bytes, size_t(p.row_bytes));
    for (int64_t c = 0; c < p.sf_cols && p.out_sf; ++c)
      p.out_sf[r * p.sf_cols + c] = p.x_sf[t * p.sf_cols + c];
  }
}

void reduce_fused(const ReduceFusedParams& p) {
  p.validate();
  const int64_t H = p.hidden, K = p.top_k;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t r = p.token_topk_to_pos[t * K + j];
        if (r < 0) continue;
        DI_CHECK(r < p.num_rows, "reduce_fused: position {} of slot {} >= rows {}", r, t * K + j,
                 p.num_rows);
        const float c = (p.weights ? p.weights[t * K + j] : 1.0f) * (p.x_sf ? p.x_sf[r] : 1.0f);
        acc = std::fma(bf16_to_f32(p.x[r * H + h]), c, acc);
      }
      p.out[t * H + h] = f32_to_bf16(p.sf ? acc * p.sf[0] : acc);
    }
}

namespace {
// Indices of the k largest of v [n], descending; a stable sort keeps ties in index order.
void stable_topk(const std::vector<float>& v, int64_t k, int64_t* out) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return v[size_t(a)] > v[size_t(b)]; });
  std::copy(order.begin(), order.begin() + k, out);
}
}  // namespace

void topk_gate(const TopkGateParams& p) {
  p.validate();
  const int64_t E = p.num_experts;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const std::vector<float> row(p.scores + t * E, p.scores + (t + 1) * E);
    for (int64_t e = 0; e < E; ++e)
      DI_CHECK(!std::isnan(row[size_t(e)]), "topk_gate: score [{}, {}] is NaN", t, e);
    stable_topk(row, p.top_k, p.idx + t * p.top_k);
  }
}

void topk_group(const TopkGroupParams& p) {
  p.validate();
  const int64_t G = p.num_groups, S = p.group_size;
  std::vector<float> gs(static_cast<size_t>(G));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> v(p.scores + (t * G + g) * S, p.scores + (t * G + g + 1) * S);
      std::sort(v.begin(), v.end(), std::greater<>());
      gs[size_t(g)] = p.sum_top == 1 ? v[0] : v[0] + v[1];
    }
    stable_topk(gs, p.topk_group, p.group_idx + t * p.topk_group);
  }
}

void normalize_weight(const NormalizeWeightParams& p) {
  p.validate();
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    float s = 0.0f;
    for (int64_t j = 0; j < p.top_k; ++j) s += p.w[t * p.top_k + j];
    p.denom[t] = s + 1e-20f;
    for (int64_t j = 0; j < p.top_k; ++j)
      p.out[t * p.top_k + j] = p.w[t * p.top_k + j] / p.denom[t];
  }
}

void group_count(const GroupCountParams& p) {
  p.validate();
  for (int64_t g = 0; g < p.num_groups; ++g) p.counts[g] = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t g = p.idx[i];
    DI_CHECK(g >= -1 && g < p.num_groups, "group_count: id {} at {} is outside [-1, {})", g, i,
             p.num_groups);
    if (g >= 0) ++p.counts[g];
  }
}

void mask_indices_by_tp(const MaskIndicesByTpParams& p) {
  p.validate();
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = p.map(p.idx[i]);
}

}  // namespace deepinfer::kernels::host
