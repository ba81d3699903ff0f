// UTF-8 helpers for the tokenizer: strict decoding with the "maximal subpart" replacement
// rule (WHATWG, Rust's from_utf8_lossy, Python's errors="replace"), so every implementation
// agrees on how many U+FFFD an invalid sequence becomes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::utf8 {

constexpr char32_t kReplacement = 0xFFFD;
constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

enum class Status : uint8_t { ok, invalid, incomplete };

struct Step {
  Status status;
  char32_t cp;  // valid when status == ok
  size_t len;   // bytes consumed: the character, or the maximal invalid subpart (>= 1)
};

// Decodes one character at the start of `s` (non-empty). `incomplete` means `s` ends inside
// a character that more bytes could still complete; len is then s.size().
Step decode_one(std::string_view s);

// Appends `cp` as UTF-8.
void append(std::string& out, char32_t cp);

// True if `s` is entirely valid UTF-8.
bool is_valid(std::string_view s);

// `s` with each maximal invalid subpart (and an incomplete tail) replaced by U+FFFD.
// `num_replaced` (optional) receives the number of replacements.
std::string sanitize(std::string_view s, size_t* num_replaced = nullptr);

// Byte offset of the first invalid byte, or npos.
size_t first_invalid(std::string_view s);

// Unicode White_Space property (Rust's char::is_whitespace), used by lstrip/rstrip.
bool is_whitespace(char32_t cp);

// Length in bytes of the last character of valid UTF-8 `s` (non-empty).
size_t last_char_len(std::string_view s);

}  // namespace deepinfer::utf8
