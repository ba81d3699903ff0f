// MLA attention, host: a 2-token attention worked by hand, the absorbed form against the naive
// form built from the same latent and weights, paged decode against the last rows of prefill
// (pages out of order), and the FlashMLA edge cases (nothing visible -> o = 0, lse = +inf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/attention.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

std::vector<bf16> bfv(std::initializer_list<float> v) {
  std::vector<bf16> out;
  for (float x : v) out.push_back(f32_to_bf16(x));
  return out;
}

TEST(MlaHost, TwoTokensByHand) {
  // H = 1, D = Dv = 2, scale 1. Keys k0 = (1, 0), k1 = (0, 1); values v0 = (1, 0), v1 = (0, 2).
  // Query 0 = (2, 0) sees k0 only: o = v0, lse = 2.
  // Query 1 = (1, 0) sees both: s = (1, 0), p = (e, 1)/(e + 1) = (0.7310586, 0.2689414),
  // o = (0.7310586, 0.5378828), lse = ln(e + 1) = 1.3132617.
  const auto q = bfv({2, 0, 1, 0}), k = bfv({1, 0, 0, 1}), v = bfv({1, 0, 0, 2});
  const int32_t cu[2] = {0, 2};
  std::vector<bf16> o(4);
  std::vector<float> lse(2);
  host::mla_prefill({.q = q.data(),
                     .k = k.data(),
                     .v = v.data(),
                     .cu_seqlens_q = cu,
                     .cu_seqlens_k = cu,
                     .o = o.data(),
                     .lse = lse.data(),
                     .num_seqs = 1,
                     .num_heads = 1,
                     .head_dim = 2,
                     .head_dim_v = 2,
                     .softmax_scale = 1.0f});
  EXPECT_EQ(bf16_to_f32(o[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(o[1]), 0.0f);
  EXPECT_FLOAT_EQ(lse[0], 2.0f);
  EXPECT_EQ(bf16_to_f32(o[2]), round_bf16(0.7310585786f));
  EXPECT_EQ(bf16_to_f32(o[3]), round_bf16(0.5378828427f));
  EXPECT_FLOAT_EQ(lse[1], 1.3132616875f);
  // Non-causal: query 0 sees both too: s = (2, 0), p0 = e^2/(e^2+1) = 0.8807971.
  host::mla_prefill({.q = q.data(),
                     .k = k.data(),
                     .v = v.data(),
                     .cu_seqlens_q = cu,
                     .cu_seqlens_k = cu,
                     .o = o.data(),
                     .lse = lse.data(),
                     .num_seqs = 1,
                     .num_heads = 1,
                     .head_dim = 2,
                     .head_dim_v = 2,
                     .softmax_scale = 1.0f,
                     .causal = false});
  EXPECT_EQ(bf16_to_f32(o[0]), round_bf16(0.8807970780f));
  EXPECT_EQ(bf16_to_f32(o[1]), round_bf16(2 * 0.1192029220f));
  EXPECT_FLOAT_EQ(lse[0], float(std::log(std::exp(2.0) + 1.0)));
}

// A small MLA layer: latent c [T, L], k_pe [T, R], per-head W_UK [H, N, L], W_UV [H, V, L],
// q_nope [T, H, N], q_pe [T, H, R].
struct SmallMla {
  int64_t T, H, L = 32, R = 8, N = 16, V = 16;
  std::vector<float> c, kpe, wuk, wuv, qn, qp;
  SmallMla(int64_t t, int64_t h, uint64_t seed) : T(t), H(h) {
    auto f = [&](int64_t n, uint64_t s) {
      return testing::to_f32(testing::random_bf16(n, seed * 100 + s));
    };
    c = f(T * L, 1), kpe = f(T * R, 2), wuk = f(H * N * L, 3), wuv = f(H * V * L, 4);
    qn = f(T * H * N, 5), qp = f(T * H * R, 6);
  }
  // Absorbed inputs: q [T, H, L + R] = [W_UK^T q_nope | q_pe], kv [T, L + R] = [c | k_pe].
  std::vector<bf16> absorbed_q() const {
    std::vector<bf16> q(T * H * (L + R));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        bf16* row = q.data() + (t * H + h) * (L + R);
        for (int64_t l = 0; l < L; ++l) {
          double s = 0;
          for (int64_t n = 0; n < N; ++n)
            s += double(wuk[(h * N + n) * L + l]) * qn[(t * H + h) * N + n];
          row[l] = f32_to_bf16(float(s));
        }
        for (int64_t r = 0; r < R; ++r) row[L + r] = f32_to_bf16(qp[(t * H + h) * R + r]);
      }
    return q;
  }
  std::vector<bf16> latent_kv() const {
    std::vector<bf16> kv(T * (L + R));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t l = 0; l < L; ++l) kv[t * (L + R) + l] = f32_to_bf16(c[t * L + l]);
      for (int64_t r = 0; r < R; ++r) kv[t * (L + R) + L + r] = f32_to_bf16(kpe[t * R + r]);
    }
    return kv;
  }
};

TEST(MlaHost, AbsorbedMatchesNaive) {
  const SmallMla m(9, 3, 7);
  const int64_t T = m.T, H = m.H, L = m.L, R = m.R, N = m.N, V = m.V;
  // Naive: q_h = [q_nope | q_pe], k_h = [W_UK,h c | k_pe], v_h = W_UV,h c (each rounded to bf16).
  std::vector<bf16> q(T * H * (N + R)), k(T * H * (N + R)), v(T * H * V);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t n = 0; n < N; ++n) {
        q[(t * H + h) * (N + R) + n] = f32_to_bf16(m.qn[(t * H + h) * N + n]);
        double s = 0;
        for (int64_t l = 0; l < L; ++l) s += double(m.wuk[(h * N + n) * L + l]) * m.c[t * L + l];
        k[(t * H + h) * (N + R) + n] = f32_to_bf16(float(s));
      }
      for (int64_t r = 0; r < R; ++r) {
        q[(t * H + h) * (N + R) + N + r] = f32_to_bf16(m.qp[(t * H + h) * R + r]);
        k[(t * H + h) * (N + R) + N + r] = f32_to_bf16(m.kpe[t * R + r]);
      }
      for (int64_t j = 0; j < V; ++j) {
        double s = 0;
        for (int64_t l = 0; l < L; ++l) s += double(m.wuv[(h * V + j) * L + l]) * m.c[t * L + l];
        v[(t * H + h) * V + j] = f32_to_bf16(float(s));
      }
    }
  const int32_t cu[2] = {0, int32_t(T)};
  const float scale = 1.0f / std::sqrt(float(N + R));
  std::vector<bf16> o_naive(T * H * V), o_lat(T * H * L);
  std::vector<float> lse_naive(H * T), lse_abs(H * T);
  host::mla_prefill({.q = q.data(),
                     .k = k.data(),
                     .v = v.data(),
                     .cu_seqlens_q = cu,
                     .cu_seqlens_k = cu,
                     .o = o_naive.data(),
                     .lse = lse_naive.data(),
                     .num_heads = H,
                     .head_dim = N + R,
                     .head_dim_v = V,
                     .softmax_scale = scale});
  const auto qa = m.absorbed_q();
  const auto kv = m.latent_kv();
  host::mla_prefill({.q = qa.data(),
                     .kv = kv.data(),
                     .cu_seqlens_q = cu,
                     .cu_seqlens_k = cu,
                     .o = o_lat.data(),
                     .lse = lse_abs.data(),
                     .num_heads = H,
                     .head_dim = L + R,
                     .head_dim_v = L,
                     .softmax_scale = scale});
  // o_h = W_UV,h o~_h.
  double err = 0, ref = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < V; ++j) {
        double s = 0;
        for (int64_t l = 0; l < L; ++l)
          s += double(m.wuv[(h * V + j) * L + l]) * bf16_to_f32(o_lat[(t * H + h) * L + l]);
        const double nv = bf16_to_f32(o_naive[(t * H + h) * V + j]);
        err += (s - nv) * (s - nv);
        ref += nv * nv;
      }
  EXPECT_LT(std::sqrt(err / ref), 2e-2);  // bf16 roundings of k, v, q~ and o differ between forms
  for (int64_t i = 0; i < H * T; ++i)
    EXPECT_NEAR(lse_abs[size_t(i)], lse_naive[size_t(i)], 0.05) << i;
}

// Writes kv [T, D] into a paged cache with pages in `order`; returns the block table row.
std::vector<int32_t> page_in(const std::vector<bf16>& kv, int64_t T, int64_t D, int64_t page,
                             std::vector<int32_t> order, std::vector<bf16>& cache) {
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(kv.begin() + t * D, D,
                cache.begin() + (int64_t(order[size_t(t / page)]) * page + t % page) * D);
  return order;
}

TEST(MlaHost, PagedDecodeEqualsPrefillLastRows) {
  const SmallMla m(37, 4, 9);  // 37 tokens: pages of 8 -> 5 pages, the last partial
  const int64_t T = m.T, H = m.H, D = m.L + m.R, Dv = m.L, page = 8, S = 3;
  const auto q = m.absorbed_q();
  const auto kv = m.latent_kv();
  const int32_t cu[2] = {0, int32_t(T)};
  std::vector<bf16> o_pre(T * H * Dv);
  std::vector<float> lse_pre(H * T);
  host::mla_prefill({.q = q.data(),
                     .kv = kv.data(),
                     .cu_seqlens_q = cu,
                     .cu_seqlens_k = cu,
                     .o = o_pre.data(),
                     .lse = lse_pre.data(),
                     .num_heads = H,
                     .head_dim = D,
                     .head_dim_v = Dv,
                     .softmax_scale = 0.3f});
  // Cache of 9 pages, the sequence's 5 pages scattered out of order.
  std::vector<bf16> cache(9 * page * D, f32_to_bf16(100.0f));
  const auto table = page_in(kv, T, D, page, {6, 2, 8, 0, 4}, cache);
  const int32_t seqlen = int32_t(T);
  std::vector<bf16> o(S * H * Dv);
  std::vector<float> lse(H * S);
  host::mla_decode({.q = q.data() + (T - S) * H * D,
                    .kv_cache = cache.data(),
                    .block_table = table.data(),
                    .cache_seqlens = &seqlen,
                    .o = o.data(),
                    .lse = lse.data(),
                    .batch = 1,
                    .s_q = S,
                    .num_heads = H,
                    .head_dim = D,
                    .head_dim_v = Dv,
                    .page_size = page,
                    .num_pages = 9,
                    .max_pages_per_seq = 5,
                    .softmax_scale = 0.3f});
  for (int64_t r = 0; r < S; ++r)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < Dv; ++c)
        ASSERT_EQ(o[(r * H + h) * Dv + c].bits, o_pre[((T - S + r) * H + h) * Dv + c].bits)
            << r << "," << h;
      EXPECT_EQ(lse[h * S + r], lse_pre[h * T + T - S + r]);
    }
}

TEST(MlaHost, NothingVisibleGivesZeroAndInfiniteLse) {
  // Sequence 0 empty; sequence 1 has 2 keys but 4 queries: rows 0, 1 see nothing (bottom-right).
  const int64_t H = 2, D = 6, Dv = 4, S = 4, page = 4;
  const auto q = testing::random_bf16(2 * S * H * D, 3);
  const auto cache = testing::random_bf16(2 * page * D, 4);
  const std::vector<int32_t> table = {1, 0, 0, 1}, seqlens = {0, 2};
  std::vector<bf16> o(2 * S * H * Dv, f32_to_bf16(5.0f));
  std::vector<float> lse(2 * H * S, 0.0f);
  host::mla_decode({.q = q.data(),
                    .kv_cache = cache.data(),
                    .block_table = table.data(),
                    .cache_seqlens = seqlens.data(),
                    .o = o.data(),
                    .lse = lse.data(),
                    .batch = 2,
                    .s_q = S,
                    .num_heads = H,
                    .head_dim = D,
                    .head_dim_v = Dv,
                    .page_size = page,
                    .num_pages = 2,
                    .max_pages_per_seq = 2,
                    .softmax_scale = 0.5f});
  auto row_zero = [&](int64_t b, int64_t r, int64_t h) {
    for (int64_t c = 0; c < Dv; ++c)
      if (o[((b * S + r) * H + h) * Dv + c].bits != 0) return false;
    return true;
  };
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < S; ++r) {
      EXPECT_TRUE(row_zero(0, r, h));
      EXPECT_EQ(lse[(0 * H + h) * S + r], INFINITY);
      const bool sees = r >= 2;  // 2 - 4 + r + 1 > 0
      EXPECT_EQ(row_zero(1, r, h), !sees) << r;
      EXPECT_EQ(std::isinf(lse[(1 * H + h) * S + r]), !sees) << r;
    }
  // Query row 2 of sequence 1 sees key 0 only (page table[1][0] = 0, row 0): o = v0 exactly.
  for (int64_t c = 0; c < Dv; ++c)
    EXPECT_EQ(o[((1 * S + 2) * H + 0) * Dv + c].bits, cache[(0 * page + 0) * D + c].bits);
  // Bad block table entries are rejected with a message.
  const std::vector<int32_t> bad = {0, 0, 7, 0};  // sequence 1's first page
  EXPECT_THROW(host::mla_decode({.q = q.data(),
                                 .kv_cache = cache.data(),
                                 .block_table = bad.data(),
                                 .cache_seqlens = seqlens.data(),
                                 .o = o.data(),
                                 .batch = 2,
                                 .s_q = S,
                                 .num_heads = H,
                                 .head_dim = D,
                                 .head_dim_v = Dv,
                                 .page_size = page,
                                 .num_pages = 2,
                                 .max_pages_per_seq = 2,
                                 .softmax_scale = 0.5f}),
               Error);
}

}  // namespace
}  // namespace deepinfer::kernels
