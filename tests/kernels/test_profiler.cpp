// The decode profile's accounting (kernels/profiler.h) against what the test itself did: call
// counts, scope nesting, collective time net of the kernels inside, and the pool-wait counter
// against a wait the test arranges, and each GEMM call's floor against the closed form
// max(weight bytes / read bandwidth, flops / peak).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/gemm.h"
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

// A bf16 GEMM m×n×k reads 2·n·k weight bytes and does 2·m·n·k flops; an fp8 one n·k codes plus
// its 4-byte 128×128 block scales. Limits chosen so one call is read-bound and one compute-bound.
TEST(Profiler, GemmFloorIsTheSlowerOfReadAndCompute) {
  const int64_t m = 4, n = 256, k = 256;
  std::vector<bf16> a(size_t(m * k), bf16(0.25f)), w(size_t(n * k), bf16(0.5f));
  std::vector<float> out(size_t(m * n));
  std::vector<fp8_e4m3> a8(size_t(m * k), fp8_e4m3(1.0f)), w8(size_t(n * k), fp8_e4m3(0.5f));
  std::vector<float> as(size_t(m * num_blocks(k)), 1.0f),
      ws(size_t(num_blocks(n) * num_blocks(k)), 1.0f);
  std::vector<bf16> o1(size_t(m * n)), o2(size_t(m * n));
  // 1 GB/s and 1 GFLOP/s: bf16 reads 131072 B (131 µs) and computes 524288 flops (524 µs); the
  // fp8 peak of 10 GFLOP/s makes the multi call (two problems: 131072 + 16 scale bytes, twice the
  // flops) read-bound: 131.1 µs against 104.9 µs.
  const RooflineLimits lim{.read_gbps = 1.0, .peak_gflops = 1.0, .fp8_peak_gflops = 10.0};
  Profiler prof;
  prof.set_limits(lim);
  {
    ScopedProfiler use(&prof);
    gemm_bf16({.a = a.data(), .w = w.data(), .out_f32 = out.data(), .m = m, .n = n, .k = k});
    std::vector<GemmFp8Params> multi(2);
    for (int i = 0; i < 2; ++i)
      multi[size_t(i)] = {.a = a8.data(),
                          .a_scales = as.data(),
                          .w = w8.data(),
                          .w_scales = ws.data(),
                          .out = i ? o2.data() : o1.data(),
                          .m = m,
                          .n = n,
                          .k = k};
    gemm_fp8_multi(multi);
  }
  const auto& bf = prof.kernels().at({"", "gemm_bf16"});
  EXPECT_DOUBLE_EQ(bf.weight_bytes, double(2 * n * k));
  EXPECT_DOUBLE_EQ(bf.flops, double(2 * m * n * k));
  EXPECT_DOUBLE_EQ(bf.floor, double(2 * m * n * k) / 1e9);  // compute-bound
  const auto& mu = prof.kernels().at({"", "gemm_fp8_multi"});
  const double bytes = 2.0 * double(n * k + num_blocks(n) * num_blocks(k) * 4);
  EXPECT_DOUBLE_EQ(mu.weight_bytes, bytes);
  EXPECT_DOUBLE_EQ(mu.flops, 4.0 * double(m * n * k));
  EXPECT_DOUBLE_EQ(mu.floor, bytes / 1e9);  // read-bound at the fp8 peak
  const std::string table = prof.table(1, 0.01);
  EXPECT_NE(table.find("x floor"), std::string::npos);
  EXPECT_NE(table.find("# floor: each GEMM call"), std::string::npos);
  // The op rows sum into the floor line (ms per step, one step here).
  EXPECT_NE(table.find(fmt::format("against {:.3f} ms", (bf.floor + mu.floor) * 1e3)),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("(no scope) gemm_bf16"), std::string::npos) << table;  // GEMMs by place

  // Without limits there are no floors and no floor columns.
  Profiler bare;
  {
    ScopedProfiler use(&bare);
    gemm_bf16({.a = a.data(), .w = w.data(), .out_f32 = out.data(), .m = m, .n = n, .k = k});
  }
  EXPECT_EQ(bare.kernels().at({"", "gemm_bf16"}).floor, 0.0);
  EXPECT_EQ(bare.table(1, 0.01).find("x floor"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::kernels
