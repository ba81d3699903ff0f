// EPBuffer unit tests on the `local` backend at small worlds: config validation, layout against
// hand-computed counts, input errors agreed on every rank, the collectives each algorithm issues
// (through a counting Group), and dispatch/combine against the host reference.
#include <deepinfer/ep.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "counting_group.h"
#include "ep/check_ep.h"
#include "ep/reference.h"

namespace deepinfer {
namespace {

// memcmp that accepts the null data of empty tensors and vectors when n = 0.
bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

EPConfig small_config(int world) {
  EPConfig c;
  c.num_experts = 4 * world;
  c.hidden = 160;
  c.num_topk = std::min(4, c.num_experts);
  c.num_max_tokens_per_rank = 20;
  c.algo = EpAlgo::ag;
  c.combine = CombineMode::exact;
  c.ag_rows = AgRows::max;
  c.reduce = EpReduce::rs;
  c.chunk_bytes = 64 << 20;
  return c;
}

void run_local(int world, const std::function<void(Group&)>& fn) {
  LaunchOptions o;
  o.comm = CommKind::local;
  o.world = world;
  o.timeout_s = 20;
  run_ranks(o, fn);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(EpConfig, ValidateNamesTheField) {
  EPConfig c = small_config(2);
  EXPECT_EQ(error_of([&] { c.validate(2); }), "");
  EPConfig bad = c;
  bad.num_experts = 9;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("num_experts"), std::string::npos);
  bad = c;
  bad.num_topk = 0;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("num_topk"), std::string::npos);
  bad = c;
  bad.num_topk = 9;  // > E = 8
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("num_topk"), std::string::npos);
  bad = c;
  bad.hidden = 0;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("hidden"), std::string::npos);
  bad = c;
  bad.expert_alignment = 0;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("expert_alignment"), std::string::npos);
  bad = c;
  bad.chunk_bytes = 100;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("chunk_bytes"), std::string::npos);
  bad = c;
  bad.num_max_tokens_per_rank = -1;
  EXPECT_NE(error_of([&] { bad.validate(2); }).find("num_max_tokens_per_rank"), std::string::npos);
}

TEST(EpConfig, AutoFollowsCapabilities) {
  Capabilities trusted;
  Capabilities no_v;
  no_v.all_to_all_v = false;
  EXPECT_EQ(resolve_ep_algo(EpAlgo::automatic, trusted), EpAlgo::a2a);
  EXPECT_EQ(resolve_ep_algo(EpAlgo::automatic, no_v), EpAlgo::ag);
  EXPECT_EQ(resolve_ep_algo(EpAlgo::a2a, no_v), EpAlgo::a2a);  // explicit stays
  EXPECT_EQ(resolve_ep_algo(EpAlgo::ag, trusted), EpAlgo::ag);
}

TEST(EpLayout, CountsMatchHandComputed) {
  run_local(2, [](Group& g) {
    EPConfig c = small_config(2);  // E = 8, L = 4, K = 4
    EPBuffer buf(g, c);
    // token 0: experts 0 1 (rank 0) and 5 (rank 1); token 1: all masked; token 2: 7 only.
    std::vector<int64_t> idx{0, 1, -1, 5, -1, -1, -1, -1, 7, -1, -1, -1};
    const Layout l = buf.layout(Tensor::borrow(idx.data(), DType::i64, {3, 4}));
    EXPECT_EQ(l.num_tokens_per_rank, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(l.num_tokens_per_expert, (std::vector<int64_t>{1, 1, 0, 0, 0, 1, 0, 1}));
    EXPECT_EQ(l.is_token_in_rank, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1}));
    std::vector<int64_t> rep{3, 3, -1, -1};
    EXPECT_NE(error_of([&] {
                buf.layout(Tensor::borrow(rep.data(), DType::i64, {1, 4}));
              }).find("repeats expert 3"),
              std::string::npos);
    std::vector<int64_t> oor{8, -1, -1, -1};
    EXPECT_NE(error_of([&] {
                buf.layout(Tensor::borrow(oor.data(), DType::i64, {1, 4}));
              }).find("out of range"),
              std::string::npos);
  });
}

// One dispatch + cached dispatch + combine on `g`, checked against the host reference;
// before_combine runs just before the combine. Returns the dispatch's lowering.
std::string dispatch_combine_vs_reference(Group& g, const EPConfig& cfg, uint64_t seed,
                                          const std::function<void()>& before_combine = {}) {
  const int w = g.size(), me = g.rank();
  ep::ref::GenParams gp{seed, w, cfg};
  std::vector<ep::ref::RankInput> all;
  std::vector<int64_t> offset(size_t(w) + 1, 0);
  for (int r = 0; r < w; ++r) {
    all.push_back(ep::ref::make_input(gp, r));
    offset[size_t(r) + 1] = offset[size_t(r)] + all.back().num_tokens;
  }
  EPBuffer buf(g, cfg);
  const DispatchInput in = all[size_t(me)].as_input(cfg);
  const DispatchOutput out = buf.dispatch(in);
  const std::string lowering = buf.last_stats().lowering;
  const ep::ref::ExpectedDispatch ex = ep::ref::expected_dispatch(all, cfg, w, me);
  EXPECT_EQ(out.x.nbytes(), ex.x.size());
  EXPECT_TRUE(same_bytes(out.x.raw(), ex.x.data(), std::min(out.x.nbytes(), ex.x.size())));
  EXPECT_EQ(size_t(out.src.numel()), ex.src.size());
  EXPECT_TRUE(
      same_bytes(out.src.raw(), ex.src.data(), std::min(out.src.nbytes(), ex.src.size() * 8)));
  if (cfg.dispatch_dtype == DispatchDType::fp8) {
    EXPECT_EQ(out.scales.nbytes(), ex.scales.size() * 4);
    EXPECT_TRUE(same_bytes(out.scales.raw(), ex.scales.data(),
                           std::min(out.scales.nbytes(), ex.scales.size() * 4)));
  }
  EXPECT_EQ(std::vector<int64_t>(out.topk_idx.data<int64_t>(),
                                 out.topk_idx.data<int64_t>() + out.topk_idx.numel()),
            ex.topk_idx);
  EXPECT_EQ(std::vector<float>(out.topk_weights.data<float>(),
                               out.topk_weights.data<float>() + out.topk_weights.numel()),
            ex.weights);
  EXPECT_EQ(out.num_recv_tokens_per_expert_aligned, ex.count_aligned);
  const DispatchOutput cached = buf.dispatch(in.x, in.scales, out.handle);
  EXPECT_EQ(cached.x.nbytes(), out.x.nbytes());
  EXPECT_TRUE(same_bytes(cached.x.raw(), out.x.raw(), std::min(cached.x.nbytes(), out.x.nbytes())));

  const int64_t rows = out.src.numel(), h = cfg.hidden, m = cfg.num_max_tokens_per_rank;
  Tensor y = Tensor::empty(DType::bf16, {rows, h});
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t gid = out.src.data<int64_t>()[i];
    for (int64_t c = 0; c < h; ++c)
      y.data<uint16_t>()[i * h + c] =
          gid < 0 ? uint16_t(0x3f80)
                  : ep::ref::y_value(
                        seed, offset[size_t(gid / m)] + gid % m,
                        cfg.expand ? me * (cfg.num_experts / w) + out.topk_idx.data<int64_t>()[i]
                                   : cfg.num_experts + me,
                        int(c));
  }
  if (before_combine) before_combine();
  const CombineOutput comb = buf.combine(y, out.handle);
  const ep::ref::ExpectedCombine ec = ep::ref::expected_combine(all, cfg, w, me, seed, offset);
  EXPECT_EQ(comb.x.nbytes(), ec.x.size() * 2);
  EXPECT_TRUE(same_bytes(comb.x.raw(), ec.x.data(), std::min(comb.x.nbytes(), ec.x.size() * 2)))
      << cfg.describe();
  EXPECT_TRUE(same_bytes(comb.topk_weights.raw(), ec.weights.data(), ec.weights.size() * 4));
  return lowering;
}

// Runs body on every rank of a local world through a CountingGroup; the calls of all ranks.
std::map<std::string, int> count_calls(int world,
                                       const std::function<void(test::CountingGroup&)>& body) {
  std::mutex mu;
  std::map<std::string, int> calls;
  run_local(world, [&](Group& inner) {
    test::CountingGroup g(inner);
    body(g);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [k, v] : g.calls) calls[k] += v;
  });
  return calls;
}

TEST(EpAllGather, IssuesNoAllToAll) {
  for (CombineMode cm : {CombineMode::exact, CombineMode::fast})
    for (EpReduce red : {EpReduce::rs, EpReduce::ar})
      for (bool expand : {false, true}) {
        std::map<std::string, int> calls = count_calls(3, [&](test::CountingGroup& g) {
          EPConfig cfg = small_config(3);
          cfg.combine = cm;
          cfg.reduce = red;
          cfg.expand = expand;
          cfg.expert_alignment = expand ? 8 : 1;
          cfg.dispatch_dtype = DispatchDType::fp8;
          cfg.chunk_bytes = 4096;  // several combine chunks
          dispatch_combine_vs_reference(g, cfg, 7);
        });
        // ag: rows gathered, partials reduced by the chosen collective; no all-to-all of any kind.
        EXPECT_EQ(calls["all_to_all"] + calls["all_to_all_v"] + calls["all_to_all_v_rows"], 0);
        EXPECT_GT(calls["all_gather"], 0);
        EXPECT_GT(calls[red == EpReduce::rs ? "reduce_scatter" : "all_reduce"], 0);
        if (red == EpReduce::ar) {
          EXPECT_EQ(calls["reduce_scatter"], 0);
        }
      }
}

TEST(EpAllToAll, CachedDispatchSkipsCountCollective) {
  for (bool peer_memory : {false, true})
    run_local(3, [&](Group& inner) {
      test::CountingGroup g(inner);
      EPConfig cfg = small_config(3);
      cfg.algo = EpAlgo::a2a;
      cfg.peer_memory = peer_memory ? EpPeerMemory::on : EpPeerMemory::off;
      ep::ref::GenParams gp{3, 3, cfg};
      ep::ref::RankInput in = ep::ref::make_input(gp, g.rank());
      EPBuffer buf(g, cfg);
      const DispatchInput di = in.as_input(cfg);
      const DispatchOutput out = buf.dispatch(di);
      g.calls.clear();
      const DispatchOutput cached = buf.dispatch(di.x, di.scales, out.handle);
      EXPECT_TRUE(same_bytes(cached.x.raw(), out.x.raw(), out.x.nbytes()));
      EXPECT_EQ(g.calls["all_gather"], 0);
      EXPECT_EQ(g.calls["all_reduce"], 0);
      EXPECT_EQ(g.calls["all_gather"] + g.calls["all_gather_v"] + g.calls["reduce_scatter"], 0);
      if (peer_memory) {
        // The direct lowering: rows read where the sources hold them.
        EXPECT_GT(g.calls["expose"], 0);
        EXPECT_EQ(g.all_to_alls(), 0);
      } else {
        // Only the data moves, through the exchange.
        EXPECT_EQ(g.calls["expose"], 0);
        EXPECT_GT(g.all_to_alls(), 0);
      }
    });
}

TEST(EpAllToAll, MatchesReferenceWithEveryLowering) {
  for (bool trust_v : {true, false})
    for (CombineMode cm : {CombineMode::exact, CombineMode::fast})
      run_local(4, [&](Group& inner) {
        test::NoA2avGroup no_v(inner);
        Group& g = trust_v ? inner : static_cast<Group&>(no_v);
        EPConfig cfg = small_config(4);
        cfg.algo = EpAlgo::a2a;
        cfg.combine = cm;
        cfg.expand = true;
        cfg.peer_memory = EpPeerMemory::off;
        const std::string lowering = dispatch_combine_vs_reference(g, cfg, 11);
        if (!trust_v) {
          EXPECT_EQ(lowering, "padded");
        }
      });
}

// On a group with peer memory, the a2a combine reads the peers' y in place: one expose and one
// barrier, no all_to_all; with peer_memory off the partials go through all_to_all_v. Both match
// the reference bit for bit.
TEST(EpAllToAll, DirectCombineReadsPeersInPlace) {
  for (bool peer_memory : {true, false})
    for (CombineMode cm : {CombineMode::exact, CombineMode::fast})
      for (bool expand : {false, true}) {
        std::map<std::string, int> calls = count_calls(3, [&](test::CountingGroup& g) {
          ASSERT_EQ(g.peer_memory(), PeerMemory::address_space);
          EPConfig cfg = small_config(3);
          cfg.algo = EpAlgo::a2a;
          cfg.combine = cm;
          cfg.expand = expand;
          cfg.expert_alignment = expand ? 8 : 1;
          cfg.peer_memory = peer_memory ? EpPeerMemory::on : EpPeerMemory::off;
          dispatch_combine_vs_reference(g, cfg, 13, [&] { g.calls.clear(); });
        });
        SCOPED_TRACE(
            fmt::format("peer_memory={} combine={} expand={}", peer_memory, to_string(cm), expand));
        // a2a's combine gathers and reduce-scatters nothing; in place it exchanges nothing either.
        EXPECT_EQ(calls["all_gather"] + calls["all_gather_v"] + calls["reduce_scatter"], 0);
        const int all_to_alls =
            calls["all_to_all"] + calls["all_to_all_v"] + calls["all_to_all_v_rows"];
        if (peer_memory) {
          EXPECT_EQ(all_to_alls, 0);
          EXPECT_GT(calls["expose"], 0);
        } else {
          EXPECT_GT(all_to_alls, 0);
          EXPECT_EQ(calls["expose"], 0);
        }
      }
}

// A rank with a pool of its own (ScopedThreadPool, as run_ranks_with_pools installs) splits the
// direct combine's tokens over it (256 tokens of H=4096: pieces of 64): the reference's bits.
TEST(EpAllToAll, DirectCombineSplitOverTheRanksPoolMatchesReference) {
  for (CombineMode cm : {CombineMode::exact, CombineMode::fast})
    run_local(2, [&](Group& g) {
      ThreadPool pool(3);
      ScopedThreadPool use_pool(pool);
      EPConfig cfg = small_config(2);
      cfg.algo = EpAlgo::a2a;
      cfg.combine = cm;
      cfg.hidden = 4096;
      cfg.num_max_tokens_per_rank = 256;
      cfg.peer_memory = EpPeerMemory::on;
      dispatch_combine_vs_reference(g, cfg, 17);
    });
}

// A dispatch whose x rows over all ranks exceed a cache (kEpStreamMinBytes, 32 MiB; the first two
// cases pass it) in one address space: the sources write their rows into the destinations' outputs
// (direct-push), x by streaming stores. A small one reads them where the sources hold them
// (direct). Rows, scales, ids, weights, cached dispatch and combine: the reference's bits.
TEST(EpAllToAll, LargeDispatchSourcesWriteRowsMatchesReference) {
  struct Case {
    DispatchDType dtype;
    int64_t tokens;
    CombineMode combine;
    const char* lowering;
  };
  for (const Case& c : {Case{DispatchDType::fp8, 1024, CombineMode::fast, "direct-push"},
                        Case{DispatchDType::bf16, 640, CombineMode::exact, "direct-push"},
                        Case{DispatchDType::bf16, 40, CombineMode::fast, "direct"}})
    run_local(4, [&](Group& g) {
      EPConfig cfg = small_config(4);
      cfg.algo = EpAlgo::a2a;
      cfg.dispatch_dtype = c.dtype;
      cfg.combine = c.combine;
      cfg.hidden = 8192;
      cfg.num_max_tokens_per_rank = c.tokens;
      cfg.peer_memory = EpPeerMemory::on;
      SCOPED_TRACE(cfg.describe());
      EXPECT_EQ(dispatch_combine_vs_reference(g, cfg, 19), c.lowering);
    });
}

// A small a2a call (fewer collective rounds win) against a large one (~40 rows per rank: 12.5
// KiB vs 640 KiB of bf16 per rank): dispatch sends whole records, or x rows apart from the
// small records; peer_memory = automatic takes the direct lowering only for the large call.
// The same bits as the reference in every case.
TEST(EpAllToAll, SmallAndLargeCallsPickTheirLowerings) {
  for (int hidden : {160, 8192})
    for (EpPeerMemory pm : {EpPeerMemory::automatic, EpPeerMemory::off}) {
      std::map<std::string, int> calls = count_calls(3, [&](test::CountingGroup& g) {
        EPConfig cfg = small_config(3);
        cfg.algo = EpAlgo::a2a;
        cfg.combine = CombineMode::fast;
        cfg.hidden = hidden;  // bf16 x: dispatch and combine move the same bytes
        cfg.peer_memory = pm;
        dispatch_combine_vs_reference(g, cfg, 17);
      });
      const bool large = hidden > 160, direct = large && pm == EpPeerMemory::automatic;
      SCOPED_TRACE(fmt::format("hidden {} peer_memory {}", hidden, to_string(pm)));
      const int all_to_alls =
          calls["all_to_all"] + calls["all_to_all_v"] + calls["all_to_all_v_rows"];
      EXPECT_EQ(calls["reduce_scatter"], 0);
      if (direct) {
        EXPECT_GT(calls["expose"], 0);
        EXPECT_EQ(all_to_alls, 0);
      } else {
        // Through the exchange; a large call sends the x rows apart from the records, straight
        // from x (all_to_all_v_rows), a small one sends whole records.
        EXPECT_EQ(calls["expose"], 0);
        EXPECT_GT(all_to_alls, 0);
        EXPECT_EQ(calls["all_to_all_v_rows"] > 0, large);
      }
    }
}

// The input places' lifetime rules (ep.h): while a tensor from dispatch_input (or any copy of
// it) lives, combine_input, combine and another dispatch_input throw an Error naming the rule;
// while one from combine_input lives, dispatch, dispatch_input and another combine_input do.
// Used as the rules say, x and y written in place give the reference's bits on every path.
TEST(EpInputPlaces, ReuseWhileAViewLivesIsAnErrorAndRightUseMatchesReference) {
  for (EpPeerMemory pm : {EpPeerMemory::on, EpPeerMemory::off})
    for (EpAlgo algo : {EpAlgo::a2a, EpAlgo::ag})
      run_local(2, [&](Group& g) {
        EPConfig cfg = small_config(2);
        cfg.algo = algo;
        cfg.peer_memory = pm;
        cfg.combine = CombineMode::fast;
        const int w = g.size(), me = g.rank();
        const uint64_t seed = 23;
        ep::ref::GenParams gp{seed, w, cfg};
        std::vector<ep::ref::RankInput> all;
        std::vector<int64_t> offset(size_t(w) + 1, 0);
        for (int r = 0; r < w; ++r) {
          all.push_back(ep::ref::make_input(gp, r));
          offset[size_t(r) + 1] = offset[size_t(r)] + all.back().num_tokens;
        }
        EPBuffer buf(g, cfg);
        DispatchInput in = all[size_t(me)].as_input(cfg);
        Tensor x = buf.dispatch_input(in.x.dim(0));
        if (x.nbytes()) std::memcpy(x.raw(), in.x.raw(), x.nbytes());
        const Tensor original_x = in.x;
        in.x = x;
        const DispatchOutput out = buf.dispatch(in);
        const ep::ref::ExpectedDispatch ex = ep::ref::expected_dispatch(all, cfg, w, me);
        ASSERT_EQ(out.x.nbytes(), ex.x.size());
        EXPECT_TRUE(same_bytes(out.x.raw(), ex.x.data(), ex.x.size()));
        EXPECT_TRUE(same_bytes(x.raw(), original_x.raw(), x.nbytes()))
            << "x is read after dispatch";

        auto expect_rule = [](const std::string& err, const char* op, const char* place) {
          EXPECT_NE(err.find(fmt::format("ep {} on rank", op)), std::string::npos) << err;
          EXPECT_NE(err.find(fmt::format("a tensor from {} is still alive", place)),
                    std::string::npos)
              << err;
        };
        const Tensor ordinary_y = Tensor::zeros(DType::bf16, {out.num_recv_tokens, cfg.hidden});
        expect_rule(error_of([&] { buf.combine_input(out.handle); }), "combine_input",
                    "dispatch_input (x)");
        expect_rule(error_of([&] { buf.combine(ordinary_y, out.handle); }), "combine",
                    "dispatch_input (x)");
        expect_rule(error_of([&] { buf.dispatch_input(1); }), "dispatch_input",
                    "dispatch_input (x)");
        x = {};  // DispatchInput::x is a copy: x is still alive
        expect_rule(error_of([&] { buf.combine_input(out.handle); }), "combine_input",
                    "dispatch_input (x)");
        in.x = {};

        Tensor y = buf.combine_input(out.handle);
        const int64_t rows = out.src.numel(), h = cfg.hidden, m = cfg.num_max_tokens_per_rank;
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t gid = out.src.data<int64_t>()[i];
          for (int64_t c = 0; c < h; ++c)
            y.data<uint16_t>()[i * h + c] = ep::ref::y_value(
                seed, offset[size_t(gid / m)] + gid % m, cfg.num_experts + me, int(c));
        }
        const DispatchInput again = all[size_t(me)].as_input(cfg);
        expect_rule(error_of([&] { buf.dispatch(again); }), "dispatch", "combine_input (y)");
        expect_rule(error_of([&] { buf.dispatch(again.x, again.scales, out.handle); }),
                    "cached dispatch", "combine_input (y)");
        expect_rule(error_of([&] { buf.dispatch_input(1); }), "dispatch_input",
                    "combine_input (y)");
        expect_rule(error_of([&] { buf.combine_input(out.handle); }), "combine_input",
                    "combine_input (y)");
        const CombineOutput comb = buf.combine(y, out.handle);
        const ep::ref::ExpectedCombine ec =
            ep::ref::expected_combine(all, cfg, w, me, seed, offset);
        ASSERT_EQ(comb.x.nbytes(), ec.x.size() * 2);
        EXPECT_TRUE(same_bytes(comb.x.raw(), ec.x.data(), ec.x.size() * 2)) << cfg.describe();
        y = {};
        EXPECT_EQ(buf.dispatch(again).num_recv_tokens,
                  out.num_recv_tokens);  // the places are free again
        EXPECT_TRUE(buf.dispatch_input(1).defined());
      });
}

TEST(EpValidation, InvalidInputThrowsOnEveryRank) {
  std::atomic<int> errors{0}, timeouts{0};
  run_local(3, [&](Group& g) {
    EPConfig cfg = small_config(3);
    ep::ref::GenParams gp{5, 3, cfg};
    ep::ref::RankInput in = ep::ref::make_input(gp, g.rank() == 2 ? 0 : g.rank());
    if (g.rank() == 2) in.topk_idx[1] = in.topk_idx[0] = 2;  // repeated expert
    EPBuffer buf(g, cfg);
    try {
      buf.dispatch(in.as_input(cfg));
    } catch (const CommTimeout&) {
      ++timeouts;
    } catch (const Error& e) {
      ++errors;
      if (g.rank() == 2)
        EXPECT_NE(std::string(e.what()).find("repeats expert 2"), std::string::npos) << e.what();
      else
        EXPECT_NE(std::string(e.what()).find("rank 2 passed invalid input"), std::string::npos)
            << e.what();
    }
  });
  EXPECT_EQ(errors.load(), 3);
  EXPECT_EQ(timeouts.load(), 0);
}

TEST(EpValidation, MismatchedMaxTokensDetectedAtConstruction) {
  std::atomic<int> errors{0};
  run_local(2, [&](Group& g) {
    EPConfig cfg = small_config(2);
    if (g.rank() == 1) cfg.num_max_tokens_per_rank = 21;
    const std::string e = error_of([&] { EPBuffer buf(g, cfg); });
    EXPECT_NE(e.find("num_max_tokens_per_rank differs across ranks"), std::string::npos) << e;
    errors += !e.empty();
  });
  EXPECT_EQ(errors.load(), 2);
}

// The `check ep` matrix itself at small worlds (the CLI runs it at 1..64 in the ep stage).
class EpCheckMatrix : public ::testing::TestWithParam<int> {};
TEST_P(EpCheckMatrix, Passes) {
  std::atomic<int> failed{0}, passed{0};
  run_local(GetParam(), [&](Group& g) {
    ep::CheckEpOptions o;
    const ep::CheckEpResult r = ep::run_check_ep(g, o);
    if (g.rank() == 0) {
      failed = r.failed;
      passed = r.passed;
    }
  });
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(passed.load(), 0);
}
INSTANTIATE_TEST_SUITE_P(Worlds, EpCheckMatrix, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_ranks"; });

}  // namespace
}  // namespace deepinfer
