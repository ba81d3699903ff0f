// Paged latent KV cache for MLA (docs/numerics.md §6, docs/architecture.md §6): per layer, pages of
// 64 tokens, each token one row [c_n (kv_lora) | k_pe (rope)] bf16 — the FlashMLA layout mla_decode
// reads. Sequences share one page pool; a sequence's block table (page ids) is the same for every
// layer.
#pragma once

#include <deepinfer/dtype.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <map>
#include <vector>

namespace deepinfer::model {

struct KvCacheConfig {
  int64_t num_layers = 0;
  int64_t row_dim = 0;     // kv_lora_rank + qk_rope_head_dim (576 for V3)
  int64_t num_pages = 0;   // pages per layer (the pool)
  int64_t page_size = 64;  // tokens per page (kMlaPageSize)
  void validate() const;
};

class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  // A new empty sequence; returns its id.
  int64_t add_sequence();
  // Frees the sequence's pages.
  void remove_sequence(int64_t seq);
  // Grows the sequence's page list so it can hold `len` tokens; an Error naming the sizes if the
  // pool is exhausted (raise the page count).
  void reserve(int64_t seq, int64_t len);
  int64_t capacity(int64_t seq) const;  // tokens the reserved pages hold
  const std::vector<int32_t>& block_table(int64_t seq) const;
  // Row of token `pos` of `seq` in `layer` (reserved beforehand).
  bf16* row(int64_t layer, int64_t seq, int64_t pos);
  const bf16* pages(int64_t layer) const;  // [num_pages, page_size, row_dim]
  int64_t free_pages() const { return int64_t(free_.size()); }
  int64_t num_sequences() const { return int64_t(tables_.size()); }

 private:
  const std::vector<int32_t>& table(int64_t seq) const;
  KvCacheConfig cfg_;
  std::vector<Tensor> layers_;  // per layer [num_pages, page_size, row_dim] bf16
  std::vector<int32_t> free_;   // free page ids (a stack)
  std::map<int64_t, std::vector<int32_t>> tables_;
  int64_t next_id_ = 0;
};

}  // namespace deepinfer::model
