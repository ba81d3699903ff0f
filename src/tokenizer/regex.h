// PCRE2 wrapper for the pre-tokenizer patterns: UTF + UCP (\p{L}, \s, \w are Unicode-aware),
// JIT-compiled when the library supports it. Subjects must be valid UTF-8 (the tokenizer
// sanitizes input first), so matching skips PCRE2's UTF check.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer {

class Regex {
 public:
  // `where` names the pattern's origin (e.g. "tokenizer.json: pre_tokenizer.pattern.Regex")
  // in the Error a bad pattern raises. `literal` matches the pattern text as is.
  Regex(std::string_view pattern, std::string_view where, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty, non-overlapping matches of the whole pattern in `subject`, left to right,
  // as [begin, end) byte offsets. Appends to `out`.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;
  // True if the pattern matches at the start of `subject`.
  bool matches_prefix(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace deepinfer
