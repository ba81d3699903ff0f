// BucketBuffer's bf16 transport (docs/ep.md §13.1): the random stream of the stochastic rounding,
// a pure function of (seed, source rank, tensor, element), and the rounding itself.
#pragma once

#include <deepinfer/dtype.h>

#include <bit>
#include <cmath>
#include <cstdint>

namespace deepinfer::ep::bucket {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream of one (seed, source rank, tensor index in the call) triple; sr_bits gives each
// element's 16 random bits from it, by the element's index in its tensor.
inline uint64_t sr_stream(uint64_t seed, int src_rank, size_t tensor) {
  return splitmix64(seed ^ (uint64_t(uint32_t(src_rank)) * 0xd1b54a32d192ed03ull) ^
                    (uint64_t(tensor) * 0x8cb92ba72f3d8dd7ull));
}
inline uint16_t sr_bits(uint64_t stream, uint64_t element) {
  return uint16_t(splitmix64(stream + element) >> 48);
}

// fp32 -> bf16 rounded stochastically: the magnitude rounds up (away from zero) with probability
// (dropped 16 bits) / 2^16, i.e. when the dropped bits plus `r` carry. NaN stays a quiet NaN; inf
// stays inf; the largest finite values may round up to inf, as the probability says.
inline bf16 round_bf16_stochastic(float x, uint16_t r) {
  if (std::isnan(x)) return f32_to_bf16(x);
  return bf16{uint16_t((std::bit_cast<uint32_t>(x) + r) >> 16)};
}

}  // namespace deepinfer::ep::bucket
