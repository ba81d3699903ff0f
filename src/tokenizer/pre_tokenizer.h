// Pre-tokenizers of tokenizer.json (ByteLevel, Split, Digits, Sequence), HF semantics: each
// step splits every piece produced by the previous one; empty pieces are dropped.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace deepinfer {

// HF SplitDelimiterBehavior: what happens to the text a pattern matches.
enum class SplitBehavior : uint8_t {
  removed,
  isolated,
  merged_with_previous,
  merged_with_next,
  contiguous
};

struct PreTokenizerStep {
  enum class Kind : uint8_t { split, byte_level };
  Kind kind = Kind::split;
  std::shared_ptr<const Regex> regex;  // split; byte_level with use_regex (the GPT-2 regex)
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // byte_level
};

class PreTokenizer {
 public:
  // `j` is the "pre_tokenizer" value (may be null); `path` is its JSON path for errors.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& path);

  // Splits `text` (valid UTF-8) into pieces, appended to `out` (raw UTF-8, before any byte
  // mapping).
  void apply(std::string_view text, std::vector<std::string>& out) const;

  // A ByteLevel step is present: BPE sees the pieces' bytes through the GPT-2 byte->char map.
  bool byte_level() const { return byte_level_; }

 private:
  void parse(const nlohmann::json& j, const std::string& path);
  std::vector<PreTokenizerStep> steps_;
  bool byte_level_ = false;
};

// The regex of HF's ByteLevel pre-tokenizer (GPT-2's).
extern const char* const kGpt2Pattern;

}  // namespace deepinfer
