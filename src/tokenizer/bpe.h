// The BPE model of tokenizer.json: vocab, ranked merges, a word cache.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100.. in order.
const std::array<std::string, 256>& byte_to_unicode_table();  // UTF-8 of each byte's char
int unicode_to_byte(char32_t cp);                             // the byte, or -1

struct BpeLimits {
  static constexpr size_t kMaxCachedPieceBytes = 128;  // longer pieces are rare: not cached
  static constexpr size_t kMaxCacheEntries = 1 << 18;  // the cache is cleared when this full
};

class BpeModel {
 public:
  // `m` is tokenizer.json's "model"; `path` its JSON path for errors.
  void load(const nlohmann::json& m, const std::string& path);

  // Appends the ids of one pre-tokenized piece (raw UTF-8). With `byte_level`, the piece's
  // bytes go through the GPT-2 byte->char map first.
  void encode_piece(std::string_view piece, bool byte_level, std::vector<TokenId>& out) const;

  const std::unordered_map<std::string, TokenId>& vocab() const { return vocab_; }
  size_t num_merges() const { return num_merges_; }
  size_t num_dropped() const { return dropped_.load(); }  // chars with no token and no unk

 private:
  void merge_word(std::vector<TokenId>& syms) const;
  void initial_symbols(std::string_view piece, bool byte_level, std::vector<TokenId>& syms) const;

  std::unordered_map<std::string, TokenId> vocab_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges_;
  std::array<TokenId, 256> byte_ids_{};  // id of each byte's mapped char, -1 when absent
  std::optional<TokenId> unk_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  size_t num_merges_ = 0;

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
  mutable std::atomic<size_t> dropped_{0};
};

}  // namespace deepinfer
