// A whole .safetensors file's bytes (8-byte header length, JSON header, data): parse_safetensors
// either rejects it with an Error or returns tensors whose every byte lies inside the input
// (read here, so ASan checks the bounds the parser promised).
#include <cstring>

#include "fuzz_common.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  fuzz::expect_clean([&] {
    const auto h = model::parse_safetensors(reinterpret_cast<const std::byte*>(data), size,
                                            "fuzz.safetensors");
    unsigned sum = 0;
    for (const auto& [name, t] : h.tensors) {
      if (t.name != name) __builtin_trap();
      if (t.nbytes != size_t(t.numel()) * dtype_size(t.dtype)) __builtin_trap();
      if (t.nbytes) sum += unsigned(t.as<uint8_t>()[0]) + t.as<uint8_t>()[t.nbytes - 1];
      sum += unsigned(t.describe().size());
    }
    for (const auto& [k, v] : h.metadata) sum += unsigned(k.size() + v.size());
    volatile unsigned sink = sum;
    (void)sink;
  });
  return 0;
}
