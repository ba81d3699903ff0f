// Chat templates (serve/chat_template.h, serve/jinja.h). The first byte picks the mode:
//   even: the rest is a conversation as JSON (an object of variables, e.g. {"messages": [...],
//         "tools": [...]}, or a bare list of messages), rendered by one of the repository's real
//         templates (models/tiny's chat_template and tests/serve/data/templates/*.jinja, picked by
//         byte >> 1) with its variables untrusted. With role/content string messages, tiny's
//         ChatFormat also encodes them.
//   odd:  the rest is template text: parsed and, when it parses, rendered over the tests' fixed
//         conversation (tests/serve/data/contexts.json, "basic").
// An Error (syntax, unsupported construct, raise_exception, a type error) is a clean outcome.
// Oracles: one untrusted flag per output byte; the flags cover the messages' text (rendering
// again with the messages trusted gives the same text); the encoded ids decode to the text.
#include "serve/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::json;
using deepinfer::serve::ChatTemplate;

std::string read(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Fixture {
  deepinfer::Tokenizer tok;
  std::vector<ChatTemplate> templates;  // tiny's first
  deepinfer::serve::ChatFormat format;  // tiny's template, as serve uses it
  json vars;                            // bos_token, eos_token, tools, ... (trusted)
  json conversation;                    // contexts.json's "basic" messages

  Fixture()
      : tok(deepinfer::Tokenizer::from_dir(DEEPINFER_SOURCE_DIR "/models/tiny")), format(tok) {
    const std::string data = DEEPINFER_SOURCE_DIR "/tests/serve/data";
    templates.push_back(ChatTemplate::parse(tok.chat_template()));
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(data + "/templates"))
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());  // a fixed index per template, run to run
    for (const auto& f : files) templates.push_back(ChatTemplate::parse(read(f)));
    const json contexts = json::parse(read(data + "/contexts.json"));
    vars = contexts["common"];
    conversation = contexts["conversations"]["basic"]["messages"];
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

// The conversation's variables: an object as it is, a list as {"messages": list}.
json untrusted_of(const json& in) {
  if (in.is_object()) return in;
  return json{{"messages", in}};
}

void render_checked(const ChatTemplate& t, const json& vars, const json& untrusted) {
  const deepinfer::serve::jinja::Rendered r = t.render_marked(vars, untrusted);
  if (r.untrusted.size() != r.text.size()) __builtin_trap();
  // The same variables, all trusted: the same text, nothing flagged.
  json all = vars;
  bool clash = false;
  for (const auto& [k, v] : untrusted.items()) clash |= !all.emplace(k, v).second;
  if (clash) return;  // a key in both is an Error above, so not reached
  const deepinfer::serve::jinja::Rendered plain = t.render_marked(all, json::object());
  if (plain.text != r.text) __builtin_trap();
  if (std::count(plain.untrusted.begin(), plain.untrusted.end(), 1) != 0) __builtin_trap();
}

// Role/content string messages as ChatMessages; false for any other shape.
bool chat_messages(const json& in, std::vector<deepinfer::ChatMessage>& out) {
  if (!in.is_array()) return false;
  for (const json& m : in) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content")) return false;
    if (!m["role"].is_string() || !m["content"].is_string()) return false;
    out.push_back({m["role"], m["content"]});
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  if (size == 0) return 0;
  const Fixture& fx = fixture();
  const uint8_t mode = data[0];
  const std::string rest = fuzz::as_string(data + 1, size - 1);

  if (mode & 1) {  // arbitrary template text
    fuzz::expect_clean([&] {
      const ChatTemplate t = ChatTemplate::parse(rest);
      json vars = fx.vars;
      vars["add_generation_prompt"] = true;
      fuzz::expect_clean([&] { render_checked(t, vars, {{"messages", fx.conversation}}); });
    });
    return 0;
  }

  const json in = json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded()) return 0;
  const ChatTemplate& t = fx.templates[(mode >> 1) % fx.templates.size()];
  json vars = fx.vars;
  vars["add_generation_prompt"] = bool(mode & 0x80);
  json untrusted = untrusted_of(in);
  for (const auto& [k, v] : vars.items()) untrusted.erase(k);  // a clash is only an Error
  fuzz::expect_clean([&] { render_checked(t, vars, untrusted); });

  std::vector<ChatMessage> messages;
  if (chat_messages(in.is_object() && in.contains("messages") ? in["messages"] : in, messages)) {
    fuzz::expect_clean([&] {
      const std::vector<TokenId> ids = fx.format.encode(messages, mode & 0x80);
      for (const TokenId id : ids)
        if (id < 0 || size_t(id) >= fx.tok.vocab_size()) __builtin_trap();
      if (fx.tok.decode(ids) != fx.format.render(messages, mode & 0x80)) __builtin_trap();
    });
  }
  return 0;
}
