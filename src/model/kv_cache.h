// Paged latent KV cache for MLA (docs/numerics.md §6, docs/architecture.md §6): per layer, pages of
// 64 tokens, each token one row [c_n (kv_lora) | k_pe (rope)] bf16 — the FlashMLA layout mla_decode
// reads. Sequences share one page pool; a sequence's block table (page ids) is the same for every
// layer. Models with Engram blocks keep two more things per position on the same pages
// (docs/engram.md §3): each Engram layer's short-conv input row, and the canonical token id.
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
  // Engram state per position: conv rows [conv_dim] bf16 for each of conv_layers layers, and
  // one int32 canonical token id (token_ids).
  int64_t conv_layers = 0;
  int64_t conv_dim = 0;
  bool token_ids = false;
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
  // Engram layer `conv_layer`'s conv row [conv_dim] of token `pos` (reserved beforehand).
  bf16* conv_row(int64_t conv_layer, int64_t seq, int64_t pos);
  // The canonical token id stored for token `pos` (config().token_ids).
  int32_t& token_id(int64_t seq, int64_t pos);
  int64_t free_pages() const { return int64_t(free_.size()); }
  int64_t num_sequences() const { return int64_t(tables_.size()); }

 private:
  const std::vector<int32_t>& table(int64_t seq) const;
  int64_t slot(int64_t seq, int64_t pos) const;  // page * page_size + pos % page_size, checked
  KvCacheConfig cfg_;
  std::vector<Tensor> layers_;  // per layer [num_pages, page_size, row_dim] bf16
  std::vector<Tensor> conv_;    // per Engram layer [num_pages, page_size, conv_dim] bf16
  Tensor token_ids_;            // [num_pages, page_size] i32
  std::vector<int32_t> free_;   // free page ids (a stack)
  std::map<int64_t, std::vector<int32_t>> tables_;
  int64_t next_id_ = 0;
};

}  // namespace deepinfer::model
