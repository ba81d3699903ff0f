// Sampling: parameter checks, Philox4x32-10, dispatch.
#include "kernels/sampling.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels {

void SamplingParams::validate() const {
  DI_CHECK(batch >= 0, "sample: batch must be >= 0, got {}", batch);
  DI_CHECK(vocab > 0, "sample: vocab must be > 0, got {}", vocab);
  DI_CHECK(vocab <= INT32_MAX, "sample: vocab {} does not fit the i32 token ids", vocab);
  DI_CHECK(stride() >= vocab, "sample: logits_stride {} < vocab {}", logits_stride, vocab);
  DI_CHECK(batch == 0 || (logits && tokens), "sample: logits and tokens must be set");
  for (int64_t b = 0; b < batch; ++b) {
    DI_CHECK(!top_p || (top_p[b] > 0.0f && top_p[b] <= 1.0f),
             "sample: row {} top_p = {} is outside (0, 1]", b, top_p[b]);
    DI_CHECK(!temperature || std::isfinite(temperature[b]),
             "sample: row {} temperature is not finite", b);
  }
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c[0], p1 = uint64_t(kM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k = {k[0] + kW0, k[1] + kW1};
  }
  return c;
}

double sampling_uniform(uint64_t seed, uint64_t counter) {
  const auto r = philox4x32_10({uint32_t(counter), uint32_t(counter >> 32), 0u, 0u},
                               {uint32_t(seed), uint32_t(seed >> 32)});
  const uint64_t bits = (uint64_t(r[0]) << 32 | r[1]) >> 11;  // 53 bits
  return double(bits) * 0x1.0p-53;
}

void sample(const SamplingParams& p) { dispatch(p, host::sample, cpu::sample); }

}  // namespace deepinfer::kernels
