// MLA attention: parameter checks and dispatch.
#include "kernels/attention.h"

#include <deepinfer/error.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels {

void MlaPrefillParams::validate() const {
  DI_CHECK(num_seqs >= 0 && num_heads > 0,
           "mla_prefill: num_seqs {} must be >= 0 and num_heads {} > 0", num_seqs, num_heads);
  DI_CHECK(head_dim > 0 && head_dim_v > 0, "mla_prefill: head_dim {} and head_dim_v {} must be > 0",
           head_dim, head_dim_v);
  DI_CHECK(softmax_scale > 0.0f && std::isfinite(softmax_scale),
           "mla_prefill: softmax_scale must be finite and > 0, got {} (use mla_softmax_scale)",
           softmax_scale);
  DI_CHECK(cu_seqlens_q && cu_seqlens_k,
           "mla_prefill: cu_seqlens_q / cu_seqlens_k must be set ([B+1] i32)");
  DI_CHECK(!(kv && (k || v)),
           "mla_prefill: set k and v (naive form) or kv (absorbed form), not both");
  DI_CHECK(total_k() == 0 || kv || (k && v),
           "mla_prefill: keys missing: set k and v (naive) or kv (absorbed)");
  DI_CHECK(total_q() == 0 || (q && o), "mla_prefill: q and o must be set");
  DI_CHECK(!absorbed() || head_dim_v <= head_dim,
           "mla_prefill: absorbed form needs head_dim_v {} <= head_dim {}", head_dim_v, head_dim);
  DI_CHECK(cu_seqlens_q[0] == 0 && cu_seqlens_k[0] == 0, "mla_prefill: cu_seqlens must start at 0");
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t nq = cu_seqlens_q[b + 1] - cu_seqlens_q[b],
                  nk = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    DI_CHECK(nq >= 0 && nk >= 0, "mla_prefill: cu_seqlens not ascending at sequence {}", b);
  }
}

void MlaDecodeParams::validate() const {
  DI_CHECK(batch >= 0 && s_q > 0 && num_heads > 0,
           "mla_decode: batch {} >= 0, s_q {} > 0, num_heads {} > 0", batch, s_q, num_heads);
  DI_CHECK(head_dim > 0 && head_dim_v > 0 && head_dim_v <= head_dim,
           "mla_decode: need 0 < head_dim_v ({}) <= head_dim ({})", head_dim_v, head_dim);
  DI_CHECK(page_size > 0, "mla_decode: page_size must be > 0, got {}", page_size);
  DI_CHECK(num_pages >= 0 && max_pages_per_seq >= 0,
           "mla_decode: num_pages {} / max_pages_per_seq {} < 0", num_pages, max_pages_per_seq);
  DI_CHECK(softmax_scale > 0.0f && std::isfinite(softmax_scale),
           "mla_decode: softmax_scale must be finite and > 0, got {} (use mla_softmax_scale)",
           softmax_scale);
  DI_CHECK(batch == 0 || (q && kv_cache && block_table && cache_seqlens && o),
           "mla_decode: q, kv_cache, block_table, cache_seqlens and o must be set");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = cache_seqlens[b];
    DI_CHECK(
        n >= 0 && n <= max_pages_per_seq * page_size,
        "mla_decode: cache_seqlens[{}] = {} does not fit the block table ({} pages of {} tokens)",
        b, n, max_pages_per_seq, page_size);
    for (int64_t j = 0; j < (n + page_size - 1) / page_size; ++j) {
      const int32_t page = block_table[b * max_pages_per_seq + j];
      DI_CHECK(page >= 0 && page < num_pages,
               "mla_decode: block_table[{}][{}] = {} is not a page in [0, {})", b, j, page,
               num_pages);
    }
  }
}

void mla_prefill(const MlaPrefillParams& p) { dispatch(p, host::mla_prefill, cpu::mla_prefill); }
void mla_decode(const MlaDecodeParams& p) { dispatch(p, host::mla_decode, cpu::mla_decode); }

}  // namespace deepinfer::kernels
