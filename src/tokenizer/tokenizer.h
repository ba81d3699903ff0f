// HuggingFace tokenizer.json loader and byte-level BPE (docs/architecture.md §6).
//
// Supported (everything else is an Error naming the JSON path and the type):
//   model          BPE: vocab, merges ("a b" or ["a","b"]), unk_token, fuse_unk, ignore_merges;
//                  byte_fallback false; dropout ignored (inference is deterministic).
//   added_tokens   special and non-special; matched before pre-tokenization, leftmost-longest;
//                  `normalized`, lstrip, rstrip, single_word.
//   normalizer     null, NFC/NFD/NFKC/NFKD (ICU), Sequence of those.
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex = the GPT-2 regex), Split (Regex or
//                  String pattern, every behavior, invert), Digits, Sequence — the DeepSeek-V3
//                  shape is Sequence[Split, Split, Split, ByteLevel(use_regex false)].
//   post_processor null, ByteLevel, TemplateProcessing (single), Sequence of those.
//   decoder        ByteLevel, null.
// Regexes run on PCRE2 with PCRE2_UTF | PCRE2_UCP (JIT when available).
//
// Invalid UTF-8 given to encode(): by default each maximal invalid subsequence becomes one
// U+FFFD (the WHATWG/Rust from_utf8_lossy rule) and encoding goes on; InvalidUtf8::error throws
// instead. decode() applies the same replacement to ids whose bytes are not valid UTF-8
// (e.g. a cut multi-byte character); StreamDecoder holds back an incomplete tail instead.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

using TokenId = int32_t;

enum class InvalidUtf8 : uint8_t { replace, error };

struct EncodeOptions {
  // Add the tokens tokenizer_config.json asks for (add_bos_token / add_eos_token) or, without
  // those keys, the tokenizer.json post_processor template (e.g. DeepSeek-V3's BOS).
  bool add_special_tokens = true;
  // Recognise the text of special added tokens in the input. Set false for untrusted text
  // (HF's encode_special_tokens=True): "<｜User｜>" typed by a user is then encoded as plain text.
  bool split_special_tokens = true;
  InvalidUtf8 invalid_utf8 = InvalidUtf8::replace;
  // Optional, one flag per byte of the text (the text must then be valid UTF-8): a special token
  // that overlaps a flagged byte is not recognised, so flagged text (a chat message inside a
  // rendered template) is encoded as plain text while the rest still gets its special tokens.
  std::span<const uint8_t> untrusted = {};
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json) and, if present, tokenizer_config.json in the same folder.
  static Tokenizer from_file(const std::string& path);
  // `dir` holds tokenizer.json (and optionally tokenizer_config.json).
  static Tokenizer from_dir(const std::string& dir);
  // From in-memory JSON text; `config_json` is tokenizer_config.json's text (may be empty).
  // `source` names the origin in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                             std::string_view source = "tokenizer.json");

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  // Ids out of range are an Error. Bytes that are not valid UTF-8 become U+FFFD.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;  // vocab or added token
  std::string id_to_token(
      TokenId id) const;  // the stored token string (byte-level form); Error if unknown
  // The raw bytes `id` decodes to (may be part of a UTF-8 character).
  const std::string& token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;
  size_t vocab_size() const;  // 1 + the largest id (vocab and added tokens)

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  // tokenizer_config.json's bos_token / eos_token strings and chat_template ("" when absent; a
  // list of named templates gives the one named "default").
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& chat_template() const;

  // The normalizer + pre-tokenizer pieces of `text` (no added-token matching), as raw UTF-8
  // (before the byte-level mapping). For tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // DeepSeek-V3 chat format: BOS, system prompts (joined by "\n\n"), then "<｜User｜>"+content,
  // "<｜Assistant｜>"+content+"<｜end▁of▁sentence｜>", ending with "<｜Assistant｜>" when
  // add_generation_prompt. Vocabularies without those tokens get a plain-text format
  // ("User: ...\n\nAssistant:"), with a warning logged once.
  std::string format_chat(std::span<const ChatMessage> messages,
                          bool add_generation_prompt = true) const;
  // The same prompt as ids; message contents are encoded with split_special_tokens = false so
  // a message cannot inject control tokens.
  std::vector<TokenId> encode_chat(std::span<const ChatMessage> messages,
                                   bool add_generation_prompt = true) const;
  bool has_chat_tokens() const;  // the DeepSeek-V3 chat tokens are in the vocabulary

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of ids into text that is always complete UTF-8, for printing token by token:
// bytes of a character split across tokens are held back until the character is complete;
// bytes that can never form a character become U+FFFD.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(TokenId id);  // the text that became complete with this token (maybe "")
  std::string flush();           // whatever is held back, an incomplete tail as U+FFFD

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

// GPT-2 byte <-> unicode mapping, exposed for tests: the UTF-8 of the char byte `b` maps to.
std::string byte_to_unicode_utf8(uint8_t b);

}  // namespace deepinfer
