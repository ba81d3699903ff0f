// Engine: greedy generation at EP 2 (threads) equals the PyTorch golden continuation, a rank with
// no requests still joins every MoE layer, stop tokens end a sequence, and gather_results moves
// every rank's results.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
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

namespace deepinfer::runtime {
namespace {

// The step-level API at EP 2: a request that joins while another decodes, on the other rank
// nothing at first, still gives the golden tokens; a cancelled sequence gives its pages back and
// emits nothing more.
TEST(Engine, StepApiJoinsMidRunAndCancelsMatchingTheGolden) {
  const auto j = golden();
  const auto& p0 = j.at("prompts").at(0);
  const auto& p1 = j.at("prompts").at(1);
  const auto ids0 = p0.at("ids").get<std::vector<int32_t>>(),
             gen0 = p0.at("generated_ids").get<std::vector<int32_t>>();
  const auto ids1 = p1.at("ids").get<std::vector<int32_t>>(),
             gen1 = p1.at("generated_ids").get<std::vector<int32_t>>();
  ASSERT_GE(gen0.size(), 4u);
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  lo.ep = 2;
  std::mutex mu;
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, std::string> reason;
  std::vector<int64_t> free_after(2, -1), total(2, 0);
  run_model_ranks(lo, [&](RankContext& ctx) {
    EngineOptions eo;
    eo.kv_pages = 32;
    eo.max_tokens_per_step = 5;  // prompts prefill in chunks beside the decodes
    Engine engine(ctx.weights, ctx.group, eo);
    const int rank = ctx.group.rank();
    auto req = [](int64_t id, const std::vector<int32_t>& ids, size_t n) {
      Request r;
      r.id = id;
      r.prompt = ids;
      r.max_new_tokens = int64_t(n);
      return r;
    };
    if (rank == 0) engine.start(req(0, ids0, gen0.size()));
    for (int step = 0; step < 200; ++step) {
      if (step == 3 && rank == 1) engine.start(req(1, ids1, gen1.size()));
      if (step == 3 && rank == 0) engine.start(req(2, ids1, 500));  // cancelled below
      if (step == 6 && rank == 0) engine.cancel(2);
      int32_t running = engine.num_active() > 0 || step < 4 ? 1 : 0;
      ctx.group.all_reduce(&running, 1, DType::i32, ReduceOp::max);
      if (!running) break;
      for (const auto& ev : engine.step()) {
        std::lock_guard lk(mu);
        got[ev.id].push_back(ev.token);
        if (ev.finished) reason[ev.id] = ev.result.finish_reason;
      }
    }
    std::lock_guard lk(mu);
    free_after[size_t(rank)] = engine.free_pages();
    total[size_t(rank)] = engine.total_pages();
  });
  EXPECT_EQ(got[0], gen0);
  EXPECT_EQ(got[1], gen1);
  EXPECT_EQ(reason[0], "length");
  EXPECT_EQ(reason[1], "length");
  EXPECT_LE(got[2].size(), 3u);  // started at step 3, cancelled before step 6
  EXPECT_EQ(reason.count(2), 0u);
  EXPECT_EQ(free_after[0], total[0]);
  EXPECT_EQ(free_after[1], total[1]);
  EXPECT_EQ(total[0], 32);
}

TEST(Engine, StartRefusesWhatDoesNotFit) {
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  run_model_ranks(lo, [&](RankContext& ctx) {
    EngineOptions eo;
    eo.kv_pages = 2;
    eo.max_batch = 1;
    Engine engine(ctx.weights, ctx.group, eo);
    Request r;
    r.id = 1;
    r.prompt = {5, 6, 7};
    r.max_new_tokens = 200;  // 4 pages > 2
    EXPECT_THROW(engine.start(r), Error);
    r.max_new_tokens = 10;
    engine.start(r);
    EXPECT_EQ(engine.free_pages(), 1);
    r.id = 2;
    EXPECT_THROW(engine.start(r), Error);  // max_batch 1
    r.id = 1;
    EXPECT_THROW(engine.start(r), Error);  // already running
    engine.cancel(1);
    EXPECT_EQ(engine.free_pages(), 2);
    EXPECT_EQ(engine.num_active(), 0);
  });
}

}  // namespace
}  // namespace deepinfer::runtime
