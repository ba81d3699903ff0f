// Sampling: Philox known-answer vectors, greedy = argmax, top-k = 1 = greedy, the temperature -> 0
// limit, top-k / top-p subsets, a chi-square frequency check, and reproducibility (same seed ->
// same tokens, on host and cpu, with 1 or 2 threads).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/sampling.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors, philox4x32_10.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// Samples one row `n` times with counters 0..n-1; returns token counts.
std::map<int32_t, int> draw(const std::vector<float>& logits, float temperature, int32_t top_k,
                            float top_p, int n, KernelBackend be = KernelBackend::host,
                            uint64_t seed = 1234) {
  const int64_t V = int64_t(logits.size());
  const size_t un = static_cast<size_t>(n);
  std::vector<float> rows(un * size_t(V)), temp(un, temperature), tp(un, top_p);
  std::vector<int32_t> tk(un, top_k), tokens(un);
  std::vector<int64_t> seeds(un, int64_t(seed)), counters(un);
  for (int i = 0; i < n; ++i) {
    std::copy(logits.begin(), logits.end(), rows.begin() + int64_t(i) * V);
    counters[size_t(i)] = i;
  }
  ScopedBackend use(be);
  sample({.logits = rows.data(),
          .temperature = temp.data(),
          .top_k = tk.data(),
          .top_p = tp.data(),
          .seed = seeds.data(),
          .counter = counters.data(),
          .tokens = tokens.data(),
          .batch = n,
          .vocab = V});
  std::map<int32_t, int> counts;
  for (int32_t t : tokens) counts[t]++;
  return counts;
}

TEST(SamplingHost, GreedyIsArgmaxWithTiesToLowerId) {
  const std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    EXPECT_EQ(draw(l, 0.0f, 0, 1.0f, 10, be), (std::map<int32_t, int>{{1, 10}}));
    EXPECT_EQ(draw(l, 1.5f, 1, 1.0f, 10, be), (std::map<int32_t, int>{{1, 10}}));  // top_k = 1
  }
}

TEST(SamplingHost, TemperatureToZeroIsGreedy) {
  const std::vector<float> l = {0.0f, 1.0f, 0.9f, -3.0f};
  EXPECT_EQ(draw(l, 1e-3f, 0, 1.0f, 200), (std::map<int32_t, int>{{1, 200}}));
  EXPECT_GT(draw(l, 1.0f, 0, 1.0f, 200).size(), 2u);  // while temperature 1 spreads out
}

TEST(SamplingHost, TopKAndTopPKeepTheRightSubset) {
  // p = [0.5, 0.3, 0.15, 0.05] (log-probabilities as logits).
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    const auto k2 = draw(l, 1.0f, 2, 1.0f, 4000, be);
    EXPECT_EQ(k2.size(), 2u);
    EXPECT_TRUE(k2.count(0) && k2.count(1));
    EXPECT_NEAR(k2.at(0) / 4000.0, 0.5 / 0.8, 0.03);
    const auto p7 = draw(l, 1.0f, 0, 0.7f, 4000, be);  // 0.5 < 0.7 <= 0.8: keep {0, 1}
    EXPECT_EQ(p7.size(), 2u);
    EXPECT_NEAR(p7.at(0) / 4000.0, 0.5 / 0.8, 0.03);
    const auto p9 = draw(l, 1.0f, 0, 0.9f, 4000, be);  // 0.8 < 0.9 <= 0.95: keep {0, 1, 2}
    EXPECT_EQ(p9.size(), 3u);
    EXPECT_EQ(draw(l, 1.0f, 0, 0.4f, 100, be),
              (std::map<int32_t, int>{{0, 100}}));  // first token alone
  }
}

TEST(SamplingHost, ChiSquareFrequencies) {
  // 6 tokens, p proportional to 1..6; 30000 draws. 5 degrees of freedom: P(chi2 > 40) ~ 1.5e-7.
  std::vector<float> l;
  for (int i = 1; i <= 6; ++i) l.push_back(std::log(float(i)));
  const int n = 30000;
  for (KernelBackend be : {KernelBackend::host, KernelBackend::cpu}) {
    const auto counts = draw(l, 1.0f, 0, 1.0f, n, be, 99);
    double chi2 = 0;
    for (int i = 0; i < 6; ++i) {
      const double expect = n * (i + 1) / 21.0;
      const double got = counts.count(i) ? counts.at(i) : 0;
      chi2 += (got - expect) * (got - expect) / expect;
    }
    EXPECT_LT(chi2, 40.0) << to_string(be);
  }
}

TEST(SamplingCpu, ReproducibleAcrossBackendsAndThreads) {
  // 64 rows of a 1000-token vocabulary with mixed settings; tokens depend only on the row.
  const int64_t B = 64, V = 1000;
  const auto logits = testing::random_f32(B * V, 7, -5.0f, 5.0f);
  std::vector<float> temp(B), tp(B);
  std::vector<int32_t> tk(B);
  std::vector<int64_t> seed(B), counter(B);
  for (int64_t b = 0; b < B; ++b) {
    temp[size_t(b)] = b % 5 == 0 ? 0.0f : 0.5f + 0.1f * float(b % 7);
    tk[size_t(b)] = b % 3 == 0 ? 0 : int32_t(1 + b % 50);
    tp[size_t(b)] = b % 4 == 0 ? 1.0f : 0.3f + 0.1f * float(b % 6);
    seed[size_t(b)] = int64_t(1000 + b);
    counter[size_t(b)] = b * 3;
  }
  auto run = [&](KernelBackend be, int threads) {
    ThreadPool pool(threads);
    ScopedThreadPool use_pool(pool);
    ScopedBackend use(be);
    std::vector<int32_t> tokens(B, -1);
    sample({.logits = logits.data(),
            .temperature = temp.data(),
            .top_k = tk.data(),
            .top_p = tp.data(),
            .seed = seed.data(),
            .counter = counter.data(),
            .tokens = tokens.data(),
            .batch = B,
            .vocab = V});
    return tokens;
  };
  const auto ref = run(KernelBackend::host, 1);
  EXPECT_EQ(run(KernelBackend::host, 1), ref);
  EXPECT_EQ(run(KernelBackend::cpu, 1), ref);
  EXPECT_EQ(run(KernelBackend::cpu, 2), ref);
  // A different counter changes some tokens (the stream moves on).
  for (auto& c : counter) c += 1;
  EXPECT_NE(run(KernelBackend::cpu, 2), ref);
}

TEST(SamplingHost, RejectsNanAndBadTopP) {
  std::vector<float> l = {0.0f, NAN};
  int32_t tok = 0;
  EXPECT_THROW(host::sample({.logits = l.data(), .tokens = &tok, .batch = 1, .vocab = 2}), Error);
  l[1] = 1.0f;
  const float bad = 0.0f;
  EXPECT_THROW(
      host::sample({.logits = l.data(), .top_p = &bad, .tokens = &tok, .batch = 1, .vocab = 2}),
      Error);
}

}  // namespace
}  // namespace deepinfer::kernels
