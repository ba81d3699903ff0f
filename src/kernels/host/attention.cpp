// Host reference: MLA attention, prefill (naive and absorbed) and paged decode. Scalar, fp64,
// one query row at a time.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace deepinfer::kernels::host {
namespace {

// One query row against n_vis keys; key(t) -> [D] bf16, value(t) -> [Dv] bf16.
template <class KeyFn, class ValFn>
void attend_row(const bf16* q, int64_t d, int64_t dv, int64_t n_vis, double scale, KeyFn key,
                ValFn val, bf16* o, float* lse) {
  if (n_vis <= 0) {
    for (int64_t c = 0; c < dv; ++c) o[c] = bf16{0};
    if (lse) *lse = std::numeric_limits<float>::infinity();
    return;
  }
  std::vector<double> s(static_cast<size_t>(n_vis));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < n_vis; ++t) {
    const bf16* k = key(t);
    double acc = 0.0;
    for (int64_t c = 0; c < d; ++c) acc += double(bf16_to_f32(q[c])) * double(bf16_to_f32(k[c]));
    s[size_t(t)] = acc * scale;
    m = std::max(m, s[size_t(t)]);
  }
  double sum = 0.0;
  for (auto& x : s) sum += (x = std::exp(x - m));
  std::vector<double> acc(size_t(dv), 0.0);
  for (int64_t t = 0; t < n_vis; ++t) {
    const bf16* v = val(t);
    for (int64_t c = 0; c < dv; ++c) acc[size_t(c)] += s[size_t(t)] * double(bf16_to_f32(v[c]));
  }
  for (int64_t c = 0; c < dv; ++c) o[c] = f32_to_bf16(float(acc[size_t(c)] / sum));
  if (lse) *lse = float(m + std::log(sum));
}

// Keys visible to query row r of n_q against n_k keys (bottom-right causal).
int64_t visible(bool causal, int64_t n_k, int64_t n_q, int64_t r) {
  return causal ? std::clamp<int64_t>(n_k - n_q + r + 1, 0, n_k) : n_k;
}

}  // namespace

void mla_prefill(const MlaPrefillParams& p) {
  p.validate();
  const int64_t H = p.num_heads, D = p.head_dim, Dv = p.head_dim_v, Tq = p.total_q();
  for (int64_t b = 0; b < p.num_seqs; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], nq = p.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = p.cu_seqlens_k[b], nk = p.cu_seqlens_k[b + 1] - k0;
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const bf16* q = p.q + ((q0 + r) * H + h) * D;
        bf16* o = p.o + ((q0 + r) * H + h) * Dv;
        float* lse = p.lse ? p.lse + h * Tq + q0 + r : nullptr;
        const int64_t n = visible(p.causal, nk, nq, r);
        if (p.absorbed()) {
          auto row = [&](int64_t t) { return p.kv + (k0 + t) * D; };
          attend_row(q, D, Dv, n, p.softmax_scale, row, row, o, lse);
        } else {
          attend_row(
              q, D, Dv, n, p.softmax_scale, [&](int64_t t) { return p.k + ((k0 + t) * H + h) * D; },
              [&](int64_t t) { return p.v + ((k0 + t) * H + h) * Dv; }, o, lse);
        }
      }
  }
}

void mla_decode(const MlaDecodeParams& p) {
  p.validate();
  const int64_t H = p.num_heads, D = p.head_dim, Dv = p.head_dim_v, S = p.s_q;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = p.cache_seqlens[b];
    const int32_t* table = p.block_table + b * p.max_pages_per_seq;
    auto row = [&](int64_t t) {
      return p.kv_cache + (int64_t(table[t / p.page_size]) * p.page_size + t % p.page_size) * D;
    };
    for (int64_t r = 0; r < S; ++r)
      for (int64_t h = 0; h < H; ++h)
        attend_row(p.q + ((b * S + r) * H + h) * D, D, Dv, visible(p.causal, n, S, r),
                   p.softmax_scale, row, row, p.o + ((b * S + r) * H + h) * Dv,
                   p.lse ? p.lse + (b * H + h) * S + r : nullptr);
  }
}

}  // namespace deepinfer::kernels::host
