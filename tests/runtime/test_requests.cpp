// Request checks (shared by the engine and the CLI), the prompts-file format, and the engine's
// agreement on a bad request: every rank ends with the same error, none is left waiting.
#include <deepinfer/comm.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/launch.h"
#include "runtime/requests.h"

namespace deepinfer::runtime {
namespace {

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

TEST(Requests, SamplingRangesInTheCallersWords) {
  EXPECT_EQ(sampling_problem({}), "");
  EXPECT_EQ(sampling_problem({0.7f, 40, 0.9f, 1}), "");
  EXPECT_EQ(sampling_problem({0.0f, 0, 1.0f, 0}), "");
  const SamplingNames cli{"--temperature", "--top-k", "--top-p"};
  EXPECT_EQ(sampling_problem({0.0f, 0, 0.0f, 0}, cli),
            "--top-p must be in (0, 1] (1 = keep every token), got 0");
  EXPECT_NE(sampling_problem({0.0f, 0, 1.5f, 0}, cli).find("--top-p must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(sampling_problem({-1.0f, 0, 1.0f, 0}, cli).find("--temperature must be a number >= 0"),
            std::string::npos);
  EXPECT_NE(sampling_problem({NAN, 0, 1.0f, 0}, cli).find("--temperature"), std::string::npos);
  EXPECT_EQ(sampling_problem({0.0f, -1, 1.0f, 0}, cli),
            "--top-k must be >= 0 (0 = keep every token), got -1");
  EXPECT_NE(sampling_problem({0.0f, 0, 0.0f, 0}).find("top_p must be"), std::string::npos);
}

TEST(Requests, PromptIdsLengthAndSampling) {
  Request r;
  r.prompt = {0, 5, 9};
  r.max_new_tokens = 4;
  EXPECT_EQ(request_problem(r, 10, 8), "");
  EXPECT_NE(request_problem(r, 10, 6).find("exceed the model's context of 6 positions"),
            std::string::npos);
  r.prompt = {0, 10};
  EXPECT_NE(request_problem(r, 10, 8).find("id 10, outside the model's vocabulary [0, 10)"),
            std::string::npos);
  r.prompt = {};
  EXPECT_NE(request_problem(r, 10, 8).find("no tokens"), std::string::npos);
  r.prompt = {1};
  r.max_new_tokens = 0;
  EXPECT_NE(request_problem(r, 10, 8).find("max_new_tokens must be >= 1"), std::string::npos);
  r.max_new_tokens = 1;
  r.sampling.top_k = -3;
  EXPECT_NE(request_problem(r, 10, 8).find("top_k must be >= 0"), std::string::npos);
}

TEST(Prompts, IndexIsTheLineCrlfStrippedEmptyLinesKeepTheirNumber) {
  std::istringstream in("first\r\n\nthird\r\n\r\nfifth");
  const auto p = read_prompts(in);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].index, 0);
  EXPECT_EQ(p[0].text, "first");
  EXPECT_EQ(p[1].index, 2);
  EXPECT_EQ(p[1].text, "third");
  EXPECT_EQ(p[2].index, 4);
  EXPECT_EQ(p[2].text, "fifth");
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InternalError& e) {
    return std::string("internal: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Prompts, FileDashIsStdinAndProblemsAreUserErrors) {
  std::istringstream in("a\nb\n");
  const auto p = read_prompts_file("-", in);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].text, "b");
  std::istringstream none;
  const std::string missing = error_of([&] { read_prompts_file("/no/such/prompts.txt", none); });
  EXPECT_EQ(missing.rfind("cannot read --prompts-file /no/such/prompts.txt: No such file", 0), 0u)
      << missing;
  const auto empty_path =
      std::filesystem::temp_directory_path() / ("deepinfer_empty_" + std::to_string(::getpid()));
  std::ofstream(empty_path.string()) << "\n\r\n";
  const std::string empty = error_of([&] { read_prompts_file(empty_path.string(), none); });
  EXPECT_NE(empty.find("holds no prompt"), std::string::npos) << empty;
  std::filesystem::remove(empty_path);
  std::istringstream blank("");
  EXPECT_NE(error_of([&] { read_prompts_file("-", blank); }).find("- (stdin) holds no prompt"),
            std::string::npos);
}

// Without agreement the bad rank throws alone while its peer enters the step's all_reduce.
TEST(Requests, AgreeOrThrowGivesEveryRankTheLowestBadRanksError) {
  for (int world : {1, 3}) {
    std::vector<std::string> errors(static_cast<size_t>(world));
    LaunchOptions lo;
    lo.world = world;
    lo.timeout_s = 10;
    run_ranks(lo, [&](Group& g) {
      agree_or_throw(g, "");  // all fine: returns
      const std::string mine = g.rank() >= 1 ? "bad on " + std::to_string(g.rank()) : "";
      try {
        agree_or_throw(g, world == 1 ? "bad alone" : mine);
      } catch (const Error& e) {
        errors[size_t(g.rank())] = e.what();
      }
    });
    for (const auto& e : errors) EXPECT_EQ(e, world == 1 ? "bad alone" : "rank 1: bad on 1");
  }
}

TEST(Engine, ABadRequestOnOneRankIsTheSameErrorOnEveryRank) {
  const auto j = nlohmann::json::parse(std::ifstream(kTiny + "/golden/golden.json"));
  const auto ids = j.at("prompts").at(0).at("ids").get<std::vector<int32_t>>();
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  lo.ep = 2;
  std::vector<std::string> errors(2);
  std::vector<bool> other(2, false);
  run_model_ranks(lo, [&](RankContext& ctx) {
    Engine engine(ctx.weights, ctx.group, {});
    Request r;
    r.id = ctx.group.rank();
    r.prompt = ids;
    r.max_new_tokens = 2;
    if (ctx.group.rank() == 1) r.sampling.top_p = 0;  // invalid on rank 1 only
    try {
      engine.generate({r});
    } catch (const CommTimeout&) {
      other[size_t(ctx.group.rank())] = true;
    } catch (const InternalError&) {
      other[size_t(ctx.group.rank())] = true;
    } catch (const Error& e) {
      errors[size_t(ctx.group.rank())] = e.what();
    }
    // The group is still usable: nobody is stuck in a step.
    int32_t one = 1;
    ctx.group.all_reduce(&one, 1, DType::i32, ReduceOp::sum);
    EXPECT_EQ(one, 2);
  });
  EXPECT_FALSE(other[0]);
  EXPECT_FALSE(other[1]);
  EXPECT_EQ(errors[0], "rank 1: request 1: top_p must be in (0, 1] (1 = keep every token), got 0");
  EXPECT_EQ(errors[1], errors[0]);
}

// Options of the Engine wrong on one rank: the same Error on every rank (agreed before the model's
// EPBuffers are built), never a rank left waiting, never an internal check.
TEST(Engine, BadOptionsOnOneRankAreTheSameErrorOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(EngineOptions&)> spoil;
    std::string want;
  };
  const std::vector<Case> cases{
      {"max_batch 0", [](EngineOptions& o) { o.max_batch = 0; },
       "rank 1: EngineOptions::max_batch must be >= 1, got 0"},
      {"kv_pages -1", [](EngineOptions& o) { o.kv_pages = -1; },
       "rank 1: EngineOptions::kv_pages must be >= 0 (0: sized per generate call), got -1"},
      {"max_tokens_per_step 0", [](EngineOptions& o) { o.max_tokens_per_step = 0; },
       "rank 1: EngineOptions::max_tokens_per_step must be >= 1, got 0"},
  };
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  lo.ep = 2;
  run_model_ranks(lo, [&](RankContext& ctx) {
    for (const Case& k : cases) {
      EngineOptions eo;
      if (ctx.group.rank() == 1) k.spoil(eo);
      std::string error;
      try {
        Engine engine(ctx.weights, ctx.group, eo);
      } catch (const CommTimeout& e) {
        error = std::string("timeout: ") + e.what();
      } catch (const Error& e) {
        error = e.what();
      }
      EXPECT_EQ(error, k.want) << k.name << " on rank " << ctx.group.rank();
    }
    // The group is still in step: nobody is stuck in a constructor's collective.
    int32_t one = 1;
    ctx.group.all_reduce(&one, 1, DType::i32, ReduceOp::sum);
    EXPECT_EQ(one, 2);
  });
}

// The step-level API's refusals are the caller's mistakes: Errors, not internal checks.
TEST(Engine, StartWithoutAPagePoolIsAnError) {
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  run_model_ranks(lo, [&](RankContext& ctx) {
    Engine engine(ctx.weights, ctx.group, {});  // kv_pages 0: generate() sizes its own pool
    Request r;
    r.prompt = {5, 6, 7};
    try {
      engine.start(r);
      ADD_FAILURE() << "start() without a page pool returned";
    } catch (const InternalError& e) {
      ADD_FAILURE() << "an internal check: " << e.what();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "Engine::start needs a KV page pool: set EngineOptions::kv_pages > 0");
    }
  });
}

// A checkpoint that lacks a tensor only rank 1 loads (one of its experts): every rank stops with
// that rank's error before any of them runs the model, at once (not at a collective's deadline).
TEST(Loader, ATensorMissingOnOneRankIsTheSameErrorOnEveryRank) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer_load_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kTiny + "/" + f, dir / f, fs::copy_options::overwrite_existing);
  const std::string missing = "model.layers.2.mlp.experts.12.down_proj.weight";  // rank 1's at EP 2
  {
    model::SafetensorsFile tiny(kTiny + "/model.safetensors");
    std::vector<model::TensorToWrite> keep;
    for (const auto& [name, t] : tiny.tensors())
      if (name != missing) keep.push_back({name, t.dtype, t.shape, t.data});
    model::write_safetensors((dir / "model.safetensors").string(), keep, tiny.metadata());
  }
  LaunchModelOptions lo;
  lo.model_dir = dir.string();
  lo.ep = 2;
  std::atomic<int> ran{0};
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  try {
    run_model_ranks(lo, [&](RankContext&) { ran += 1; });
  } catch (const CommTimeout& e) {
    error = std::string("timeout: ") + e.what();
  } catch (const Error& e) {
    error = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(error.rfind("rank 1: ", 0), 0u) << error;
  EXPECT_NE(error.find(missing), std::string::npos) << error;
  EXPECT_EQ(ran.load(), 0);
  EXPECT_LT(s, 30.0);
  // At EP 1 the one rank loads every expert: the same tensor, its own message.
  lo.ep = 1;
  EXPECT_THROW(run_model_ranks(lo, [&](RankContext&) { ran += 1; }), Error);
  EXPECT_EQ(ran.load(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::runtime
