// An HTTP request body, as /v1/chat/completions and /v1/completions: parse_completion either
// returns parameters or throws ApiError, whose JSON body (what the server sends back) must
// serialize.
#include "fuzz_common.h"
#include "serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const std::string body = fuzz::as_string(data, size);
  for (const bool chat : {true, false}) {
    try {
      const serve::CompletionParams p = serve::parse_completion(body, chat);
      if (p.chat != chat) __builtin_trap();
      if (p.stop.size() > 4) __builtin_trap();
    } catch (const serve::ApiError& e) {
      if (e.status != 400) __builtin_trap();
      volatile size_t sink = e.body().dump().size();
      (void)sink;
    }
  }
  return 0;
}
