// fp8 e4m3fn / e5m2 conversions against an independent reference: decode from the OCP FP8
// formula in double arithmetic, encode by searching the sorted table of representable values
// (nearest, ties to the even code), then the format's overflow rule. No bit tricks shared
// with dtype.h.
#include <deepinfer/dtype.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

namespace deepinfer {
namespace {

struct Fp8Format {
  const char* name;
  int exp_bits, man_bits, bias;
  bool has_inf;  // e5m2: IEEE-like (inf + NaNs at the top exponent); e4m3fn: only S.1111.111 = NaN
};
constexpr Fp8Format kE4m3{"e4m3fn", 4, 3, 7, false};
constexpr Fp8Format kE5m2{"e5m2", 5, 2, 15, true};
// gtest prints a parameter (--gtest_list_tests, failures) by its name, not its address.
void PrintTo(const Fp8Format* f, std::ostream* os) { *os << f->name; }

// Decoded value of a code per the OCP 8-bit floating point spec, in double.
double ref_decode(const Fp8Format& f, int code) {
  const bool neg = code & 0x80;
  const int e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = code & ((1 << f.man_bits) - 1);
  const int e_max = (1 << f.exp_bits) - 1;
  double v;
  if (f.has_inf && e == e_max) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && e == e_max && m == (1 << f.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = double(m) / double(1 << f.man_bits) * std::pow(2.0, 1 - f.bias);
  } else {
    v = (1.0 + double(m) / double(1 << f.man_bits)) * std::pow(2.0, e - f.bias);
  }
  return neg ? -v : v;
}

bool ref_is_nan_code(const Fp8Format& f, int code) { return std::isnan(ref_decode(f, code)); }

struct Entry {
  double value;
  int code;
};

// Non-negative finite values in increasing order, plus for e5m2 the +inf code placed at 2^16
// (the value the next code would have with an unbounded exponent: IEEE overflow rounds there).
std::vector<Entry> ref_table(const Fp8Format& f) {
  std::vector<Entry> t;
  for (int c = 0; c < 0x80; ++c) {
    const double v = ref_decode(f, c);
    if (std::isfinite(v)) t.push_back({v, c});
  }
  if (f.has_inf) t.push_back({65536.0, 0x7c});
  std::sort(t.begin(), t.end(), [](const Entry& a, const Entry& b) { return a.value < b.value; });
  return t;
}

// Reference encoder.
int ref_encode(const Fp8Format& f, const std::vector<Entry>& table, float x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return -1;  // any NaN code is accepted; checked separately
  const double a = std::fabs(double(x));
  if (a > table.back().value) return sign | table.back().code;  // e4m3fn: 448; e5m2: inf
  auto hi = std::lower_bound(table.begin(), table.end(), a,
                             [](const Entry& e, double v) { return e.value < v; });
  if (hi->value == a) return sign | hi->code;
  auto lo = hi - 1;
  const double d_lo = a - lo->value, d_hi = hi->value - a;
  int code;
  if (d_lo < d_hi)
    code = lo->code;
  else if (d_hi < d_lo)
    code = hi->code;
  else
    code = (lo->code % 2 == 0) ? lo->code : hi->code;  // tie: even mantissa
  return sign | code;
}

int encode(const Fp8Format& f, float x) {
  return &f == &kE4m3 ? f32_to_e4m3(x).bits : f32_to_e5m2(x).bits;
}
float decode(const Fp8Format& f, int code) {
  return &f == &kE4m3 ? e4m3_to_f32(fp8_e4m3{uint8_t(code)}) : e5m2_to_f32(fp8_e5m2{uint8_t(code)});
}

void check_one(const Fp8Format& f, const std::vector<Entry>& table, float x, int& failures) {
  const int got = encode(f, x);
  const int want = ref_encode(f, table, x);
  const bool ok =
      want < 0 ? ref_is_nan_code(f, got) && ((got & 0x80) != 0) == std::signbit(x) : got == want;
  if (!ok && ++failures <= 10) {
    ADD_FAILURE() << f.name << " encode(" << x << " = 0x" << std::hex << std::bit_cast<uint32_t>(x)
                  << ") = 0x" << got << ", reference 0x" << want;
  }
}

class Fp8Test : public ::testing::TestWithParam<const Fp8Format*> {};

TEST_P(Fp8Test, DecodeAll256CodesMatchesFormula) {
  const Fp8Format& f = *GetParam();
  for (int c = 0; c < 256; ++c) {
    const double want = ref_decode(f, c);
    const float got = decode(f, c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
    } else {
      EXPECT_EQ(double(got), want) << f.name << " code " << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << f.name << " code " << c;  // -0 included
    }
  }
}

TEST(Fp8Golden, KnownValuesFromTheOcpSpec) {
  // e4m3fn: max 448 = S.1111.110, min normal 2^-6, min subnormal 2^-9, NaN S.1111.111.
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x7e}), 448.0f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0xfe}), -448.0f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x08}), 0.015625f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x01}), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x38}), 1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(fp8_e4m3{0x7f})));
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x78}), 256.0f);  // S.1111.000 is a number in e4m3fn
  EXPECT_EQ(kFp8E4m3Max, 448.0f);
  // e5m2: max 57344 = S.11110.11, min normal 2^-14, min subnormal 2^-16, inf S.11111.00.
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x7b}), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x04}), 0.00006103515625f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x01}), 0.0000152587890625f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x3c}), 1.0f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x7c}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0xfc}), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kFp8E5m2Max, 57344.0f);
  // Encoding rules named in docs/numerics.md §2.
  EXPECT_EQ(f32_to_e4m3(1e9f).bits, 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()).bits, 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xfe);
  EXPECT_EQ(f32_to_e5m2(1e9f).bits, 0x7c);
  EXPECT_EQ(f32_to_e5m2(61440.0f).bits, 0x7c);  // tie between 57344 (odd) and overflow: inf
  EXPECT_EQ(f32_to_e5m2(std::nextafter(61440.0f, 0.0f)).bits, 0x7b);
  EXPECT_EQ(f32_to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(f32_to_e4m3(0.0f).bits, 0x00);
}

TEST_P(Fp8Test, EncodeDecodeIsIdentityOnEveryNonNanCode) {
  const Fp8Format& f = *GetParam();
  for (int c = 0; c < 256; ++c) {
    if (ref_is_nan_code(f, c)) {
      EXPECT_TRUE(ref_is_nan_code(f, encode(f, decode(f, c)))) << f.name << " NaN code " << c;
      continue;
    }
    EXPECT_EQ(encode(f, decode(f, c)), c) << f.name << " code " << c;
  }
}

TEST_P(Fp8Test, MidpointsAndNeighboursOfEveryCode) {
  const Fp8Format& f = *GetParam();
  const std::vector<Entry> table = ref_table(f);
  int failures = 0;
  std::vector<double> points;
  for (size_t i = 0; i < table.size(); ++i) {
    points.push_back(table[i].value);
    if (i + 1 < table.size()) points.push_back((table[i].value + table[i + 1].value) / 2);
  }
  points.push_back(table.back().value * 1.5);
  for (double p : points) {
    const float x = float(p);
    ASSERT_EQ(double(x), p);  // midpoints of fp8 values are exact in fp32
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
      check_one(f, table, y, failures);
      check_one(f, table, -y, failures);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(Fp8Test, SpecialInputs) {
  const Fp8Format& f = *GetParam();
  const std::vector<Entry> table = ref_table(f);
  int failures = 0;
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::bit_cast<float>(0x7f800001u) /* signalling NaN */,
                  std::bit_cast<float>(0xffbfffffu)}) {
    check_one(f, table, x, failures);
  }
  EXPECT_EQ(failures, 0);
}

// Several million fp32 inputs: raw random bit patterns (every exponent, denormals, NaNs),
// values spread over the format's range and below its smallest subnormal.
TEST_P(Fp8Test, RandomSweepMatchesReferenceEncoder) {
  const Fp8Format& f = *GetParam();
  const std::vector<Entry> table = ref_table(f);
  std::mt19937_64 rng(f.exp_bits * 1000003u);
  int failures = 0;
  constexpr int kRawBits = 1'000'000, kInRange = 2'000'000, kDenormals = 200'000;
  for (int i = 0; i < kRawBits; ++i)
    check_one(f, table, std::bit_cast<float>(uint32_t(rng())), failures);
  const int min_exp = 1 - f.bias - f.man_bits - 3;  // a bit below the smallest subnormal
  const int max_exp = (1 << f.exp_bits) - f.bias + 1;
  std::uniform_int_distribution<int> exp_dist(min_exp, max_exp);
  for (int i = 0; i < kInRange; ++i) {
    const uint64_t r = rng();
    const float mant = 1.0f + float(r & 0x7fffff) / float(1 << 23);
    float x = std::ldexp(mant, exp_dist(rng));
    if (r >> 63) x = -x;
    check_one(f, table, x, failures);
  }
  for (int i = 0; i < kDenormals; ++i) {
    const uint32_t bits = uint32_t(rng()) & 0x807fffffu;  // fp32 denormals of either sign
    check_one(f, table, std::bit_cast<float>(bits), failures);
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test, ::testing::Values(&kE4m3, &kE5m2),
                         [](const auto& info) { return std::string(info.param->name); });

}  // namespace
}  // namespace deepinfer
