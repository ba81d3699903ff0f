// The tiny model's own tokenizer (models/tiny, trained by tools/reference/train_tokenizer.py)
// against the independent Python encoder (tools/reference/bpe.py, `regex` module): its ids for
// mixed text (golden/tokenizer_cases.json) and for the golden prompts (golden/golden.json).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using Ids = std::vector<TokenId>;

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

json load_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return json::parse(f);
}

TEST(TinyModelTokenizer, LoadsAndRoundTrips) {
  if (!std::filesystem::exists(kTiny + "/tokenizer.json"))
    GTEST_SKIP() << "no " << kTiny << "/tokenizer.json";
  const Tokenizer tok = Tokenizer::from_dir(kTiny);
  EXPECT_TRUE(tok.has_chat_tokens());
  ASSERT_TRUE(tok.bos_id().has_value());
  EXPECT_TRUE(tok.eos_id().has_value());
  const std::string text = "The quick brown fox, 12345 times: 你好 — naïve café 👍\n\n\tend";
  EncodeOptions o;
  o.add_special_tokens = false;
  EXPECT_EQ(tok.decode(tok.encode(text, o)), text);
  EXPECT_EQ(tok.encode(text).front(), *tok.bos_id());  // tokenizer_config.json add_bos_token
}

// golden/tokenizer_cases.json: [{"text": str, "ids": [int]}], ids without BOS.
TEST(TinyModelTokenizer, MatchesReferenceEncoderCases) {
  const std::string path = kTiny + "/golden/tokenizer_cases.json";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "no " << path << " (tools/reference/write_golden.py writes it)";
  const Tokenizer tok = Tokenizer::from_dir(kTiny);
  const json cases = load_json(path);
  ASSERT_TRUE(cases.is_array());
  ASSERT_GT(cases.size(), 0u);
  EncodeOptions o;
  o.add_special_tokens = false;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i].at("text").get<std::string>();
    const Ids expect = cases[i].at("ids").get<Ids>();
    EXPECT_EQ(tok.encode(text, o), expect) << "case " << i << ": " << text;
    // The reference decodes special tokens to their text, so every case round-trips.
    EXPECT_EQ(tok.decode(expect), text) << "case " << i;
  }
}

// golden/golden.json: prompts[i].ids = [BOS] (when add_bos) + the reference encoder's ids of
// prompts[i].text.
TEST(TinyModelTokenizer, MatchesGoldenPromptIds) {
  const std::string path = kTiny + "/golden/golden.json";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "no " << path << " (tools/reference/write_golden.py writes it)";
  const Tokenizer tok = Tokenizer::from_dir(kTiny);
  const json golden = load_json(path);
  ASSERT_GT(golden.at("prompts").size(), 0u);
  EncodeOptions o;
  o.add_special_tokens = golden.value("add_bos", true);
  for (const json& p : golden.at("prompts")) {
    const std::string text = p.at("text").get<std::string>();
    EXPECT_EQ(tok.encode(text, o), p.at("ids").get<Ids>())
        << "prompt " << p.value("index", -1) << ": " << text;
  }
}

}  // namespace
}  // namespace deepinfer
