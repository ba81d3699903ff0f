#include "model/kv_cache.h"

#include <deepinfer/error.h>

#include "core/check.h"

namespace deepinfer::model {

void KvCacheConfig::validate() const {
  DI_CHECK(num_layers > 0, "KV cache: num_layers must be positive, got {}", num_layers);
  DI_CHECK(row_dim > 0, "KV cache: row_dim must be positive, got {}", row_dim);
  DI_CHECK(num_pages > 0, "KV cache: num_pages must be positive, got {}", num_pages);
  DI_CHECK(page_size > 0, "KV cache: page_size must be positive, got {}", page_size);
  DI_CHECK(conv_layers >= 0 && (conv_layers == 0 || conv_dim > 0),
           "KV cache: {} conv layers of width {}", conv_layers, conv_dim);
}

PagedKvCache::PagedKvCache(const KvCacheConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  DI_CHECK(cfg_.num_pages < (int64_t(1) << 31), "KV cache: {} pages do not fit int32 page ids",
           cfg_.num_pages);
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    layers_.push_back(Tensor::zeros(DType::bf16, {cfg_.num_pages, cfg_.page_size, cfg_.row_dim}));
  for (int64_t l = 0; l < cfg_.conv_layers; ++l)
    conv_.push_back(Tensor::zeros(DType::bf16, {cfg_.num_pages, cfg_.page_size, cfg_.conv_dim}));
  if (cfg_.token_ids) token_ids_ = Tensor::zeros(DType::i32, {cfg_.num_pages, cfg_.page_size});
  // Stack with page 0 on top so the first sequence gets pages 0, 1, 2, ...
  for (int64_t p = cfg_.num_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

int64_t PagedKvCache::add_sequence() {
  const int64_t id = next_id_++;
  tables_[id];
  return id;
}

const std::vector<int32_t>& PagedKvCache::table(int64_t seq) const {
  auto it = tables_.find(seq);
  DI_CHECK(it != tables_.end(), "KV cache: unknown sequence id {}", seq);
  return it->second;
}

void PagedKvCache::remove_sequence(int64_t seq) {
  auto it = tables_.find(seq);
  DI_CHECK(it != tables_.end(), "KV cache: unknown sequence id {}", seq);
  for (int32_t p : it->second) free_.push_back(p);
  tables_.erase(it);
}

void PagedKvCache::reserve(int64_t seq, int64_t len) {
  auto it = tables_.find(seq);
  DI_CHECK(it != tables_.end(), "KV cache: unknown sequence id {}", seq);
  auto& t = it->second;
  const int64_t need = (len + cfg_.page_size - 1) / cfg_.page_size;
  if (need - int64_t(t.size()) > int64_t(free_.size()))
    DI_FAIL(
        "KV cache full: sequence {} needs {} pages for {} tokens but only {} of {} pages are free; "
        "raise the cache size (--kv-pages) or lower the batch / max tokens",
        seq, need, len, free_.size(), cfg_.num_pages);
  while (int64_t(t.size()) < need) {
    t.push_back(free_.back());
    free_.pop_back();
  }
}

int64_t PagedKvCache::capacity(int64_t seq) const {
  return int64_t(table(seq).size()) * cfg_.page_size;
}

const std::vector<int32_t>& PagedKvCache::block_table(int64_t seq) const { return table(seq); }

int64_t PagedKvCache::slot(int64_t seq, int64_t pos) const {
  const auto& t = table(seq);
  DI_CHECK(pos >= 0 && pos < int64_t(t.size()) * cfg_.page_size,
           "KV cache: position {} of sequence {} beyond its {} reserved tokens", pos, seq,
           int64_t(t.size()) * cfg_.page_size);
  return int64_t(t[size_t(pos / cfg_.page_size)]) * cfg_.page_size + pos % cfg_.page_size;
}

bf16* PagedKvCache::row(int64_t layer, int64_t seq, int64_t pos) {
  DI_CHECK(layer >= 0 && layer < cfg_.num_layers, "KV cache: layer {} out of range [0, {})", layer,
           cfg_.num_layers);
  return layers_[size_t(layer)].data<bf16>() + slot(seq, pos) * cfg_.row_dim;
}

bf16* PagedKvCache::conv_row(int64_t conv_layer, int64_t seq, int64_t pos) {
  DI_CHECK(conv_layer >= 0 && conv_layer < cfg_.conv_layers,
           "KV cache: conv layer {} out of range [0, {})", conv_layer, cfg_.conv_layers);
  return conv_[size_t(conv_layer)].data<bf16>() + slot(seq, pos) * cfg_.conv_dim;
}

int32_t& PagedKvCache::token_id(int64_t seq, int64_t pos) {
  DI_CHECK(cfg_.token_ids, "KV cache: this cache keeps no token ids");
  return token_ids_.data<int32_t>()[slot(seq, pos)];
}

const bf16* PagedKvCache::pages(int64_t layer) const {
  DI_CHECK(layer >= 0 && layer < cfg_.num_layers, "KV cache: layer {} out of range [0, {})", layer,
           cfg_.num_layers);
  return layers_[size_t(layer)].data<bf16>();
}

}  // namespace deepinfer::model
