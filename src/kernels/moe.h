// MoE layout kernels (docs/kernels.md §MoE ops): the fused (expert-contiguous, aligned) layout
// of routed token slots, the copies into and out of it, and the index utilities. Index -1 means
// an empty slot or padding everywhere; ids are int64 top-k ids, positions int32.
//
// fused_mapping: slot (t, j) with expert e = topk_idx[t, j] >= 0 goes to a row of expert e's
//   segment; segments are contiguous in expert order, each num_tokens_per_expert[e] = count
//   rounded up to `alignment` rows long; within a segment slots are in (t, j) order; padding rows
//   and rows past the last segment are -1 in every pos_* array.
// expand_to_fused: out[pos(t, j)] = x[t] (byte rows, any dtype); padding rows are zero.
// reduce_fused: out[t] = bf16(sum_j x[pos(t, j)] * (w[t, j] * x_sf[pos])) * sf (fp32 FMA in
//   j order; skipped where pos = -1; w, x_sf, sf optional = 1).
// topk_gate: the k largest scores of each row, descending, ties -> the smaller index.
// topk_group: group score = sum of the group's top-s scores (s = 1 or 2); the kg best groups,
//   descending, ties -> the smaller group id.
// normalize_weight: denom[t] = 1e-20 + sum_j w[t, j] (fp32, j order), out = w / denom.
// group_count: counts[g] = number of ids == g.
// mask_indices_by_tp: with per = num_experts / n_ep, keep e iff (e / per) mod n_tp == tp_rank and
//   rename it (e / per / n_tp) * per + e mod per; otherwise -1.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// Rows a fused layout may need: (T*K + (alignment - 1) * E) rounded up to alignment.
int64_t fused_rows_bound(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t alignment);

struct FusedMappingParams {
  const int64_t* topk_idx = nullptr;         // [T, K], -1 = no expert
  int32_t* pos_to_expert = nullptr;          // [P]
  int32_t* pos_to_token = nullptr;           // [P]
  int32_t* pos_to_token_topk = nullptr;      // [P]: t * K + j
  int32_t* token_topk_to_pos = nullptr;      // [T, K]
  int32_t* expert_start = nullptr;           // [E] first row of the segment
  int32_t* expert_end = nullptr;             // [E] one past the last real (non-padding) row
  int32_t* num_tokens_per_expert = nullptr;  // [E] segment length (aligned count)
  int64_t num_tokens = 0, top_k = 0, num_experts = 0;
  int64_t num_rows = 0;  // P: at least the segments' total (fused_rows_bound is always enough)
  int64_t alignment = 1;
  void validate() const;
};

struct ExpandToFusedParams {
  const uint8_t* x = nullptr;                  // [T, row_bytes]
  const int32_t* token_topk_to_pos = nullptr;  // [T, K]
  const int32_t* pos_to_expert = nullptr;      // [P]
  uint8_t* out = nullptr;                      // [P, row_bytes]
  const float* x_sf = nullptr;                 // [T, sf_cols] or null: per-token scale rows
  float* out_sf = nullptr;                     // [P, sf_cols] (padding rows 0)
  int64_t num_tokens = 0, top_k = 0, num_rows = 0, row_bytes = 0, sf_cols = 0;
  void validate() const;
};

struct ReduceFusedParams {
  const bf16* x = nullptr;                     // [P, H]
  const float* x_sf = nullptr;                 // [P] or null
  const float* weights = nullptr;              // [T, K] or null
  const int32_t* token_topk_to_pos = nullptr;  // [T, K]
  const float* sf = nullptr;                   // [1] or null: a global scale
  bf16* out = nullptr;                         // [T, H]
  int64_t num_tokens = 0, top_k = 0, num_rows = 0, hidden = 0;
  void validate() const;
};

struct TopkGateParams {
  const float* scores = nullptr;  // [T, E]
  int64_t* idx = nullptr;         // [T, K]
  int64_t num_tokens = 0, num_experts = 0, top_k = 0;
  void validate() const;
};

struct TopkGroupParams {
  const float* scores = nullptr;  // [T, G, E/G]
  int64_t* group_idx = nullptr;   // [T, KG]
  int64_t num_tokens = 0, num_groups = 0, group_size = 0, topk_group = 0, sum_top = 2;
  void validate() const;
  float group_score(const float* g) const;  // sum of the top sum_top of group_size values
};

struct NormalizeWeightParams {
  const float* w = nullptr;  // [T, K]
  float* denom = nullptr;    // [T]
  float* out = nullptr;      // [T, K]
  int64_t num_tokens = 0, top_k = 0;
  void validate() const;
};

struct GroupCountParams {
  const int64_t* idx = nullptr;  // [n]
  int32_t* counts = nullptr;     // [G]
  int64_t n = 0, num_groups = 0;
  void validate() const;
};

struct MaskIndicesByTpParams {
  const int64_t* idx = nullptr;  // [n]
  int64_t* out = nullptr;        // [n] (may be idx)
  int64_t n = 0, num_experts = 0, n_ep = 1, tp_rank = 0, n_tp = 1;
  void validate() const;
  int64_t map(int64_t e) const;  // the rule above, for one id
};

// fused_mapping's steps, shared by the backends: count ids of slots [s0, s1) into count[E]
// (checking them); lay the segments out from the per-expert totals (writes expert_start/end and
// num_tokens_per_expert, checks num_rows, returns the rows used); place slots [s0, s1) from
// next[E] (each expert's next free row, advanced).
void fused_count(const FusedMappingParams& p, int64_t s0, int64_t s1, int64_t* count);
int64_t fused_segments(const FusedMappingParams& p, const int64_t* total);
void fused_place(const FusedMappingParams& p, int64_t s0, int64_t s1, int64_t* next);

void fused_mapping(const FusedMappingParams& p);
void expand_to_fused(const ExpandToFusedParams& p);
void reduce_fused(const ReduceFusedParams& p);
void topk_gate(const TopkGateParams& p);
void topk_group(const TopkGroupParams& p);
void normalize_weight(const NormalizeWeightParams& p);
void group_count(const GroupCountParams& p);
void mask_indices_by_tp(const MaskIndicesByTpParams& p);

namespace host {
void fused_mapping(const FusedMappingParams& p);
void expand_to_fused(const ExpandToFusedParams& p);
void reduce_fused(const ReduceFusedParams& p);
void topk_gate(const TopkGateParams& p);
void topk_group(const TopkGroupParams& p);
void normalize_weight(const NormalizeWeightParams& p);
void topk_gate(const TopkGateParams& p);
void topk_group(const TopkGroupParams& p);
void normalize_weight(const NormalizeWeightParams& p);
void group_count(const GroupCountParams& p);
void mask_indices_by_tp(const MaskIndicesByTpParams& p);
}  // namespace host
namespace cpu {
void fused_mapping(const FusedMappingParams& p);
void expand_to_fused(const ExpandToFusedParams& p);
void reduce_fused(const ReduceFusedParams& p);
void topk_gate(const TopkGateParams& p);
void topk_group(const TopkGroupParams& p);
void normalize_weight(const NormalizeWeightParams& p);
void topk_gate(const TopkGateParams& p);
void topk_group(const TopkGroupParams& p);
void normalize_weight(const NormalizeWeightParams& p);
void group_count(const GroupCountParams& p);
void mask_indices_by_tp(const MaskIndicesByTpParams& p);
}  // namespace cpu

template <>
struct OpSpec<FusedMappingParams> {
  static constexpr const char* name = "fused_mapping";
  static std::string shape(const FusedMappingParams& p) {
    return fmt::format("t={} k={} e={} rows={} align={}", p.num_tokens, p.top_k, p.num_experts,
                       p.num_rows, p.alignment);
  }
  template <class V>
  static void visit(FusedMappingParams& p, V& v) {
    v.in("topk_idx", p.topk_idx, p.num_tokens * p.top_k);
    v.out("pos_to_expert", p.pos_to_expert, p.num_rows);
    v.out("pos_to_token", p.pos_to_token, p.num_rows);
    v.out("pos_to_token_topk", p.pos_to_token_topk, p.num_rows);
    v.out("token_topk_to_pos", p.token_topk_to_pos, p.num_tokens * p.top_k);
    v.out("expert_start", p.expert_start, p.num_experts);
    v.out("expert_end", p.expert_end, p.num_experts);
    v.out("num_tokens_per_expert", p.num_tokens_per_expert, p.num_experts);
  }
};

template <>
struct OpSpec<ExpandToFusedParams> {
  static constexpr const char* name = "expand_to_fused";
  static std::string shape(const ExpandToFusedParams& p) {
    return fmt::format("t={} k={} rows={} row_bytes={} sf_cols={}", p.num_tokens, p.top_k,
                       p.num_rows, p.row_bytes, p.sf_cols);
  }
  template <class V>
  static void visit(ExpandToFusedParams& p, V& v) {
    v.in("x", p.x, p.num_tokens * p.row_bytes);
    v.in("token_topk_to_pos", p.token_topk_to_pos, p.num_tokens * p.top_k);
    v.in("pos_to_expert", p.pos_to_expert, p.num_rows);
    v.in("x_sf", p.x_sf, p.num_tokens * p.sf_cols);
    v.out("out", p.out, p.num_rows * p.row_bytes);
    v.out("out_sf", p.out_sf, p.num_rows * p.sf_cols);
  }
};

template <>
struct OpSpec<ReduceFusedParams> {
  static constexpr const char* name = "reduce_fused";
  static std::string shape(const ReduceFusedParams& p) {
    return fmt::format("t={} k={} rows={} h={}", p.num_tokens, p.top_k, p.num_rows, p.hidden);
  }
  template <class V>
  static void visit(ReduceFusedParams& p, V& v) {
    v.in("x", p.x, p.num_rows * p.hidden);
    v.in("x_sf", p.x_sf, p.num_rows);
    v.in("weights", p.weights, p.num_tokens * p.top_k);
    v.in("token_topk_to_pos", p.token_topk_to_pos, p.num_tokens * p.top_k);
    v.in("sf", p.sf, 1);
    v.out("out", p.out, p.num_tokens * p.hidden);
  }
};

template <>
struct OpSpec<TopkGateParams> {
  static constexpr const char* name = "topk_gate";
  static std::string shape(const TopkGateParams& p) {
    return fmt::format("t={} e={} k={}", p.num_tokens, p.num_experts, p.top_k);
  }
  template <class V>
  static void visit(TopkGateParams& p, V& v) {
    v.in("scores", p.scores, p.num_tokens * p.num_experts);
    v.out("idx", p.idx, p.num_tokens * p.top_k);
  }
};

template <>
struct OpSpec<TopkGroupParams> {
  static constexpr const char* name = "topk_group";
  static std::string shape(const TopkGroupParams& p) {
    return fmt::format("t={} groups={}x{} kg={} top{}", p.num_tokens, p.num_groups, p.group_size,
                       p.topk_group, p.sum_top);
  }
  template <class V>
  static void visit(TopkGroupParams& p, V& v) {
    v.in("scores", p.scores, p.num_tokens * p.num_groups * p.group_size);
    v.out("group_idx", p.group_idx, p.num_tokens * p.topk_group);
  }
};

template <>
struct OpSpec<NormalizeWeightParams> {
  static constexpr const char* name = "normalize_weight";
  static std::string shape(const NormalizeWeightParams& p) {
    return fmt::format("t={} k={}", p.num_tokens, p.top_k);
  }
  template <class V>
  static void visit(NormalizeWeightParams& p, V& v) {
    v.in("w", p.w, p.num_tokens * p.top_k);
    v.out("denom", p.denom, p.num_tokens);
    v.out("out", p.out, p.num_tokens * p.top_k);
  }
};

template <>
struct OpSpec<GroupCountParams> {
  static constexpr const char* name = "group_count";
  static std::string shape(const GroupCountParams& p) {
    return fmt::format("n={} groups={}", p.n, p.num_groups);
  }
  template <class V>
  static void visit(GroupCountParams& p, V& v) {
    v.in("idx", p.idx, p.n);
    v.out("counts", p.counts, p.num_groups);
  }
};

template <>
struct OpSpec<MaskIndicesByTpParams> {
  static constexpr const char* name = "mask_indices_by_tp";
  static std::string shape(const MaskIndicesByTpParams& p) {
    return fmt::format("n={} e={} ep={} tp={}/{}", p.n, p.num_experts, p.n_ep, p.tp_rank, p.n_tp);
  }
  template <class V>
  static void visit(MaskIndicesByTpParams& p, V& v) {
    if (p.out == p.idx) {
      int64_t* io = p.out;
      v.inout("idx", io, p.n);
      p.out = io;
      p.idx = io;
    } else {
      v.in("idx", p.idx, p.n);
      v.out("out", p.out, p.n);
    }
  }
};

}  // namespace deepinfer::kernels
