// The decode profile's accounting (kernels/profiler.h) against what the test itself did: call
// counts, scope nesting, collective time net of the kernels inside, and the pool-wait counter
// against a wait the test arranges.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/profiler.h"
#include "kernels/recorder.h"
#include "kernels/swiglu.h"

namespace deepinfer::kernels {
namespace {

void run_swiglu(std::vector<bf16>& gu, std::vector<bf16>& y, int64_t T, int64_t I) {
  SwigluParams p;
  p.gate = gu.data();
  p.up = gu.data() + I;
  p.y = y.data();
  p.num_tokens = T;
  p.inter = I;
  swiglu(p);
}

TEST(Profiler, CountsKernelsPerTagAndNetsCollectiveScopes) {
  const int64_t T = 4, I = 256;
  std::vector<bf16> gu(size_t(T * 2 * I), bf16(0.5f)), y(size_t(T * I));
  Profiler prof;
  const auto t0 = std::chrono::steady_clock::now();
  {
    ScopedProfiler use(&prof);
    KernelTag layer("layer0");
    {
      KernelTag mlp("mlp");
      for (int i = 0; i < 3; ++i) run_swiglu(gu, y, T, I);
    }
    {
      KernelTag ep("moe.dispatch", ScopeKind::collective);
      run_swiglu(gu, y, T, I);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run_swiglu(gu, y, T, I);  // no profiler installed: not counted

  const auto& k = prof.kernels();
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k.at({"layer0.mlp", "swiglu"}).calls, 3);
  EXPECT_EQ(k.at({"layer0.moe.dispatch", "swiglu"}).calls, 1);
  const auto& s = prof.scopes();
  ASSERT_EQ(s.size(), 3u);
  const double layer = s.at("layer0").seconds, ep = s.at("layer0.moe.dispatch").seconds;
  EXPECT_EQ(s.at("layer0.moe.dispatch").kind, ScopeKind::collective);
  EXPECT_GE(ep, 0.020);
  EXPECT_LE(layer, wall);
  EXPECT_GE(layer, ep + s.at("layer0.mlp").seconds);
  double kern = 0;
  for (const auto& [key, st] : k) kern += st.seconds;
  EXPECT_LE(kern, layer);

  // The table: one step whose wall time was `wall`; the layer row's parts add up to its total.
  const std::string table = prof.table(1, wall);
  EXPECT_NE(table.find("swiglu"), std::string::npos);
  EXPECT_NE(table.find("layer0"), std::string::npos);
  EXPECT_NE(table.find("outside the parts"), std::string::npos);
}

TEST(Profiler, PoolWaitIsTheCallersWaitForWorkers) {
  ThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> worker_ran{false};
  const int64_t before = pool_wait_ns();
  // Chunks on a worker sleep; the caller's own return at once, so when a worker took any chunk
  // the caller waited at least that long, and when it took none the caller never waited on it.
  pool.parallel_for(2, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() != caller) {
      worker_ran = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  const double waited = double(pool_wait_ns() - before) * 1e-9;
  if (worker_ran) {
    EXPECT_GE(waited, 0.025);
  } else {
    EXPECT_LT(waited, 0.025);
  }
  EXPECT_LT(waited, 5.0);
}

}  // namespace
}  // namespace deepinfer::kernels
