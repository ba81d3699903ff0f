#include "tokenizer/tokenizer.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

// DeepSeek-V3's chat control tokens (U+FF5C fullwidth bar, U+2581 lower block).
constexpr std::string_view kChatBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kChatEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kChatUser = "<｜User｜>";
constexpr std::string_view kChatAssistant = "<｜Assistant｜>";

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool normalized = true;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// Byte trie over added-token contents: the longest token starting at a position.
class AddedTrie {
 public:
  void insert(std::string_view s, int32_t index) {
    int32_t node = 0;
    for (char ch : s) {
      const auto c = static_cast<uint8_t>(ch);
      auto& kids = nodes_[node].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == c; });
      if (it == kids.end()) {
        nodes_.push_back({});
        nodes_[node].kids.emplace_back(c, static_cast<int32_t>(nodes_.size() - 1));
        node = static_cast<int32_t>(nodes_.size() - 1);
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = index;
    first_[static_cast<uint8_t>(s[0])] = true;
  }
  // (token index, length) of the longest token at `pos`, or (-1, 0).
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const {
    if (!first_[static_cast<uint8_t>(s[pos])]) return {-1, 0};
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      const auto c = static_cast<uint8_t>(s[i]);
      const auto& kids = nodes_[node].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == c; });
      if (it == kids.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_len = i + 1 - pos;
    }
    return {best, best_len};
  }
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    int32_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

struct Segment {
  std::string_view text;  // when id < 0
  TokenId id = -1;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    DI_FAIL(
        "cannot open {} '{}': {}. Point --model at a folder holding a HuggingFace "
        "tokenizer.json.",
        what, path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(std::string_view text, std::string_view source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    DI_FAIL("{}: malformed JSON ({}). Re-download or regenerate the file.", source, e.what());
  }
}

// tokenizer_config.json writes a token as "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const json& cfg, const char* key, std::string_view source) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  DI_FAIL("{}: {} must be a string or {{\"content\": string}}, got {}", source, key, v.dump());
}

// chat_template is a string, or a list of {"name", "template"} (the "default" one is used).
std::string config_chat_template(const json& v) {
  if (v.is_null()) return {};
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    for (const json& e : v)
      if (e.is_object() && e.value("name", json()) == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    log_warn("tokenizer_config.json: chat_template lists no template named \"default\"; ignored");
    return {};
  }
  log_warn(
      "tokenizer_config.json: chat_template is neither a string nor a list of named "
      "templates; ignored");
  return {};
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre;
  bool byte_level_decoder = true;

  std::vector<AddedToken> added;
  std::unordered_map<std::string, size_t> added_by_content;
  std::unordered_map<TokenId, size_t> added_by_id;
  AddedTrie raw_trie, norm_trie;     // tokens matched on the raw / the normalized text
  std::unique_ptr<Regex> word_char;  // single_word: is a character alphanumeric

  std::vector<std::string> tokens;  // id -> stored token string
  std::vector<std::string> bytes;   // id -> decoded bytes
  std::vector<uint8_t> known, special;

  std::vector<TokenId> prefix, suffix;  // add_special_tokens
  std::optional<TokenId> bos, eos;
  std::string bos_text, eos_text;
  std::string chat_template;

  bool chat_tokens = false;
  mutable std::atomic<bool> warned_chat{false};
  mutable std::atomic<bool> warned_dropped{false};

  void load(const json& j, const json* cfg);
  void load_added(const json& arr);
  void load_post_processor(const json& j, const std::string& path, bool& seen_sequence);
  void build_tables();
  void split_added(std::string_view text, const AddedTrie& trie, bool split_special,
                   const uint8_t* untrusted, std::vector<Segment>& out) const;
  void encode_text(std::string_view text, bool split_special, std::vector<TokenId>& out,
                   const uint8_t* untrusted = nullptr) const;
  std::optional<TokenId> lookup(std::string_view tok) const;
};

std::optional<TokenId> Tokenizer::Impl::lookup(std::string_view tok) const {
  if (const auto it = added_by_content.find(std::string(tok)); it != added_by_content.end())
    return added[it->second].id;
  if (const auto it = model.vocab().find(std::string(tok)); it != model.vocab().end())
    return it->second;
  return std::nullopt;
}

void Tokenizer::Impl::load(const json& j, const json* cfg) {
  if (!j.is_object()) DI_FAIL("{}: the top level must be a JSON object", source);
  if (!j.contains("model"))
    DI_FAIL("{}: no \"model\" section; this is not a tokenizers tokenizer.json", source);
  model.load(j["model"], source + ": model");
  normalizer = Normalizer::from_json(j.value("normalizer", json()), source + ": normalizer");
  pre = PreTokenizer::from_json(j.value("pre_tokenizer", json()), source + ": pre_tokenizer");

  const json dec = j.value("decoder", json());
  if (dec.is_null()) {
    byte_level_decoder = false;  // HF joins the tokens with spaces
  } else if (dec.is_object() && dec.value("type", "") == "ByteLevel") {
    byte_level_decoder = true;
  } else {
    DI_FAIL(
        "{}: decoder.type = {} is not supported (supported decoders: ByteLevel, null)", source,
        dec.is_object() && dec.contains("type") ? dec["type"].dump() : dec.dump().substr(0, 100));
  }

  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) load_added(j["added_tokens"]);
  build_tables();

  bool seen_sequence = false;
  load_post_processor(j.value("post_processor", json()), source + ": post_processor",
                      seen_sequence);

  if (cfg) {
    const std::string cfg_src = "tokenizer_config.json";
    for (auto [key, dst_text, dst_id] :
         {std::tuple{"bos_token", &bos_text, &bos}, std::tuple{"eos_token", &eos_text, &eos}}) {
      if (auto t = config_token(*cfg, key, cfg_src)) {
        *dst_text = *t;
        *dst_id = lookup(*t);
        if (!*dst_id)
          log_warn("{}: {} \"{}\" is not a token of {}; ignored", cfg_src, key, *t, source);
      }
    }
    if (cfg->contains("chat_template"))
      chat_template = config_chat_template((*cfg)["chat_template"]);
    // add_bos_token / add_eos_token decide, as transformers' Llama-style fast tokenizers do.
    const bool has_add_bos = cfg->contains("add_bos_token") && (*cfg)["add_bos_token"].is_boolean();
    const bool has_add_eos = cfg->contains("add_eos_token") && (*cfg)["add_eos_token"].is_boolean();
    if (has_add_bos || has_add_eos) {
      prefix.clear(), suffix.clear();
      if (has_add_bos && (*cfg)["add_bos_token"].get<bool>()) {
        if (!bos) DI_FAIL("{}: add_bos_token is true but bos_token is missing or unknown", cfg_src);
        prefix.push_back(*bos);
      }
      if (has_add_eos && (*cfg)["add_eos_token"].get<bool>()) {
        if (!eos) DI_FAIL("{}: add_eos_token is true but eos_token is missing or unknown", cfg_src);
        suffix.push_back(*eos);
      }
    }
  }
  chat_tokens = lookup(kChatUser) && lookup(kChatAssistant) && lookup(kChatEos);
  word_char = std::make_unique<Regex>(R"([\p{Alphabetic}\p{N}])", "single_word character class");
}

void Tokenizer::Impl::load_added(const json& arr) {
  const std::string path = source + ": added_tokens";
  if (!arr.is_array()) DI_FAIL("{} must be an array", path);
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const std::string p = fmt::format("{}[{}]", path, i);
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
        e["id"].get<int64_t>() < 0 || !e.contains("content") || !e["content"].is_string())
      DI_FAIL(
          "{} must be an object with a non-negative integer \"id\" and a string \"content\", got "
          "{}",
          p, e.dump().substr(0, 200));
    AddedToken t;
    t.id = static_cast<TokenId>(e["id"].get<int64_t>());
    t.content = e["content"].get<std::string>();
    if (t.content.empty()) DI_FAIL("{}: empty \"content\"", p);
    if (!utf8::is_valid(t.content)) DI_FAIL("{}: \"content\" is not valid UTF-8", p);
    auto flag = [&](const char* key, bool def) {
      if (!e.contains(key) || e[key].is_null()) return def;
      if (!e[key].is_boolean()) DI_FAIL("{}.{} must be true or false", p, key);
      return e[key].get<bool>();
    };
    t.special = flag("special", false);
    t.normalized = flag("normalized", !t.special);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.single_word = flag("single_word", false);
    if (added_by_content.count(t.content)) continue;  // HF keeps the first
    added_by_content[t.content] = added.size();
    added_by_id[t.id] = added.size();
    added.push_back(std::move(t));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.normalized && !normalizer.is_identity()) {
      norm_trie.insert(normalizer.apply(t.content), static_cast<int32_t>(i));
    } else if (t.normalized) {
      norm_trie.insert(t.content, static_cast<int32_t>(i));
    } else {
      raw_trie.insert(t.content, static_cast<int32_t>(i));
    }
  }
}

void Tokenizer::Impl::build_tables() {
  size_t n = 0;
  for (const auto& [tok, id] : model.vocab()) n = std::max(n, static_cast<size_t>(id) + 1);
  for (const AddedToken& t : added) n = std::max(n, static_cast<size_t>(t.id) + 1);
  tokens.assign(n, {});
  bytes.assign(n, {});
  known.assign(n, 0);
  special.assign(n, 0);
  for (const auto& [tok, id] : model.vocab()) tokens[id] = tok, known[id] = 1;
  for (const AddedToken& t : added)
    tokens[t.id] = t.content, known[t.id] = 1, special[t.id] = t.special;
  for (size_t id = 0; id < n; ++id) {
    if (!known[id]) continue;
    const std::string& tok = tokens[id];
    if (!byte_level_decoder) {
      bytes[id] = tok;
      continue;
    }
    // HF ByteLevel decoder: map every char back to its byte; a token with a char outside
    // the map (e.g. "<｜User｜>") decodes to its own UTF-8.
    std::string out;
    bool all_mapped = utf8::is_valid(tok);
    for (size_t i = 0; all_mapped && i < tok.size();) {
      const utf8::Step st = utf8::decode_one(std::string_view(tok).substr(i));
      const int b = unicode_to_byte(st.cp);
      if (b < 0)
        all_mapped = false;
      else
        out.push_back(static_cast<char>(b));
      i += st.len;
    }
    bytes[id] = all_mapped ? out : tok;
  }
}

void Tokenizer::Impl::load_post_processor(const json& j, const std::string& path,
                                          bool& seen_sequence) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    DI_FAIL("{} must be null or an object with a string \"type\"", path);
  const std::string type = j["type"].get<std::string>();
  auto id_of = [&](const json& name, const std::string& where) {
    if (!name.is_string()) DI_FAIL("{} must be a token string, got {}", where, name.dump());
    const auto id = lookup(name.get<std::string>());
    if (!id) DI_FAIL("{}: \"{}\" is not a token", where, name.get<std::string>());
    return *id;
  };
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      DI_FAIL("{}: Sequence needs an array \"processors\"", path);
    for (size_t i = 0; i < j["processors"].size(); ++i)
      load_post_processor(j["processors"][i], fmt::format("{}.processors[{}]", path, i),
                          seen_sequence);
    return;
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array())
      DI_FAIL("{}: TemplateProcessing needs \"single\"", path);
    const json& specials = j.value("special_tokens", json::object());
    bool after = false;
    for (size_t i = 0; i < j["single"].size(); ++i) {
      const json& item = j["single"][i];
      const std::string p = fmt::format("{}.single[{}]", path, i);
      if (item.contains("Sequence")) {
        after = true;
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        std::vector<TokenId> ids;
        if (specials.contains(name) && specials[name].contains("ids")) {
          for (const json& v : specials[name]["ids"]) ids.push_back(v.get<TokenId>());
        } else {
          ids.push_back(id_of(item["SpecialToken"]["id"], p));
        }
        auto& dst = after ? suffix : prefix;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        DI_FAIL("{} must be {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}, got {}", p,
                item.dump());
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"})
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2)
        DI_FAIL("{}.{} must be [token, id]", path, key);
    prefix.push_back(j["cls"][1].get<TokenId>());
    suffix.push_back(j["sep"][1].get<TokenId>());
    return;
  }
  DI_FAIL(
      "{}.type = \"{}\" is not supported (supported post-processors: null, ByteLevel, "
      "TemplateProcessing, RobertaProcessing, BertProcessing, Sequence)",
      path, type);
}

// HF AddedVocabulary::find_matches: leftmost-longest tokens, with lstrip/rstrip/single_word.
void Tokenizer::Impl::split_added(std::string_view text, const AddedTrie& trie, bool split_special,
                                  const uint8_t* untrusted, std::vector<Segment>& out) const {
  if (trie.empty()) {
    out.push_back({text, -1});
    return;
  }
  auto is_word_char = [&](std::string_view ch) { return word_char->matches_prefix(ch); };
  size_t start_offset = 0, pos = 0;
  while (pos < text.size()) {
    const auto [index, len] = trie.longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[static_cast<size_t>(index)];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search goes on after this match, used or not
    if (t.special && !split_special) continue;
    if (t.special && untrusted &&
        std::any_of(untrusted + start, untrusted + stop, [](uint8_t f) { return f != 0; }))
      continue;
    if (t.single_word) {
      const bool start_ok =
          start == 0 ||
          !is_word_char(text.substr(start - utf8::last_char_len(text.substr(0, start))));
      const bool stop_ok = stop == text.size() || !is_word_char(text.substr(stop));
      if (!start_ok || !stop_ok) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t k = utf8::last_char_len(text.substr(0, s));
        if (!utf8::is_whitespace(utf8::decode_one(text.substr(s - k)).cp)) break;
        s -= k;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        const utf8::Step st = utf8::decode_one(text.substr(stop));
        if (!utf8::is_whitespace(st.cp)) break;
        stop += st.len;
      }
      pos = stop;
    }
    if (start_offset < start) out.push_back({text.substr(start_offset, start - start_offset), -1});
    out.push_back({{}, t.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

void Tokenizer::Impl::encode_text(std::string_view text, bool split_special,
                                  std::vector<TokenId>& out, const uint8_t* untrusted) const {
  std::vector<Segment> raw_segs, norm_segs;
  std::vector<std::string> pieces;
  split_added(text, raw_trie, split_special, untrusted, raw_segs);
  for (const Segment& rs : raw_segs) {
    if (rs.id >= 0) {
      out.push_back(rs.id);
      continue;
    }
    if (rs.text.empty()) continue;
    const std::string normalized =
        normalizer.is_identity() ? std::string() : normalizer.apply(rs.text);
    const std::string_view nt = normalizer.is_identity() ? rs.text : std::string_view(normalized);
    norm_segs.clear();
    // The flags of this segment: where it lies in `text` (the normalizer may move bytes: then a
    // segment with any flagged byte gets no special tokens at all).
    const uint8_t* seg_flags = nullptr;
    bool seg_special = split_special;
    if (untrusted) {
      const uint8_t* f = untrusted + (rs.text.data() - text.data());
      if (normalizer.is_identity())
        seg_flags = f;
      else if (std::any_of(f, f + rs.text.size(), [](uint8_t x) { return x != 0; }))
        seg_special = false;
    }
    split_added(nt, norm_trie, seg_special, seg_flags, norm_segs);
    for (const Segment& ns : norm_segs) {
      if (ns.id >= 0) {
        out.push_back(ns.id);
        continue;
      }
      pieces.clear();
      pre.apply(ns.text, pieces);
      for (const std::string& p : pieces) model.encode_piece(p, pre.byte_level(), out);
    }
  }
  if (model.num_dropped() > 0 && !warned_dropped.exchange(true))
    log_warn(
        "{}: some characters have no token and the model has no unk_token; they were dropped "
        "(as HF tokenizers does). Round trips of such text are lossy.",
        source);
}

// ---- Tokenizer -------------------------------------------------------------------------------

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               std::string_view source) {
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  const json j = parse_json(tokenizer_json, source);
  json cfg;
  if (!config_json.empty()) {
    cfg = parse_json(config_json, "tokenizer_config.json");
    if (!cfg.is_object()) DI_FAIL("tokenizer_config.json: the top level must be a JSON object");
  }
  impl->load(j, config_json.empty() ? nullptr : &cfg);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  const std::string text = read_file(path, "tokenizer file");
  const auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::string cfg;
  if (std::filesystem::exists(cfg_path)) cfg = read_file(cfg_path.string(), "tokenizer config");
  return from_json(text, cfg, path);
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  return from_file((std::filesystem::path(dir) / "tokenizer.json").string());
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  if (!opt.untrusted.empty())
    DI_CHECK(opt.untrusted.size() == text.size(), "untrusted flags for {} bytes, text of {}",
             opt.untrusted.size(), text.size());
  std::string clean;
  if (const size_t bad = utf8::first_invalid(text); bad != std::string_view::npos) {
    if (!opt.untrusted.empty())  // replacing bytes would move what the flags point at
      DI_FAIL("tokenizer: text with untrusted flags must be valid UTF-8 (bad byte at offset {})",
              bad);
    if (opt.invalid_utf8 == InvalidUtf8::error)
      DI_FAIL(
          "tokenizer: the input is not valid UTF-8 (first bad byte 0x{:02X} at offset {} of {}). "
          "Convert it to UTF-8 first.",
          static_cast<uint8_t>(text[bad]), bad, text.size());
    clean = utf8::sanitize(text);
    text = clean;
  }
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (opt.add_special_tokens) out.insert(out.end(), impl_->prefix.begin(), impl_->prefix.end());
  impl_->encode_text(text, opt.split_special_tokens, out,
                     opt.untrusted.empty() ? nullptr : opt.untrusted.data());
  if (opt.add_special_tokens) out.insert(out.end(), impl_->suffix.begin(), impl_->suffix.end());
  return out;
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size() || !impl_->known[id])
    DI_FAIL(
        "tokenizer: token id {} is not in the vocabulary (size {}); the model and tokenizer may "
        "not match",
        id, impl_->tokens.size());
  return impl_->bytes[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string raw;
  bool first = true;
  for (TokenId id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special_tokens && impl_->special[id]) continue;
    if (!impl_->byte_level_decoder && !first) raw.push_back(' ');
    raw += b;
    first = false;
  }
  return utf8::is_valid(raw) ? raw : utf8::sanitize(raw);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->lookup(token);
}

std::string Tokenizer::id_to_token(TokenId id) const {
  token_bytes(id);  // range check
  return impl_->tokens[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::has_chat_tokens() const { return impl_->chat_tokens; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_text; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_text; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  const std::string clean = utf8::sanitize(text);
  const std::string norm = impl_->normalizer.apply(clean);
  std::vector<std::string> out;
  impl_->pre.apply(norm, out);
  return out;
}

namespace {

struct ChatParts {
  std::string system;  // system prompts joined by "\n\n"
  bool has_system = false;
};

ChatParts collect_system(std::span<const ChatMessage> messages) {
  ChatParts p;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (p.has_system) p.system += "\n\n";
    p.system += m.content;
    p.has_system = true;
  }
  return p;
}

void check_role(const ChatMessage& m) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant")
    DI_FAIL("chat: message role \"{}\" is not supported (use system, user or assistant)", m.role);
}

}  // namespace

std::string Tokenizer::format_chat(std::span<const ChatMessage> messages,
                                   bool add_generation_prompt) const {
  const ChatParts sys = collect_system(messages);
  std::string out;
  if (impl_->chat_tokens) {
    out += impl_->bos ? impl_->bos_text
                      : (impl_->lookup(kChatBos) ? std::string(kChatBos) : std::string());
    out += sys.system;
    for (const ChatMessage& m : messages) {
      check_role(m);
      if (m.role == "user") out += std::string(kChatUser) + m.content;
      if (m.role == "assistant")
        out += std::string(kChatAssistant) + m.content + std::string(kChatEos);
    }
    if (add_generation_prompt) out += kChatAssistant;
    return out;
  }
  if (!impl_->warned_chat.exchange(true))
    log_warn(
        "{}: the vocabulary lacks DeepSeek-V3's chat tokens (<｜User｜>, <｜Assistant｜>); "
        "using a plain-text chat format",
        impl_->source);
  if (sys.has_system) out += sys.system + "\n\n";
  for (const ChatMessage& m : messages) {
    check_role(m);
    if (m.role == "user") out += "User: " + m.content + "\n\n";
    if (m.role == "assistant") out += "Assistant: " + m.content + "\n\n";
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

std::vector<TokenId> Tokenizer::encode_chat(std::span<const ChatMessage> messages,
                                            bool add_generation_prompt) const {
  const Impl& im = *impl_;
  std::vector<TokenId> out;
  auto text = [&](std::string_view s) {  // untrusted content: special tokens stay text
    const std::string clean = utf8::sanitize(s);
    im.encode_text(clean, /*split_special=*/false, out);
  };
  if (!im.chat_tokens) {
    if (im.bos) out.push_back(*im.bos);
    text(format_chat(messages, add_generation_prompt));
    return out;
  }
  if (im.bos)
    out.push_back(*im.bos);
  else if (auto b = im.lookup(kChatBos))
    out.push_back(*b);
  const ChatParts sys = collect_system(messages);
  text(sys.system);
  const TokenId user = *im.lookup(kChatUser), assistant = *im.lookup(kChatAssistant),
                end = *im.lookup(kChatEos);
  for (const ChatMessage& m : messages) {
    check_role(m);
    if (m.role == "user") out.push_back(user), text(m.content);
    if (m.role == "assistant") out.push_back(assistant), text(m.content), out.push_back(end);
  }
  if (add_generation_prompt) out.push_back(assistant);
  return out;
}

// ---- StreamDecoder ---------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(TokenId id) {
  const std::string& b = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += b;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const utf8::Step st = utf8::decode_one(std::string_view(pending_).substr(i));
    if (st.status == utf8::Status::incomplete) break;  // wait for the next token
    if (st.status == utf8::Status::ok)
      out.append(pending_, i, st.len);
    else
      out.append(utf8::kReplacementUtf8);
    i += st.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? std::string() : utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

std::string byte_to_unicode_utf8(uint8_t b) { return byte_to_unicode_table()[b]; }

}  // namespace deepinfer
