// NumPy's SeedSequence, PCG64 and bounded integers (numpy_random.h), transcribed from their
// published algorithms (numpy/random/bit_generator.pyx, pcg64.h, distributions.c).
#include "core/numpy_random.h"

#include <deepinfer/error.h>

#include <limits>

#include "core/check.h"

namespace deepinfer {
namespace {

constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu, kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

std::vector<uint32_t> seed_words(uint64_t seed) {
  std::vector<uint32_t> w{uint32_t(seed)};
  if (seed >> 32) w.push_back(uint32_t(seed >> 32));
  return w;
}

using u128 = unsigned __int128;
constexpr u128 kPcgMult = (u128(2549297995355413924ULL) << 64) | u128(4865540595714422341ULL);

}  // namespace

std::vector<uint32_t> numpy_seed_sequence_state(std::span<const uint32_t> entropy, size_t n_words) {
  DI_CHECK(!entropy.empty(), "SeedSequence: the entropy needs at least one word");
  // mix_entropy: hash the entropy into the pool, then mix every pool word into every other.
  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  // generate_state: cycle through the pool with the second hash.
  std::vector<uint32_t> out(n_words);
  hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) : NumpyPcg64(std::span<const uint32_t>(seed_words(seed))) {}

NumpyPcg64::NumpyPcg64(std::span<const uint32_t> seed_words) {
  // generate_state(4, uint64): 8 words, paired (low, high) into 4 uint64 v[0..3];
  // initstate = v[0]:v[1] (v[0] high), initseq = v[2]:v[3].
  const std::vector<uint32_t> w = numpy_seed_sequence_state(seed_words, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i)
    v[i] = uint64_t(w[size_t(2 * i)]) | (uint64_t(w[size_t(2 * i + 1)]) << 32);
  const u128 initstate = (u128(v[0]) << 64) | v[1], initseq = (u128(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPcg64::next_uint64() {
  state_ = state_ * kPcgMult + inc_;
  const uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = uint32_t(next >> 32);
  return uint32_t(next);
}

std::vector<int64_t> NumpyPcg64::integers(int64_t low, int64_t high, size_t n) {
  DI_CHECK(high > low, "integers: high ({}) must be greater than low ({})", high, low);
  const uint64_t rng = uint64_t(high) - uint64_t(low) - 1;  // inclusive range
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = 0;
    if (rng == 0) {
      r = 0;
    } else if (rng <= 0xFFFFFFFFull) {
      if (rng == 0xFFFFFFFFull) {
        r = next_uint32();
      } else {
        const uint32_t excl = uint32_t(rng) + 1;
        uint64_t m = uint64_t(next_uint32()) * excl;
        uint32_t left = uint32_t(m);
        if (left < excl) {
          const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - uint32_t(rng)) % excl;
          while (left < threshold) {
            m = uint64_t(next_uint32()) * excl;
            left = uint32_t(m);
          }
        }
        r = m >> 32;
      }
    } else if (rng == std::numeric_limits<uint64_t>::max()) {
      r = next_uint64();
    } else {
      const uint64_t excl = rng + 1;
      u128 m = u128(next_uint64()) * excl;
      uint64_t left = uint64_t(m);
      if (left < excl) {
        const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % excl;
        while (left < threshold) {
          m = u128(next_uint64()) * excl;
          left = uint64_t(m);
        }
      }
      r = uint64_t(m >> 64);
    }
    out[i] = int64_t(uint64_t(low) + r);
  }
  return out;
}

}  // namespace deepinfer
