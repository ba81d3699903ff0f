#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <deepinfer/error.h>
#include <pcre2.h>

#include <memory>

#include "core/check.h"

namespace deepinfer {
namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf));
}

// One match-data block per thread, reused across calls (the ovector only needs group 0).
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

// Unicode White_Space, as HF's Oniguruma and Python's `regex` read \s. PCRE2 10.42 also counts
// U+180E (a space before Unicode 6.3), so \s is spelled out. Class content, no brackets.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s (and \S outside character classes) to the White_Space class. \S inside a class
// has no PCRE2 spelling without class subtraction and is left as is.
std::string spell_out_whitespace(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 'Q') {  // \Q...\E quotes literally
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c, out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view where, bool literal)
    : pattern_(pattern), where_(where) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // PCRE2_LITERAL rejects UCP (nothing to classify in a literal).
  const uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  const std::string compiled = literal ? pattern_ : spell_out_whitespace(pattern_);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   opts, &err, &err_off, nullptr);
  if (!code)
    DI_FAIL(
        "{}: cannot compile regex /{}/: {} at offset {}{}. Fix the pattern (PCRE2 syntax, "
        "UTF + UCP mode).",
        where_, pattern_, pcre2_message(err), static_cast<size_t>(err_off),
        compiled == pattern_ ? std::string() : fmt::format(" of its compiled form /{}/", compiled));
  code_ = code;
  uint32_t jit_ok = 0;
  if (pcre2_config(PCRE2_CONFIG_JIT, &jit_ok) >= 0 && jit_ok)
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  pcre2_match_data* md = thread_match_data();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos < subject.size()) {
    const int rc =
        pcre2_match(as_code(code_), s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0)
      DI_FAIL("{}: regex /{}/ failed on a {}-byte piece: {}. Simplify the pattern.", where_,
              pattern_, subject.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one character (empty pieces are dropped anyway, as in HF).
      pos = b + 1;
      while (pos < subject.size() && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

bool Regex::matches_prefix(std::string_view subject) const {
  pcre2_match_data* md = thread_match_data();
  const int rc = pcre2_match(as_code(code_), reinterpret_cast<PCRE2_SPTR>(subject.data()),
                             subject.size(), 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, md, nullptr);
  return rc >= 0;  // 0: matched, ovector too small for the groups
}

}  // namespace deepinfer
