// models/tiny's real tokenizer on any bytes. The first byte picks the encode options, the rest
// is the text. Oracles: decode(encode(text)) is the text (invalid UTF-8 replaced as documented),
// and a StreamDecoder fed the ids one by one prints the same. The same bytes read as token ids
// decode or are rejected with an Error.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

const deepinfer::Tokenizer& tiny() {
  static const deepinfer::Tokenizer tok = [] {
    const char* dir = std::getenv("DEEPINFER_FUZZ_TOKENIZER_DIR");
    return deepinfer::Tokenizer::from_dir(dir ? dir : DEEPINFER_SOURCE_DIR "/models/tiny");
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  if (size == 0) return 0;
  const Tokenizer& tok = tiny();
  const uint8_t flags = data[0];
  const std::string text = fuzz::as_string(data + 1, size - 1);
  EncodeOptions opt;
  opt.add_special_tokens = flags & 1;
  opt.split_special_tokens = flags & 2;
  opt.invalid_utf8 = flags & 4 ? InvalidUtf8::error : InvalidUtf8::replace;

  fuzz::expect_clean([&] {
    const std::vector<TokenId> ids = tok.encode(text, opt);
    for (const TokenId id : ids)
      if (id < 0 || size_t(id) >= tok.vocab_size()) __builtin_trap();
    if (opt.invalid_utf8 == InvalidUtf8::error && !utf8::is_valid(text)) __builtin_trap();
    const std::string back = tok.decode(ids);
    if (!opt.add_special_tokens && back != utf8::sanitize(text)) __builtin_trap();
    StreamDecoder stream(tok, /*skip_special_tokens=*/false);
    std::string streamed;
    for (const TokenId id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (streamed != back) __builtin_trap();
    volatile size_t sink = tok.decode(ids, /*skip_special_tokens=*/true).size();
    (void)sink;
  });

  // The text's bytes as ids: out-of-range ones are an Error.
  std::vector<TokenId> ids((size - 1) / sizeof(TokenId));
  if (!ids.empty()) std::memcpy(ids.data(), data + 1, ids.size() * sizeof(TokenId));
  fuzz::expect_clean([&] {
    volatile size_t sink = tok.decode(ids, flags & 8).size();
    (void)sink;
  });
  StreamDecoder stream(tok, flags & 8);
  fuzz::expect_clean([&] {
    for (const TokenId id : ids) stream.push(id);
    stream.flush();
  });
  for (const TokenId id : ids)
    fuzz::expect_clean([&] {
      volatile size_t sink = tok.id_to_token(id).size() + tok.token_bytes(id).size();
      (void)sink;
    });
  return 0;
}
