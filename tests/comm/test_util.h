// Helpers for the comm tests: payloads whose expected value is computable from (rank, index).
#pragma once

#include <deepinfer/comm.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace deepinfer::test {

// splitmix64 finaliser: an independent, well-mixed value for (a, b, c).
inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c = 0) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b * 0xBF58476D1CE4E5B9ull + c * 0x94D049BB133111EBull +
               0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Bytes of element `i` of the payload tagged (a, b): es bytes of mix(a, b, i).
inline void fill_payload(std::byte* out, size_t count, size_t es, uint64_t a, uint64_t b) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t v = mix(a, b, i);
    std::memcpy(out + i * es, &v, es);
  }
}

inline std::vector<std::byte> payload(size_t count, size_t es, uint64_t a, uint64_t b) {
  std::vector<std::byte> v(count * es);
  fill_payload(v.data(), count, es, a, b);
  return v;
}

inline LaunchOptions local_opts(int world, double timeout_s = 20.0, std::string fault = {}) {
  LaunchOptions o;
  o.comm = CommKind::local;
  o.world = world;
  o.timeout_s = timeout_s;
  o.fault = std::move(fault);
  return o;
}

}  // namespace deepinfer::test
