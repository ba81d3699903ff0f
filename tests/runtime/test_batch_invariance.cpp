// Batch invariance end to end (docs/numerics.md §10) on models/tiny with the batch-invariant GEMMs
// (DEEPINFER_BATCH_INVARIANT=on): a greedy request's tokens, and the bytes of every logit of its
// prompt and generated positions, are the same alone, beside 15 other prompts of other lengths,
// with its prompt chunked differently (max_tokens_per_step 7, 32, 256), and at EP 2.
#include <deepinfer/comm.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_args.h"
#include "runtime/engine.h"
#include "runtime/launch.h"

namespace deepinfer::runtime {
namespace {

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";
constexpr int64_t kNew = 12;  // generated tokens per request
constexpr int64_t kVocab = 2048;

struct InvariantGemm {
  InvariantGemm() { kernels::cpu::set_decode_gemm(kernels::cpu::DecodeGemm::invariant); }
  ~InvariantGemm() { kernels::cpu::set_decode_gemm(kernels::cpu::DecodeGemm::automatic); }
};

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Prompt i: BOS then seeded random ids (not BOS/EOS), 5 + 7·i % 53 tokens; prompt 0 is the one
// under test (45 tokens: several chunks at 7 and 32 tokens per step).
std::vector<int32_t> prompt(int64_t i) {
  const int64_t n = i == 0 ? 45 : 5 + (7 * i) % 53;
  std::vector<int32_t> p{0};
  for (int64_t t = 1; t < n; ++t)
    p.push_back(int32_t(2 + mix(uint64_t(i) * 1000003 + uint64_t(t)) % uint64_t(kVocab - 2)));
  return p;
}

// Generates prompts `ids` (ids[r] on rank r % ep) and returns prompt 0's result.
RequestResult run(const std::vector<int64_t>& ids, int64_t tokens_per_step, int ep) {
  LaunchModelOptions lo;
  lo.model_dir = kTiny;
  lo.ep = ep;
  RequestResult out;
  bool found = false;
  run_model_ranks(lo, [&](RankContext& ctx) {
    EngineOptions eo;
    eo.max_tokens_per_step = tokens_per_step;
    Engine engine(ctx.weights, ctx.group, eo);
    std::vector<Request> reqs;
    for (size_t r = 0; r < ids.size(); ++r) {
      if (int(r % size_t(ctx.group.size())) != ctx.group.rank()) continue;
      Request q;
      q.id = ids[r];
      q.prompt = prompt(ids[r]);
      q.max_new_tokens = kNew;
      q.record = true;
      reqs.push_back(std::move(q));
    }
    for (auto& res : engine.generate(reqs))
      if (res.id == 0) {
        out = std::move(res);  // one rank owns prompt 0
        found = true;
      }
  });
  EXPECT_TRUE(found);
  return out;
}

void expect_same(const RequestResult& got, const RequestResult& want, const std::string& how) {
  EXPECT_EQ(got.tokens, want.tokens) << how;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << how;
  int64_t first_diff = -1;
  for (size_t i = 0; i < got.logits.size() && first_diff < 0; ++i)
    if (std::memcmp(&got.logits[i], &want.logits[i], sizeof(float)) != 0)
      first_diff = int64_t(i) / kVocab;
  EXPECT_EQ(first_diff, -1) << how << ": logits differ from position " << first_diff;
}

TEST(BatchInvariance, GreedyTokensAndLogitsDoNotDependOnTheBatch) {
  const InvariantGemm mode;
  const RequestResult alone = run({0}, 256, 1);
  ASSERT_EQ(int64_t(alone.tokens.size()), kNew);
  ASSERT_EQ(alone.num_positions, int64_t(prompt(0).size()) + kNew - 1);
  // 16 prompts: prompt 0 in the middle, the others 5..57 tokens long.
  std::vector<int64_t> batch;
  for (int64_t i = 1; i < 16; ++i) batch.push_back(i);
  batch.insert(batch.begin() + 7, 0);
  for (int64_t step : {int64_t(7), int64_t(32), int64_t(256)}) {
    expect_same(run({0}, step, 1), alone, "alone, " + std::to_string(step) + " tokens per step");
    expect_same(run(batch, step, 1), alone,
                "with 15 others, " + std::to_string(step) + " tokens per step");
  }
  expect_same(run(batch, 32, 2), alone, "with 15 others at EP 2, 32 tokens per step");
}

}  // namespace
}  // namespace deepinfer::runtime
