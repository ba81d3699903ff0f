// Bad input at the public EP API (issue 24): each mistake a caller can make with an EPBuffer or an
// EngramBuffer (a wrong shape, dtype or value, on one rank only) is an Error on every rank and
// never a CommTimeout: no rank is left waiting for the bad one. The bad rank's message names the
// problem; the others say which rank was bad. Calls that are local by design (layout,
// dispatch_input, a handle's checks, cached dispatch and combine) throw on the bad rank before any
// collective, and the launch then ends every rank at once (never at the deadline).
#include <deepinfer/comm.h>
#include <deepinfer/engram.h>
#include <deepinfer/ep.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace deepinfer {
namespace {

constexpr int kWorld = 3;
constexpr int kBad = 1;           // the rank that passes the bad input
constexpr double kDeadline = 20;  // s: every collective's; a test that waits for it fails below

// What each rank of one launch ended with: its Error's text ("" if none), and any CommTimeout.
struct Outcome {
  std::vector<std::string> errors = std::vector<std::string>(kWorld);
  std::atomic<int> timeouts{0};
  double seconds = 0;
};

// Runs fn on kWorld local ranks, each catching its own Error.
void run_each(Outcome& out, const std::function<void(Group&)>& fn) {
  LaunchOptions o;
  o.comm = CommKind::local;
  o.world = kWorld;
  o.timeout_s = kDeadline;
  const auto start = std::chrono::steady_clock::now();
  run_ranks(o, [&](Group& g) {
    try {
      fn(g);
    } catch (const CommTimeout& e) {
      out.timeouts += 1;
      out.errors[size_t(g.rank())] = e.what();
    } catch (const Error& e) {
      out.errors[size_t(g.rank())] = e.what();
    }
  });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every rank threw (no timeout, well before the deadline); the bad rank's message holds `bad`,
// the others' hold `others`.
void expect_everywhere(const Outcome& out, const std::string& bad, const std::string& others) {
  EXPECT_EQ(out.timeouts.load(), 0);
  EXPECT_LT(out.seconds, kDeadline / 2);
  for (int r = 0; r < kWorld; ++r) {
    const std::string& e = out.errors[size_t(r)];
    const std::string& want = r == kBad ? bad : others;
    EXPECT_NE(e.find(want), std::string::npos)
        << "rank " << r << ": '" << e << "', want '" << want << "'";
    EXPECT_EQ(e.find("check `"), std::string::npos) << "an internal check, not a user error: " << e;
  }
}

void expect_none(const Outcome& out) {
  EXPECT_EQ(out.timeouts.load(), 0);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(out.errors[size_t(r)], "") << "rank " << r;
}

// ---- EPBuffer --------------------------------------------------------------------------------

EPConfig ep_config(EpAlgo algo, DispatchDType dt = DispatchDType::bf16) {
  EPConfig c;
  c.num_experts = 4 * kWorld;
  c.hidden = 160;
  c.num_topk = 3;
  c.num_max_tokens_per_rank = 8;
  c.dispatch_dtype = dt;
  c.algo = algo;
  return c;
}

// A valid dispatch input of T tokens: row t routes to experts (t + 5j) mod E, weight 1/K.
struct Input {
  Tensor x, scales, idx, weights;
  std::vector<uint16_t> strided;  // storage of a non-contiguous x
  DispatchInput get() const { return {x, scales, idx, weights}; }
};

Input valid_input(const EPConfig& c, int64_t t_count = 3) {
  Input in;
  const bool fp8 = c.dispatch_dtype == DispatchDType::fp8;
  in.x = Tensor::zeros(fp8 ? DType::e4m3 : DType::bf16, {t_count, c.hidden});
  if (fp8) in.scales = Tensor::zeros(DType::f32, {t_count, c.scale_cols()});
  in.idx = Tensor::empty(DType::i64, {t_count, c.num_topk});
  in.weights = Tensor::empty(DType::f32, {t_count, c.num_topk});
  for (int64_t t = 0; t < t_count; ++t)
    for (int j = 0; j < c.num_topk; ++j) {
      in.idx.data<int64_t>()[t * c.num_topk + j] = (t + 5 * j) % c.num_experts;
      in.weights.data<float>()[t * c.num_topk + j] = 1.0f / float(c.num_topk);
    }
  return in;
}

struct DispatchCase {
  const char* name;
  DispatchDType dtype;
  std::function<void(Input&, const EPConfig&)> spoil;
  const char* want;  // in the bad rank's message
};

std::vector<DispatchCase> dispatch_cases() {
  const auto bf16 = DispatchDType::bf16, fp8 = DispatchDType::fp8;
  const char* idx_shape = "topk_idx must be a contiguous i64 [T, K=3] tensor";
  const char* x_shape = "x must be a contiguous bf16 [T=3, H=160] tensor";
  const char* w_shape = "topk_weights must be a contiguous f32 [T=3, K=3] tensor";
  const char* range = "is out of range; expert ids are -1 (masked) or in [0, 12)";
  const char* scales = "fp8 dispatch needs scales as a contiguous f32 [T=3, ceil(H/128)=2]";
  return {
      {"topk_idx_i32", bf16,
       [](Input& in, const EPConfig&) {
         in.idx = Tensor::zeros(DType::i32, {3, 3});
       },
       idx_shape},
      {"topk_idx_wrong_k", bf16,
       [](Input& in, const EPConfig&) {
         in.idx = Tensor::zeros(DType::i64, {3, 4});
       },
       idx_shape},
      {"topk_idx_1d", bf16,
       [](Input& in, const EPConfig&) { in.idx = Tensor::zeros(DType::i64, {9}); }, idx_shape},
      {"topk_idx_missing", bf16, [](Input& in, const EPConfig&) { in.idx = Tensor(); }, idx_shape},
      {"expert_id_E", bf16, [](Input& in, const EPConfig&) { in.idx.data<int64_t>()[4] = 12; },
       range},
      {"expert_id_minus_2", bf16,
       [](Input& in, const EPConfig&) { in.idx.data<int64_t>()[0] = -2; }, range},
      {"expert_repeated", bf16,
       [](Input& in, const EPConfig&) { in.idx.data<int64_t>()[7] = in.idx.data<int64_t>()[6]; },
       "topk_idx row 2 repeats expert 2"},
      {"more_tokens_than_M", bf16, [](Input& in, const EPConfig& c) { in = valid_input(c, 9); },
       "T = 9 tokens exceeds num_max_tokens_per_rank M = 8"},
      {"x_f32", bf16,
       [](Input& in, const EPConfig&) {
         in.x = Tensor::zeros(DType::f32, {3, 160});
       },
       x_shape},
      {"x_wrong_hidden", bf16,
       [](Input& in, const EPConfig&) {
         in.x = Tensor::zeros(DType::bf16, {3, 161});
       },
       x_shape},
      {"x_fewer_rows", bf16,
       [](Input& in, const EPConfig&) {
         in.x = Tensor::zeros(DType::bf16, {2, 160});
       },
       x_shape},
      {"x_missing", bf16, [](Input& in, const EPConfig&) { in.x = Tensor(); }, x_shape},
      {"x_not_contiguous", bf16,
       [](Input& in, const EPConfig&) {
         in.strided.assign(3 * 160, 0);
         in.x = Tensor::borrow(in.strided.data(), DType::bf16, {3, 160}, {1, 3});
       },
       x_shape},
      {"weights_bf16", bf16,
       [](Input& in, const EPConfig&) {
         in.weights = Tensor::zeros(DType::bf16, {3, 3});
       },
       w_shape},
      {"weights_wrong_k", bf16,
       [](Input& in, const EPConfig&) {
         in.weights = Tensor::zeros(DType::f32, {3, 2});
       },
       w_shape},
      {"scales_with_bf16", bf16,
       [](Input& in, const EPConfig&) {
         in.scales = Tensor::zeros(DType::f32, {3, 2});
       },
       "scales were given but the EPConfig dispatch dtype is bf16"},
      {"fp8_without_scales", fp8, [](Input& in, const EPConfig&) { in.scales = Tensor(); }, scales},
      {"fp8_scales_wrong_cols", fp8,
       [](Input& in, const EPConfig&) {
         in.scales = Tensor::zeros(DType::f32, {3, 3});
       },
       scales},
      {"fp8_x_bf16", fp8,
       [](Input& in, const EPConfig&) {
         in.x = Tensor::zeros(DType::bf16, {3, 160});
       },
       "x must be a contiguous e4m3 [T=3, H=160] tensor"},
  };
}

class EpBadDispatch : public ::testing::TestWithParam<std::tuple<EpAlgo, int>> {};

// The input is valid on every rank but kBad; its dispatch is an Error on every rank. The same
// input unspoiled dispatches (so the error is the spoiled field's).
TEST_P(EpBadDispatch, IsAnErrorOnEveryRank) {
  const auto [algo, index] = GetParam();
  const std::vector<DispatchCase> cases = dispatch_cases();
  const DispatchCase& bad = cases[size_t(index)];
  const EPConfig cfg = ep_config(algo, bad.dtype);
  for (const bool spoil : {false, true}) {
    SCOPED_TRACE(spoil ? "spoiled" : "valid");
    Outcome out;
    run_each(out, [&](Group& g) {
      EPBuffer buf(g, cfg);
      Input in = valid_input(cfg);
      if (spoil && g.rank() == kBad) bad.spoil(in, cfg);
      const DispatchOutput d = buf.dispatch(in.get());
      EXPECT_GT(d.num_recv_tokens, 0);
    });
    if (spoil)
      expect_everywhere(out, bad.want, "ep dispatch: rank 1 passed invalid input");
    else
      expect_none(out);
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, EpBadDispatch,
                         ::testing::Combine(::testing::Values(EpAlgo::ag, EpAlgo::a2a),
                                            ::testing::Range(0, int(dispatch_cases().size()))),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  dispatch_cases()[size_t(std::get<1>(info.param))].name;
                         });

// A config invalid on one rank, or valid but different there: the constructor's agreement makes
// it an Error on every rank.
TEST(EpBadConfig, OneRanksConfigIsAnErrorOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(EPConfig&)> spoil;
    const char* want;
    const char* others;
  };
  const char* invalid = "another rank's EPConfig is invalid";
  const std::vector<Case> cases{
      {"E not a multiple of W", [](EPConfig& c) { c.num_experts = 13; },
       "EPConfig.num_experts = 13 is not a multiple of the group size 3", invalid},
      {"E = 0", [](EPConfig& c) { c.num_experts = 0; }, "EPConfig.num_experts must be >= 1",
       invalid},
      {"K = 0", [](EPConfig& c) { c.num_topk = 0; }, "EPConfig.num_topk must be in [1, 32]",
       invalid},
      {"K = 33", [](EPConfig& c) { c.num_topk = 33; }, "EPConfig.num_topk must be in [1, 32]",
       invalid},
      {"K > E",
       [](EPConfig& c) {
         c.num_experts = 3;
         c.num_topk = 4;
       },
       "EPConfig.num_topk = 4 exceeds num_experts = 3", invalid},
      {"H = 0", [](EPConfig& c) { c.hidden = 0; }, "EPConfig.hidden must be >= 1", invalid},
      {"M < 0", [](EPConfig& c) { c.num_max_tokens_per_rank = -1; },
       "EPConfig.num_max_tokens_per_rank must be >= 0", invalid},
      {"alignment 0", [](EPConfig& c) { c.expert_alignment = 0; },
       "EPConfig.expert_alignment must be in [1, 2^20]", invalid},
      {"chunk_bytes 100", [](EPConfig& c) { c.chunk_bytes = 100; },
       "EPConfig.chunk_bytes must be >= 4096", invalid},
      {"dispatch_dtype 5", [](EPConfig& c) { c.dispatch_dtype = DispatchDType(5); },
       "EPConfig.dispatch_dtype must be bf16 or fp8, got the value 5", invalid},
      {"algo 7", [](EPConfig& c) { c.algo = EpAlgo(7); },
       "EPConfig.algo must be one of ag, a2a, automatic, got the value 7", invalid},
      {"combine 9", [](EPConfig& c) { c.combine = CombineMode(9); },
       "EPConfig.combine must be one of exact, fast", invalid},
      {"ag_rows 2", [](EPConfig& c) { c.ag_rows = AgRows(2); }, "EPConfig.ag_rows must be one of",
       invalid},
      {"reduce 2", [](EPConfig& c) { c.reduce = EpReduce(2); }, "EPConfig.reduce must be one of",
       invalid},
      {"peer_memory 3", [](EPConfig& c) { c.peer_memory = EpPeerMemory(3); },
       "EPConfig.peer_memory must be one of", invalid},
      {"H differs", [](EPConfig& c) { c.hidden = 320; },
       "EPConfig.hidden differs across ranks (min 160, max 320)",
       "EPConfig.hidden differs across ranks (min 160, max 320)"},
      {"M differs", [](EPConfig& c) { c.num_max_tokens_per_rank = 9; },
       "EPConfig.num_max_tokens_per_rank differs across ranks",
       "EPConfig.num_max_tokens_per_rank differs across ranks"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Outcome out;
    run_each(out, [&](Group& g) {
      EPConfig cfg = ep_config(EpAlgo::ag);
      if (g.rank() == kBad) k.spoil(cfg);
      EPBuffer buf(g, cfg);
    });
    expect_everywhere(out, k.want, k.others);
  }
}

// Local calls: an Error on the calling rank before any collective (so every rank calling them
// with the same mistake throws alike, and none waits).
TEST(EpBadLocalCalls, LayoutDispatchInputAndHandlesAreErrors) {
  Outcome out;
  std::atomic<int> checked{0};
  run_each(out, [&](Group& g) {
    const EPConfig cfg = ep_config(EpAlgo::ag);
    EPBuffer buf(g, cfg);
    EPConfig other_cfg = cfg;
    other_cfg.num_topk = 2;
    EPBuffer other(g, other_cfg);
    const auto error_of = [](const std::function<void()>& f) -> std::string {
      try {
        f();
      } catch (const Error& e) {
        return e.what();
      }
      return "(no error)";
    };
    const auto expect = [&](const std::string& e, const std::string& want) {
      EXPECT_NE(e.find(want), std::string::npos) << e << "\nwant: " << want;
      EXPECT_EQ(e.find("check `"), std::string::npos) << e;
    };
    expect(error_of([&] {
             buf.layout(Tensor::zeros(DType::i32, {2, 3}));
           }),
           "ep layout: topk_idx must be a contiguous i64 [T, K=3] tensor");
    Input in = valid_input(cfg);
    in.idx.data<int64_t>()[0] = 99;
    expect(error_of([&] { buf.layout(in.idx); }), "topk_idx[0, 0] = 99 is out of range");
    expect(error_of([&] { buf.dispatch_input(-1); }), "-1 tokens, the buffer takes 0..8");
    expect(error_of([&] { buf.dispatch_input(9); }), "9 tokens, the buffer takes 0..8");
    expect(error_of([&] { buf.combine_input(Handle{}); }),
           "ep combine_input on rank " + std::to_string(g.rank()) + "/3: the handle is empty");
    expect(error_of([&] {
             buf.combine(Tensor::zeros(DType::bf16, {0, 160}), Handle{});
           }),
           "the handle is empty");
    expect(error_of([&] { buf.dispatch(in.x, in.scales, Handle{}); }), "the handle is empty");
    // A handle of another buffer (its K is 2): refused before its sizes are read.
    Input in2 = valid_input(other_cfg);
    const DispatchOutput d2 = other.dispatch(in2.get());
    expect(error_of([&] { buf.combine_input(d2.handle); }),
           "the handle comes from another EPBuffer");
    expect(error_of([&] {
             buf.combine(Tensor::zeros(DType::bf16, {d2.num_recv_tokens, 160}), d2.handle);
           }),
           "the handle comes from another EPBuffer");
    expect(error_of([&] { buf.dispatch(in2.x, Tensor(), d2.handle); }),
           "the handle comes from another EPBuffer");
    checked += 1;
  });
  expect_none(out);
  EXPECT_EQ(checked.load(), kWorld);
}

// A bad y (combine) or x (cached dispatch) on one rank is an Error there, before its collective;
// the launch then ends every rank at once (the peers' collective fails with the bad rank's error)
// and rethrows the bad rank's, long before the deadline.
TEST(EpBadLocalCalls, BadCombineOrCachedDispatchOnOneRankEndsTheLaunchAtOnce) {
  for (const EpAlgo algo : {EpAlgo::ag, EpAlgo::a2a})
    for (const bool combine : {true, false}) {
      SCOPED_TRACE(std::string(to_string(algo)) + (combine ? " combine" : " cached dispatch"));
      LaunchOptions o;
      o.world = kWorld;
      o.timeout_s = kDeadline;
      std::string error;
      const auto start = std::chrono::steady_clock::now();
      try {
        run_ranks(o, [&](Group& g) {
          const EPConfig cfg = ep_config(algo);
          EPBuffer buf(g, cfg);
          const Input in = valid_input(cfg);
          const DispatchOutput d = buf.dispatch(in.get());
          const int64_t rows = d.num_recv_tokens + (g.rank() == kBad ? 1 : 0);
          if (combine)
            buf.combine(Tensor::zeros(DType::bf16, {rows, cfg.hidden}), d.handle);
          else
            buf.dispatch(Tensor::zeros(DType::bf16, {g.rank() == kBad ? 2 : 3, cfg.hidden}),
                         Tensor(), d.handle);
        });
      } catch (const CommTimeout& e) {
        error = std::string("timeout: ") + e.what();
      } catch (const Error& e) {
        error = e.what();
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_NE(error.find(combine ? "y must be a contiguous bf16" : "x must be a contiguous bf16"),
                std::string::npos)
          << error;
      EXPECT_NE(error.find("on rank 1/3"), std::string::npos) << error;
      EXPECT_LT(s, kDeadline / 2);
    }
}

// ---- EngramBuffer ----------------------------------------------------------------------------

EngramConfig engram_config(EngramAlgo algo, EngramDType dt = EngramDType::bf16) {
  EngramConfig c;
  c.hidden = 4;
  c.dtype = dt;
  c.scale_cols = dt == EngramDType::fp8 ? 2 : 0;
  c.algo = algo;
  return c;
}

TEST(EngramBadConfig, OneRanksConfigIsAnErrorOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(EngramConfig&)> spoil;
    const char* want;
    const char* others;
  };
  const char* invalid = "EngramBuffer: another rank's config is invalid";
  const std::vector<Case> cases{
      {"hidden 0", [](EngramConfig& c) { c.hidden = 0; }, "hidden = 0 must be >= 1", invalid},
      {"fp8 without scale_cols",
       [](EngramConfig& c) {
         c.dtype = EngramDType::fp8;
         c.scale_cols = 0;
       },
       "scale_cols = 0 must be >= 1 for fp8", invalid},
      {"bf16 with scale_cols", [](EngramConfig& c) { c.scale_cols = 2; },
       "scale_cols = 2 must be 0 for bf16", invalid},
      {"dtype 4", [](EngramConfig& c) { c.dtype = EngramDType(4); },
       "dtype must be bf16 or fp8, got the value 4", invalid},
      {"algo 9", [](EngramConfig& c) { c.algo = EngramAlgo(9); },
       "algo must be ag, a2a, direct or automatic, got the value 9", invalid},
      {"hidden differs", [](EngramConfig& c) { c.hidden = 8; },
       "EngramBuffer: hidden differs between ranks (4 .. 8)",
       "EngramBuffer: hidden differs between ranks (4 .. 8)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Outcome out;
    run_each(out, [&](Group& g) {
      EngramConfig cfg = engram_config(EngramAlgo::ag);
      if (g.rank() == kBad) k.spoil(cfg);
      EngramBuffer buf(g, cfg);
    });
    expect_everywhere(out, k.want, k.others);
  }
}

TEST(EngramBadWrite, OneRanksShardIsAnErrorOnEveryRank) {
  struct Case {
    const char* name;
    EngramDType dtype;
    std::function<void(Tensor&, Tensor&)> spoil;
    const char* want;
    const char* others;
  };
  const char* invalid = "EngramBuffer::write: another rank's shard is invalid";
  const char* bf16_shape = "storage must be a contiguous [n >= 1, 4] bf16 tensor";
  const char* sf_shape = "sf must be a contiguous [3, 2] f32 tensor";
  const auto bf16 = EngramDType::bf16, fp8 = EngramDType::fp8;
  const std::vector<Case> cases{
      {"storage f32", bf16,
       [](Tensor& s, Tensor&) {
         s = Tensor::zeros(DType::f32, {3, 4});
       },
       bf16_shape, invalid},
      {"storage wrong width", bf16,
       [](Tensor& s, Tensor&) {
         s = Tensor::zeros(DType::bf16, {3, 5});
       },
       bf16_shape, invalid},
      {"storage 1-d", bf16, [](Tensor& s, Tensor&) { s = Tensor::zeros(DType::bf16, {12}); },
       bf16_shape, invalid},
      {"storage missing", bf16, [](Tensor& s, Tensor&) { s = Tensor(); }, bf16_shape, invalid},
      {"no rows", bf16,
       [](Tensor& s, Tensor&) {
         s = Tensor::zeros(DType::bf16, {0, 4});
       },
       bf16_shape, invalid},
      {"sf for bf16", bf16,
       [](Tensor&, Tensor& sf) {
         sf = Tensor::zeros(DType::f32, {3, 2});
       },
       "sf is for fp8 tables only", invalid},
      {"fp8 without sf", fp8, [](Tensor&, Tensor& sf) { sf = Tensor(); }, sf_shape, invalid},
      {"fp8 sf wrong cols", fp8,
       [](Tensor&, Tensor& sf) {
         sf = Tensor::zeros(DType::f32, {3, 1});
       },
       sf_shape, invalid},
      {"fp8 storage bf16", fp8,
       [](Tensor& s, Tensor&) {
         s = Tensor::zeros(DType::bf16, {3, 4});
       },
       "storage must be a contiguous [n >= 1, 4] e4m3 tensor", invalid},
      {"n differs", bf16,
       [](Tensor& s, Tensor&) {
         s = Tensor::zeros(DType::bf16, {4, 4});
       },
       "rows per rank differ between ranks (3 .. 4)",
       "rows per rank differ between ranks (3 .. 4)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Outcome out;
    run_each(out, [&](Group& g) {
      const EngramConfig cfg = engram_config(EngramAlgo::ag, k.dtype);
      EngramBuffer buf(g, cfg);
      const bool fp8 = k.dtype == EngramDType::fp8;
      Tensor storage = Tensor::zeros(fp8 ? DType::e4m3 : DType::bf16, {3, 4});
      Tensor sf = fp8 ? Tensor::zeros(DType::f32, {3, 2}) : Tensor();
      if (g.rank() == kBad) k.spoil(storage, sf);
      buf.write(storage, sf);
    });
    expect_everywhere(out, k.want, k.others);
  }
}

class EngramBadFetch : public ::testing::TestWithParam<EngramAlgo> {};

// Indices of the wrong dtype, rank or range on one rank: an Error on every rank, on every path.
// The same fetch with valid indices returns rows (so the error is the spoiled tensor's).
TEST_P(EngramBadFetch, OneRanksIndicesAreAnErrorOnEveryRank) {
  struct Case {
    const char* name;
    std::function<Tensor(std::vector<int32_t>&)> indices;
    const char* want;
  };
  const char* shape = "indices must be a contiguous [T, J] or [L, T, J] i32 tensor";
  const std::vector<Case> cases{
      {"valid",
       [](std::vector<int32_t>& v) {
         return Tensor::borrow(v.data(), DType::i32, {2, 2});
       },
       ""},
      {"i64",
       [](std::vector<int32_t>&) {
         return Tensor::zeros(DType::i64, {2, 2});
       },
       shape},
      {"1-d", [](std::vector<int32_t>& v) { return Tensor::borrow(v.data(), DType::i32, {4}); },
       shape},
      {"4-d",
       [](std::vector<int32_t>& v) {
         return Tensor::borrow(v.data(), DType::i32, {1, 1, 2, 2});
       },
       shape},
      {"missing", [](std::vector<int32_t>&) { return Tensor(); }, shape},
      {"not contiguous",
       [](std::vector<int32_t>& v) {
         return Tensor::borrow(v.data(), DType::i32, {2, 2}, {1, 2});
       },
       shape},
      {"index -2",
       [](std::vector<int32_t>& v) {
         v[3] = -2;
         return Tensor::borrow(v.data(), DType::i32, {2, 2});
       },
       "index -2 at flat position 3"},
      {"index W·n, 3-d",
       [](std::vector<int32_t>& v) {
         v[2] = 9;
         return Tensor::borrow(v.data(), DType::i32, {2, 1, 2});
       },
       "index 9 at flat position 2"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Outcome out;
    run_each(out, [&](Group& g) {
      EngramBuffer buf(g, engram_config(GetParam()));
      buf.write(Tensor::zeros(DType::bf16, {3, 4}));
      std::vector<int32_t> idx{0, 8, -1, 4};
      const Tensor bad = g.rank() == kBad ? k.indices(idx) : Tensor();
      const EngramResult r =
          buf.fetch(g.rank() == kBad ? bad : Tensor::borrow(idx.data(), DType::i32, {2, 2}));
      EXPECT_EQ(r.data.dim(-1), 8);
    });
    if (*k.want)
      expect_everywhere(out, k.want, "EngramBuffer::fetch: rank 1 passed an invalid index");
    else
      expect_none(out);
  }
}
INSTANTIATE_TEST_SUITE_P(Paths, EngramBadFetch,
                         ::testing::Values(EngramAlgo::ag, EngramAlgo::a2a, EngramAlgo::direct),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Misuse that every rank makes alike is local and the same Error on each: a fetch before any
// write, and a second wait on one handle.
TEST(EngramBadUse, FetchBeforeWriteAndWaitingTwice) {
  Outcome out;
  std::atomic<int> checked{0};
  run_each(out, [&](Group& g) {
    EngramBuffer buf(g, engram_config(EngramAlgo::automatic));
    std::vector<int32_t> idx{0, 1};
    const Tensor t = Tensor::borrow(idx.data(), DType::i32, {1, 2});
    try {
      buf.fetch(t);
      ADD_FAILURE() << "a fetch before write() returned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no table yet; call write() on every rank first"),
                std::string::npos)
          << e.what();
    }
    buf.write(Tensor::zeros(DType::bf16, {1, 4}));
    EngramFetch f = buf.start_fetch(t);
    EXPECT_EQ(f.wait().data.dim(1), 8);
    try {
      f.wait();
      ADD_FAILURE() << "a second wait returned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("this handle holds no fetch"), std::string::npos)
          << e.what();
    }
    checked += 1;
  });
  expect_none(out);
  EXPECT_EQ(checked.load(), kWorld);
}

}  // namespace
}  // namespace deepinfer
