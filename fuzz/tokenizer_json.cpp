// tokenizer.json (and tokenizer_config.json after the first NUL byte, when there is one):
// Tokenizer::from_json either rejects them with an Error or gives a tokenizer that encodes and
// decodes a fixed sample and the input's own bytes.
#include <cstring>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const std::string in = fuzz::as_string(data, size);
  const size_t nul = in.find('\0');
  const std::string_view tokenizer_json =
      nul == std::string::npos ? std::string_view(in) : std::string_view(in).substr(0, nul);
  const std::string_view config_json =
      nul == std::string::npos ? std::string_view() : std::string_view(in).substr(nul + 1);
  fuzz::expect_clean([&] {
    const Tokenizer tok = Tokenizer::from_json(tokenizer_json, config_json);
    for (const std::string_view text :
         {std::string_view("Hello, world! 123 héllo 你好 <｜User｜>\n\t  x"),
          tokenizer_json.substr(0, 64)}) {
      fuzz::expect_clean([&] {
        const auto ids = tok.encode(text);
        volatile size_t sink = tok.decode(ids).size() + tok.decode(ids, true).size();
        (void)sink;
      });
    }
    volatile size_t sink = tok.vocab_size() + tok.has_chat_tokens();
    (void)sink;
  });
  return 0;
}
