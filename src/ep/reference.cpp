#include "ep/reference.h"

#include <algorithm>
#include <cstring>

namespace deepinfer::ep::ref {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  uint64_t s;
  uint64_t next() { return s = mix(s); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return n <= 0 ? 0 : int64_t(next() % uint64_t(n)); }
};

size_t x_elem(const EPConfig& cfg) { return cfg.dispatch_dtype == DispatchDType::fp8 ? 1 : 2; }

}  // namespace

DispatchInput RankInput::as_input(const EPConfig& cfg) {
  DispatchInput in;
  const int64_t t = num_tokens, k = cfg.num_topk;
  const bool fp8 = cfg.dispatch_dtype == DispatchDType::fp8;
  in.x = Tensor::borrow(x.data(), fp8 ? DType::e4m3 : DType::bf16, {t, cfg.hidden});
  if (fp8) in.scales = Tensor::borrow(scales.data(), DType::f32, {t, cfg.scale_cols()});
  in.topk_idx = Tensor::borrow(topk_idx.data(), DType::i64, {t, k});
  in.topk_weights = Tensor::borrow(weights.data(), DType::f32, {t, k});
  return in;
}

RankInput make_input(const GenParams& p, int rank) {
  const EPConfig& cfg = p.cfg;
  const int64_t m = cfg.num_max_tokens_per_rank, k = cfg.num_topk, e_count = cfg.num_experts;
  Rng rng{mix(p.seed * 1000003ull + uint64_t(rank) * 7919ull + 17)};
  RankInput in;
  // Every third rank (when there are several) has no tokens; the others between M/2 and M.
  if (p.world > 1 && rank % 3 == 1)
    in.num_tokens = 0;
  else
    in.num_tokens = m - rng.below(m / 2 + 1);
  const int64_t t_count = in.num_tokens;
  in.x.resize(size_t(t_count) * size_t(cfg.hidden) * x_elem(cfg));
  for (auto& b : in.x) b = uint8_t(rng.next());
  in.scales.resize(size_t(t_count) * size_t(cfg.scale_cols()));
  for (auto& s : in.scales) s = float(rng.uniform() * 0.01 + 1e-6);
  // Cold experts (e % 5 == 4) receive nothing when there are enough others to choose from.
  std::vector<int64_t> allowed;
  for (int64_t e = 0; e < e_count; ++e)
    if (!(e_count >= 2 * k && e % 5 == 4)) allowed.push_back(e);
  in.topk_idx.assign(size_t(t_count * k), -1);
  in.weights.resize(size_t(t_count * k));
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<int64_t> pool = allowed;
    for (int64_t j = 0; j < k; ++j) {
      // Skewed: low ids are hot.
      const double u = rng.uniform();
      const size_t pick = std::min(pool.size() - 1, size_t(u * u * double(pool.size())));
      in.topk_idx[size_t(t * k + j)] = pool[pick];
      pool.erase(pool.begin() + int64_t(pick));
      if (rng.below(5) == 0) in.topk_idx[size_t(t * k + j)] = -1;  // masked slot
      in.weights[size_t(t * k + j)] = float(0.01 + rng.uniform());
    }
    if (t == 1) std::fill_n(in.topk_idx.begin() + t * k, k, -1);  // a token masked in all slots
  }
  return in;
}

uint16_t y_value(uint64_t seed, int64_t gtok, int64_t key, int h) {
  const uint64_t r = mix(mix(seed ^ 0x5eed) ^
                         mix(uint64_t(gtok) * 131071ull + uint64_t(key) * 8191ull + uint64_t(h)));
  if (r % 16 == 0) return 0x8000;  // -0
  if (r % 16 == 1) return 0;
  const float mant = 1.0f + float((r >> 8) & 0xffff) / 65536.0f;
  const int exp = int((r >> 24) % 13) - 6;
  const float v = ((r >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mant, exp);
  return f32_to_bf16(v).bits;
}

ExpectedDispatch expected_dispatch(const std::vector<RankInput>& all, const EPConfig& cfg,
                                   int world, int me) {
  const int64_t k = cfg.num_topk, l = cfg.num_experts / world, lo = int64_t(me) * l;
  const int64_t p = cfg.scale_cols(), m = cfg.num_max_tokens_per_rank;
  const size_t xb = size_t(cfg.hidden) * x_elem(cfg);
  ExpectedDispatch ex;
  ex.per_rank.assign(size_t(world), 0);
  ex.count_raw.assign(size_t(l), 0);
  struct Row {
    int src;
    int64_t t;
  };
  std::vector<Row> rows;
  for (int src = 0; src < world; ++src) {
    const RankInput& in = all[size_t(src)];
    for (int64_t t = 0; t < in.num_tokens; ++t) {
      bool hit = false;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = in.topk_idx[size_t(t * k + j)];
        if (e >= lo && e < lo + l) {
          hit = true;
          ex.count_raw[size_t(e - lo)] += 1;
        }
      }
      if (hit) {
        rows.push_back({src, t});
        ex.per_rank[size_t(src)] += 1;
      }
    }
  }
  ex.num_recv = int64_t(rows.size());
  const int64_t a = cfg.expert_alignment;
  for (int64_t c : ex.count_raw) ex.count_aligned.push_back((c + a - 1) / a * a);
  if (!cfg.expand) {
    for (const Row& r : rows) {
      const RankInput& in = all[size_t(r.src)];
      ex.x.insert(ex.x.end(), in.x.begin() + int64_t(size_t(r.t) * xb),
                  in.x.begin() + int64_t(size_t(r.t + 1) * xb));
      ex.scales.insert(ex.scales.end(), in.scales.begin() + r.t * p,
                       in.scales.begin() + (r.t + 1) * p);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = in.topk_idx[size_t(r.t * k + j)];
        ex.topk_idx.push_back(e >= lo && e < lo + l ? e - lo : -1);
        ex.weights.push_back(in.weights[size_t(r.t * k + j)]);
      }
      ex.src.push_back(int64_t(r.src) * m + r.t);
    }
    return ex;
  }
  // Expand: per local expert, its rows in (src, token) order, then zero padding to the alignment.
  for (int64_t le = 0; le < l; ++le) {
    int64_t n = 0;
    for (const Row& r : rows) {
      const RankInput& in = all[size_t(r.src)];
      for (int64_t j = 0; j < k; ++j) {
        if (in.topk_idx[size_t(r.t * k + j)] != lo + le) continue;
        ex.x.insert(ex.x.end(), in.x.begin() + int64_t(size_t(r.t) * xb),
                    in.x.begin() + int64_t(size_t(r.t + 1) * xb));
        ex.scales.insert(ex.scales.end(), in.scales.begin() + r.t * p,
                         in.scales.begin() + (r.t + 1) * p);
        ex.topk_idx.push_back(le);
        ex.weights.push_back(in.weights[size_t(r.t * k + j)]);
        ex.src.push_back(int64_t(r.src) * m + r.t);
        ++n;
      }
    }
    for (; n < ex.count_aligned[size_t(le)]; ++n) {
      ex.x.insert(ex.x.end(), xb, 0);
      ex.scales.insert(ex.scales.end(), size_t(p), 0.0f);
      ex.topk_idx.push_back(-1);
      ex.weights.push_back(0.0f);
      ex.src.push_back(-1);
    }
  }
  return ex;
}

ExpectedCombine expected_combine(const std::vector<RankInput>& all, const EPConfig& cfg, int world,
                                 int me, uint64_t seed, const std::vector<int64_t>& token_offset) {
  const RankInput& in = all[size_t(me)];
  const int64_t k = cfg.num_topk, h_dim = cfg.hidden, l = cfg.num_experts / world;
  ExpectedCombine ec;
  ec.x.resize(size_t(in.num_tokens * h_dim));
  ec.weights.assign(size_t(in.num_tokens * k), 0.0f);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    const int64_t gtok = token_offset[size_t(me)] + t;
    for (int64_t j = 0; j < k; ++j) {
      const float w = in.weights[size_t(t * k + j)];
      if (in.topk_idx[size_t(t * k + j)] >= 0) ec.weights[size_t(t * k + j)] = w == 0.0f ? 0.0f : w;
    }
    for (int64_t c = 0; c < h_dim; ++c) {
      auto term = [&](int64_t j) {
        const int64_t e = in.topk_idx[size_t(t * k + j)];
        const int64_t key = cfg.expand ? e : cfg.num_experts + e / l;
        return in.weights[size_t(t * k + j)] * bf16_to_f32(bf16{y_value(seed, gtok, key, int(c))});
      };
      float out = 0.0f;
      if (cfg.combine == CombineMode::exact) {
        for (int64_t j = 0; j < k; ++j)
          if (in.topk_idx[size_t(t * k + j)] >= 0) out += term(j);
      } else {
        for (int r = 0; r < world; ++r) {
          float part = 0.0f;
          bool any = false;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = in.topk_idx[size_t(t * k + j)];
            if (e < 0 || e / l != r) continue;
            part += term(j);
            any = true;
          }
          if (any) out += round_bf16(part);
        }
      }
      ec.x[size_t(t * h_dim + c)] = f32_to_bf16(out).bits;
    }
  }
  return ec;
}

}  // namespace deepinfer::ep::ref
