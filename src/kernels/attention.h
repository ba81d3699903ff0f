// MLA attention (docs/numerics.md §5, §6; docs/architecture.md §5).
//
// Numerics: scores s = (q . k) * softmax_scale, softmax and P.V in fp32 (host: fp64); output
// rounded to bf16 once; lse = ln(sum_t exp(s_t)) (natural log of the scaled logits), fp32.
// Visibility (causal, bottom-right aligned): with n_k keys and n_q queries, query row r sees keys
// t < n_k - n_q + r + 1; non-causal rows see all n_k keys. A row that sees nothing gets o = 0 and
// lse = +inf (FlashMLA).
//
// Forms (algebraically identical, see the reference): naive = per-head K [.., H, 192] and
// V [.., H, 128] materialised from the latent; absorbed = q~ = W_UK^T q_nope (512) and q_pe (64)
// against one shared latent row [c_n (512) | k_pe (64)] per token, V = the first 512 channels
// of that row (MQA with one KV head). The absorbed output is the latent o~ [.., H, 512]; the
// caller applies W_UV per head, then W_o.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

constexpr int64_t kMlaPageSize = 64;  // tokens per page of the latent cache (FlashMLA)

// Prefill over a batch of sequences packed back to back (flash-attn varlen layout), in either
// form: naive (k and v set, kv null) or absorbed (kv set, k and v null).
struct MlaPrefillParams {
  const bf16* q = nullptr;  // [Tq, H, D] bf16 (absorbed: [q~ | q_pe] per head)
  const bf16* k = nullptr;  // naive: [Tk, H, D] bf16
  const bf16* v = nullptr;  // naive: [Tk, H, Dv] bf16
  const bf16* kv =
      nullptr;  // absorbed: [Tk, D] bf16 ([c_n | k_pe], shared by all heads; V = first Dv)
  const int32_t* cu_seqlens_q =
      nullptr;  // [B+1] i32: query rows of sequence b are [cu[b], cu[b+1])
  const int32_t* cu_seqlens_k =
      nullptr;              // [B+1] i32: key rows likewise (n_k >= n_q with a cached prefix)
  bf16* o = nullptr;        // [Tq, H, Dv] bf16 (absorbed: the latent o~)
  float* lse = nullptr;     // [H, Tq] f32 or null
  int64_t num_seqs = 1;     // B
  int64_t num_heads = 0;    // H (query heads)
  int64_t head_dim = 0;     // D: q/k channels (naive 192; absorbed 576)
  int64_t head_dim_v = 0;   // Dv (naive 128; absorbed 512)
  float softmax_scale = 0;  // mla_softmax_scale(192, rope) for DeepSeek, in both forms
  bool causal = true;
  void validate() const;
  bool absorbed() const { return kv != nullptr; }
  int64_t total_q() const { return cu_seqlens_q ? cu_seqlens_q[num_seqs] : 0; }
  int64_t total_k() const { return cu_seqlens_k ? cu_seqlens_k[num_seqs] : 0; }
};

// Decode (and chunked prefill) over the paged latent cache, FlashMLA semantics. Token j of
// sequence b is row j % page_size of page block_table[b][j / page_size]; only the first
// cache_seqlens[b] tokens are used (the s_q new tokens included, already written).
struct MlaDecodeParams {
  const bf16* q = nullptr;               // [B, s_q, H, D] bf16 ([q~ | q_pe] per head)
  const bf16* kv_cache = nullptr;        // [num_pages, page_size, D] bf16 ([c_n | k_pe] per token)
  const int32_t* block_table = nullptr;  // [B, max_pages_per_seq] i32
  const int32_t* cache_seqlens = nullptr;  // [B] i32
  bf16* o = nullptr;                       // [B, s_q, H, Dv] bf16 (latent o~)
  float* lse = nullptr;                    // [B, H, s_q] f32 or null
  int64_t batch = 0;                       // B
  int64_t s_q = 1;                         // query tokens per sequence (> 1: MTP / chunked prefill)
  int64_t num_heads = 0;                   // H
  int64_t head_dim = 576;                  // D
  int64_t head_dim_v = 512;                // Dv: output = the first Dv channels of the cache rows
  int64_t page_size = kMlaPageSize;
  int64_t num_pages = 0;          // pages in kv_cache (block table entries are checked against it)
  int64_t max_pages_per_seq = 0;  // columns of block_table
  float softmax_scale = 0;
  bool causal = true;
  void validate() const;
};

void mla_prefill(const MlaPrefillParams& p);
void mla_decode(const MlaDecodeParams& p);

namespace host {
void mla_prefill(const MlaPrefillParams& p);
void mla_decode(const MlaDecodeParams& p);
}  // namespace host

namespace cpu {
void mla_prefill(const MlaPrefillParams& p);
void mla_decode(const MlaDecodeParams& p);
}  // namespace cpu

template <>
struct OpSpec<MlaPrefillParams> {
  static constexpr const char* name = "mla_prefill";
  static std::string shape(const MlaPrefillParams& p) {
    return fmt::format("{} b={} tq={} tk={} h={} d={} dv={}{}", p.absorbed() ? "absorbed" : "naive",
                       p.num_seqs, p.total_q(), p.total_k(), p.num_heads, p.head_dim, p.head_dim_v,
                       p.causal ? " causal" : "");
  }
  template <class V>
  static void visit(MlaPrefillParams& p, V& v) {
    const int64_t tq = p.total_q(), tk = p.total_k(), H = p.num_heads;
    v.in("q", p.q, tq * H * p.head_dim);
    v.in("k", p.k, tk * H * p.head_dim);
    v.in("v", p.v, tk * H * p.head_dim_v);
    v.in("kv", p.kv, tk * p.head_dim);
    v.in("cu_seqlens_q", p.cu_seqlens_q, p.num_seqs + 1);
    v.in("cu_seqlens_k", p.cu_seqlens_k, p.num_seqs + 1);
    v.out("o", p.o, tq * H * p.head_dim_v);
    v.out("lse", p.lse, H * tq);
  }
};

template <>
struct OpSpec<MlaDecodeParams> {
  static constexpr const char* name = "mla_decode";
  static std::string shape(const MlaDecodeParams& p) {
    return fmt::format("b={} s_q={} h={} d={} dv={} page={}{}", p.batch, p.s_q, p.num_heads,
                       p.head_dim, p.head_dim_v, p.page_size, p.causal ? " causal" : "");
  }
  template <class V>
  static void visit(MlaDecodeParams& p, V& v) {
    const int64_t rows = p.batch * p.s_q * p.num_heads;
    v.in("q", p.q, rows * p.head_dim);
    v.in("kv_cache", p.kv_cache, p.num_pages * p.page_size * p.head_dim);
    v.in("block_table", p.block_table, p.batch * p.max_pages_per_seq);
    v.in("cache_seqlens", p.cache_seqlens, p.batch);
    v.out("o", p.o, rows * p.head_dim_v);
    v.out("lse", p.lse, rows);
  }
};

}  // namespace deepinfer::kernels
