// NumPy's default random generator, bit for bit: `numpy.random.default_rng(seed)` =
// SeedSequence(seed) -> PCG64 (XSL-RR 128/64), and Generator.integers' bounded sampling (Lemire's
// method; ranges below 2^32 draw 32-bit halves of the 64-bit outputs, low half first).
// docs/kernels.md (Engram hash parameters) says where deepinfer needs it and how it is tested.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

// SeedSequence(entropy) with no spawn key, pool of 4 words: generate_state(n) as uint32 words.
// `entropy` is the seed as little-endian 32-bit words (a non-negative integer; {0} for 0).
std::vector<uint32_t> numpy_seed_sequence_state(std::span<const uint32_t> entropy, size_t n_words);

class NumpyPcg64 {
 public:
  // default_rng(seed): seeded through SeedSequence(seed).
  explicit NumpyPcg64(uint64_t seed);
  // Seeded from an arbitrary-size non-negative integer given as little-endian 32-bit words.
  explicit NumpyPcg64(std::span<const uint32_t> seed_words);

  uint64_t next_uint64();
  // The low half of a fresh 64-bit output, then its high half (NumPy's buffered next_uint32).
  uint32_t next_uint32();

  // Generator.integers(low, high, size=n, dtype=int64) with endpoint=False; high > low.
  std::vector<int64_t> integers(int64_t low, int64_t high, size_t n);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

}  // namespace deepinfer
