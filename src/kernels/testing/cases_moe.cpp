// Harness cases (cpu vs host) for the MoE layout kernels. All integer or exact (byte copies; FMA
// in the same order), so tolerance 0.
#include <fmt/format.h>

#include <vector>

#include "kernels/moe.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

constexpr Tolerance kExact{.rel_l2 = 0, .int_mismatch_frac = 0};

// Top-k ids in [0, E) (uneven counts, repeats allowed); about every 5th slot -1.
std::vector<int64_t> random_topk(int64_t t, int64_t k, int64_t e, uint64_t seed) {
  std::vector<int64_t> idx(buffer_size(t * k));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const uint64_t h = hash64(seed, uint64_t(i * k + j));
      idx[size_t(i * k + j)] = h % 5 == 0 ? -1 : int64_t((h >> 8) % uint64_t(e));
    }
  return idx;
}

struct Mapping {
  std::vector<int32_t> pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, start,
      end, count;
  FusedMappingParams params(const std::vector<int64_t>& idx, int64_t t, int64_t k, int64_t e,
                            int64_t align) {
    const int64_t rows = fused_rows_bound(t, k, e, align);
    for (auto* v : {&pos_to_expert, &pos_to_token, &pos_to_token_topk})
      v->resize(buffer_size(rows));
    token_topk_to_pos.resize(buffer_size(t * k));
    for (auto* v : {&start, &end, &count}) v->resize(size_t(e));
    return {.topk_idx = idx.data(),
            .pos_to_expert = pos_to_expert.data(),
            .pos_to_token = pos_to_token.data(),
            .pos_to_token_topk = pos_to_token_topk.data(),
            .token_topk_to_pos = token_topk_to_pos.data(),
            .expert_start = start.data(),
            .expert_end = end.data(),
            .num_tokens_per_expert = count.data(),
            .num_tokens = t,
            .top_k = k,
            .num_experts = e,
            .num_rows = rows,
            .alignment = align};
  }
};

CaseResult run_mapping(int64_t t, int64_t k, int64_t e, int64_t align, uint64_t seed) {
  const auto idx = random_topk(t, k, e, seed);
  Mapping m;
  return compare_backends(fused_mapping, m.params(idx, t, k, e, align), kExact);
}

CaseResult run_expand(int64_t t, int64_t k, int64_t e, int64_t h, int64_t align, bool sf,
                      uint64_t seed) {
  const auto idx = random_topk(t, k, e, seed);
  Mapping m;
  const FusedMappingParams mp = m.params(idx, t, k, e, align);
  host::fused_mapping(mp);
  const auto x = random_bf16(t * h, seed + 1);
  const auto xs = random_f32(t * 4, seed + 2);
  std::vector<bf16> out(buffer_size(mp.num_rows * h));
  std::vector<float> out_sf(buffer_size(mp.num_rows * 4));
  return compare_backends(expand_to_fused,
                          ExpandToFusedParams{.x = reinterpret_cast<const uint8_t*>(x.data()),
                                              .token_topk_to_pos = m.token_topk_to_pos.data(),
                                              .pos_to_expert = m.pos_to_expert.data(),
                                              .out = reinterpret_cast<uint8_t*>(out.data()),
                                              .x_sf = sf ? xs.data() : nullptr,
                                              .out_sf = sf ? out_sf.data() : nullptr,
                                              .num_tokens = t,
                                              .top_k = k,
                                              .num_rows = mp.num_rows,
                                              .row_bytes = h * 2,
                                              .sf_cols = sf ? 4 : 0},
                          kExact);
}

CaseResult run_reduce(int64_t t, int64_t k, int64_t e, int64_t h, bool scales, uint64_t seed) {
  const auto idx = random_topk(t, k, e, seed);
  Mapping m;
  const FusedMappingParams mp = m.params(idx, t, k, e, 1);
  host::fused_mapping(mp);
  const auto x = random_bf16(mp.num_rows * h, seed + 1);
  const auto w = random_f32(t * k, seed + 2, 0.0f, 1.0f);
  const auto xs = random_f32(mp.num_rows, seed + 3, 0.5f, 2.0f);
  const float sf = 0.75f;
  std::vector<bf16> out(buffer_size(t * h));
  return compare_backends(reduce_fused,
                          ReduceFusedParams{.x = x.data(),
                                            .x_sf = scales ? xs.data() : nullptr,
                                            .weights = w.data(),
                                            .token_topk_to_pos = m.token_topk_to_pos.data(),
                                            .sf = scales ? &sf : nullptr,
                                            .out = out.data(),
                                            .num_tokens = t,
                                            .top_k = k,
                                            .num_rows = mp.num_rows,
                                            .hidden = h},
                          kExact);
}

// Scores on a coarse grid (many ties, which must go to the smaller index on both backends).
std::vector<float> tied_scores(int64_t n, uint64_t seed) {
  std::vector<float> v(buffer_size(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(hash64(seed, uint64_t(i)) % 16) * 0.125f;
  return v;
}

CaseResult run_topk_gate(int64_t t, int64_t e, int64_t k, uint64_t seed) {
  const auto scores = tied_scores(t * e, seed);
  std::vector<int64_t> idx(buffer_size(t * k));
  return compare_backends(topk_gate,
                          TopkGateParams{.scores = scores.data(),
                                         .idx = idx.data(),
                                         .num_tokens = t,
                                         .num_experts = e,
                                         .top_k = k},
                          kExact);
}

CaseResult run_topk_group(int64_t t, int64_t g, int64_t size, int64_t kg, int64_t s,
                          uint64_t seed) {
  const auto scores = tied_scores(t * g * size, seed);
  std::vector<int64_t> idx(buffer_size(t * kg));
  return compare_backends(topk_group,
                          TopkGroupParams{.scores = scores.data(),
                                          .group_idx = idx.data(),
                                          .num_tokens = t,
                                          .num_groups = g,
                                          .group_size = size,
                                          .topk_group = kg,
                                          .sum_top = s},
                          kExact);
}

}  // namespace

DEEPINFER_KERNEL_CASES(moe_topk_cases) {
  cases.push_back(
      {"topk_gate", "t=64 e=256 k=8 ties", true, [] { return run_topk_gate(64, 256, 8, 1); }});
  cases.push_back({"topk_gate", "t=5 e=7 k=7", true, [] { return run_topk_gate(5, 7, 7, 2); }});
  cases.push_back({"topk_group", "t=64 g=8x32 kg=4 top2", true,
                   [] { return run_topk_group(64, 8, 32, 4, 2, 3); }});
  cases.push_back({"topk_group", "t=33 g=32x4 kg=5 top1", true,
                   [] { return run_topk_group(33, 32, 4, 5, 1, 4); }});
  cases.push_back({"normalize_weight", "t=300 k=8", true, [] {
                     const auto w = random_f32(300 * 8, 5, 0.0f, 1.0f);
                     std::vector<float> d(300), out(w.size());
                     return compare_backends(normalize_weight,
                                             NormalizeWeightParams{.w = w.data(),
                                                                   .denom = d.data(),
                                                                   .out = out.data(),
                                                                   .num_tokens = 300,
                                                                   .top_k = 8},
                                             kExact);
                   }});
}

DEEPINFER_KERNEL_CASES(moe_layout_cases) {
  cases.push_back({"fused_mapping", "t=100 k=8 e=32 align=1", true,
                   [] { return run_mapping(100, 8, 32, 1, 1); }});
  cases.push_back({"fused_mapping", "t=3000 k=8 e=256 align=128", true,
                   [] { return run_mapping(3000, 8, 256, 128, 2); }});
  cases.push_back({"fused_mapping", "t=0 k=6 e=64 align=64", true,
                   [] { return run_mapping(0, 6, 64, 64, 3); }});
  cases.push_back({"expand_to_fused", "t=50 k=6 e=16 h=128 align=16 sf", true,
                   [] { return run_expand(50, 6, 16, 128, 16, true, 4); }});
  cases.push_back({"expand_to_fused", "t=33 k=8 e=64 h=7 align=1", true,
                   [] { return run_expand(33, 8, 64, 7, 1, false, 5); }});
  cases.push_back({"reduce_fused", "t=40 k=8 e=32 h=256 scales", true,
                   [] { return run_reduce(40, 8, 32, 256, true, 6); }});
  cases.push_back(
      {"reduce_fused", "t=9 k=6 e=8 h=37", true, [] { return run_reduce(9, 6, 8, 37, false, 7); }});
  cases.push_back({"reduce_fused", "t=512 k=8 e=256 h=7168", false,
                   [] { return run_reduce(512, 8, 256, 7168, true, 8); }});
  cases.push_back({"group_count", "n=20000 g=256", true, [] {
                     const auto idx = random_topk(2500, 8, 256, 9);
                     std::vector<int32_t> counts(256);
                     return compare_backends(group_count,
                                             GroupCountParams{.idx = idx.data(),
                                                              .counts = counts.data(),
                                                              .n = 20000,
                                                              .num_groups = 256},
                                             kExact);
                   }});
  for (int64_t tp_rank : {0, 1})
    cases.push_back(
        {"mask_indices_by_tp", fmt::format("n=4096 e=256 ep=8 tp={}/2", tp_rank), true, [tp_rank] {
           const auto idx = random_topk(512, 8, 256, 10);
           std::vector<int64_t> out(idx.size());
           return compare_backends(mask_indices_by_tp,
                                   MaskIndicesByTpParams{.idx = idx.data(),
                                                         .out = out.data(),
                                                         .n = 4096,
                                                         .num_experts = 256,
                                                         .n_ep = 8,
                                                         .tp_rank = tp_rank,
                                                         .n_tp = 2},
                                   kExact);
         }});
}

}  // namespace deepinfer::kernels::testing
