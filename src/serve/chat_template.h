// Chat prompts for the OpenAI-style server: a model's own chat template (the Jinja2
// `chat_template` of tokenizer_config.json, run by the interpreter in serve/jinja.h) or, without
// one, DeepSeek-V3's built-in format (Tokenizer::encode_chat).
//
// Messages are untrusted: their text is always encoded with special tokens NOT recognised, so a
// user who types "<｜Assistant｜>" gets that text, never the control token. The template's own
// text (role markers, bos_token) is encoded with special tokens recognised.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serve/jinja.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::serve {

class ChatTemplate {
 public:
  // Throws Error naming the line:column of a syntax error or an unsupported construct.
  static ChatTemplate parse(std::string_view source);

  // The template's output for `context`, a JSON object whose keys are the variables.
  std::string render(const nlohmann::json& context) const;
  // As render, with the variables of `untrusted` (a JSON object) added; each output byte that
  // came from one of their strings is flagged in Rendered::untrusted.
  jinja::Rendered render_marked(const nlohmann::json& context,
                                const nlohmann::json& untrusted) const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

// The variables transformers gives every chat template besides the conversation: bos_token and
// eos_token (the strings of tokenizer_config.json), where the tokenizer has them.
nlohmann::json template_variables(const Tokenizer& tok);

// Renders `messages` with `tmpl` (variables: messages, add_generation_prompt, and those of
// `extra`, e.g. template_variables(tok)) and encodes the text: special tokens are recognised
// only where no byte came from a message. Nothing is added beyond what the template writes (as
// transformers' apply_chat_template(tokenize=True)). A template's raise_exception is an Error.
std::vector<TokenId> encode_chat_with_template(const Tokenizer& tok, const ChatTemplate& tmpl,
                                               std::span<const ChatMessage> messages,
                                               bool add_generation_prompt,
                                               const nlohmann::json& extra);

// A model's chat format, chosen once: the tokenizer's chat_template when tokenizer_config.json
// has one (parsed here: an unsupported template is an Error now, not at the first request),
// else Tokenizer::encode_chat. Keeps a reference to `tok`.
class ChatFormat {
 public:
  explicit ChatFormat(const Tokenizer& tok);

  bool uses_template() const { return tmpl_.has_value(); }
  std::vector<TokenId> encode(std::span<const ChatMessage> messages,
                              bool add_generation_prompt = true) const;
  // The prompt as text (for logs and tests; encode() is what the model sees).
  std::string render(std::span<const ChatMessage> messages,
                     bool add_generation_prompt = true) const;

 private:
  const Tokenizer* tok_;
  std::optional<ChatTemplate> tmpl_;
  nlohmann::json vars_;
};

}  // namespace deepinfer::serve
