// Engram's tokenizer compression (docs/engram.md §1.2), with utf8proc for the Unicode steps.
#include "tokenizer/compression.h"

#include <deepinfer/error.h>
#include <utf8proc.h>

#include <cstdlib>
#include <unordered_map>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

// utf8proc_map over `s` (valid UTF-8, may hold NUL bytes) with `options`.
std::string map_utf8(std::string_view s, int options, const char* what) {
  if (s.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                   &out, utf8proc_option_t(options));
  if (n < 0) DI_FAIL("engram compression: {} failed: {}", what, utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return r;
}

bool is_space_tab_crlf(char32_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

std::string engram_normalize(std::string_view text) {
  const std::string nfkc =
      map_utf8(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC");
  const std::string stripped =
      map_utf8(nfkc, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_STRIPMARK, "NFD");
  // Lowercase per code point, and collapse each run of space/tab/CR/LF into one space.
  std::u32string cps;
  for (std::string_view rest = stripped; !rest.empty();) {
    const utf8::Step st = utf8::decode_one(rest);
    DI_CHECK(st.status == utf8::Status::ok, "utf8proc returned invalid UTF-8");
    rest.remove_prefix(st.len);
    if (is_space_tab_crlf(st.cp)) {
      cps.push_back(U' ');
      while (!rest.empty()) {  // the rest of the run
        const utf8::Step nx = utf8::decode_one(rest);
        if (nx.status != utf8::Status::ok || !is_space_tab_crlf(nx.cp)) break;
        rest.remove_prefix(nx.len);
      }
      continue;
    }
    cps.push_back(char32_t(utf8proc_tolower(utf8proc_int32_t(st.cp))));
  }
  if (!(cps.size() == 1 && cps[0] == U' ')) {  // a lone space is kept as it is
    size_t b = 0, e = cps.size();
    while (b < e && utf8::is_whitespace(cps[b])) ++b;
    while (e > b && utf8::is_whitespace(cps[e - 1])) --e;
    cps = cps.substr(b, e - b);
  }
  if (cps.empty()) return std::string(text);
  std::string out;
  for (char32_t c : cps) utf8::append(out, c);
  return out;
}

int32_t CompressionTable::canonical(int64_t raw, int64_t fallback) const {
  DI_CHECK(raw >= 0, "engram compression: negative token id {}", raw);
  const int64_t n = int64_t(raw_to_canonical.size());
  if (raw >= n) {
    DI_CHECK(fallback >= 0 && fallback < n, "engram compression: fallback id {} outside [0, {})",
             fallback, n);
    raw = fallback;
  }
  return int32_t(raw_to_canonical[size_t(raw)]);
}

CompressionTable build_compression_table(const Tokenizer& tok) {
  CompressionTable t;
  const size_t V = tok.vocab_size();
  t.raw_to_canonical.resize(V);
  std::unordered_map<std::string, int64_t> ids;
  for (size_t i = 0; i < V; ++i) {
    const TokenId id = TokenId(i);
    std::string key;
    try {
      const std::string text = tok.decode(std::span(&id, 1));
      key = text.find(utf8::kReplacementUtf8) != std::string::npos ? tok.id_to_token(id)
                                                                   : engram_normalize(text);
    } catch (const Error&) {
      key.clear();  // an id the vocabulary skips decodes to nothing
    }
    const auto [it, added] = ids.emplace(std::move(key), int64_t(ids.size()));
    t.raw_to_canonical[i] = it->second;
  }
  t.num_canonical = int64_t(ids.size());
  return t;
}

}  // namespace deepinfer
