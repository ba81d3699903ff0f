// Engram and mHC in the model (docs/engram.md): config errors name the field; the compression
// table, hash parameters and hash rows of models/tiny-engram against the reference's golden
// (golden/compression.json, golden/engram_hash.json); the short conv's per-position state: chunked
// prefill, token-by-token decode and a batch of two sequences give the one-shot prefill's bits.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/engram.h"
#include "model/config.h"
#include "model/deepseek.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace deepinfer::model {
namespace {

using nlohmann::json;
const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";
const std::string kEngram = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny-engram";

using test_util::error_of;

json read_json(const std::string& p) {
  const std::string text = test_util::read_text(p);
  EXPECT_FALSE(text.empty()) << p;
  return json::parse(text);
}

json engram_config() {
  json j = read_json(kTiny + "/config.json");
  j["hc_mult"] = 4;
  j["engram"] = {{"layer_ids", {1}},
                 {"max_ngram_size", 3},
                 {"n_head_per_ngram", 4},
                 {"n_embed_per_ngram", 128},
                 {"engram_vocab_size", {1024, 1024}},
                 {"kernel_size", 4},
                 {"pad_id", 2},
                 {"seed", 0}};
  return j;
}

TEST(EngramConfig, ParsesTheContractsKeys) {
  const ModelConfig c = parse_config(engram_config().dump(), "c.json");
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_repeat, 10);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.hc_post_mult, 2.0);
  ASSERT_TRUE(c.engram.enabled());
  EXPECT_EQ(c.engram.heads(), 8);
  EXPECT_EQ(c.engram.head_dim(), 32);
  EXPECT_EQ(c.engram.embed_dim(), 256);
  EXPECT_EQ(c.engram.conv_history(), 9);
  EXPECT_EQ(c.engram.index_of(1), 0);
  EXPECT_EQ(c.engram.index_of(2), -1);
  const ModelConfig plain = parse_config(read_json(kTiny + "/config.json").dump(), "c.json");
  EXPECT_EQ(plain.hc_mult, 1);
  EXPECT_FALSE(plain.engram.enabled());
}

// Each mistake is an Error naming the field (and the file).
TEST(EngramConfig, BadValuesAreNamedErrors) {
  struct Case {
    std::function<void(json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["engram"]["n_heads"] = 4; }, "'engram.n_heads' is not an Engram setting"},
      {[](json& j) { j["engram"].erase("kernel_size"); }, "'engram.kernel_size' is missing"},
      {[](json& j) { j["engram"].erase("seed"); }, "'engram.seed' is missing"},
      {[](json& j) { j["engram"]["n_embed_per_ngram"] = 130; },
       "'engram.n_embed_per_ngram' (130) must be a multiple of n_head_per_ngram (4)"},
      {[](json& j) {
         j["engram"]["layer_ids"] = {1, 4};
       },
       "holds 4, outside the blocks [0, num_hidden_layers = 4)"},
      {[](json& j) {
         j["engram"]["layer_ids"] = {2, 1};
       },
       "must be strictly increasing"},
      {[](json& j) { j["engram"]["layer_ids"] = json::array(); }, "layer_ids is empty"},
      {[](json& j) { j["engram"]["layer_ids"] = {-1}; }, "layer id -1 is negative"},
      {[](json& j) { j["engram"]["engram_vocab_size"] = {1024}; },
       "engram_vocab_size has 1 entries; max_ngram_size 3 needs 2"},
      {[](json& j) {
         j["engram"]["engram_vocab_size"] = {1024, 1};
       },
       "outside [2, 2^30)"},
      {[](json& j) { j["engram"]["max_ngram_size"] = 1; }, "max_ngram_size must be >= 2"},
      {[](json& j) { j["engram"]["pad_id"] = 2048; }, "'engram.pad_id' (2048) must be a token id"},
      {[](json& j) { j["engram"]["kernel_size"] = 0; }, "'engram.kernel_size' must be in [1, 64]"},
      {[](json& j) { j["engram"]["layer_ids"] = "1"; }, "'engram.layer_ids' must be a list"},
      {[](json& j) { j["engram"]["seed"] = 0.5; }, "'engram.seed' must be an integer"},
      {[](json& j) { j["engram"] = 3; }, "field 'engram' must be an object"},
      {[](json& j) { j["hc_mult"] = 2; }, "'hc_mult' must be 1 (plain residual) or 4"},
      {[](json& j) { j["hc_sinkhorn_repeat"] = 0; }, "'hc_sinkhorn_repeat' must be in [1, 1000]"},
      {[](json& j) { j["hc_eps"] = 0; }, "'hc_eps' must be in (0, 1)"},
      {[](json& j) { j["hc_post_mult"] = -1.0; }, "'hc_post_mult' must be in (0, 1e6)"},
  };
  for (const Case& c : cases) {
    json j = engram_config();
    c.edit(j);
    const std::string msg = error_of([&] { parse_config(j.dump(), "c.json"); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "want '" << c.expect << "', got: " << msg;
    EXPECT_NE(msg.find("c.json"), std::string::npos) << msg;
  }
}

// ---- models/tiny-engram against the reference's golden ---------------------------------------

bool have_engram_model() { return std::filesystem::exists(kEngram + "/golden/engram_hash.json"); }
#define REQUIRE_ENGRAM_MODEL() \
  ASSERT_TRUE(have_engram_model()) << kEngram << "/golden is missing (tools/reference writes it)"

TEST(EngramTinyModel, CompressionTableEqualsTheReferences) {
  REQUIRE_ENGRAM_MODEL();
  const auto table = load_compression_table(kEngram);
  const json g = read_json(kEngram + "/golden/compression.json");
  EXPECT_EQ(table->num_canonical, g.at("vocab_size_compressed").get<int64_t>());
  EXPECT_EQ(table->raw_to_canonical, g.at("raw_to_canonical").get<std::vector<int64_t>>());
}

// The hash parameters the loader derives (seed, V') and the rows engram_hash gives for prompt 0's
// sequence equal the reference's.
TEST(EngramTinyModel, HashParametersAndRowsEqualTheReferences) {
  REQUIRE_ENGRAM_MODEL();
  const ModelConfig cfg = load_config(kEngram);
  const auto w = load_weights(std::make_shared<const Checkpoint>(kEngram), cfg, {});
  const EngramWeights& ew = w->engram;
  const json g = read_json(kEngram + "/golden/engram_hash.json");
  const int64_t G = cfg.engram.max_ngram_size, H = cfg.engram.heads(), Le = cfg.engram.num_layers();
  for (int64_t l = 0; l < Le; ++l) {
    const std::string key = std::to_string(cfg.engram.layer_ids[size_t(l)]);
    EXPECT_EQ(std::vector<int64_t>(ew.hash.multipliers.begin() + l * G,
                                   ew.hash.multipliers.begin() + (l + 1) * G),
              g.at("multipliers").at(key).get<std::vector<int64_t>>());
    EXPECT_EQ(std::vector<int64_t>(ew.hash.vocab_sizes.begin() + l * H,
                                   ew.hash.vocab_sizes.begin() + (l + 1) * H),
              g.at("table_sizes").at(key).get<std::vector<int64_t>>());
  }
  const auto ids = g.at("ids").get<std::vector<int64_t>>();
  const auto canon = g.at("canonical_ids").get<std::vector<int64_t>>();
  const auto want = g.at("indices").get<std::vector<std::vector<int64_t>>>();
  const int64_t T = int64_t(ids.size());
  std::vector<int32_t> windows(size_t(T * G));
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(ew.compression->canonical(ids[size_t(t)], cfg.engram.pad_id), canon[size_t(t)]);
    for (int64_t k = 0; k < G; ++k)
      windows[size_t(t * G + k)] = t - k < 0 ? ew.pad_canonical : int32_t(canon[size_t(t - k)]);
  }
  std::vector<int32_t> rows(size_t(Le * T * H));
  kernels::engram_hash({.ngram_ids = windows.data(),
                        .multipliers = ew.hash.multipliers.data(),
                        .vocab_sizes = ew.hash.vocab_sizes.data(),
                        .offsets = ew.hash.offsets.data(),
                        .out = rows.data(),
                        .num_tokens = T,
                        .num_layers = Le,
                        .max_ngram = G,
                        .heads_per_ngram = cfg.engram.n_head_per_ngram});
  ASSERT_EQ(int64_t(want.size()), T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < Le; ++l)
      for (int64_t h = 0; h < H; ++h)  // the golden's rows are per layer: take off its base row
        ASSERT_EQ(rows[size_t((l * T + t) * H + h)] - ew.row_base[size_t(l)],
                  want[size_t(t)][size_t(l * H + h)])
            << "token " << t << " layer " << l << " head " << h;
}

// The short conv and the hash read earlier positions from the cache: prefill in chunks (sizes that
// do not line up with the dilation), token by token, and beside another sequence in one forward
// all give the one-shot prefill's logits bit for bit.
TEST(EngramTinyModel, ConvStateAcrossChunksAndBatchesEqualsOneShot) {
  REQUIRE_ENGRAM_MODEL();
  const json g = read_json(kEngram + "/golden/golden.json");
  const int64_t V = g.at("vocab_size").get<int64_t>();
  const auto seq_a = g.at("prompts").at(0).at("ids").get<std::vector<int32_t>>();
  const auto seq_b = g.at("prompts").at(1).at("ids").get<std::vector<int32_t>>();
  const int64_t TA = int64_t(seq_a.size()), TB = int64_t(seq_b.size());
  LaunchOptions lo;
  run_ranks(lo, [&](Group& group) {
    const ModelConfig cfg = load_config(kEngram);
    auto w = load_weights(std::make_shared<const Checkpoint>(kEngram), cfg, {});
    DeepseekModel m(w, group, {});
    using Seq = std::pair<const std::vector<int32_t>*, std::vector<int64_t>>;
    const auto run = [&](const std::vector<Seq>& seq_chunks) {
      // Each sequence's tokens and its chunk sizes, one chunk per step.
      std::vector<std::vector<int64_t>> chunk_sizes;
      for (const Seq& q : seq_chunks) chunk_sizes.push_back(q.second);
      PagedKvCache cache(m.kv_cache_config(8));
      std::vector<int64_t> seqs, pos(chunk_sizes.size(), 0);
      for (size_t i = 0; i < chunk_sizes.size(); ++i) seqs.push_back(cache.add_sequence());
      std::vector<std::vector<float>> logits(chunk_sizes.size());
      for (size_t step = 0;; ++step) {
        std::vector<SeqChunk> chunks;
        for (size_t i = 0; i < chunk_sizes.size(); ++i)
          if (step < chunk_sizes[i].size()) {
            const auto& ids = *seq_chunks[i].first;
            chunks.push_back({seqs[i], ids.data() + pos[i], chunk_sizes[i][step], pos[i], true});
          }
        if (chunks.empty()) break;
        const ForwardOutput out = m.forward(chunks, cache);
        size_t c = 0;
        for (size_t i = 0; i < chunk_sizes.size(); ++i)
          if (step < chunk_sizes[i].size()) {
            const float* base = out.logits.data<float>();
            logits[i].insert(logits[i].end(), base + out.row_begin[c] * V,
                             base + out.row_begin[c + 1] * V);
            pos[i] += chunk_sizes[i][step];
            ++c;
          }
      }
      return logits;
    };
    const auto one = run({{&seq_a, {TA}}, {&seq_b, {TB}}});
    std::vector<int64_t> odd, ones(size_t(TA), 1);
    for (int64_t p = 0, n = 2; p < TA; p += n, n = n % 7 + 3) odd.push_back(std::min(n, TA - p));
    const auto chunked = run({{&seq_a, odd}});
    const auto decode = run({{&seq_a, ones}});
    const auto alone_b = run({{&seq_b, {TB}}});
    ASSERT_EQ(int64_t(one[0].size()), TA * V);
    EXPECT_EQ(std::memcmp(chunked[0].data(), one[0].data(), one[0].size() * 4), 0) << "chunked";
    EXPECT_EQ(std::memcmp(decode[0].data(), one[0].data(), one[0].size() * 4), 0) << "decode";
    EXPECT_EQ(std::memcmp(alone_b[0].data(), one[1].data(), one[1].size() * 4), 0) << "batched";
    // And a different history changes the logits of the same tokens (the state is read at all).
    EXPECT_NE(std::memcmp(one[0].data() + (TA - 1) * V, one[1].data() + (TB - 1) * V, 4 * V), 0);
  });
}

}  // namespace
}  // namespace deepinfer::model
