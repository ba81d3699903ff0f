#include "tokenizer/bpe.h"

#include <deepinfer/error.h>

#include <nlohmann/json.hpp>
#include <queue>

#include "core/check.h"
#include "core/log.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

struct ByteTables {
  std::array<std::string, 256> to_utf8;
  std::unordered_map<char32_t, int> from_cp;
  ByteTables() {
    // bytes_to_unicode() of GPT-2's encoder.py.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append(to_utf8[b], cp);
      from_cp[cp] = b;
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode_table() { return tables().to_utf8; }

int unicode_to_byte(char32_t cp) {
  const auto& m = tables().from_cp;
  const auto it = m.find(cp);
  return it == m.end() ? -1 : it->second;
}

void BpeModel::load(const json& m, const std::string& path) {
  if (!m.is_object()) DI_FAIL("{} must be an object, got {}", path, m.dump().substr(0, 100));
  // Old files omit the type; HF then reads a BPE model if it has merges.
  const std::string type = m.contains("type") && m["type"].is_string()
                               ? m["type"].get<std::string>()
                           : m.contains("merges") ? "BPE"
                                                  : "";
  if (type != "BPE")
    DI_FAIL(
        "{}.type = \"{}\" is not supported: only byte-level BPE models load (WordPiece, "
        "Unigram and WordLevel tokenizers do not).",
        path, type);
  auto str_or_null = [&](const char* key) -> std::optional<std::string> {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    if (!m[key].is_string())
      DI_FAIL("{}.{} must be a string or null, got {}", path, key, m[key].dump());
    return m[key].get<std::string>();
  };
  auto flag = [&](const char* key) {
    if (!m.contains(key) || m[key].is_null()) return false;
    if (!m[key].is_boolean())
      DI_FAIL("{}.{} must be true or false, got {}", path, key, m[key].dump());
    return m[key].get<bool>();
  };
  if (flag("byte_fallback"))
    DI_FAIL(
        "{}.byte_fallback = true (SentencePiece-style <0xNN> tokens) is not supported; this "
        "tokenizer expects byte-level BPE",
        path);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto v = str_or_null(key); v && !v->empty())
      DI_FAIL("{}.{} = \"{}\" is not supported (byte-level BPE uses none)", path, key, *v);
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0.0)
    log_warn("{}.dropout = {} ignored: encoding is deterministic", path,
             m["dropout"].get<double>());
  fuse_unk_ = flag("fuse_unk");
  ignore_merges_ = flag("ignore_merges");

  if (!m.contains("vocab") || !m["vocab"].is_object())
    DI_FAIL("{}.vocab must be an object {{token: id}}", path);
  vocab_.reserve(m["vocab"].size());
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > INT32_MAX)
      DI_FAIL("{}.vocab[\"{}\"] must be a non-negative integer id, got {}", path, tok, idj.dump());
    vocab_.emplace(tok, static_cast<TokenId>(idj.get<int64_t>()));
  }
  if (auto unk = str_or_null("unk_token")) {
    const auto it = vocab_.find(*unk);
    if (it == vocab_.end()) DI_FAIL("{}.unk_token \"{}\" is not in {}.vocab", path, *unk, path);
    unk_ = it->second;
  }
  const auto& tb = tables().to_utf8;
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(tb[b]);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) DI_FAIL("{}.merges must be an array", path);
  const json& merges = m["merges"];
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        DI_FAIL("{}.merges[{}] = \"{}\" must be two tokens separated by one space", path, i, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() &&
               e[1].is_string()) {  // ["a","b"]
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      DI_FAIL("{}.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", path, i, e.dump());
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end())
      DI_FAIL("{}.merges[{}]: token \"{}\" is not in the vocab", path, i,
              ia == vocab_.end() ? a : b);
    if (inew == vocab_.end())
      DI_FAIL("{}.merges[{}]: the merged token \"{}\" is not in the vocab", path, i, a + b);
    // Like HF's map collect, a repeated pair keeps its last rank.
    merges_[pair_key(ia->second, ib->second)] = {static_cast<int32_t>(i), inew->second};
  }
  num_merges_ = merges.size();
}

void BpeModel::initial_symbols(std::string_view piece, bool byte_level,
                               std::vector<TokenId>& syms) const {
  // HF merge_word: a char without a token becomes unk (fused if fuse_unk) or is dropped.
  bool pending_unk = false;
  auto add = [&](TokenId id) {
    if (id >= 0) {
      if (pending_unk) syms.push_back(*unk_), pending_unk = false;
      syms.push_back(id);
    } else if (unk_) {
      if (pending_unk && !fuse_unk_) syms.push_back(*unk_);
      pending_unk = true;
    } else {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
  };
  if (byte_level) {
    for (char c : piece) add(byte_ids_[static_cast<uint8_t>(c)]);
  } else {
    size_t i = 0;
    while (i < piece.size()) {
      const utf8::Step st = utf8::decode_one(piece.substr(i));
      const auto it = vocab_.find(std::string(piece.substr(i, st.len)));
      add(it == vocab_.end() ? -1 : it->second);
      i += st.len;
    }
  }
  if (pending_unk) syms.push_back(*unk_);
}

void BpeModel::merge_word(std::vector<TokenId>& syms) const {
  const size_t n = syms.size();
  if (n < 2) return;
  // HF Word::merge_all: a min-heap of candidate merges by (rank, position); stale entries
  // (a side already merged into something else) are skipped when popped.
  struct Cand {
    int32_t rank;
    int32_t pos;
    TokenId left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto push = [&](int32_t pos) {
    const int32_t nx = next[pos];
    if (nx < 0) return;
    const auto it = merges_.find(pair_key(syms[pos], syms[nx]));
    if (it != merges_.end())
      q.push({it->second.first, pos, syms[pos], syms[nx], it->second.second});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t nx = next[c.pos];
    if (syms[c.pos] != c.left || syms[nx] != c.right) continue;  // stale
    syms[c.pos] = c.merged;
    alive[nx] = 0;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_piece(std::string_view piece, bool byte_level,
                            std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {  // a whole piece that is a token is taken as is
    std::string mapped;
    if (byte_level) {
      const auto& tb = tables().to_utf8;
      for (char c : piece) mapped += tb[static_cast<uint8_t>(c)];
    } else {
      mapped = piece;
    }
    if (const auto it = vocab_.find(mapped); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= BpeLimits::kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (const auto it = cache_.find(std::string(piece)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> syms;
  syms.reserve(piece.size());
  initial_symbols(piece, byte_level, syms);
  merge_word(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cache_.size() >= BpeLimits::kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(syms));
  }
}

}  // namespace deepinfer
