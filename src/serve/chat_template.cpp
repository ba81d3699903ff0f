#include "serve/chat_template.h"

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace deepinfer::serve {

using json = nlohmann::json;

ChatTemplate ChatTemplate::parse(std::string_view source) {
  ChatTemplate t;
  t.program_ = jinja::parse(source);
  return t;
}

std::string ChatTemplate::render(const json& context) const {
  return jinja::render(*program_, context, json()).text;
}

jinja::Rendered ChatTemplate::render_marked(const json& context, const json& untrusted) const {
  return jinja::render(*program_, context, untrusted);
}

json template_variables(const Tokenizer& tok) {
  json v = json::object();
  if (!tok.bos_token().empty()) v["bos_token"] = tok.bos_token();
  if (!tok.eos_token().empty()) v["eos_token"] = tok.eos_token();
  return v;
}

namespace {

json messages_json(std::span<const ChatMessage> messages) {
  json m = json::array();
  for (const ChatMessage& msg : messages)
    m.push_back({{"role", msg.role}, {"content", msg.content}});
  return m;
}

jinja::Rendered render_chat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                            bool add_generation_prompt, const json& extra) {
  if (!extra.is_null() && !extra.is_object())
    DI_FAIL("chat template: the extra variables must be a JSON object");
  json ctx = extra.is_null() ? json::object() : extra;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return tmpl.render_marked(ctx, json{{"messages", messages_json(messages)}});
}

}  // namespace

std::vector<TokenId> encode_chat_with_template(const Tokenizer& tok, const ChatTemplate& tmpl,
                                               std::span<const ChatMessage> messages,
                                               bool add_generation_prompt, const json& extra) {
  const jinja::Rendered r = render_chat(tmpl, messages, add_generation_prompt, extra);
  EncodeOptions opt;
  opt.add_special_tokens = false;  // the template writes BOS itself
  opt.untrusted = r.untrusted;
  return tok.encode(r.text, opt);
}

ChatFormat::ChatFormat(const Tokenizer& tok) : tok_(&tok), vars_(template_variables(tok)) {
  if (!tok.chat_template().empty()) {
    try {
      tmpl_ = ChatTemplate::parse(tok.chat_template());
    } catch (const Error& e) {
      DI_FAIL("tokenizer_config.json: the chat_template cannot be used: {}", e.what());
    }
  }
}

std::vector<TokenId> ChatFormat::encode(std::span<const ChatMessage> messages,
                                        bool add_generation_prompt) const {
  if (!tmpl_) return tok_->encode_chat(messages, add_generation_prompt);
  return encode_chat_with_template(*tok_, *tmpl_, messages, add_generation_prompt, vars_);
}

std::string ChatFormat::render(std::span<const ChatMessage> messages,
                               bool add_generation_prompt) const {
  if (!tmpl_) return tok_->format_chat(messages, add_generation_prompt);
  return render_chat(*tmpl_, messages, add_generation_prompt, vars_).text;
}

}  // namespace deepinfer::serve
