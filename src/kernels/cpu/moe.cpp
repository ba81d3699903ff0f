// cpu: MoE layout kernels. fused_mapping and group_count count per chunk of slots in parallel
// and place with per-(chunk, expert) bases, so the layout equals host's serial (t, j) order;
// expand copies rows over kernel_pool(); reduce_fused is Highway FMA in j order (as host).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/moe.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on
#include "kernels/moe.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void reduce_fused_rows(const ReduceFusedParams& p, int64_t t0, int64_t t1) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df)), H = p.hidden, K = p.top_k;
  std::vector<int64_t> rows(static_cast<size_t>(K));
  std::vector<float> coef(static_cast<size_t>(K));
  for (int64_t t = t0; t < t1; ++t) {
    int64_t n = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = p.token_topk_to_pos[t * K + j];
      if (r < 0) continue;
      DI_CHECK(r < p.num_rows, "reduce_fused: position {} of slot {} >= rows {}", r, t * K + j,
               p.num_rows);
      rows[size_t(n)] = r;
      coef[size_t(n++)] = (p.weights ? p.weights[t * K + j] : 1.0f) * (p.x_sf ? p.x_sf[r] : 1.0f);
    }
    bf16* out = p.out + t * H;
    const float gsf = p.sf ? p.sf[0] : 1.0f;
    int64_t h = 0;
    for (; h + N <= H; h += N) {
      auto acc = hn::Zero(df);
      for (int64_t i = 0; i < n; ++i)
        acc = hn::MulAdd(load_bf16(df, p.x + rows[size_t(i)] * H + h), hn::Set(df, coef[size_t(i)]),
                         acc);
      if (p.sf) acc = hn::Mul(acc, hn::Set(df, gsf));
      store_bf16(df, acc, out + h);
    }
    for (; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i)
        acc = std::fma(bf16_to_f32(p.x[rows[size_t(i)] * H + h]), coef[size_t(i)], acc);
      out[h] = f32_to_bf16(p.sf ? acc * gsf : acc);
    }
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {
namespace {

constexpr int64_t kChunk = 4096;  // slots per counting chunk

int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

}  // namespace

HWY_EXPORT(reduce_fused_rows);

void fused_mapping(const FusedMappingParams& p) {
  p.validate();
  const int64_t E = p.num_experts, S = p.num_tokens * p.top_k, C = num_chunks(S);
  std::vector<int64_t> count(size_t(C * E), 0);  // [chunk, expert], then the chunk's base row
  kernel_pool().parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      fused_count(p, c * kChunk, std::min(S, (c + 1) * kChunk), count.data() + c * E);
  });
  std::vector<int64_t> total(static_cast<size_t>(E), 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t e = 0; e < E; ++e) total[size_t(e)] += count[size_t(c * E + e)];
  const int64_t used = fused_segments(p, total.data());
  for (int64_t e = 0; e < E; ++e) {
    int64_t base = p.expert_start[e];
    for (int64_t c = 0; c < C; ++c) {
      const int64_t n = count[size_t(c * E + e)];
      count[size_t(c * E + e)] = base;
      base += n;
    }
  }
  // Padding rows of every segment, and the rows past the last one.
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = p.expert_end[e]; r < p.expert_start[e] + p.num_tokens_per_expert[e]; ++r)
      p.pos_to_expert[r] = p.pos_to_token[r] = p.pos_to_token_topk[r] = -1;
  for (int64_t r = used; r < p.num_rows; ++r)
    p.pos_to_expert[r] = p.pos_to_token[r] = p.pos_to_token_topk[r] = -1;
  kernel_pool().parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      fused_place(p, c * kChunk, std::min(S, (c + 1) * kChunk), count.data() + c * E);
  });
}

void expand_to_fused(const ExpandToFusedParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.num_rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (p.pos_to_expert[r] < 0) {
        std::memset(p.out + r * p.row_bytes, 0, size_t(p.row_bytes));
        if (p.out_sf) std::fill(p.out_sf + r * p.sf_cols, p.out_sf + (r + 1) * p.sf_cols, 0.0f);
      }
  });
  kernel_pool().parallel_for(p.num_tokens, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t s = t0 * p.top_k; s < t1 * p.top_k; ++s) {
      const int64_t r = p.token_topk_to_pos[s], t = s / p.top_k;
      if (r < 0) continue;
      DI_CHECK(r < p.num_rows, "expand_to_fused: position {} of slot {} >= rows {}", r, s,
               p.num_rows);
      std::memcpy(p.out + r * p.row_bytes, p.x + t * p.row_bytes, size_t(p.row_bytes));
      if (p.out_sf)
        std::memcpy(p.out_sf + r * p.sf_cols, p.x_sf + t * p.sf_cols, size_t(p.sf_cols) * 4);
    }
  });
}

void reduce_fused(const ReduceFusedParams& p) {
  p.validate();
  const int64_t grain = std::max<int64_t>(1, 8192 / p.hidden);
  kernel_pool().parallel_for(p.num_tokens, grain, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(reduce_fused_rows)(p, t0, t1);
  });
}

namespace {
// One pass over v [n]: a k-slot list kept in descending order; strict > keeps ties in index order.
template <class Value>
void insertion_topk(int64_t n, int64_t k, int64_t* top, const Value& value) {
  int64_t have = 0;
  for (int64_t e = 0; e < n; ++e) {
    const float v = value(e);
    if (have == k && !(v > value(top[k - 1]))) continue;
    int64_t j = have < k ? have++ : k - 1;
    while (j > 0 && v > value(top[j - 1])) {
      top[j] = top[j - 1];
      --j;
    }
    top[j] = e;
  }
}
}  // namespace

void topk_gate(const TopkGateParams& p) {
  p.validate();
  const int64_t E = p.num_experts;
  kernel_pool().parallel_for(
      p.num_tokens, std::max<int64_t>(1, 8192 / E), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* row = p.scores + t * E;
          for (int64_t e = 0; e < E; ++e)
            DI_CHECK(!std::isnan(row[e]), "topk_gate: score [{}, {}] is NaN", t, e);
          insertion_topk(E, p.top_k, p.idx + t * p.top_k, [&](int64_t e) { return row[e]; });
        }
      });
}

void topk_group(const TopkGroupParams& p) {
  p.validate();
  const int64_t G = p.num_groups, S = p.group_size;
  kernel_pool().parallel_for(p.num_tokens, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> gs(static_cast<size_t>(G));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t g = 0; g < G; ++g) gs[size_t(g)] = p.group_score(p.scores + (t * G + g) * S);
      insertion_topk(G, p.topk_group, p.group_idx + t * p.topk_group,
                     [&](int64_t g) { return gs[size_t(g)]; });
    }
  });
}

void normalize_weight(const NormalizeWeightParams& p) {
  p.validate();
  const int64_t K = p.top_k;
  kernel_pool().parallel_for(p.num_tokens, 1024, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float s = 0.0f;
      for (int64_t j = 0; j < K; ++j) s += p.w[t * K + j];
      const float d = s + 1e-20f;
      p.denom[t] = d;
      for (int64_t j = 0; j < K; ++j) p.out[t * K + j] = p.w[t * K + j] / d;
    }
  });
}

void group_count(const GroupCountParams& p) {
  p.validate();
  const int64_t G = p.num_groups, C = num_chunks(p.n);
  std::vector<int32_t> partial(size_t(C * G), 0);
  kernel_pool().parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = c * kChunk; i < std::min(p.n, (c + 1) * kChunk); ++i) {
        const int64_t g = p.idx[i];
        DI_CHECK(g >= -1 && g < G, "group_count: id {} at {} is outside [-1, {})", g, i, G);
        if (g >= 0) ++partial[size_t(c * G + g)];
      }
  });
  for (int64_t g = 0; g < G; ++g) {
    int32_t s = 0;
    for (int64_t c = 0; c < C; ++c) s += partial[size_t(c * G + g)];
    p.counts[g] = s;
  }
}

void mask_indices_by_tp(const MaskIndicesByTpParams& p) {
  p.validate();
  kernel_pool().parallel_for(p.n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) p.out[i] = p.map(p.idx[i]);
  });
}

}  // namespace deepinfer::kernels::cpu
#endif
