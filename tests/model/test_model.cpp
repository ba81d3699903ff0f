// Model layer: config/safetensors errors name the problem; the paged KV cache; the forward pass
// against the independent PyTorch golden (models/tiny/golden), and chunked prefill through the
// paged cache against one-shot prefill; the ranks sharing the replicated work of small steps
// (split_linears, shared_expert_rank) against each rank doing all of its own.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "model/config.h"
#include "model/deepseek.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace deepinfer::model {
namespace {

namespace fs = std::filesystem;
const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

using test_util::error_of;
using test_util::read_text;

TEST(Config, BadFieldIsNamed) {
  auto j = nlohmann::json::parse(read_text(kTiny + "/config.json"));
  j["topk_group"] = 7;  // more groups kept than exist (n_group 4)
  const std::string msg = error_of([&] { parse_config(j.dump(), "test.json"); });
  EXPECT_NE(msg.find("topk_group"), std::string::npos) << msg;
  auto k = nlohmann::json::parse(read_text(kTiny + "/config.json"));
  k.erase("hidden_size");
  const std::string msg2 = error_of([&] { parse_config(k.dump(), "test.json"); });
  EXPECT_NE(msg2.find("hidden_size"), std::string::npos) << msg2;
}

// A number past double's range (here "41e308", found by fuzz/config.cpp) makes the JSON parser
// throw out_of_range, not parse_error: still an Error naming the file.
TEST(Config, NumberOutOfRangeIsAnError) {
  std::string text = read_text(kTiny + "/config.json");
  const size_t at = text.find("\"num_key_value_heads\": 4");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 26, "\"num_key_value_heads\": 41e308");
  const std::string msg = error_of([&] { parse_config(text, "test.json"); });
  EXPECT_NE(msg.find("test.json: not valid JSON"), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] { parse_config(read_text(kTiny + "/config.json"), "test.json"); }), "");
}

// Sizes past int32 (found by fuzz/config.cpp: qk_head_dim() overflowed int64) are Errors
// naming the field.
TEST(Config, SizesPastInt32AreErrors) {
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, int64_t>>{{"qk_nope_head_dim", INT64_MAX},
                                                    {"hidden_size", int64_t(1) << 31},
                                                    {"eos_token_id", int64_t(1) << 40},
                                                    {"bos_token_id", INT64_MIN}}) {
    auto j = nlohmann::json::parse(read_text(kTiny + "/config.json"));
    j[field] = value;
    const std::string msg = error_of([&] { parse_config(j.dump(), "test.json").qk_head_dim(); });
    EXPECT_NE(msg.find("'" + field + "'"), std::string::npos) << field << ": " << msg;
  }
}

// A safetensors file's bytes: the 8-byte little-endian header length, the header, `data` zeros.
std::string safetensors_bytes(const std::string& header, size_t data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data, '\0');
}

SafetensorsHeader parse_bytes(const std::string& bytes) {
  return parse_safetensors(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), "f");
}

// Headers that are JSON but not a valid tensor list (the checks fuzz/safetensors_header.cpp
// found missing): each an Error naming the tensor and the field, never a json exception, an
// int64 overflow (UBSan) or a tensor whose elements do not fit its bytes.
TEST(Safetensors, MalformedHeaderEntriesAreErrors) {
  const std::string valid = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  EXPECT_EQ(parse_bytes(safetensors_bytes(valid, 8)).tensors.at("a").nbytes, 8u);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})", "corrupt"},
      {R"({"a": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "dtype must be a string"},
      {R"({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", "shape must be an array"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]}})", "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}})", "data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.5, 4]}})", "data_offsets"},
      // 2^32 * 2^32 bytes: wrapped to 0, it matched an empty data range.
      {R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
       "more than 2^64"},
      {R"({"a": {"dtype": "BF16", "shape": [9223372036854775807, 3], "data_offsets": [0, 4]}})",
       "more than 2^64"},
  };
  for (const auto& [header, expected] : cases) {
    const std::string msg = error_of([&] { parse_bytes(safetensors_bytes(header, 8)); });
    EXPECT_NE(msg.find(expected), std::string::npos) << header << "\n" << msg;
    if (std::string(expected) != "corrupt") {
      EXPECT_NE(msg.find("tensor a"), std::string::npos) << msg;
    }
  }
}

// model.safetensors.index.json: a number past double's range (found by
// fuzz/safetensors_index.cpp) and shard names that are not files of the folder are Errors.
TEST(Safetensors, MalformedIndexIsAnError) {
  EXPECT_EQ(parse_safetensors_index(R"({"weight_map": {"a": "s1", "b": "s2", "c": "s1"}})", "i"),
            (std::vector<std::string>{"s1", "s2"}));
  for (const char* text : {
           R"({"metadata": {"total_size": 1e3087103480}, "weight_map": {}})",
           R"({"weight_map": {"a": 7}})",
           R"({"weight_map": {"a": ""}})",
           R"({"weight_map": {"a": "../model.safetensors"}})",
           R"({"weight_map": {"a": ".."}})",
           R"({"weight_map": ["a"]})",
           R"([1])",
       }) {
    const std::string msg = error_of([&] { parse_safetensors_index(text, "index.json"); });
    EXPECT_NE(msg.find("index.json"), std::string::npos) << text << "\n" << msg;
  }
}

TEST(Safetensors, TruncatedMissingWrongShapeAndDtype) {
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer_model_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> data(64, 0x3f80);
  write_safetensors((dir / "model.safetensors").string(),
                    {{"a.weight", DType::bf16, {8, 8}, data.data()}});
  {
    Checkpoint ck(dir.string());
    EXPECT_NE(error_of([&] { ck.get("b.weight"); }).find("b.weight"), std::string::npos);
    EXPECT_NE(error_of([&] {
                ck.get("a.weight", DType::bf16, {8, 4});
              }).find("a.weight"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                ck.get("a.weight", DType::e4m3, {8, 8});
              }).find("a.weight"),
              std::string::npos);
    EXPECT_EQ(error_of([&] { ck.get("a.weight", DType::bf16, {8, 8}); }), "");
  }
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 10);
  const std::string msg = error_of([&] { Checkpoint ck(dir.string()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  fs::remove_all(dir);
}

// Each part once: the tensor, its file, the file's dtype and shape, what config.json implies.
TEST(Safetensors, MismatchNamesTensorFileShapeAndExpectedOnce) {
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer_mismatch_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> data(64, 0x3f80);
  write_safetensors((dir / "model.safetensors").string(),
                    {{"a.weight", DType::bf16, {8, 8}, data.data()}});
  {
    Checkpoint ck(dir.string());
    const std::string msg = error_of([&] { ck.get("a.weight", DType::bf16, {8, 4}); });
    EXPECT_EQ(msg.rfind("tensor a.weight in model.safetensors is BF16[8, 8], but config.json "
                        "implies BF16[8, 4]",
                        0),
              0u)
        << msg;
    EXPECT_EQ(msg.find("[8, 8]"), msg.rfind("[8, 8]")) << msg;
    EXPECT_EQ(msg.find("check `"), std::string::npos) << msg;
  }
  fs::remove_all(dir);
}

// The advice follows the dtype: F16 converts to BF16, a non-OCP fp8 to F8_E4M3, others re-export.
TEST(Safetensors, UnsupportedDtypeAdviceDependsOnTheDtype) {
  EXPECT_NE(unsupported_dtype_hint("F16").find("F16 tensors to BF16"), std::string::npos);
  EXPECT_NE(unsupported_dtype_hint("F8_E4M3FNUZ").find("F8_E4M3FNUZ tensors to F8_E4M3"),
            std::string::npos);
  EXPECT_EQ(unsupported_dtype_hint("BOOL").find("F16 tensors"), std::string::npos);
  EXPECT_NE(unsupported_dtype_hint("BOOL").find("BOOL"), std::string::npos);
  // Through the loader: a header naming F16 gets the F16 advice, BOOL does not.
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer_dtype_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const std::string dtype : {"F16", "BOOL"}) {
    const std::string header =
        R"({"a":{"dtype":")" + dtype + R"(","shape":[2],"data_offsets":[0,4]}})";
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(4, '\0');
    out.close();
    const std::string msg = error_of([&] { Checkpoint ck(dir.string()); });
    EXPECT_NE(msg.find("dtype " + dtype + " is not supported"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("F16 tensors") != std::string::npos, dtype == "F16") << msg;
  }
  fs::remove_all(dir);
}

TEST(Config, ModelDirIsCheckedBeforeItsFiles) {
  const std::string missing = error_of([] { check_model_dir("/no/such/model"); });
  EXPECT_NE(missing.find("--model /no/such/model: no such folder"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("tokenizer.json not"), std::string::npos) << missing;
  const std::string file = error_of([] { check_model_dir(kTiny + "/config.json"); });
  EXPECT_NE(file.find("is a file, not a folder"), std::string::npos) << file;
  const std::string empty = error_of([] { check_model_dir(fs::temp_directory_path().string()); });
  EXPECT_NE(empty.find("has no config.json"), std::string::npos) << empty;
  EXPECT_EQ(error_of([] { check_model_dir(kTiny); }), "");
}

TEST(KvCache, PagesReserveFreeAndExhaustion) {
  PagedKvCache c({2, 8, 3, 4});
  const int64_t a = c.add_sequence(), b = c.add_sequence();
  c.reserve(a, 5);  // 2 pages
  EXPECT_EQ(c.block_table(a).size(), 2u);
  EXPECT_EQ(c.capacity(a), 8);
  c.row(1, a, 4)[0] = f32_to_bf16(3.0f);
  const int32_t page = c.block_table(a)[1];
  EXPECT_EQ(bf16_to_f32(c.pages(1)[(page * 4 + 0) * 8]), 3.0f);
  EXPECT_NE(error_of([&] { c.reserve(b, 9); }).find("KV cache full"), std::string::npos);
  EXPECT_NE(error_of([&] { c.row(0, a, 8); }).find("beyond"), std::string::npos);
  c.remove_sequence(a);
  EXPECT_EQ(c.free_pages(), 3);
  c.reserve(b, 9);
  EXPECT_EQ(c.block_table(b).size(), 3u);
}

struct Golden {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [positions, V]
  int64_t vocab = 0;
};

Golden golden_prompt(int i) {
  const auto j = nlohmann::json::parse(read_text(kTiny + "/golden/golden.json"));
  Golden g;
  g.vocab = j.at("vocab_size").get<int64_t>();
  const auto& p = j.at("prompts").at(size_t(i));
  g.ids = p.at("ids").get<std::vector<int32_t>>();
  const int64_t n = p.at("num_positions").get<int64_t>();
  g.logits.resize(size_t(n * g.vocab));
  std::ifstream in(kTiny + "/golden/" + p.at("logits_file").get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(g.logits.data()),
          std::streamsize(g.logits.size() * sizeof(float)));
  return g;
}

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Prefill of golden prompt 2 at EP 1, one shot and in chunks of 5 tokens through the paged cache.
// Local ranks loading one mapped checkpoint share the decode layout of each replicated fp8 weight
// (one copy in the process, not one per rank); each rank's experts have their own, and so does a
// second mapping of the same file (other addresses), whose layout holds the same bytes.
TEST(Weights, RanksOfOneMappingShareReplicatedDecodeLayouts) {
  const auto cfg = load_config(kTiny);
  auto ck = std::make_shared<const Checkpoint>(kTiny);
  LoadOptions r0;
  r0.decode_layout = true;
  r0.ep_size = 2;
  LoadOptions r1 = r0;
  r1.ep_rank = 1;
  auto w0 = load_weights(ck, cfg, r0), w1 = load_weights(ck, cfg, r1);
  const Linear& o0 = w0->layers[0].o;
  if (!o0.w_decode) GTEST_SKIP() << "no decode layout on this CPU";
  EXPECT_EQ(o0.w_decode, w1->layers[0].o.w_decode);
  const LayerWeights& moe0 = w0->layers.back();
  const LayerWeights& moe1 = w1->layers.back();
  ASSERT_FALSE(moe0.experts.empty());
  EXPECT_EQ(moe0.shared.gate.w_decode, moe1.shared.gate.w_decode);
  EXPECT_NE(moe0.experts[0].gate.w_decode, moe1.experts[0].gate.w_decode);
  auto other = load_weights(std::make_shared<const Checkpoint>(kTiny), cfg, r0);
  const Linear& o2 = other->layers[0].o;
  ASSERT_NE(o2.w_decode, nullptr);
  EXPECT_NE(o2.w_decode, o0.w_decode);
  EXPECT_EQ(std::memcmp(o2.w_decode, o0.w_decode, kernels::decode_layout_bytes(o0.out, o0.in)), 0);
}

// With a decode layout nothing a decode step reads lies in the checkpoint mapping: the scales are
// copied out (same values) as the codes are released, since a read there maps the page cache's
// whole folio around it, released codes included (peak RSS 1.5x the weights when it held 2 MiB
// folios). Without a decode layout the scales stay where they are.
TEST(Weights, DecodeLayoutScalesLeaveTheMapping) {
  const auto cfg = load_config(kTiny);
  auto ck = std::make_shared<const Checkpoint>(kTiny);
  LoadOptions opts;
  opts.decode_layout = true;
  auto w = load_weights(ck, cfg, opts);
  if (!w->layers[0].o.w_decode) GTEST_SKIP() << "no decode layout on this CPU";
  int checked = 0;
  auto check = [&](const Linear& l) {
    if (!l.fp8()) return;
    ASSERT_NE(l.w_decode, nullptr) << l.name;
    const TensorView& s = ck->get(l.name + ".weight_scale_inv");
    EXPECT_NE(static_cast<const void*>(l.w_scale), static_cast<const void*>(s.data)) << l.name;
    EXPECT_EQ(std::memcmp(l.w_scale, s.data, s.nbytes), 0) << l.name;
    ++checked;
  };
  for (const LayerWeights& L : w->layers) {
    check(L.o);
    check(L.kv_a);
    if (L.moe) {
      check(L.shared.down);
      for (const Mlp& e : L.experts) check(e.up);
    } else {
      check(L.dense.gate);
    }
  }
  EXPECT_GT(checked, 0);
  LoadOptions plain;  // no decode layout: the kernels read codes and scales in place
  auto p = load_weights(ck, cfg, plain);
  const Linear& o = p->layers[0].o;
  if (o.fp8()) {
    EXPECT_EQ(static_cast<const void*>(o.w_scale),
              static_cast<const void*>(ck->get(o.name + ".weight_scale_inv").data));
  }
}

// With several ranks each rank's vocabulary slice of the BF16 LM head is copied out of the mapping
// (rank_columns: whole 128-column blocks, together the whole head once) and w_bf16 stays the
// mapped head; one rank copies the whole head and reads w_bf16 from the copy.
TEST(Weights, EachRankCopiesItsHeadSlice) {
  const auto cfg = load_config(kTiny);
  auto ck = std::make_shared<const Checkpoint>(kTiny);
  const TensorView& head = ck->get("lm_head.weight");
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  for (int W : {2, 4}) {
    int64_t covered = 0;
    for (int r = 0; r < W; ++r) {
      LoadOptions opts;
      opts.ep_size = W;
      opts.ep_rank = r;
      if (cfg.n_routed_experts % W != 0) continue;
      auto w = load_weights(ck, cfg, opts);
      const Linear& l = w->lm_head;
      EXPECT_EQ(static_cast<const void*>(l.w_bf16), static_cast<const void*>(head.data));
      ASSERT_NE(l.w_slice, nullptr) << "rank " << r << " of " << W;
      EXPECT_EQ(l.slice, rank_columns(V, r, W));
      EXPECT_EQ(l.slice.first, covered) << "slices in rank order, no gap";
      EXPECT_EQ(l.slice.first % 128, 0);
      const int64_t cols = l.slice.second - l.slice.first;
      EXPECT_EQ(std::memcmp(l.w_slice, head.data + size_t(l.slice.first * H) * sizeof(bf16),
                            size_t(cols * H) * sizeof(bf16)),
                0)
          << "rank " << r << " of " << W;
      covered = l.slice.second;
    }
    EXPECT_EQ(covered, V) << W << " ranks";
  }
  auto one = load_weights(ck, cfg, {});  // one rank: the whole head copied, no slice
  EXPECT_EQ(one->lm_head.w_slice, nullptr);
  EXPECT_NE(static_cast<const void*>(one->lm_head.w_bf16), static_cast<const void*>(head.data));
}

TEST(Forward, PrefillMatchesGoldenAndChunkedPrefillMatchesOneShot) {
  const Golden g = golden_prompt(2);
  const int64_t T = int64_t(g.ids.size()), V = g.vocab;
  std::vector<float> one, chunked;
  LaunchOptions lo;
  run_ranks(lo, [&](Group& group) {
    const auto cfg = load_config(kTiny);
    auto w = load_weights(std::make_shared<const Checkpoint>(kTiny), cfg, {});
    DeepseekModel m(w, group, {});
    {
      PagedKvCache cache(m.kv_cache_config(4));
      const int64_t s = cache.add_sequence();
      auto out = m.forward({{s, g.ids.data(), T, 0, true}}, cache);
      ASSERT_EQ(out.logits.dim(0), T);
      one.assign(out.logits.data<float>(), out.logits.data<float>() + T * V);
    }
    // Chunks of 5 rows run the decode GEMMs; this model also has the cpu decode layout (where the
    // CPU has one), as the runtime loads it.
    LoadOptions with_layout;
    with_layout.decode_layout = true;
    auto wl = load_weights(std::make_shared<const Checkpoint>(kTiny), cfg, with_layout);
    const Linear& o_proj = wl->layers[0].o;
    EXPECT_EQ(o_proj.w_decode != nullptr,
              o_proj.fp8() && kernels::decode_layout_bytes(o_proj.out, o_proj.in) > 0);
    DeepseekModel ml(wl, group, {});
    PagedKvCache cache(ml.kv_cache_config(4));
    const int64_t s = cache.add_sequence();
    for (int64_t p = 0; p < T; p += 5) {
      const int64_t n = std::min<int64_t>(5, T - p);
      auto out = ml.forward({{s, g.ids.data() + p, n, p, true}}, cache);
      chunked.insert(chunked.end(), out.logits.data<float>(), out.logits.data<float>() + n * V);
    }
  });
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_LT(rel_err(one.data() + t * V, g.logits.data() + t * V, V), 5e-3) << "position " << t;
    EXPECT_LT(rel_err(chunked.data() + t * V, one.data() + t * V, V), 5e-3) << "position " << t;
  }
}

// Closed forms of the placement rule: 2 ranks, 8 experts (0-3 on rank 0), top-2, cost per row
// kSharedRowCost = 0.25.
TEST(SharedExpert, OneRankTakesItWhereTheBusiestRankGainsNothingElse) {
  // One row a rank; rank 0's rows route to experts 0, 1 and 2, 3 (4 reads + 4 rows), rank 1's
  // to none of its own: rank 1 takes the shared expert (1 + 2 rows) and the busiest cost stays 5.
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{0, 1, 2, 3}, std::vector<int64_t>{1, 1}, 8, 2),
            1);
  // Balanced routing (each rank reads 2 experts for 2 rows): 3.75 with its own shared expert on
  // each, 4 if either took both rows: each runs its own.
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{0, 4, 1, 5}, std::vector<int64_t>{1, 1}, 8, 2),
            -1);
  // A rank with no rows of its own and no experts: it takes the others' rows.
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{0, 1}, std::vector<int64_t>{1, 0}, 8, 2), 1);
  // Masked slots read nothing; ties go to the lowest rank and to one rank running it: both
  // ranks' routed cost is 1.25, and 2.75 either way.
  EXPECT_EQ(
      shared_expert_rank(std::vector<int32_t>{0, -1, 4, -1}, std::vector<int64_t>{2, 0}, 8, 2), 0);
  // Many rows: the rows' cost outweighs the one weight read saved.
  std::vector<int32_t> many;
  for (int i = 0; i < 64; ++i) many.insert(many.end(), {int32_t(i % 8), int32_t((i + 3) % 8)});
  EXPECT_EQ(shared_expert_rank(many, std::vector<int64_t>{32, 32}, 8, 2), -1);
  // 4 ranks (2 experts each), a row each, every expert used twice: ranks 0-2 cost 3, 1.5 and 1.5,
  // rank 3 nothing. Each with its own rows the busiest costs 4.25; rank 3 taking all four rows
  // costs 2, so the busiest costs 3.
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{0, 1, 2, 4, 0, 1, 2, 4},
                               std::vector<int64_t>{1, 1, 1, 1}, 8, 2),
            3);
  // One rank, or no rows at all: no choice to make.
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{0, 1}, std::vector<int64_t>{1}, 8, 2), -1);
  EXPECT_EQ(shared_expert_rank(std::vector<int32_t>{}, std::vector<int64_t>{0, 0}, 8, 2), -1);
  EXPECT_NE(error_of([] {
              shared_expert_rank(std::vector<int32_t>{0, 9}, std::vector<int64_t>{1, 0}, 8, 2);
            }).find("expert 9 of 8"),
            std::string::npos);
}

// At EP 2 (threads), two sequences decoding: the logits are the same bytes whether the ranks share
// the replicated work of the decode steps (attention projections split by columns, the shared
// expert on one rank for both ranks' rows) or each rank does all of its own, and the split run did
// move the shared expert.
TEST(SplitReplicatedWork, SameBytesAsEachRankAloneAtEp2) {
  const auto cfg = load_config(kTiny);
  const int64_t V = cfg.vocab_size, steps = 4;
  std::vector<float> logits[2][2];  // [balanced][rank]
  int moved = 0, kept = 0;
  std::mutex mu;
  for (const bool balance : {false, true}) {
    LaunchOptions lo;
    lo.world = 2;
    run_ranks(lo, [&](Group& group) {
      LoadOptions o;
      o.ep_rank = group.rank();
      o.ep_size = 2;
      auto w = load_weights(std::make_shared<const Checkpoint>(kTiny), cfg, o);
      ModelOptions mo;
      mo.split_replicated = balance;
      DeepseekModel m(w, group, mo);
      PagedKvCache cache(m.kv_cache_config(4));
      const int64_t s = cache.add_sequence();
      std::vector<int32_t> ids = golden_prompt(group.rank()).ids;
      std::vector<float> mine;
      int64_t pos = 0;
      for (int64_t step = 0; step <= steps; ++step) {
        const int64_t n = step == 0 ? int64_t(ids.size()) : 1;
        auto out = m.forward({{s, ids.data() + pos, n, pos, false}}, cache, /*trace=*/true);
        const float* l = out.logits.data<float>();
        mine.insert(mine.end(), l, l + V);
        pos += n;
        ids.push_back(int32_t(std::max_element(l, l + V) - l));
        std::lock_guard lk(mu);
        for (int r : out.routing.shared_rank) {
          if (balance) {
            ++(r >= 0 ? moved : kept);
          } else {
            EXPECT_EQ(r, -1);
          }
        }
      }
      std::lock_guard lk(mu);
      logits[balance][group.rank()] = std::move(mine);
    });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(logits[0][r].size(), size_t((steps + 1) * V));
    EXPECT_EQ(std::memcmp(logits[0][r].data(), logits[1][r].data(), logits[0][r].size() * 4), 0)
        << "rank " << r;
  }
  EXPECT_GT(moved, 0) << "no layer ran the shared expert on one rank (" << kept << " kept it)";
}

}  // namespace
}  // namespace deepinfer::model
