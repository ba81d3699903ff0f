#include "tokenizer/utf8.h"

namespace deepinfer::utf8 {

Step decode_one(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Status::ok, b0, 1};
  size_t need;                   // continuation bytes
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {Status::invalid, 0, 1};
  }
  for (size_t i = 1; i <= need; ++i) {
    if (i >= n) return {Status::incomplete, 0, n};
    const uint8_t b = p[i];
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Status::invalid, 0, i};  // the maximal subpart ends before b
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Status::ok, cp, need + 1};
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {  // ASCII fast path
      ++i;
      continue;
    }
    const Step st = decode_one(s.substr(i));
    if (st.status != Status::ok) return i;
    i += st.len;
  }
  return std::string_view::npos;
}

bool is_valid(std::string_view s) { return first_invalid(s) == std::string_view::npos; }

std::string sanitize(std::string_view s, size_t* num_replaced) {
  size_t replaced = 0;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    const Step st = decode_one(s.substr(i));
    if (st.status == Status::ok) {
      out.append(s.substr(i, st.len));
    } else {
      out.append(kReplacementUtf8);
      ++replaced;
    }
    i += st.len;
  }
  if (num_replaced) *num_replaced = replaced;
  return out;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

size_t last_char_len(std::string_view s) {
  size_t k = 1;
  while (k < s.size() && k < 4 && (static_cast<uint8_t>(s[s.size() - k]) & 0xC0) == 0x80) ++k;
  return k;
}

}  // namespace deepinfer::utf8
