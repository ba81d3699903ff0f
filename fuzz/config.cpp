// config.json: parse_config either rejects it with an Error naming the field or returns a config
// whose derived values (what the engine computes from it first) are computed without UB.
#include "model/config.h"

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  fuzz::expect_clean([&] {
    const model::ModelConfig c = model::parse_config(fuzz::as_string(data, size), "config.json");
    volatile size_t sink = c.summary().size();
    volatile double scale = c.softmax_scale();
    volatile int64_t moe = 0;
    for (int64_t l = 0; l < 4; ++l) moe = moe + c.is_moe_layer(l);
    (void)sink, (void)scale, (void)moe;
  });
  return 0;
}
