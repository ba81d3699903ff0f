// BucketBuffer: the path choice (pure), the stochastic rounding's statistics, the summation order
// against a closed form, that a call is one collective (counted), and the `check bucket` matrix on
// the local group at 1..16 ranks, also through a group that trusts no all_to_all.
#include <deepinfer/bucket.h>
#include <deepinfer/comm.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "counting_group.h"
#include "ep/bucket/check_bucket.h"
#include "ep/bucket/lowerings.h"
#include "ep/bucket/stochastic.h"

namespace deepinfer {
namespace {

TEST(BucketPath, AutoFollowsTheCapabilities) {
  Capabilities all, no_a2a;
  no_a2a.all_to_all = false;
  EXPECT_EQ(ep::bucket::choose_path(BucketAlgo::automatic, all), BucketAlgo::a2a);
  EXPECT_EQ(ep::bucket::choose_path(BucketAlgo::automatic, no_a2a), BucketAlgo::ag);
  EXPECT_EQ(ep::bucket::choose_path(BucketAlgo::ag, all), BucketAlgo::ag);
  EXPECT_THROW(ep::bucket::choose_path(BucketAlgo::a2a, no_a2a), Error);
}

// Rounds up with the probability of the dropped fraction (the mean is unbiased), leaves bf16
// values alone, keeps NaN, inf and the sign.
TEST(BucketStochasticRounding, UnbiasedAndExactOnBf16Values) {
  const uint64_t stream = ep::bucket::sr_stream(42, 3, 1);
  for (float x : {1.0f + 0x1p-10f, -3.0f - 0x1p-6f, 0x1.234568p-20f}) {
    const float lo = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
    const float hi = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & 0xffff0000u) + 0x10000u);
    const double p = double(x - lo) / double(hi - lo);
    const int n = 1 << 16;
    int ups = 0;
    for (int k = 0; k < n; ++k) {
      const float r = bf16_to_f32(
          ep::bucket::round_bf16_stochastic(x, ep::bucket::sr_bits(stream, uint64_t(k))));
      ASSERT_TRUE(r == lo || r == hi) << x << " -> " << r;
      ups += r == hi;
    }
    // Binomial: 6 standard deviations.
    EXPECT_NEAR(double(ups) / n, p, 6.0 * std::sqrt(p * (1 - p) / n)) << x;
  }
  for (float x : {1.0f, -0.5f, 0.0f, 448.0f, INFINITY, -INFINITY})
    for (uint16_t r : {uint16_t(0), uint16_t(0x8000), uint16_t(0xffff)})
      EXPECT_EQ(bf16_to_f32(ep::bucket::round_bf16_stochastic(x, r)), x);
  EXPECT_TRUE(std::isnan(bf16_to_f32(ep::bucket::round_bf16_stochastic(NAN, 0xffff))));
}

// Rank 0's shard at W = 3 is summed own, rank 2, rank 1: (1 + -2^24) + 2^24 = 1, where ascending
// order would give (1 + 2^24) + -2^24 = 0. Rank 1 sums own, rank 0, rank 2; rank 2 own, 1, 0.
TEST(BucketReduceScatter, SumsInTheCyclicOrderAndScalesOnce) {
  for (BucketAlgo algo : {BucketAlgo::a2a, BucketAlgo::ag}) {
    LaunchOptions o;
    o.world = 3;
    o.timeout_s = 30;
    std::vector<float> got(3);
    run_ranks(o, [&](Group& g) {
      BucketBuffer buf(g, {1024, algo});
      Tensor t = buf.alloc(DType::f32, {3});
      const float v[3] = {1.0f, 0x1p24f, -0x1p24f};  // rank r holds v[r] in every shard
      for (int i = 0; i < 3; ++i) t.data<float>()[i] = v[g.rank()];
      const Tensor ts[] = {t};
      buf.reduce_scatter(ts, {BucketPrecision::fp32, 0.5f, 0});
      got[size_t(g.rank())] = t.data<float>()[g.rank()];
    });
    // rank 0: (1 + -2^24) + 2^24 = 1; rank 1: (2^24 + 1) + -2^24 = 0 (2^24 + 1 rounds to 2^24);
    // rank 2: (-2^24 + 2^24) + 1 = 1; each times 0.5.
    EXPECT_EQ(got, (std::vector<float>{0.5f, 0.0f, 0.5f})) << to_string(algo);
  }
}

// A list of mixed tensors moves in one all_gather; reduce_scatter in one all_to_all (a2a) or one
// all_gather (ag, no all_to_all). The only other call is the agreement's all_reduce.
TEST(BucketBuffer, EachCallIsOneCollective) {
  LaunchOptions o;
  o.world = 4;
  o.timeout_s = 30;
  std::vector<std::map<std::string, int>> calls(8);  // [rank · 2 + (0: a2a, 1: ag)]
  run_ranks(o, [&](Group& inner) {
    for (BucketAlgo algo : {BucketAlgo::a2a, BucketAlgo::ag}) {
      test::CountingGroup g(inner);
      BucketBuffer buf(g, {1 << 16, algo});
      g.calls.clear();
      const Tensor ag[] = {buf.alloc(DType::bf16, {4 * 3}), buf.alloc(DType::i64, {4 * 5}),
                           buf.alloc(DType::u8, {4 * 7})};
      buf.all_gather(ag);
      const Tensor rs[] = {buf.alloc(DType::f32, {4 * 3}), buf.alloc(DType::f32, {4 * 9})};
      buf.reduce_scatter(rs, {BucketPrecision::bf16, 1.0f, 5});
      calls[size_t(inner.rank()) * 2 + (algo == BucketAlgo::ag ? 1 : 0)] = g.calls;
    }
  });
  for (size_t i = 0; i < calls.size(); ++i) {
    auto c = calls[i];
    const bool a2a = i % 2 == 0;
    EXPECT_EQ(c["all_reduce"], 2);
    EXPECT_EQ(c["all_gather"], a2a ? 1 : 2);
    EXPECT_EQ(c["all_to_all"], a2a ? 1 : 0);
    int total = 0;
    for (auto& [name, n] : c) total += n;
    EXPECT_EQ(total, 4) << "call " << i;
  }
}

class BucketCheck : public ::testing::TestWithParam<int> {};

TEST_P(BucketCheck, MatrixPassesBitExact) {
  LaunchOptions o;
  o.world = GetParam();
  o.timeout_s = 60;
  std::atomic<int> passed{0}, failed{0};
  run_ranks(o, [&](Group& g) {
    const ep::bucket::CheckBucketResult r = ep::bucket::run_check_bucket(g, {});
    if (g.rank() == 0) {
      passed = r.passed;
      failed = r.failed;
    }
  });
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(passed.load(), 40);
}

INSTANTIATE_TEST_SUITE_P(World, BucketCheck, ::testing::Values(1, 2, 3, 4, 8, 16));

// A group that trusts no all_to_all (and throws if one is issued): auto takes ag, a forced a2a is
// an Error on every rank, and the matrix passes on what is left.
class NoAllToAll final : public GroupDecorator {
 public:
  using GroupDecorator::GroupDecorator;
  Capabilities capabilities() const override {
    Capabilities c = inner().capabilities();
    c.all_to_all = false;
    return c;
  }
  void all_to_all(const void*, void*, size_t, DType) override {
    throw Error("all_to_all called on a group that does not trust it");
  }
};

TEST(BucketBuffer, RoutesAroundAnUntrustedAllToAll) {
  LaunchOptions o;
  o.world = 4;
  o.timeout_s = 30;
  std::atomic<int> passed{0}, failed{0}, threw{0}, path{-1};
  run_ranks(o, [&](Group& inner) {
    NoAllToAll g(inner);
    try {
      BucketBuffer forced(g, {64, BucketAlgo::a2a});
    } catch (const Error&) {
      ++threw;
    }
    BucketBuffer buf(g, {64, BucketAlgo::automatic});
    const ep::bucket::CheckBucketResult r = ep::bucket::run_check_bucket(g, {});
    if (g.rank() == 0) {
      passed = r.passed;
      failed = r.failed;
      path = int(buf.path());
    }
  });
  EXPECT_EQ(threw.load(), 4);
  EXPECT_EQ(path.load(), int(BucketAlgo::ag));
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(passed.load(), 30);
}

}  // namespace
}  // namespace deepinfer
