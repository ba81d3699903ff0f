// A direct kernel-call driver for the diff tests: one "pass" calls each op under test twice
// (call indices 0 and 1) under layer tags, on small random inputs, with the dispatcher's backend.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/engram.h"
#include "kernels/gemm.h"
#include "kernels/mhc.h"
#include "kernels/norm.h"
#include "kernels/recorder.h"
#include "kernels/router.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels::diff::testing {

namespace kt = deepinfer::kernels::testing;

// The ops the driver calls; each twice per pass.
inline const char* const kDriverOps[] = {"rms_norm",   "gemm_fp8",    "router",
                                         "mla_decode", "engram_hash", "engram_gate",
                                         "mhc_pre",    "mhc_post",    "mhc_head"};

inline void run_driver_pass(uint64_t seed = 1) {
  reset_call_counters();
  for (int layer = 0; layer < 2; ++layer) {
    KernelTag lt("layer" + std::to_string(layer));
    const uint64_t s = seed * 100 + uint64_t(layer);
    {  // RMSNorm [T=4, H=256] bf16
      KernelTag t("attn_norm");
      const int64_t T = 4, H = 256;
      const auto x = kt::random_bf16(T * H, s + 1, -2.0f, 2.0f);
      const auto w = kt::random_bf16(H, s + 2, 0.5f, 1.5f);
      std::vector<bf16> y(size_t(T * H));
      RmsNormParams p;
      p.x = x.data();
      p.w = w.data();
      p.y = y.data();
      p.num_tokens = T;
      p.hidden = H;
      rms_norm(p);
    }
    {  // fp8 GEMM [4, 256] x [256, 256]^T -> bf16
      KernelTag t("q_proj");
      const int64_t M = 4, N = 256, K = 256;
      const auto a = kt::random_fp8_activations(M, K, s + 3);
      const auto w = kt::random_fp8_weights(N, K, s + 4);
      std::vector<bf16> out(size_t(M * N));
      GemmFp8Params p;
      p.a = a.q.data();
      p.a_scales = a.scales.data();
      p.w = w.q.data();
      p.w_scales = w.scales.data();
      p.out = out.data();
      p.m = M;
      p.n = N;
      p.k = K;
      gemm_fp8(p);
    }
    {  // router noaux_tc: T=4 tokens, E=16 experts, K=4, 4 groups keep 2
      KernelTag t("moe.router");
      const int64_t T = 4, E = 16, K = 4;
      const auto logits = kt::random_f32(T * E, s + 5, -3.0f, 3.0f);
      const auto bias = kt::random_f32(E, s + 6, -0.1f, 0.1f);
      std::vector<int64_t> idx(size_t(T * K));
      std::vector<float> wts(size_t(T * K));
      std::vector<float> margins(static_cast<size_t>(T));
      RouterParams p;
      p.logits = logits.data();
      p.bias = bias.data();
      p.topk_idx = idx.data();
      p.topk_weights = wts.data();
      p.margins = margins.data();
      p.num_tokens = T;
      p.num_experts = E;
      p.top_k = K;
      p.n_group = 4;
      p.topk_group = 2;
      p.routed_scaling_factor = 2.5f;
      router(p);
    }
    {  // MLA decode: B=2 sequences (70 and 9 cached tokens), H=4 heads, D=576, Dv=512
      KernelTag t("attn.decode");
      const int64_t B = 2, H = 4, D = 576, Dv = 512, P = kMlaPageSize, pages_per_seq = 2;
      const int64_t num_pages = B * pages_per_seq;
      const auto q = kt::random_bf16(B * H * D, s + 7);
      const auto kv = kt::random_bf16(num_pages * P * D, s + 8);
      const std::vector<int32_t> table{2, 0, 1, 3};
      const std::vector<int32_t> seqlens{70, 9};
      std::vector<bf16> o(size_t(B * H * Dv));
      std::vector<float> lse(size_t(B * H));
      MlaDecodeParams p;
      p.q = q.data();
      p.kv_cache = kv.data();
      p.block_table = table.data();
      p.cache_seqlens = seqlens.data();
      p.o = o.data();
      p.lse = lse.data();
      p.batch = B;
      p.num_heads = H;
      p.head_dim = D;
      p.head_dim_v = Dv;
      p.num_pages = num_pages;
      p.max_pages_per_seq = pages_per_seq;
      p.softmax_scale = 0.1f;
      mla_decode(p);
    }
    {  // Engram hash of T=6 tokens (2 layers, orders 2-3, 2 heads each) and the gate (hc=4, d=64)
      KernelTag t("engram");
      const int64_t T = 6, hc = 4, d = 64;
      const EngramHashTables tab = engram_hash_tables({.layer_ids = {0, 3},
                                                       .max_ngram_size = 3,
                                                       .n_head_per_ngram = 2,
                                                       .engram_vocab_size = {97, 89},
                                                       .vocab_size = 50});
      std::vector<int32_t> ids(size_t(T * 3)), rows(size_t(2 * T * 4));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(kt::hash64(s, i) % 50);
      engram_hash({.ngram_ids = ids.data(),
                   .multipliers = tab.multipliers.data(),
                   .vocab_sizes = tab.vocab_sizes.data(),
                   .offsets = tab.offsets.data(),
                   .out = rows.data(),
                   .num_tokens = T,
                   .num_layers = 2,
                   .max_ngram = 3,
                   .heads_per_ngram = 2});
      const auto x = kt::random_bf16(T * hc * d, s + 9), k = kt::random_bf16(T * hc * d, s + 10),
                 v = kt::random_bf16(T * d, s + 11);
      const auto w = kt::random_f32(hc * d, s + 12, 0.5f, 1.5f);
      std::vector<bf16> out(size_t(T * hc * d));
      engram_gate({.x = x.data(),
                   .k = k.data(),
                   .v = v.data(),
                   .w_fused = w.data(),
                   .out = out.data(),
                   .num_tokens = T,
                   .hc = hc,
                   .dim = d});
    }
    {  // mHC pre / post / head: T=3 tokens, hc=4, d=64
      KernelTag t("mhc");
      const int64_t T = 3, hc = 4, d = 64;
      const auto r = kt::random_bf16(T * hc * d, s + 13), y = kt::random_bf16(T * d, s + 14);
      const auto fn = kt::random_f32(24 * hc * d, s + 15), base = kt::random_f32(24, s + 16);
      const std::vector<float> scale = {0.1f, 0.2f, 0.3f};
      std::vector<bf16> x(size_t(T * d)), r2(size_t(T * hc * d)), head(size_t(T * d));
      std::vector<float> post(size_t(T * hc)), comb(size_t(T * hc * hc));
      mhc_pre({.residual = r.data(),
               .fn = fn.data(),
               .scale = scale.data(),
               .base = base.data(),
               .x = x.data(),
               .post = post.data(),
               .comb = comb.data(),
               .num_tokens = T,
               .hc = hc,
               .dim = d});
      mhc_post({.y = y.data(),
                .residual = r.data(),
                .post = post.data(),
                .comb = comb.data(),
                .out = r2.data(),
                .num_tokens = T,
                .hc = hc,
                .dim = d});
      mhc_head({.residual = r2.data(),
                .fn = fn.data(),
                .scale = scale.data(),
                .base = base.data(),
                .out = head.data(),
                .num_tokens = T,
                .hc = hc,
                .dim = d});
    }
  }
}

}  // namespace deepinfer::kernels::diff::testing
