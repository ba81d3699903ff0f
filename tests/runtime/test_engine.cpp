// Engine: greedy generation at EP 2 (threads) equals the PyTorch golden continuation, a rank with
// no requests still joins every MoE layer, stop tokens end a sequence, and gather_results moves
// every rank's results.
#include <deepinfer/comm.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "runtime/engine.h"
#include "runtime/launch.h"

namespace deepinfer::runtime {
namespace {

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

nlohmann::json golden() {
  std::ifstream in(kTiny + "/golden/golden.json");
  return nlohmann::json::parse(in);
}

TEST(Engine, GreedyAtEp2MatchesGoldenStopsAndIdleRankJoins) {
  const auto j = golden();
  const auto& p0 = j.at("prompts").at(0);
  const auto& p1 = j.at("prompts").at(1);
  const auto ids0 = p0.at("ids").get<std::vector<int32_t>>(),
             gen0 = p0.at("generated_ids").get<std::vector<int32_t>>();
  const auto ids1 = p1.at("ids").get<std::vector<int32_t>>(),
             gen1 = p1.at("generated_ids").get<std::vector<int32_t>>();
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  lo.ep = 2;
  std::vector<RequestResult> all;
  std::vector<int32_t> streamed;
  std::mutex mu;
  run_model_ranks(lo, [&](RankContext& ctx) {
    Engine engine(ctx.weights, ctx.group, {});
    std::vector<Request> reqs;
    if (ctx.group.rank() == 0) {  // rank 1 has nothing to do but must join every MoE layer
      Request a;
      a.id = 0;
      a.prompt = ids0;
      a.max_new_tokens = int64_t(gen0.size());
      Request b;
      b.id = 1;
      b.prompt = ids1;
      b.max_new_tokens = 100;
      b.stop_ids = {gen1[3]};
      reqs = {a, b};
    }
    auto local = engine.generate(reqs, [&](int64_t id, int32_t t) {
      std::lock_guard lk(mu);
      if (id == 0) streamed.push_back(t);
    });
    auto g = gather_results(ctx.group, local);
    if (ctx.group.rank() == 1) all = g;
  });
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].tokens, gen0);
  EXPECT_EQ(streamed, gen0);
  EXPECT_EQ(all[0].finish_reason, "length");
  // Stops at the first occurrence of the stop token (kept in the output).
  size_t first = 0;
  while (gen1[first] != gen1[3]) ++first;
  EXPECT_EQ(all[1].tokens, std::vector<int32_t>(gen1.begin(), gen1.begin() + int64_t(first) + 1));
  EXPECT_EQ(all[1].finish_reason, "stop");
}

}  // namespace
}  // namespace deepinfer::runtime

namespace deepinfer::runtime {
namespace {

// Rank threads of one process share its cores: each gets the process's threads / ranks (at least
// one), so W pools never oversubscribe the machine W times over.
TEST(Launch, LocalRanksSplitTheKernelThreads) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int total = knobs().threads > 0 ? knobs().threads : hw;
  for (int world : {1, 2, 3}) {
    std::mutex mu;
    std::vector<int> got;
    LaunchOptions lo;
    lo.world = world;
    run_ranks(lo, [&](Group& g) {
      const int n = kernel_threads_per_rank(g, CommKind::local);
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(n);
    });
    ASSERT_EQ(int(got.size()), world);
    for (int n : got) EXPECT_EQ(n, std::max(1, total / world)) << "world " << world;
  }
}

}  // namespace
}  // namespace deepinfer::runtime
