// Self-speculative decoding with the MTP module (docs/architecture.md §6.1). The first model:
// models/tiny plus an MTP module whose block is a copy of the last layer and whose eh_proj is
// random (so most drafts are wrong: rejection and rollback on every step). Checked against plain
// decode of the same weights (an independent path: one token per forward, no drafts, no rollback):
//  - greedy tokens and every recorded logit bit-identical, at EP 1 and 2, k = 1 and 3, batched,
//    with chunked prefill and a step budget that cuts the drafts, a stop token and length limits;
//  - sampled tokens (temperature, top-k, top-p) identical for every seed;
//  - the acceptance rule: drawing y ~ p with the token's own uniform and accepting the draft x
//    iff y = x accepts with probability p(x) and, on rejection, emits y ~ p(y) / (1 - p(x)) (the
//    speculative-sampling rule for a one-hot draft distribution), by a chi-square test;
//  - the same on models/tiny-mtp, whose trained module's drafts are mostly accepted (verify steps
//    emit several tokens), greedy against the reference's golden tokens and sampled at 3 seeds;
//  - the MTP catch-up that writes only the latent of a chunk's earlier rows gives its last row
//    the same logits, block output and cache rows, bit for bit, as the full MTP forward;
//  - bad configurations are clear errors.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling.h"
#include "model/config.h"
#include "model/deepseek.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/launch.h"

namespace deepinfer::runtime {
namespace {

namespace fs = std::filesystem;
const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

// models/tiny + one MTP module (layer num_hidden_layers), written once per test process.
const std::string& mtp_model() {
  static const std::string dir = [] {
    const std::string d =
        (fs::temp_directory_path() / ("deepinfer-tiny-mtp-" + std::to_string(::getpid()))).string();
    fs::create_directories(d);
    model::Checkpoint ck(kTiny);
    const model::ModelConfig cfg = model::load_config(kTiny);
    const int64_t L = cfg.num_hidden_layers, h = cfg.hidden_size;
    std::vector<model::TensorToWrite> ts;
    const std::string last = "model.layers." + std::to_string(L - 1) + ".";
    const std::string mtp = "model.layers." + std::to_string(L) + ".";
    for (const auto& n : ck.names()) {
      const auto& t = ck.get(n);
      ts.push_back({n, t.dtype, t.shape, t.data});
      if (n.rfind(last, 0) == 0)
        ts.push_back({mtp + n.substr(last.size()), t.dtype, t.shape, t.data});
    }
    std::vector<uint16_t> ones(size_t(h), f32_to_bf16(1.0f).bits), proj;
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (int64_t i = 0; i < h * 2 * h; ++i) proj.push_back(f32_to_bf16(u(rng)).bits);
    for (const char* n : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
      ts.push_back({mtp + n, DType::bf16, {h}, ones.data()});
    ts.push_back({mtp + "eh_proj.weight", DType::bf16, {h, 2 * h}, proj.data()});
    model::write_safetensors(d + "/model.safetensors", ts);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(kTiny + "/config.json"));
    c["num_nextn_predict_layers"] = 1;
    std::ofstream(d + "/config.json") << c.dump(2);
    return d;
  }();
  return dir;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Request i: BOS then seeded ids, 3 + 11·i % 40 tokens, 2 + 5·i % 15 new tokens.
Request request(int64_t i, const SamplingConfig& sc) {
  Request q;
  q.id = i;
  q.prompt = {0};
  for (int64_t t = 1; t < 3 + (11 * i) % 40; ++t)
    q.prompt.push_back(int32_t(2 + mix(uint64_t(i) * 7919 + uint64_t(t)) % 2000));
  q.max_new_tokens = 2 + (5 * i) % 15;
  q.sampling = sc;
  q.record = i % 2 == 0;
  return q;
}

// Every rank's results of requests [0, n) (request r on rank r % ep), sorted by id.
std::vector<RequestResult> run(int ep, int64_t draft_tokens, int64_t n, int64_t step_tokens,
                               const SamplingConfig& sc, int32_t stop = -1,
                               EngineStats* stats = nullptr,
                               const std::string& model_dir = mtp_model()) {
  LaunchModelOptions lo;
  lo.model_dir = model_dir;
  lo.ep = ep;
  lo.mtp = true;
  std::vector<RequestResult> all;
  std::mutex mu;
  run_model_ranks(lo, [&](RankContext& ctx) {
    EngineOptions eo;
    eo.max_tokens_per_step = step_tokens;
    eo.max_batch = 4;  // more requests than that: later ones start mid-run
    eo.draft_tokens = draft_tokens;
    Engine engine(ctx.weights, ctx.group, eo);
    std::vector<Request> reqs;
    for (int64_t i = 0; i < n; ++i) {
      if (int(i % ep) != ctx.group.rank()) continue;
      reqs.push_back(request(i, sc));
      if (stop >= 0 && i == 1) reqs.back().stop_ids = {stop};
    }
    auto g = gather_results(ctx.group, engine.generate(reqs));
    std::lock_guard lk(mu);
    if (ctx.group.rank() == 0) all = std::move(g);
    if (stats && ctx.group.rank() == 0) *stats = engine.stats();
  });
  return all;
}

void expect_same(const std::vector<RequestResult>& got, const std::vector<RequestResult>& want,
                 const std::string& how) {
  ASSERT_EQ(got.size(), want.size()) << how;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << how << ", request " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << how << ", request " << i;
    EXPECT_EQ(got[i].num_positions, want[i].num_positions) << how << ", request " << i;
    ASSERT_EQ(got[i].logits.size(), want[i].logits.size()) << how << ", request " << i;
    // No recorded logits: nothing to compare (memcmp of an empty vector's null data is UB).
    const bool same_logits =
        got[i].logits.empty() || std::memcmp(got[i].logits.data(), want[i].logits.data(),
                                             got[i].logits.size() * sizeof(float)) == 0;
    EXPECT_TRUE(same_logits) << how << ", request " << i << ": recorded logits differ";
    if (got[i].num_positions > 0) {  // the MTP logits of every recorded position
      EXPECT_EQ(got[i].mtp_logits.size(), got[i].logits.size()) << how << ", request " << i;
    }
  }
}

TEST(Speculative, GreedyIsTokenForTokenPlainDecodeBatchedAtEp1And2) {
  const SamplingConfig greedy;
  const auto plain = run(1, 0, 9, 64, greedy);
  ASSERT_EQ(plain.size(), 9u);
  // A stop token request 1 generates (its third), so the stop cuts a verified run short.
  const int32_t stop = plain[1].tokens.size() > 2 ? plain[1].tokens[2] : -1;
  const auto plain_stop = run(1, 0, 9, 64, greedy, stop);
  for (int ep : {1, 2})
    for (int64_t k : {int64_t(1), int64_t(3)}) {
      EngineStats st;
      const std::string how = "EP " + std::to_string(ep) + " k " + std::to_string(k);
      expect_same(run(ep, k, 9, 64, greedy, -1, &st), plain, how);
      EXPECT_GT(st.drafted, 0) << how;
      // 16 tokens per step: prefill in chunks, and decode chunks of 4 sequences cut the drafts.
      expect_same(run(ep, k, 9, 16, greedy, stop), plain_stop, how + ", 16 tokens per step, stop");
    }
}

// models/tiny-mtp (a trained MTP module, written by tools/reference): most drafts are accepted,
// so verify steps emit several tokens and the caches skip ahead. The golden prompts, batched:
// tokens = the reference's greedy continuation, recorded logits bit-identical to plain decode.
TEST(Speculative, TrainedModuleAcceptsDraftsAndKeepsTheGoldenTokens) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny-mtp";
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/golden/golden.json"));
  std::vector<Request> reqs;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : j.at("prompts")) {
    Request q;
    q.id = int64_t(reqs.size());
    q.prompt = p.at("ids").get<std::vector<int32_t>>();
    q.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
    q.record = true;
    reqs.push_back(q);
    want.push_back(p.at("generated_ids").get<std::vector<int32_t>>());
  }
  auto run_golden = [&](int ep, int64_t k, EngineStats* stats) {
    LaunchModelOptions lo;
    lo.model_dir = dir;
    lo.ep = ep;
    lo.mtp = true;
    std::vector<RequestResult> all;
    std::mutex mu;
    run_model_ranks(lo, [&](RankContext& ctx) {
      EngineOptions eo;
      eo.draft_tokens = k;
      Engine engine(ctx.weights, ctx.group, eo);
      std::vector<Request> mine;
      for (const auto& q : reqs)
        if (int(q.id % ep) == ctx.group.rank()) mine.push_back(q);
      auto g = gather_results(ctx.group, engine.generate(mine));
      std::lock_guard lk(mu);
      if (ctx.group.rank() == 0) {
        all = std::move(g);
        *stats = engine.stats();
      }
    });
    return all;
  };
  EngineStats st;
  const auto plain = run_golden(1, 0, &st);
  ASSERT_EQ(plain.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(plain[i].tokens, want[i]) << "prompt " << i;
  for (int ep : {1, 2})
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(3)}) {
      const std::string how = "EP " + std::to_string(ep) + " k " + std::to_string(k);
      expect_same(run_golden(ep, k, &st), plain, how);
      // Rank 0's sequences: the trained module's drafts are mostly right (the reference's
      // acceptance is 0.85 at k = 1, 0.75 at k = 2).
      EXPECT_GT(double(st.accepted), 0.5 * double(st.drafted))
          << how << ": " << st.accepted << " of " << st.drafted;
    }
}

// A speculative step's MTP catch-up (a chunk without all_logits: docs/architecture.md §6.1) runs
// only the chunk's last row past the cache write. Its logits and block output, and every row's
// latent in the cache, must be those of the full MTP forward, bit for bit (models/tiny-mtp, golden
// prompt 4: 26 positions, so the catch-up has 25 rows).
// The main forward over ids in a new sequence of cache, then the MTP forward over its positions
// (every row's logits or, as a catch-up, the last row's), its logits of the first vocab ids.
model::ForwardOutput main_then_mtp(model::DeepseekModel& m, model::PagedKvCache& cache,
                                   const std::vector<int32_t>& ids, bool all_rows,
                                   int64_t vocab = 0, int64_t* seq_out = nullptr) {
  const int64_t n = int64_t(ids.size());
  const int64_t seq = cache.add_sequence();
  cache.reserve(seq, n);
  if (seq_out) *seq_out = seq;
  model::SeqChunk c{.cache_seq = seq, .tokens = ids.data(), .num_tokens = n};
  const model::ForwardOutput main = m.forward({c}, cache, false, true);
  model::SeqChunk mc{
      .cache_seq = seq, .tokens = ids.data() + 1, .num_tokens = n - 1, .all_logits = all_rows};
  return m.mtp_forward({mc}, main.hidden.data<bf16>(), cache, vocab);
}

TEST(Speculative, MtpCatchUpRowsOnlyFeedTheCache) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny-mtp";
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/golden/golden.json"));
  const auto ids = j.at("prompts").at(4).at("ids").get<std::vector<int32_t>>();
  const int64_t n = int64_t(ids.size());
  ASSERT_GT(n, 8);
  LaunchModelOptions lo;
  lo.model_dir = dir;
  lo.mtp = true;
  run_model_ranks(lo, [&](RankContext& ctx) {
    model::DeepseekModel m(ctx.weights, ctx.group, model::ModelOptions::from_knobs());
    const int64_t hid = m.config().hidden_size, V = m.config().vocab_size;
    const int64_t L = m.config().num_hidden_layers, row = m.kv_cache_config(1).row_dim;
    struct Out {
      std::vector<float> logits;  // the last row's
      std::vector<bf16> hidden;   // the last row's block output
      std::vector<bf16> cache;    // the MTP layer's latent rows, positions 0 .. n-2
    };
    auto run = [&](bool all_rows) {
      model::PagedKvCache cache(m.kv_cache_config(4));
      int64_t seq = 0;
      const model::ForwardOutput o = main_then_mtp(m, cache, ids, all_rows, 0, &seq);
      const int64_t last = o.row_begin[1] - 1;
      EXPECT_EQ(last, all_rows ? n - 2 : 0);
      Out r;
      r.logits.assign(o.logits.data<float>() + last * V, o.logits.data<float>() + (last + 1) * V);
      r.hidden.assign(o.hidden.data<bf16>() + last * hid, o.hidden.data<bf16>() + (last + 1) * hid);
      for (int64_t p = 0; p < n - 1; ++p)
        r.cache.insert(r.cache.end(), cache.row(L, seq, p), cache.row(L, seq, p) + row);
      return r;
    };
    const Out full = run(true), trimmed = run(false);
    EXPECT_EQ(std::memcmp(trimmed.logits.data(), full.logits.data(), full.logits.size() * 4), 0);
    EXPECT_EQ(std::memcmp(trimmed.hidden.data(), full.hidden.data(), full.hidden.size() * 2), 0);
    EXPECT_EQ(std::memcmp(trimmed.cache.data(), full.cache.data(), full.cache.size() * 2), 0);
  });
}

// A draft vocabulary (EngineOptions::draft_vocab): the MTP logits are the first N columns of the
// whole head's, bit for bit, at EP 1 and 2 (N = 1000: the ranks' 128-column slices end mid-block);
// the engine's greedy tokens stay the golden's, and drafts are still accepted.
TEST(Speculative, DraftVocabularyScoresAPrefixAndKeepsTheTokens) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny-mtp";
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/golden/golden.json"));
  constexpr int64_t kVocab = 1000;
  for (int ep : {1, 2}) {
    LaunchModelOptions lo;
    lo.model_dir = dir;
    lo.ep = ep;
    lo.mtp = true;
    EngineStats st;
    std::vector<RequestResult> got;
    std::mutex mu;
    run_model_ranks(lo, [&](RankContext& ctx) {
      {  // the MTP forward alone: prefix columns of the whole head's logits
        model::DeepseekModel m(ctx.weights, ctx.group, model::ModelOptions::from_knobs());
        const auto ids = j.at("prompts").at(0).at("ids").get<std::vector<int32_t>>();
        const int64_t V = m.config().vocab_size;
        auto logits = [&](int64_t vocab) {
          model::PagedKvCache cache(m.kv_cache_config(4));
          return main_then_mtp(m, cache, ids, true, vocab).logits;
        };
        const Tensor whole = logits(0), prefix = logits(kVocab);
        ASSERT_EQ(prefix.dim(1), kVocab);
        ASSERT_EQ(prefix.dim(0), whole.dim(0));
        for (int64_t r = 0; r < whole.dim(0); ++r)
          EXPECT_EQ(std::memcmp(prefix.data<float>() + r * kVocab, whole.data<float>() + r * V,
                                kVocab * sizeof(float)),
                    0)
              << "EP " << ep << " row " << r;
      }
      EngineOptions eo;
      eo.draft_tokens = 2;
      eo.draft_vocab = kVocab;
      Engine engine(ctx.weights, ctx.group, eo);
      std::vector<Request> mine;
      for (const auto& p : j.at("prompts")) {
        Request q;
        q.id = int64_t(&p - &j.at("prompts")[0]);
        q.prompt = p.at("ids").get<std::vector<int32_t>>();
        q.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
        if (int(q.id % ep) == ctx.group.rank()) mine.push_back(q);
      }
      auto g = gather_results(ctx.group, engine.generate(mine));
      std::lock_guard lk(mu);
      if (ctx.group.rank() == 0) {
        got = std::move(g);
        st = engine.stats();
      }
    });
    ASSERT_EQ(got.size(), j.at("prompts").size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i].tokens, j.at("prompts")[i].at("generated_ids").get<std::vector<int32_t>>())
          << "EP " << ep << " prompt " << i;
    EXPECT_GT(st.accepted, 0) << "EP " << ep;
  }
  LaunchModelOptions lo;
  lo.model_dir = dir;
  lo.mtp = true;
  try {
    run_model_ranks(lo, [](RankContext& ctx) {
      EngineOptions eo;
      eo.draft_tokens = 2;
      eo.draft_vocab = ctx.weights->config.vocab_size + 1;
      Engine e(ctx.weights, ctx.group, eo);
    });
    FAIL() << "a draft vocabulary larger than the model's was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--draft-vocab"), std::string::npos) << e.what();
  }
  // A request recording MTP logits is refused before any step: they would be partial.
  try {
    run_model_ranks(lo, [&](RankContext& ctx) {
      EngineOptions eo;
      eo.draft_tokens = 2;
      eo.draft_vocab = kVocab;
      Engine e(ctx.weights, ctx.group, eo);
      Request q;
      q.prompt = j.at("prompts").at(0).at("ids").get<std::vector<int32_t>>();
      q.max_new_tokens = 4;
      q.record = true;
      e.generate({q});
    });
    FAIL() << "a recording request with a draft vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole vocabulary"), std::string::npos) << e.what();
  }
}

TEST(Speculative, SampledTokensAreThoseOfPlainSamplingForEverySeed) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const SamplingConfig sc{0.9f, 50, 0.95f, seed};
    const auto plain = run(1, 0, 5, 64, sc);
    expect_same(run(1, 2, 5, 64, sc), plain, "seed " + std::to_string(seed));
    expect_same(run(2, 1, 5, 64, sc), plain, "EP 2, seed " + std::to_string(seed));
    const std::string trained = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny-mtp";
    EngineStats st;
    const auto plain_t = run(1, 0, 5, 64, sc, -1, nullptr, trained);
    expect_same(run(2, 2, 5, 64, sc, -1, &st, trained), plain_t,
                "models/tiny-mtp EP 2, seed " + std::to_string(seed));
    EXPECT_GT(st.accepted, 0) << "models/tiny-mtp, seed " << seed;
  }
}

// The acceptance rule on a small distribution: p from logits with temperature 1 (no filter), the
// draft x = token 2. Over N seeds: accept iff the draw y equals x. Expected: P(accept) = p(x), and
// the emitted token on rejection follows p(y) / (1 - p(x)) over y != x. Chi-square with 5 degrees
// of freedom (6 outcomes: accept, or reject with y in the 5 others) below 20.5 (p = 0.001).
TEST(Speculative, AcceptanceRuleMatchesSpeculativeSamplingClosedForm) {
  const std::vector<float> logits = {0.3f, -1.0f, 1.2f, 0.0f, 0.7f, -0.4f};
  const int64_t V = int64_t(logits.size()), x = 2, N = 60000;
  std::vector<double> p(static_cast<size_t>(V));
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += p[size_t(i)] = std::exp(double(logits[size_t(i)]));
  for (auto& v : p) v /= z;
  std::vector<int64_t> seen(static_cast<size_t>(V),
                            0);  // seen[x]: accepted; seen[y]: rejected, emitted y
  for (int64_t s = 0; s < N; ++s) {
    float temp = 1.0f;
    int64_t seed = s, counter = 5;
    int32_t y = -1;
    kernels::SamplingParams sp;
    sp.logits = logits.data();
    sp.temperature = &temp;
    sp.seed = &seed;
    sp.counter = &counter;
    sp.tokens = &y;
    sp.batch = 1;
    sp.vocab = V;
    kernels::sample(sp);
    ++seen[size_t(y)];  // y == x: the draft is accepted; else y is the residual draw
  }
  double chi2 = 0;
  for (int64_t i = 0; i < V; ++i) {
    // Accept: N·p(x). Reject then y: N·(1 - p(x))·p(y)/(1 - p(x)) = N·p(y).
    const double expect =
        double(N) *
        (i == x ? p[size_t(x)] : (1 - p[size_t(x)]) * p[size_t(i)] / (1 - p[size_t(x)]));
    chi2 += (double(seen[size_t(i)]) - expect) * (double(seen[size_t(i)]) - expect) / expect;
  }
  EXPECT_LT(chi2, 20.5) << "acceptance " << double(seen[size_t(x)]) / double(N) << " vs p(x) "
                        << p[size_t(x)];
}

TEST(Speculative, WithoutAnMtpModuleIsAClearError) {
  LaunchModelOptions lo;
  lo.model_dir = kTiny;  // num_nextn_predict_layers = 0
  lo.mtp = true;
  try {
    run_model_ranks(lo, [](RankContext&) {});
    FAIL() << "loading models/tiny with its MTP module did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_nextn_predict_layers = 0"), std::string::npos)
        << e.what();
  }
  lo.mtp = false;
  EXPECT_THROW(run_model_ranks(lo,
                               [](RankContext& ctx) {
                                 EngineOptions eo;
                                 eo.draft_tokens = 2;
                                 Engine e(ctx.weights, ctx.group, eo);
                               }),
               Error);
}

}  // namespace
}  // namespace deepinfer::runtime
