// Engram and mHC kernels against independent answers: the hash parameters and hash outputs NumPy
// printed (tests/core/data/numpy_rng.json, from tools/reference/numpy_rng_values.py), hand-worked
// hashes and gates, closed forms of mHC (Sinkhorn is doubly stochastic; zero mixes give
// sigmoid(base); identity comb passes the residual through), batch invariance of the cpu twins.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/engram.h"
#include "kernels/mhc.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

using testing::random_bf16;
using testing::random_f32;

const KernelBackend kBoth[] = {KernelBackend::host, KernelBackend::cpu};

nlohmann::json numpy_values() {
  std::ifstream f(std::string(DEEPINFER_SOURCE_DIR) + "/tests/core/data/numpy_rng.json");
  EXPECT_TRUE(f.good()) << "tests/core/data/numpy_rng.json is missing";
  return nlohmann::json::parse(f);
}

EngramHashConfig config_of(const nlohmann::json& e) {
  return {.layer_ids = e["layer_ids"].get<std::vector<int64_t>>(),
          .max_ngram_size = e["max_ngram_size"].get<int64_t>(),
          .n_head_per_ngram = e["n_head_per_ngram"].get<int64_t>(),
          .engram_vocab_size = e["engram_vocab_size"].get<std::vector<int64_t>>(),
          .seed = e["seed"].get<int64_t>(),
          .vocab_size = e["vocab"].get<int64_t>()};
}

TEST(EngramParams, MultipliersAndPrimesMatchNumpy) {
  const auto j = numpy_values();
  ASSERT_GE(j["engram"].size(), 4u);
  for (const auto& e : j["engram"]) {
    const EngramHashTables t = engram_hash_tables(config_of(e));
    const int64_t G = t.max_ngram, H = t.heads();
    for (int64_t l = 0; l < t.num_layers; ++l) {
      for (int64_t k = 0; k < G; ++k)
        EXPECT_EQ(t.multipliers[size_t(l * G + k)],
                  std::stoll(e["multipliers"][size_t(l)][size_t(k)].get<std::string>()))
            << "vocab " << e["vocab"] << " layer " << l << " k " << k;
      int64_t offset = 0;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t p =
            e["primes"][size_t(l)][size_t(h / t.heads_per_ngram)][size_t(h % t.heads_per_ngram)];
        EXPECT_EQ(t.vocab_sizes[size_t(l * H + h)], p);
        EXPECT_EQ(t.offsets[size_t(l * H + h)], offset);
        offset += p;
      }
      EXPECT_EQ(t.rows[size_t(l)], offset);
    }
  }
}

TEST(EngramParams, DemoPrimesAndRowCounts) {
  // docs/kernels.md: the demo's 32 moduli are the distinct primes just above 646400.
  const EngramHashTables t = engram_hash_tables({.layer_ids = {1, 15},
                                                 .max_ngram_size = 3,
                                                 .n_head_per_ngram = 8,
                                                 .engram_vocab_size = {646400, 646400},
                                                 .vocab_size = 129280});
  EXPECT_EQ(t.vocab_sizes[0], 646403);
  EXPECT_EQ(t.vocab_sizes[15], 646619);
  EXPECT_EQ(t.vocab_sizes[16], 646631);
  EXPECT_EQ(t.vocab_sizes[31], 646879);
  EXPECT_EQ(t.rows[0], 10344164);
  EXPECT_EQ(t.rows[0] + t.rows[1], 10344164 + 10348242);
  for (int64_t m : t.multipliers) EXPECT_EQ(m % 2, 1);
}

TEST(EngramParams, BadConfigIsAClearError) {
  EngramHashConfig c{
      .layer_ids = {1}, .max_ngram_size = 3, .engram_vocab_size = {100}, .vocab_size = 50};
  try {
    engram_hash_tables(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_vocab_size has 1 entries"), std::string::npos)
        << e.what();
  }
}

std::vector<int32_t> run_hash(const EngramHashTables& t, const std::vector<int32_t>& ids,
                              KernelBackend be) {
  const int64_t n = int64_t(ids.size()) / t.max_ngram;
  std::vector<int32_t> out(size_t(t.num_layers * n * t.heads()));
  ScopedBackend use(be);
  engram_hash({.ngram_ids = ids.data(),
               .multipliers = t.multipliers.data(),
               .vocab_sizes = t.vocab_sizes.data(),
               .offsets = t.offsets.data(),
               .out = out.data(),
               .num_tokens = n,
               .num_layers = t.num_layers,
               .max_ngram = t.max_ngram,
               .heads_per_ngram = t.heads_per_ngram});
  return out;
}

TEST(EngramHash, MatchesTheNumpyDemoHash) {
  const auto j = numpy_values();
  const auto& ex = j["hash_example"];
  const EngramHashTables t = engram_hash_tables(config_of(j["engram"][ex["engram"].get<size_t>()]));
  std::vector<int32_t> ids;
  for (const auto& row : ex["ngram_ids"])
    for (const auto& v : row) ids.push_back(v.get<int32_t>());
  const int64_t n = int64_t(ids.size()) / 3;
  for (KernelBackend be : kBoth) {
    const auto out = run_hash(t, ids, be);
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < 16; ++h)
          EXPECT_EQ(out[size_t((l * n + i) * 16 + h)],
                    ex["rows"][size_t(l)][size_t(i)][size_t(h)].get<int64_t>())
              << to_string(be) << " layer " << l << " token " << i << " head " << h;
  }
}

TEST(EngramHash, HandWorkedAndMaskedTokens) {
  // One layer, orders 2 and 3, 2 heads each: multipliers 3, 5, 7, moduli 11 13 | 17 19.
  // ids (2, 3, 4): mix2 = 6 ^ 15 = 9, mix3 = 9 ^ 28 = 21 -> 9 % 11, 9 % 13, 21 % 17, 21 % 19
  // = 9, 9, 4, 2, plus offsets 0, 11, 24, 41. A token with id -1 in column 0 gives -1.
  EngramHashTables t;
  t.num_layers = 1;
  t.max_ngram = 3;
  t.heads_per_ngram = 2;
  t.multipliers = {3, 5, 7};
  t.vocab_sizes = {11, 13, 17, 19};
  t.offsets = {0, 11, 24, 41};
  for (KernelBackend be : kBoth) {
    EXPECT_EQ(run_hash(t, {2, 3, 4, -1, 3, 4}, be),
              (std::vector<int32_t>{9, 20, 28, 43, -1, -1, -1, -1}))
        << to_string(be);
    EXPECT_THROW(run_hash(t, {2, -1, 4}, be), std::exception) << to_string(be);
  }
}

struct GateOut {
  std::vector<bf16> out;
  std::vector<float> raw, g, rx, rk;
};

GateOut run_gate(const std::vector<bf16>& x, const std::vector<bf16>& k, const std::vector<bf16>& v,
                 const std::vector<float>& w, int64_t n, int64_t hc, int64_t d, float eps,
                 float clamp, KernelBackend be) {
  GateOut o;
  o.out.resize(size_t(n * hc * d));
  o.raw.resize(size_t(n * hc));
  o.g.resize(o.raw.size());
  o.rx.resize(o.raw.size());
  o.rk.resize(o.raw.size());
  ScopedBackend use(be);
  engram_gate({.x = x.data(),
               .k = k.data(),
               .v = v.data(),
               .w_fused = w.data(),
               .out = o.out.data(),
               .raw = o.raw.data(),
               .gate = o.g.data(),
               .rstd_x = o.rx.data(),
               .rstd_k = o.rk.data(),
               .num_tokens = n,
               .hc = hc,
               .dim = d,
               .eps = eps,
               .clamp = clamp});
  return o;
}

std::vector<bf16> bf(std::initializer_list<float> v) {
  std::vector<bf16> r;
  for (float f : v) r.push_back(f32_to_bf16(f));
  return r;
}

TEST(EngramGate, HandWorked) {
  // d = 2, hc = 2. Branch 0: x = (1, 1), k = (1, 1), w = (1, 1): raw = 2, rstd = 1, dot = 2/sqrt2
  // = sqrt2, a = 2^(1/4), g = sigmoid(2^0.25). Branch 1: x = (1, 0), k = (0, 1): raw = 0 -> sign 0
  // -> g = 0.5 exactly. Branch 1 with k = (-1e-9, 1): |dot| below the clamp -> a = -sqrt(clamp).
  const auto v = bf({0.5f, -2.0f});
  const std::vector<float> w = {1, 1, 1, 1};
  for (KernelBackend be : kBoth) {
    const GateOut o = run_gate(bf({1, 1, 1, 0}), bf({1, 1, 0, 1}), v, w, 1, 2, 2, 0.0f, 1e-6f, be);
    const double g0 = 1.0 / (1.0 + std::exp(-std::pow(2.0, 0.25)));
    EXPECT_NEAR(o.g[0], g0, 1e-6) << to_string(be);
    EXPECT_FLOAT_EQ(o.raw[0], 2.0f);
    EXPECT_FLOAT_EQ(o.rx[0], 1.0f);
    EXPECT_FLOAT_EQ(o.g[1], 0.5f);
    EXPECT_EQ(bf16_to_f32(o.out[0]), round_bf16(float(1 + g0 * 0.5)));
    EXPECT_EQ(bf16_to_f32(o.out[2]), 1.25f);  // 1 + 0.5 * 0.5
    EXPECT_EQ(bf16_to_f32(o.out[3]), -1.0f);  // 0 + 0.5 * -2
    const GateOut c =
        run_gate(bf({1, 1, 1, 1}), bf({1, 1, -1, 1e-3f}), v, w, 1, 2, 2, 0.0f, 0.25f, be);
    // Branch 1: raw = -1 + 1e-3 -> dot ~ -1 (above the clamp 0.25: plain); clamp 1.5 below.
    EXPECT_NEAR(
        c.g[1],
        1.0 / (1.0 + std::exp(std::sqrt(std::fabs(c.raw[1] * c.rx[1] * c.rk[1] / std::sqrt(2.0))))),
        1e-6);
    const GateOut d =
        run_gate(bf({1, 1, 1, 1}), bf({1, 1, -1, 1e-3f}), v, w, 1, 2, 2, 0.0f, 1.5f, be);
    EXPECT_NEAR(d.g[1], 1.0 / (1.0 + std::exp(std::sqrt(1.5))), 1e-6) << to_string(be);
  }
}

TEST(Mhc, SinkhornIsDoublyStochastic) {
  const std::vector<float> c32 = random_f32(16, 5, -3.0f, 3.0f);
  std::vector<double> c(c32.begin(), c32.end());
  mhc_sinkhorn(c.data(), 4, 10, 1e-6);
  for (int i = 0; i < 4; ++i) {
    double rs = 0, cs = 0;
    for (int j = 0; j < 4; ++j) rs += c[size_t(i * 4 + j)], cs += c[size_t(j * 4 + i)];
    EXPECT_NEAR(rs, 1.0, 2e-3);
    EXPECT_NEAR(cs, 1.0, 1e-5);  // the last step normalises columns
  }
  std::vector<double> one(16, 0.0);  // equal logits: softmax 1/4, stays 1/4 up to eps
  mhc_sinkhorn(one.data(), 4, 10, 1e-6);
  for (double v : one) EXPECT_NEAR(v, 0.25, 1e-5);
}

TEST(Mhc, ZeroMixesGiveSigmoidOfBase) {
  // fn = 0 -> mixes = 0: pre = sigmoid(base) + pre_eps, post = 2 sigmoid(base), comb = Sinkhorn
  // (base); x = bf16(sum_m pre_m R_m).
  const int64_t n = 2, hc = 4, d = 40;
  const auto r = random_bf16(n * hc * d, 3, -2.0f, 2.0f);
  const std::vector<float> fn(size_t(24 * hc * d), 0.0f), scale = {1, 1, 1};
  const auto base = random_f32(24, 4, -1.0f, 1.0f);
  for (KernelBackend be : kBoth) {
    std::vector<bf16> x(size_t(n * d));
    std::vector<float> post(size_t(n * hc)), comb(size_t(n * 16)), pre(size_t(n * hc));
    ScopedBackend use(be);
    mhc_pre({.residual = r.data(),
             .fn = fn.data(),
             .scale = scale.data(),
             .base = base.data(),
             .x = x.data(),
             .post = post.data(),
             .comb = comb.data(),
             .pre = pre.data(),
             .num_tokens = n,
             .hc = hc,
             .dim = d});
    std::vector<double> c(base.begin() + 8, base.end());
    mhc_sinkhorn(c.data(), 4, 10, double(1e-6f));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t m = 0; m < hc; ++m) {
        const float sp = 1.0f / (1.0f + std::exp(-base[size_t(m)]));
        EXPECT_NEAR(pre[size_t(t * hc + m)], sp + 1e-6f, 1e-6f);
        EXPECT_NEAR(post[size_t(t * hc + m)], 2.0f / (1.0f + std::exp(-base[size_t(hc + m)])),
                    1e-6f);
      }
      for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(comb[size_t(t * 16 + i)], float(c[size_t(i)]));
      for (int64_t dd = 0; dd < d; ++dd) {
        double s = 0;
        for (int64_t m = 0; m < hc; ++m)
          s += double(pre[size_t(t * hc + m)]) * bf16_to_f32(r[size_t((t * hc + m) * d + dd)]);
        EXPECT_NEAR(bf16_to_f32(x[size_t(t * d + dd)]), s, std::fabs(s) * 8e-3 + 1e-6)
            << to_string(be);
      }
    }
  }
}

TEST(Mhc, PostWithIdentityCombAndZeroPostPassesTheResidual) {
  const int64_t n = 3, hc = 4, d = 33;
  const auto r = random_bf16(n * hc * d, 7, -2.0f, 2.0f);
  const auto y = random_bf16(n * d, 8, -2.0f, 2.0f);
  std::vector<float> post(size_t(n * hc), 0.0f), comb(size_t(n * 16), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t m = 0; m < hc; ++m) comb[size_t(t * 16 + m * 4 + m)] = 1.0f;
  post[1] = 1.0f;  // token 0 branch 1 also gets y
  for (KernelBackend be : kBoth) {
    std::vector<bf16> out(r.size());
    ScopedBackend use(be);
    mhc_post({.y = y.data(),
              .residual = r.data(),
              .post = post.data(),
              .comb = comb.data(),
              .out = out.data(),
              .num_tokens = n,
              .hc = hc,
              .dim = d});
    for (int64_t i = 0; i < n * hc * d; ++i) {
      const bool plus_y = i / d == 1;
      const float want = plus_y
                             ? round_bf16(bf16_to_f32(r[size_t(i)]) + bf16_to_f32(y[size_t(i % d)]))
                             : bf16_to_f32(r[size_t(i)]);
      ASSERT_EQ(bf16_to_f32(out[size_t(i)]), want) << to_string(be) << " at " << i;
    }
  }
}

TEST(Mhc, HeadWithZeroMixes) {
  const int64_t n = 2, hc = 4, d = 16;
  const auto r = random_bf16(n * hc * d, 9, -1.0f, 1.0f);
  const std::vector<float> fn(size_t(hc * hc * d), 0.0f), scale = {1.0f}, base = {0, 1, -1, 2};
  for (KernelBackend be : kBoth) {
    std::vector<bf16> out(size_t(n * d));
    ScopedBackend use(be);
    mhc_head({.residual = r.data(),
              .fn = fn.data(),
              .scale = scale.data(),
              .base = base.data(),
              .out = out.data(),
              .num_tokens = n,
              .hc = hc,
              .dim = d});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t dd = 0; dd < d; ++dd) {
        double s = 0;
        for (int64_t m = 0; m < hc; ++m)
          s += (1.0 / (1.0 + std::exp(-base[size_t(m)])) + 1e-6) *
               bf16_to_f32(r[size_t((t * hc + m) * d + dd)]);
        EXPECT_NEAR(bf16_to_f32(out[size_t(t * d + dd)]), s, std::fabs(s) * 8e-3 + 1e-6);
      }
  }
}

// u = bf16(g·v) then RMSNorm with eps and the branch weight: v = (1, -1, 2, 0), g = 0.5 gives
// u = (0.5, -0.5, 1, 0), mean(u²) = 0.375; g = 0 gives u = 0 and out = 0 (eps keeps it finite).
TEST(EngramConvNorm, HandWorked) {
  const auto v = bf({1, -1, 2, 0});
  const std::vector<float> g = {0.5f, 0.0f};
  const auto w = bf({1, 1, 2, 1, 1, 1, 1, 1});
  for (KernelBackend be : kBoth) {
    ScopedBackend use(be);
    std::vector<bf16> out(8);
    engram_conv_norm({.v = v.data(),
                      .gate = g.data(),
                      .w = w.data(),
                      .out = out.data(),
                      .num_tokens = 1,
                      .hc = 2,
                      .dim = 4,
                      .eps = 1e-5f});
    const double r = 1.0 / std::sqrt(0.375 + 1e-5);
    const double want[] = {0.5 * r, -0.5 * r, 2 * r, 0, 0, 0, 0, 0};
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(bf16_to_f32(out[size_t(i)]), round_bf16(float(want[i]))) << to_string(be) << i;
  }
}

// The conv's taps read exactly the rows they name, in order, weighted per channel; -1 reads zero;
// SiLU at the end: x rows are (1, 10), (2, 20), (3, 30); w = [[1, 0, 2], [0, 1, 0]] (C = 2, K = 3).
TEST(EngramShortConv, HandWorkedTapsAndSilu) {
  const auto x = bf({1, 10, 2, 20, 3, 30});
  const auto w = bf({1, 0, 2, 0, 1, 0});
  const std::vector<int32_t> taps = {0, 1, 2, -1, -1, 0, 2, 2, 2};
  const auto silu = [](double a) { return round_bf16(float(a / (1 + std::exp(-a)))); };
  for (KernelBackend be : kBoth) {
    ScopedBackend use(be);
    std::vector<bf16> out(6);
    engram_short_conv({.x = x.data(),
                       .taps = taps.data(),
                       .w = w.data(),
                       .out = out.data(),
                       .num_tokens = 3,
                       .num_rows = 3,
                       .channels = 2,
                       .kernel_size = 3});
    // token 0: c0 = 1·1 + 0·2 + 2·3 = 7, c1 = 20; token 1: c0 = 2·1, c1 = 0; token 2: 9, 30
    const double want[] = {7, 20, 2, 0, 9, 30};
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(bf16_to_f32(out[size_t(i)]), silu(want[i]), std::fabs(silu(want[i])) * 4e-3)
          << to_string(be) << i;
  }
  const std::vector<int32_t> bad = {0, 1, 3};
  std::vector<bf16> out(2);
  try {
    engram_short_conv({.x = x.data(),
                       .taps = bad.data(),
                       .w = w.data(),
                       .out = out.data(),
                       .num_tokens = 1,
                       .num_rows = 3,
                       .channels = 2,
                       .kernel_size = 3});
    ADD_FAILURE() << "a tap past the rows must be an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("reads row 3 of 3"), std::string::npos) << e.what();
  }
}

// A row's bytes must not depend on the other rows in the call (docs/numerics.md §10).
TEST(EngramMhcBatchInvariance, GateAndMhcPreRowsAlone) {
  const int64_t hc = 4, d = 200, rows = 37;
  const auto x = random_bf16(rows * hc * d, 1), k = random_bf16(rows * hc * d, 2),
             v = random_bf16(rows * d, 3);
  const auto w = random_f32(hc * d, 4, 0.5f, 1.5f);
  const GateOut all = run_gate(x, k, v, w, rows, hc, d, 1e-6f, 1e-6f, KernelBackend::cpu);
  const auto fn = random_f32(24 * hc * d, 5), base = random_f32(24, 6), scale = random_f32(3, 7);
  std::vector<bf16> xa(size_t(rows * d));
  std::vector<float> pa(size_t(rows * hc)), ca(size_t(rows * 16));
  ScopedBackend use(KernelBackend::cpu);
  mhc_pre({.residual = x.data(),
           .fn = fn.data(),
           .scale = scale.data(),
           .base = base.data(),
           .x = xa.data(),
           .post = pa.data(),
           .comb = ca.data(),
           .num_tokens = rows,
           .hc = hc,
           .dim = d});
  for (int64_t t : {0, 17, 36}) {
    const auto one = [&](const std::vector<bf16>& a, int64_t width) {
      return std::vector<bf16>(a.begin() + t * width, a.begin() + (t + 1) * width);
    };
    const GateOut g = run_gate(one(x, hc * d), one(k, hc * d), one(v, d), w, 1, hc, d, 1e-6f, 1e-6f,
                               KernelBackend::cpu);
    EXPECT_EQ(std::memcmp(g.out.data(), all.out.data() + t * hc * d, g.out.size() * 2), 0);
    std::vector<bf16> x1(static_cast<size_t>(d));
    std::vector<float> p1(static_cast<size_t>(hc)), c1(16);
    const auto r1 = one(x, hc * d);
    mhc_pre({.residual = r1.data(),
             .fn = fn.data(),
             .scale = scale.data(),
             .base = base.data(),
             .x = x1.data(),
             .post = p1.data(),
             .comb = c1.data(),
             .num_tokens = 1,
             .hc = hc,
             .dim = d});
    EXPECT_EQ(std::memcmp(x1.data(), xa.data() + t * d, x1.size() * 2), 0);
    EXPECT_EQ(std::memcmp(c1.data(), ca.data() + t * 16, 64), 0);
  }
}

}  // namespace
}  // namespace deepinfer::kernels
