// `deepinfer diff` on the tiny model (models/tiny): a clean run lists every op within tolerance,
// and one perturbed call (DEEPINFER_FAULT) of each of GEMM, attention decode, RMSNorm and router
// is ranked first, with its exact call index.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/env.h"
#include "kernels/diff/diff_recorder.h"
#include "kernels/registry.h"
#include "runtime/engine.h"
#include "runtime/launch.h"

namespace deepinfer::kernels::diff {
namespace {

const std::string kModel = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

class ScopedFault {
 public:
  explicit ScopedFault(std::string fault) : saved_(knobs()) {
    Knobs k = saved_;
    k.fault = std::move(fault);
    k.kernels = "cpu";
    set_knobs(k);
  }
  ~ScopedFault() { set_knobs(saved_); }

 private:
  Knobs saved_;
};

// The same flow as `deepinfer diff`: 2 prompts (fixed token ids) x 3 new tokens (2 decode steps).
DiffReport run_model_diff(int ep) {
  runtime::LaunchModelOptions lo;
  lo.model_dir = kModel;
  lo.ep = ep;
  DiffRecorder rec;
  std::optional<DiffReport> rep;
  std::mutex mu;
  runtime::run_model_ranks(lo, [&](runtime::RankContext& ctx) {
    Group& g = ctx.group;
    DiffRankScope bind(rec, g.rank());
    std::optional<ScopedRecorder> on;
    g.barrier();
    if (g.rank() == 0) on.emplace(&rec);
    g.barrier();
    reset_call_counters();
    {
      runtime::Engine engine(ctx.weights, g, runtime::EngineOptions{});
      std::vector<runtime::Request> reqs;
      for (int i = 0; i < 2; ++i) {
        if (i % g.size() != g.rank()) continue;
        runtime::Request r;
        r.id = i;
        r.prompt = {0, 17 + i, 305, 1200, 44, 9};
        r.max_new_tokens = 3;
        reqs.push_back(r);
      }
      engine.generate(reqs);
    }
    g.barrier();
    on.reset();
    g.barrier();
    auto rows = gather_diff_rows(g, rec.rows(g.rank()));
    if (g.rank() == 0) {
      std::lock_guard lk(mu);
      rep = make_report(std::move(rows));
    }
  });
  return *rep;
}

TEST(DiffModel, CleanRunWithinTolerance) {
  ScopedFault none("");
  const DiffReport rep = run_model_diff(1);
  std::map<std::string, int64_t> calls;
  for (const auto& o : rep.ops) calls[o.op] = o.calls;
  for (const char* op : {"rms_norm", "router", "mla_decode"}) EXPECT_GE(calls[op], 2) << op;
  EXPECT_GE(calls["gemm_fp8"] + calls["gemm_bf16"], 2);
  EXPECT_TRUE(rep.ok()) << format_report(rep, {.top = 10});
}

TEST(DiffModel, CleanRunUnderEp2MergesBothRanks) {
  ScopedFault none("");
  const DiffReport rep = run_model_diff(2);
  bool r0 = false, r1 = false;
  for (const auto& r : rep.ranked) (r.rank == 0 ? r0 : r1) = true;
  EXPECT_TRUE(r0 && r1);
  EXPECT_TRUE(rep.ok()) << format_report(rep, {.top = 10});
}

class DiffModelFault : public ::testing::TestWithParam<const char*> {};

TEST_P(DiffModelFault, FaultedCallRanksFirst) {
  std::string op = GetParam();
  if (op == "gemm") {  // whichever GEMM the model's linear layers use
    ScopedFault none("");
    const DiffReport clean = run_model_diff(1);
    op = "gemm_bf16";
    for (const auto& o : clean.ops)
      if (o.op == "gemm_fp8" && o.calls >= 2) op = "gemm_fp8";
  }
  ScopedFault f("kernel:" + op + ":1");
  const DiffReport rep = run_model_diff(1);
  ASSERT_FALSE(rep.ranked.empty());
  EXPECT_EQ(rep.ranked[0].op, op) << format_report(rep, {.top = 5});
  EXPECT_EQ(rep.ranked[0].index, 1u) << format_report(rep, {.top = 5});
  EXPECT_TRUE(rep.ranked[0].bad());
  EXPECT_FALSE(rep.ok());
}

INSTANTIATE_TEST_SUITE_P(Ops, DiffModelFault,
                         ::testing::Values("gemm", "mla_decode", "rms_norm", "router"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deepinfer::kernels::diff
