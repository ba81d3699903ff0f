// The NumPy generator port against values NumPy itself printed
// (tools/reference/numpy_rng_values.py -> tests/core/data/numpy_rng.json).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/numpy_random.h"

namespace deepinfer {
namespace {

nlohmann::json numpy_values() {
  std::ifstream f(std::string(DEEPINFER_SOURCE_DIR) + "/tests/core/data/numpy_rng.json");
  EXPECT_TRUE(f.good()) << "tests/core/data/numpy_rng.json is missing";
  return nlohmann::json::parse(f);
}

// A decimal string (JSON keeps 64-bit values as strings) as little-endian 32-bit words.
std::vector<uint32_t> words_of(const std::string& dec) {
  std::vector<uint32_t> digits;  // base 2^32, little-endian
  for (char c : dec) {
    uint64_t carry = uint64_t(c - '0');
    for (auto& w : digits) {
      const uint64_t v = uint64_t(w) * 10 + carry;
      w = uint32_t(v);
      carry = v >> 32;
    }
    if (carry) digits.push_back(uint32_t(carry));
  }
  if (digits.empty()) digits.push_back(0);
  return digits;
}

TEST(NumpyRandom, RawOutputsMatchNumpyPcg64) {
  const auto j = numpy_values();
  ASSERT_FALSE(j["next_uint64"].empty());
  for (const auto& c : j["next_uint64"]) {
    const std::vector<uint32_t> seed = words_of(c["seed"].get<std::string>());
    NumpyPcg64 g(seed);
    for (const auto& v : c["values"])
      EXPECT_EQ(g.next_uint64(), std::stoull(v.get<std::string>())) << "seed " << c["seed"];
  }
}

TEST(NumpyRandom, BoundedIntegersMatchNumpy) {
  const auto j = numpy_values();
  ASSERT_FALSE(j["integers"].empty());
  for (const auto& c : j["integers"]) {
    NumpyPcg64 g(c["seed"].get<uint64_t>());
    const int64_t high = std::stoll(c["high"].get<std::string>());
    const auto got = g.integers(0, high, c["values"].size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], std::stoll(c["values"][i].get<std::string>()))
          << "seed " << c["seed"] << " high " << high << " draw " << i;
  }
}

TEST(NumpyRandom, SmallSeedEqualsItsWordForm) {
  NumpyPcg64 a(uint64_t(150105)), b(std::vector<uint32_t>{150105u});
  EXPECT_EQ(a.next_uint64(), b.next_uint64());
}

TEST(NumpyRandom, RejectsAnEmptyRange) {
  NumpyPcg64 g(uint64_t(1));
  EXPECT_THROW(g.integers(5, 5, 1), std::exception);
}

}  // namespace
}  // namespace deepinfer
