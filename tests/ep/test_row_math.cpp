// ep::rows against the docs/ep.md §5 formula written with dtype.h's scalar conversions: every
// column count around the vector widths (16, 32, 64), with and without weights, canon on and off,
// and values that round, cancel to ±0, overflow to inf and underflow.
#include <deepinfer/dtype.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ep/row_math.h"

namespace deepinfer {
namespace {

// ((0 + w0·y0) + w1·y1) + ... in f32, bf16 (nearest even), canon: -0 -> +0.
uint16_t expected(const std::vector<float>& w, const std::vector<std::vector<uint16_t>>& y,
                  size_t c, bool canon, bool weighted) {
  float acc = 0.0f;
  for (size_t s = 0; s < y.size(); ++s) {
    const float v = bf16_to_f32(bf16{y[s][c]});
    const float p = weighted ? w[s] * v : v;
    acc = acc + p;
  }
  uint16_t bits = f32_to_bf16(acc).bits;
  if (canon && bits == 0x8000u) bits = 0;
  return bits;
}

// bf16 values in [-4, 4], with -0, values whose products and sums overflow to inf, and subnormals.
void fill_row(std::mt19937& rng, std::vector<uint16_t>& row) {
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  for (auto& bits : row) {
    const uint32_t pick = rng() % 16;
    float v = val(rng);
    if (pick == 0) v = -0.0f;
    if (pick == 1) v = 3.0e38f;
    if (pick == 2) v = 1.0e-39f;
    bits = f32_to_bf16(v).bits;
  }
}

// m weights in [-4, 4] and m random rows of n columns (fill_row), with the pointers the row
// functions take.
struct RandomRows {
  std::vector<std::vector<uint16_t>> y;
  std::vector<const uint16_t*> ptr;
  std::vector<float> w;
  // Slot s reads slot first's row, as a token's slots on one rank do without the expand layout.
  void share(size_t s, size_t first) { y[s] = y[first], ptr[s] = ptr[first]; }
};
RandomRows random_rows(std::mt19937& rng, int m, size_t n) {
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  RandomRows r{std::vector<std::vector<uint16_t>>(static_cast<size_t>(m), std::vector<uint16_t>(n)),
               {},
               std::vector<float>(static_cast<size_t>(m))};
  for (auto& x : r.w) x = val(rng);
  for (auto& row : r.y) {
    fill_row(rng, row);
    r.ptr.push_back(row.data());
  }
  return r;
}

TEST(RowMath, WeightedSumMatchesTheScalarFormulaAtEveryWidth) {
  std::mt19937 rng(7);
  int checked = 0;
  for (size_t n :
       {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 192, 200, 255, 7168, 7205})
    for (int m : {0, 1, 2, 3, 8})
      for (bool weighted : {false, true})
        for (int canon_shared = 0; canon_shared < 4; ++canon_shared) {
          const bool canon = canon_shared & 1,
                     shared = canon_shared & 2;  // shared: every slot reads row 0
          RandomRows r = random_rows(rng, m, n);
          if (shared)
            for (size_t s = 1; s < r.y.size(); ++s) r.share(s, 0);
          const auto& [y, ptr, w] = r;
          std::vector<uint16_t> bits(n, 0xdead);
          std::vector<float> f32(n, -1.0f);
          ep::rows::weighted_sum(weighted ? w.data() : nullptr, ptr.data(), m, n, canon,
                                 bits.data(), f32.data());
          for (size_t c = 0; c < n; ++c) {
            const uint16_t want = expected(w, y, c, canon, weighted);
            ASSERT_EQ(bits[c], want) << "n=" << n << " m=" << m << " column " << c;
            uint32_t fb;
            std::memcpy(&fb, &f32[c], 4);
            ASSERT_EQ(fb, uint32_t(want) << 16) << "n=" << n << " m=" << m << " column " << c;
            ++checked;
          }
        }
  EXPECT_GT(checked, 100000);
}

// The fast combine in one pass: per group the partial canon(bf16(Σ w·y)), then bf16 of the
// partials' f32 sum from +0, group by group; each version this CPU runs (fill_row's subnormals
// give denormal partials, which the AVX512-BF16 rounding instruction would read as zero).
void check_sum_of_partials(ep::rows::SumOfPartialsFn sum_of_partials) {
  std::mt19937 rng(11);
  const std::vector<std::vector<int>> group_sizes = {{},           {1},       {3},      {2, 3},
                                                     {1, 1, 1, 1}, {4, 2, 1}, {1, 5, 2}};
  int checked = 0;
  for (size_t n : {1, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 192, 200, 255, 7168, 7205})
    for (const std::vector<int>& sizes : group_sizes)
      for (bool shared_rows : {false, true}) {  // shared: a group's slots read one row (no expand)
        std::vector<int> end;
        int m = 0;
        for (int g : sizes) end.push_back(m += g);
        RandomRows r = random_rows(rng, m, n);
        if (shared_rows)
          for (size_t g = 0, s = 0; g < end.size(); ++g)
            for (size_t first = s; s < size_t(end[g]); ++s) r.share(s, first);
        const auto& [y, ptr, w] = r;
        std::vector<uint16_t> bits(n, 0xdead);
        sum_of_partials(w.data(), ptr.data(), end.data(), int(end.size()), n, bits.data());
        for (size_t c = 0; c < n; ++c) {
          float acc = 0.0f;
          for (size_t g = 0, s = 0; g < end.size(); ++g) {
            float p = 0.0f;
            for (; s < size_t(end[g]); ++s) p = p + w[s] * bf16_to_f32(bf16{y[s][c]});
            uint16_t pb = f32_to_bf16(p).bits;
            if (pb == 0x8000u) pb = 0;
            acc = acc + bf16_to_f32(bf16{pb});
          }
          ASSERT_EQ(bits[c], f32_to_bf16(acc).bits)
              << "n=" << n << " groups=" << end.size() << " column " << c;
          ++checked;
        }
      }
  EXPECT_GT(checked, 30000);
}

TEST(RowMath, SumOfPartialsMatchesPartialsThenTheirSum) {
  for (const ep::rows::SumOfPartialsVersion& version : ep::rows::sum_of_partials_versions()) {
    SCOPED_TRACE(version.name);
    check_sum_of_partials(version.fn);
  }
}

}  // namespace
}  // namespace deepinfer
