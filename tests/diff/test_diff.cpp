// `deepinfer diff` core: buffer comparison against closed forms, ranking, the EP merge, and the
// recorder on a direct kernel driver — clean (every call within tolerance) and with one call
// perturbed through DEEPINFER_FAULT (that op and call index must rank first).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <string>

#include "core/env.h"
#include "diff_driver.h"
#include "kernels/diff/diff_recorder.h"

namespace deepinfer::kernels::diff {
namespace {

class ScopedFault {
 public:
  explicit ScopedFault(std::string fault) : saved_(knobs()) {
    Knobs k = saved_;
    k.fault = std::move(fault);
    set_knobs(k);
  }
  ~ScopedFault() { set_knobs(saved_); }

 private:
  Knobs saved_;
};

DiffRow make_row(std::string op, uint64_t index, double rel_err, double tol,
                 int64_t nonfinite = 0) {
  DiffRow r;
  r.op = std::move(op);
  r.index = index;
  r.rel_err = rel_err;
  r.tol = tol;
  r.nonfinite = nonfinite;
  return r;
}

DiffReport run_driver_with_recorder(int passes = 1) {
  DiffRecorder rec;
  {
    ScopedBackend cpu(KernelBackend::cpu);
    ScopedRecorder on(&rec);
    for (int i = 0; i < passes; ++i) testing::run_driver_pass(uint64_t(i + 1));
  }
  return make_report(rec.all_rows());
}

TEST(DiffCompare, ClosedForms) {
  const std::vector<float> b{3.0f, 4.0f, 0.0f, 0.0f};
  const std::vector<float> a{3.0f, 4.0f, 0.5f, 0.0f};  // ‖a−b‖ = 0.5, ‖b‖ = 5
  const BufferDiff d = compare_buffer(DType::f32, a.data(), b.data(), 4, 1e-3);
  EXPECT_DOUBLE_EQ(d.max_abs, 0.5);
  EXPECT_NEAR(d.rel_err, 0.1, 1e-12);
  EXPECT_EQ(d.over_tol, 1);  // only element 2 (0.5 > 1e-3 · rms 2.5)
  EXPECT_EQ(d.nonfinite, 0);

  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const std::vector<float> b2{1.0f, inf, 2.0f, -inf};
  const std::vector<float> a2{1.0f, inf, nan,
                              inf};  // inf==inf ok; NaN and -inf vs inf are mismatches
  const BufferDiff d2 = compare_buffer(DType::f32, a2.data(), b2.data(), 4, 1e-3);
  EXPECT_EQ(d2.nonfinite, 2);
  EXPECT_EQ(d2.nan_a, 1);
  EXPECT_DOUBLE_EQ(d2.rel_err, 0.0);  // the finite pair matches

  const std::vector<int64_t> ib{1, 2, 3, 4}, ia{1, 2, 7, 4};
  const BufferDiff d3 = compare_buffer(DType::i64, ia.data(), ib.data(), 4, 0);
  EXPECT_EQ(d3.over_tol, 1);
  EXPECT_DOUBLE_EQ(d3.rel_err, 0.25);
  EXPECT_DOUBLE_EQ(d3.max_abs, 4.0);

  const std::vector<bf16> zb(3), za{f32_to_bf16(0.0f), f32_to_bf16(1.0f), f32_to_bf16(0.0f)};
  EXPECT_TRUE(std::isinf(compare_buffer(DType::bf16, za.data(), zb.data(), 3, 2e-3).rel_err));
}

TEST(DiffRank, NanFirstThenScore) {
  std::vector<DiffRow> rows(4);
  rows[0] = make_row("a", 0, 1e-3, 2e-3);  // score 0.5
  rows[1] = make_row("b", 3, 1e-4, 1e-5);  // score 10
  rows[2] = make_row("c", 1, 0, 1e-5, 2);  // NaN: first
  rows[3] = make_row("d", 2, 0.25, 0);     // exact op differs
  const DiffReport rep = make_report(rows);
  ASSERT_EQ(rep.ranked.size(), 4u);
  EXPECT_EQ(rep.ranked[0].op, "c");
  EXPECT_EQ(rep.ranked[1].op, "d");
  EXPECT_EQ(rep.ranked[2].op, "b");
  EXPECT_EQ(rep.ranked[3].op, "a");
  EXPECT_EQ(rep.bad_calls, 3);
  EXPECT_FALSE(rep.ok());
  const std::string json = report_json(rep, {.top = 2});
  EXPECT_NE(json.find("\"ok\":false"), std::string::npos);
  EXPECT_NE(json.find("\"op\":\"c\""), std::string::npos);
}

TEST(DiffRank, Summary) {
  std::vector<DiffRow> rows;
  for (double r : {1e-6, 5e-6, 3e-6}) rows.push_back(make_row("x", 0, r, 1e-5));
  const auto s = summarize(rows);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].calls, 3);
  EXPECT_DOUBLE_EQ(s[0].worst_rel, 5e-6);
  EXPECT_DOUBLE_EQ(s[0].median_rel, 3e-6);
  EXPECT_EQ(s[0].bad_calls, 0);
}

TEST(DiffMerge, SerializeRoundTrip) {
  std::vector<DiffRow> rows(2);
  rows[0] = make_row("gemm_fp8", 7, 1e-3, 2e-3);
  rows[0].rank = 1;
  rows[0].tag = "layer0.q";
  rows[0].over_tol = 3;
  rows[1] = make_row("router", 0, 0, 0, 1);
  const auto back = deserialize_rows(serialize_rows(rows));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].tag, "layer0.q");
  EXPECT_EQ(back[0].index, 7u);
  EXPECT_EQ(back[0].over_tol, 3);
  EXPECT_DOUBLE_EQ(back[0].rel_err, 1e-3);
  EXPECT_EQ(back[1].op, "router");
  EXPECT_EQ(back[1].nonfinite, 1);
  std::string cut = serialize_rows(rows);
  cut.pop_back();
  EXPECT_THROW(deserialize_rows(cut), Error);
}

TEST(DiffMerge, GatherOverRanks) {
  // Each rank thread drives its own calls; rank 1 faults (every rank thread would: the knob is
  // process-wide, so the fault goes on a call only rank 1 makes); rank 0 must see both tables.
  DiffRecorder rec;
  std::vector<DiffRow> merged;
  std::mutex mu;
  ScopedFault f("kernel:rms_norm:1");
  ScopedRecorder on(&rec);
  LaunchOptions lo;
  lo.world = 2;
  run_ranks(lo, [&](Group& g) {
    DiffRankScope bind(rec, g.rank());
    ScopedBackend cpu(KernelBackend::cpu);
    if (g.rank() == 1)
      testing::run_driver_pass(5);
    else {
      reset_call_counters();
      KernelTag t("rank0");
      const auto x = kernels::testing::random_bf16(64, 9);
      const auto w = kernels::testing::random_bf16(64, 10);
      std::vector<bf16> y(64);
      RmsNormParams p;
      p.x = x.data();
      p.w = w.data();
      p.y = y.data();
      p.num_tokens = 1;
      p.hidden = 64;
      rms_norm(p);
    }
    auto rows = gather_diff_rows(g, rec.rows(g.rank()));
    if (g.rank() == 0) {
      std::lock_guard lk(mu);
      merged = std::move(rows);
    }
  });
  const DiffReport rep = make_report(merged);
  EXPECT_EQ(rep.calls, 1 + 2 * int64_t(std::size(testing::kDriverOps)));
  std::set<int> ranks;
  for (const auto& r : rep.ranked) ranks.insert(r.rank);
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  ASSERT_FALSE(rep.ranked.empty());
  EXPECT_EQ(rep.ranked[0].rank, 1);
  EXPECT_EQ(rep.ranked[0].op, "rms_norm");
  EXPECT_EQ(rep.ranked[0].index, 1u);
  EXPECT_EQ(rep.bad_calls, 1);
}

TEST(DiffDriver, CleanRunWithinTolerance) {
  const DiffReport rep = run_driver_with_recorder(2);
  EXPECT_EQ(rep.calls, 2 * 2 * int64_t(std::size(testing::kDriverOps)));
  std::set<std::string> ops;
  for (const auto& o : rep.ops) ops.insert(o.op);
  for (const char* op : testing::kDriverOps) EXPECT_TRUE(ops.count(op)) << op << " not recorded";
  EXPECT_TRUE(rep.ok()) << format_report(rep, {.top = 5});
  for (const auto& r : rep.ranked) {
    EXPECT_FALSE(r.tag.empty()) << r.op;
    EXPECT_LE(r.rel_err, r.tol) << r.op << " call " << r.index;
  }
}

class DiffFault : public ::testing::TestWithParam<const char*> {};

TEST_P(DiffFault, FaultedCallRanksFirst) {
  const std::string op = GetParam();
  ScopedFault f("kernel:" + op + ":1");
  const DiffReport rep = run_driver_with_recorder();
  ASSERT_FALSE(rep.ranked.empty());
  const DiffRow& top = rep.ranked[0];
  EXPECT_EQ(top.op, op) << format_report(rep, {.top = 5});
  EXPECT_EQ(top.index, 1u);
  EXPECT_EQ(top.tag.substr(0, 6), "layer1");  // the second call of each op is in layer1
  EXPECT_TRUE(top.bad());
  EXPECT_EQ(rep.bad_calls, 1) << format_report(rep, {.top = 5});
  EXPECT_NE(format_report(rep, {.top = 3}).find("FAIL"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Ops, DiffFault, ::testing::ValuesIn(testing::kDriverOps),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deepinfer::kernels::diff
