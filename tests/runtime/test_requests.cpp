// Request checks (shared by the engine and the CLI), the prompts-file format, and the engine's
// agreement on a bad request: every rank ends with the same error, none is left waiting.
#include <deepinfer/comm.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace deepinfer::runtime
