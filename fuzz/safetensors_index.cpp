// model.safetensors.index.json: parse_safetensors_index either rejects it with an Error or
// names shards that are plain, distinct file names.
#include <set>

#include "fuzz_common.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  fuzz::expect_clean([&] {
    const auto shards =
        model::parse_safetensors_index(fuzz::as_string(data, size), "model.safetensors.index.json");
    if (std::set<std::string>(shards.begin(), shards.end()).size() != shards.size())
      __builtin_trap();
  });
  return 0;
}
