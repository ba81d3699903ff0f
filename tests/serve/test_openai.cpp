// OpenAI request bodies: the fields land where they should, OpenAI's defaults apply, and every
// bad value is a 400 naming its field.
#include <gtest/gtest.h>

#include "serve/openai.h"

namespace deepinfer::serve {
namespace {

std::string param_of(const std::string& body, bool chat = false) {
  try {
    parse_completion(body, chat);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    return e.param.empty() ? "<none>" : e.param;
  }
  return "<accepted>";
}

TEST(OpenAi, ParsesACompletion) {
  const auto p = parse_completion(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":3,
          "seed":9,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true}})",
      false);
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(*p.prompt, "hi");
  EXPECT_EQ(*p.max_tokens, 5);
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 3);
  EXPECT_EQ(p.sampling.seed, 9u);
  EXPECT_TRUE(p.seed_given);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
}

TEST(OpenAi, DefaultsFollowOpenAi) {
  const auto p = parse_completion(R"({"prompt":[1,2,3]})", false);
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(p.prompt);
  EXPECT_FALSE(p.max_tokens);
  EXPECT_EQ(p.sampling.temperature, 1.0f);
  EXPECT_EQ(p.sampling.top_p, 1.0f);
  EXPECT_FALSE(p.seed_given);
  EXPECT_FALSE(p.stream);
}

TEST(OpenAi, ParsesChatMessages) {
  const auto p = parse_completion(
      R"({"messages":[{"role":"system","content":"be brief"},
                      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                      {"role":"assistant","content":"ok"}],"max_completion_tokens":3})",
      true);
  ASSERT_EQ(p.messages.size(), 3u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_EQ(p.messages[1].content, "ab");
  EXPECT_EQ(p.messages[2].role, "assistant");
  EXPECT_EQ(*p.max_tokens, 3);
}

TEST(OpenAi, EveryBadValueIsA400NamingItsField) {
  EXPECT_EQ(param_of("{"), "<none>");
  EXPECT_EQ(param_of("[]"), "<none>");
  EXPECT_EQ(param_of(R"({})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":5})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":[1,-2]})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":["a","b"]})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":"x","max_tokens":0})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt":"x","max_tokens":"5"})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt":"x","max_tokens":1.5})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt":"x","temperature":-1})"), "temperature");
  EXPECT_EQ(param_of(R"({"prompt":"x","top_p":0})"), "top_p");
  EXPECT_EQ(param_of(R"({"prompt":"x","top_p":1.5})"), "top_p");
  EXPECT_EQ(param_of(R"({"prompt":"x","top_k":-2})"), "top_k");
  EXPECT_EQ(param_of(R"({"prompt":"x","n":2})"), "n");
  EXPECT_EQ(param_of(R"({"prompt":"x","stop":["a","b","c","d","e"]})"), "stop");
  EXPECT_EQ(param_of(R"({"prompt":"x","stop":[""]})"), "stop");
  EXPECT_EQ(param_of(R"({"prompt":"x","stream":"yes"})"), "stream");
  EXPECT_EQ(param_of(R"({"prompt":"x","stream_options":{"include_usage":true}})"),
            "stream_options");
  EXPECT_EQ(param_of(R"({"prompt":"x","model":3})"), "model");
  EXPECT_EQ(param_of("{\"prompt\":\"\xff\xfe\"}"), "<none>");  // invalid UTF-8
  EXPECT_EQ(param_of(R"({"messages":[]})", true), "messages");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"tool","content":"x"}]})", true), "messages[0].role");
  EXPECT_EQ(param_of(R"({"messages":[{"content":"x"}]})", true), "messages[0]");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true),
            "messages[0].content");
}

TEST(OpenAi, ErrorBodyHasTheOpenAiShape) {
  const ApiError e(404, "no such model", "not_found_error", "model", "model_not_found");
  const auto b = e.body();
  EXPECT_EQ(b["error"]["message"], "no such model");
  EXPECT_EQ(b["error"]["type"], "not_found_error");
  EXPECT_EQ(b["error"]["param"], "model");
  EXPECT_EQ(b["error"]["code"], "model_not_found");
  EXPECT_TRUE(ApiError(400, "x").body()["error"]["param"].is_null());
}

// Bodies fuzz/openai_request.cpp found: each a 400 whose error body serializes (the server
// dumps it), for both endpoints.
TEST(OpenAi, MalformedBodiesAreA400WithASerializableBody) {
  const std::string bodies[] = {
      // Invalid UTF-8 after a key: the parse error quotes the bytes read, and dump() threw.
      std::string(
          R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "stop": ["\n", "."], )"
          R"("seed": 7, "top_p": 0.9, "top)") +
          "\xab\x94\xdd\xc5\xdf\xcb\xcf\x82",
      // A number past double's range: the parser throws out_of_range, not parse_error (a 500).
      R"({"prompt": "x", "max_tokens": 1e999})",
  };
  for (const std::string& body : bodies) {
    for (const bool chat : {true, false}) {
      try {
        parse_completion(body, chat);
        ADD_FAILURE() << "accepted: " << body;
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        const std::string dumped = e.body().dump();
        EXPECT_NE(dumped.find("not valid JSON"), std::string::npos) << dumped;
      }
    }
  }
  // Bytes that are not UTF-8 in a message become U+FFFD in the body.
  const auto b = ApiError(400, "bad \xff byte", "invalid_request_error", "p\xc3").body();
  EXPECT_EQ(b["error"]["message"], "bad \xef\xbf\xbd byte");
  EXPECT_EQ(b["error"]["param"], "p\xef\xbf\xbd");
}

}  // namespace
}  // namespace deepinfer::serve
