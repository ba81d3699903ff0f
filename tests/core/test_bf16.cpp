// bf16 conversions against an independent reference: decode from the IEEE formula,
// encode by round-to-nearest-even in double arithmetic (value / ulp, floor, compare the
// remainder with one half), never by bit manipulation.
#include <deepinfer/dtype.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace deepinfer {
namespace {

// IEEE binary16-brain: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double ref_decode(uint16_t code) {
  const bool neg = code & 0x8000;
  const int e = (code >> 7) & 0xff, m = code & 0x7f;
  double v;
  if (e == 0xff)
    v = m == 0 ? INFINITY : NAN;
  else if (e == 0)
    v = double(m) / 128.0 * std::pow(2.0, -126);
  else
    v = (1.0 + double(m) / 128.0) * std::pow(2.0, e - 127);
  return neg ? -v : v;
}

// fp32 -> bf16 -> fp32 rounded value, computed in double. NaN in, NaN out.
double ref_round(float x) {
  if (std::isnan(x)) return NAN;
  if (std::isinf(x)) return double(x);
  const double a = std::fabs(double(x));
  int e2 = 0;
  std::frexp(a, &e2);  // a in [2^(e2-1), 2^e2)
  // 8 significant bits for normals; subnormals share the spacing of the smallest binade.
  const double ulp = std::ldexp(1.0, std::max(e2, -125) - 8);
  const double q = a / ulp;  // exact: a has at most 24 significant bits
  const double lo = std::floor(q);
  const double frac = q - lo;
  double r = lo;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(lo, 2.0) != 0.0)) r = lo + 1;
  double v = r * ulp;
  if (v >= std::ldexp(1.0, 128)) v = INFINITY;  // IEEE overflow
  return std::signbit(x) ? -v : v;
}

TEST(Bf16, All65536CodesDecodeAndRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = uint16_t(c);
    const double want = ref_decode(code);
    const float got = bf16_to_f32(bf16{code});
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "code " << c;
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(got)))) << "NaN code " << c << " lost its NaN";
      ASSERT_EQ(std::signbit(bf16_to_f32(f32_to_bf16(got))), std::signbit(got)) << "code " << c;
      continue;
    }
    ASSERT_EQ(double(got), want) << "code " << c;
    ASSERT_EQ(std::signbit(got), bool(code & 0x8000)) << "code " << c;
    ASSERT_EQ(f32_to_bf16(got).bits, code) << "code " << c;
  }
}

void check_one(float x, int& failures) {
  const float got = round_bf16(x);
  const double want = ref_round(x);
  const bool ok = std::isnan(want) ? std::isnan(got)
                                   : double(got) == want && std::signbit(got) == std::signbit(want);
  if (!ok && ++failures <= 10)
    ADD_FAILURE() << "round_bf16(" << x << " = 0x" << std::hex << std::bit_cast<uint32_t>(x)
                  << ") = " << got << ", reference " << want;
}

TEST(Bf16, MidpointsBetweenEveryPairOfAdjacentCodes) {
  int failures = 0;
  for (uint32_t c = 0; c + 1 < 0x7f80; ++c) {
    const double mid = (ref_decode(uint16_t(c)) + ref_decode(uint16_t(c + 1))) / 2;
    const float x = float(mid);
    ASSERT_EQ(double(x), mid);
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
      check_one(y, failures);
      check_one(-y, failures);
    }
  }
  // Above the largest finite bf16: the tie at 2^128 - 2^119 rounds to inf (odd mantissa).
  check_one(std::numeric_limits<float>::max(), failures);
  EXPECT_EQ(failures, 0);
}

TEST(Bf16, RandomSweepMatchesReference) {
  std::mt19937_64 rng(12345);
  int failures = 0;
  for (int i = 0; i < 2'000'000; ++i) check_one(std::bit_cast<float>(uint32_t(rng())), failures);
  for (int i = 0; i < 200'000; ++i)  // fp32 denormals of both signs
    check_one(std::bit_cast<float>(uint32_t(rng()) & 0x807fffffu), failures);
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),
                  std::bit_cast<float>(0xff800001u), std::bit_cast<float>(0x7fffffffu)})
    check_one(x, failures);
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace deepinfer
