// A DEEPINFER_CAPABILITIES file: parse_capabilities either rejects it with an Error or returns
// its fields.
#include "comm/capabilities.h"

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  fuzz::expect_clean([&] {
    const CapabilitiesFile f = parse_capabilities(fuzz::as_string(data, size), "caps.json");
    volatile size_t sink = f.backend.size() + f.caps.all_to_all + f.caps.all_to_all_v;
    (void)sink;
  });
  return 0;
}
