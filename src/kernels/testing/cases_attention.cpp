// Harness cases (cpu vs host) for MLA attention: paged decode over shuffled block tables, empty
// sequences, s_q > 1 (bottom-right causal, rows that see nothing), split-KV lengths, non-causal;
// prefill in both forms with ragged batches and cached prefixes. cpu is fp32, host fp64.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/attention.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

constexpr Tolerance kAttnTol{.rel_l2 = 2e-3};

struct DecodeShape {
  std::vector<int32_t> seqlens;
  int64_t s_q, heads, d, dv, page;
  bool causal;
};

CaseResult run_decode(const DecodeShape& s, uint64_t seed) {
  const int64_t B = int64_t(s.seqlens.size());
  int64_t max_pages = 1, total_pages = 0;
  for (int32_t n : s.seqlens) {
    max_pages = std::max<int64_t>(max_pages, (n + s.page - 1) / s.page);
    total_pages += (n + s.page - 1) / s.page;
  }
  const int64_t num_pages = total_pages + 3;  // a few pages no sequence uses
  // Pages handed out in a scrambled order; unused table slots hold -1 (never read).
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = num_pages - 1; i > 0; --i)
    std::swap(perm[size_t(i)], perm[hash64(seed, uint64_t(i)) % uint64_t(i + 1)]);
  std::vector<int32_t> table(size_t(B * max_pages), -1);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < (s.seqlens[size_t(b)] + s.page - 1) / s.page; ++j)
      table[size_t(b * max_pages + j)] = perm[next++];
  const auto cache = random_bf16(num_pages * s.page * s.d, seed + 1, -1.0f, 1.0f);
  const auto q = random_bf16(B * s.s_q * s.heads * s.d, seed + 2, -1.0f, 1.0f);
  std::vector<bf16> o(size_t(B * s.s_q * s.heads * s.dv));
  std::vector<float> lse(size_t(B * s.heads * s.s_q));
  return compare_backends(mla_decode,
                          MlaDecodeParams{.q = q.data(),
                                          .kv_cache = cache.data(),
                                          .block_table = table.data(),
                                          .cache_seqlens = s.seqlens.data(),
                                          .o = o.data(),
                                          .lse = lse.data(),
                                          .batch = B,
                                          .s_q = s.s_q,
                                          .num_heads = s.heads,
                                          .head_dim = s.d,
                                          .head_dim_v = s.dv,
                                          .page_size = s.page,
                                          .num_pages = num_pages,
                                          .max_pages_per_seq = max_pages,
                                          .softmax_scale = 1.0f / std::sqrt(float(s.d)),
                                          .causal = s.causal},
                          kAttnTol);
}

struct PrefillShape {
  std::vector<int32_t> nq, nk;  // per sequence (nk >= nq: cached prefix)
  int64_t heads, d, dv;
  bool absorbed, causal;
};

CaseResult run_prefill(const PrefillShape& s, uint64_t seed) {
  const int64_t B = int64_t(s.nq.size());
  std::vector<int32_t> cq(size_t(B + 1), 0), ck(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    cq[size_t(b + 1)] = cq[size_t(b)] + s.nq[size_t(b)];
    ck[size_t(b + 1)] = ck[size_t(b)] + s.nk[size_t(b)];
  }
  const int64_t Tq = cq.back(), Tk = ck.back(), H = s.heads;
  const auto q = random_bf16(Tq * H * s.d, seed, -1.0f, 1.0f);
  const auto k = random_bf16(s.absorbed ? 0 : Tk * H * s.d, seed + 1, -1.0f, 1.0f);
  const auto v = random_bf16(s.absorbed ? 0 : Tk * H * s.dv, seed + 2, -1.0f, 1.0f);
  const auto kv = random_bf16(s.absorbed ? Tk * s.d : 0, seed + 3, -1.0f, 1.0f);
  std::vector<bf16> o(size_t(Tq * H * s.dv));
  std::vector<float> lse(size_t(H * Tq));
  MlaPrefillParams p{.q = q.data(),
                     .cu_seqlens_q = cq.data(),
                     .cu_seqlens_k = ck.data(),
                     .o = o.data(),
                     .lse = lse.data(),
                     .num_seqs = B,
                     .num_heads = H,
                     .head_dim = s.d,
                     .head_dim_v = s.dv,
                     .softmax_scale = 1.0f / std::sqrt(float(s.d)),
                     .causal = s.causal};
  if (s.absorbed) {
    p.kv = kv.data();
  } else {
    p.k = k.data();
    p.v = v.data();
  }
  return compare_backends(mla_prefill, p, kAttnTol);
}

}  // namespace

DEEPINFER_KERNEL_CASES(mla_decode_cases) {
  struct C {
    const char* name;
    DecodeShape s;
    bool quick;
  };
  const C all[] = {
      {"v3 b=1 s_q=1 h=16 len=1000", {{1000}, 1, 16, 576, 512, 64, true}, true},
      {"odd b=4 s_q=2 h=5 d=40 dv=32 page=8 lens=0,17,64,3",
       {{0, 17, 64, 3}, 2, 5, 40, 32, 8, true},
       true},
      {"s_q=4 > len=2 rows see nothing", {{2, 9}, 4, 3, 24, 16, 4, true}, true},
      {"non-causal s_q=3", {{9, 40}, 3, 2, 24, 16, 8, false}, true},
      {"split-kv b=1 h=4 len=3000", {{3000}, 1, 4, 576, 512, 64, true}, true},
      {"all empty b=3", {{0, 0, 0}, 1, 4, 576, 512, 64, true}, true},
      {"v3 b=4 s_q=2 h=128 len=4096,100,1,64",
       {{4096, 100, 1, 64}, 2, 128, 576, 512, 64, true},
       false},
  };
  for (const C& c : all)
    cases.push_back({"mla_decode", c.name, c.quick, [s = c.s] { return run_decode(s, 17); }});
}

DEEPINFER_KERNEL_CASES(mla_prefill_cases) {
  struct C {
    const char* name;
    PrefillShape s;
    bool quick;
  };
  const C all[] = {
      {"naive b=3 nq=5,0,33 h=3 d=24 dv=16",
       {{5, 0, 33}, {5, 0, 33}, 3, 24, 16, false, true},
       true},
      {"naive prefix nq=7 nk=20 h=2 d=192 dv=128", {{7}, {20}, 2, 192, 128, false, true}, true},
      {"absorbed b=2 nq=70,3 h=16 d=576 dv=512",
       {{70, 3}, {70, 3}, 16, 576, 512, true, true},
       true},
      {"absorbed prefix nq=4 nk=130 h=3 d=40 dv=32", {{4}, {130}, 3, 40, 32, true, true}, true},
      {"naive non-causal b=2", {{6, 9}, {6, 9}, 2, 24, 16, false, false}, true},
      {"naive b=2 nq=512 h=16 d=192 dv=128",
       {{512, 100}, {512, 100}, 16, 192, 128, false, true},
       false},
  };
  for (const C& c : all)
    cases.push_back({"mla_prefill", c.name, c.quick, [s = c.s] { return run_prefill(s, 23); }});
}

}  // namespace deepinfer::kernels::testing
