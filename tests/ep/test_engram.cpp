// EngramBuffer: the path choice (pure), the check matrix on the local group at 1..16 ranks, and
// agreed errors (a bad index on one rank, differing n) raised on every rank without a hang.
#include <deepinfer/comm.h>
#include <deepinfer/engram.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "ep/engram/check_engram.h"
#include "ep/engram/path.h"

namespace deepinfer {
namespace {

using ep::engram::choose_path;

TEST(EngramPath, AutoFollowsTheGroup) {
  Capabilities all;
  Capabilities no_v;
  no_v.all_to_all_v = false;
  EXPECT_EQ(choose_path(EngramAlgo::automatic, PeerMemory::address_space, all), EngramAlgo::direct);
  EXPECT_EQ(choose_path(EngramAlgo::automatic, PeerMemory::address_space, no_v),
            EngramAlgo::direct);
  // A window would copy the shard at every fetch: the exchange instead.
  EXPECT_EQ(choose_path(EngramAlgo::automatic, PeerMemory::window, all), EngramAlgo::a2a);
  EXPECT_EQ(choose_path(EngramAlgo::automatic, PeerMemory::none, all), EngramAlgo::a2a);
  EXPECT_EQ(choose_path(EngramAlgo::automatic, PeerMemory::none, no_v), EngramAlgo::ag);
}

TEST(EngramPath, ForcedPathsAndTheirErrors) {
  Capabilities all;
  Capabilities no_v;
  no_v.all_to_all_v = false;
  EXPECT_EQ(choose_path(EngramAlgo::ag, PeerMemory::address_space, all), EngramAlgo::ag);
  EXPECT_EQ(choose_path(EngramAlgo::a2a, PeerMemory::address_space, all), EngramAlgo::a2a);
  EXPECT_EQ(choose_path(EngramAlgo::direct, PeerMemory::window, no_v), EngramAlgo::direct);
  EXPECT_THROW(choose_path(EngramAlgo::a2a, PeerMemory::none, no_v), Error);
  EXPECT_THROW(choose_path(EngramAlgo::direct, PeerMemory::none, all), Error);
}

class EngramCheck : public ::testing::TestWithParam<int> {};

TEST_P(EngramCheck, MatrixPassesBitExact) {
  LaunchOptions o;
  o.world = GetParam();
  o.timeout_s = 60;
  std::atomic<int> passed{0}, failed{0};
  run_ranks(o, [&](Group& g) {
    const ep::engram::CheckEngramResult r = ep::engram::run_check_engram(g, {});
    if (g.rank() == 0) {
      passed = r.passed;
      failed = r.failed;
    }
  });
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(passed.load(), 100);
}

INSTANTIATE_TEST_SUITE_P(World, EngramCheck, ::testing::Values(1, 2, 4, 8, 16));

// Through a backend whose all_to_all_v hangs: auto takes ag (no all_to_all, no peer memory) and
// the matrix still passes.
TEST(EngramFault, AutoRoutesAroundABrokenAllToAllV) {
  LaunchOptions o;
  o.world = 4;
  o.fault = "a2av-hang";
  o.timeout_s = 20;
  std::atomic<int> passed{0}, failed{0}, path{-1};
  run_ranks(o, [&](Group& g) {
    EngramConfig cfg;
    cfg.hidden = 4;
    EngramBuffer buf(g, cfg);
    const ep::engram::CheckEngramResult r = ep::engram::run_check_engram(g, {});
    if (g.rank() == 0) {
      passed = r.passed;
      failed = r.failed;
      path = int(buf.path());
    }
  });
  EXPECT_EQ(path.load(), int(EngramAlgo::ag));
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(passed.load(), 40);
}

// A bad index on one rank only: every rank throws, on every path, and nobody hangs.
TEST(EngramErrors, BadIndexOnOneRankIsAnErrorEverywhere) {
  for (EngramAlgo algo : {EngramAlgo::ag, EngramAlgo::a2a, EngramAlgo::direct}) {
    LaunchOptions o;
    o.world = 4;
    o.timeout_s = 20;
    std::atomic<int> threw{0};
    run_ranks(o, [&](Group& g) {
      EngramConfig cfg;
      cfg.hidden = 4;
      cfg.algo = algo;
      EngramBuffer buf(g, cfg);
      buf.write(Tensor::zeros(DType::bf16, {3, 4}));
      std::vector<int32_t> idx{0, 1, 11, -1};
      if (g.rank() == 2) idx[1] = 12;  // W·n = 12
      try {
        buf.fetch(Tensor::borrow(idx.data(), DType::i32, {2, 2}));
      } catch (const Error& e) {
        threw += 1;
        if (g.rank() == 2) {
          EXPECT_NE(std::string(e.what()).find("index 12"), std::string::npos);
        }
      }
    });
    EXPECT_EQ(threw.load(), 4) << to_string(algo);
  }
}

// The fetched rows, on one rank, equal the owners' rows (a check that does not go through the
// matrix's generator): row g of a table whose every element is g.
TEST(EngramFetch, RowsComeFromTheirOwners) {
  LaunchOptions o;
  o.world = 3;
  std::atomic<int> bad{0};
  run_ranks(o, [&](Group& g) {
    for (EngramAlgo algo : {EngramAlgo::ag, EngramAlgo::a2a, EngramAlgo::direct}) {
      EngramConfig cfg;
      cfg.hidden = 2;
      cfg.dtype = EngramDType::fp8;
      cfg.scale_cols = 1;
      cfg.algo = algo;
      EngramBuffer buf(g, cfg);
      const int64_t n = 5;
      Tensor shard = Tensor::empty(DType::e4m3, {n, 2}), sf = Tensor::empty(DType::f32, {n, 1});
      for (int64_t i = 0; i < n; ++i) {
        const int64_t gid = g.rank() * n + i;
        shard.data<uint8_t>()[2 * i] = uint8_t(gid);
        shard.data<uint8_t>()[2 * i + 1] = uint8_t(100 + gid);
        sf.data<float>()[i] = float(gid) + 0.5f;
      }
      buf.write(shard, sf);
      std::vector<int32_t> idx{14, -1, 0, 7, 7, 3};
      const EngramResult r = buf.fetch(Tensor::borrow(idx.data(), DType::i32, {2, 3}));
      if (r.data.dim(0) != 2 || r.data.dim(1) != 6 || r.sf.dim(1) != 3) bad += 1;
      for (size_t p = 0; p < idx.size(); ++p) {
        const int g_id = idx[p];
        const uint8_t* d = r.data.data<uint8_t>() + 2 * p;
        const bool ok = g_id < 0 ? (d[0] == 0 && d[1] == 0 && r.sf.data<float>()[p] == 0.0f)
                                 : (d[0] == g_id && d[1] == 100 + g_id &&
                                    r.sf.data<float>()[p] == float(g_id) + 0.5f);
        if (!ok) bad += 1;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace deepinfer
