// The OpenAI API's request bodies and errors (docs/serve.md): /v1/completions and
// /v1/chat/completions fields parsed and checked into one CompletionParams, every mistake an
// ApiError that names the field (HTTP 400 with {"error": {message, type, param, code}}).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::serve {

struct ApiError : std::runtime_error {
  int status;
  std::string type;   // "invalid_request_error", "authentication_error", ...
  std::string param;  // the request field at fault ("" if none)
  std::string code;   // machine-readable ("" if none)
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : std::runtime_error(std::move(message)),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  nlohmann::json body() const;  // {"error": {...}}
};

struct CompletionParams {
  bool chat = false;
  std::string model;                  // "" when the request names none
  std::optional<std::string> prompt;  // completions: text
  std::vector<int32_t> prompt_ids;    // completions: token ids given directly
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens
  runtime::SamplingConfig sampling;   // temperature defaults to 1 (OpenAI's default)
  bool seed_given = false;
  std::vector<std::string> stop;  // up to 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (as vLLM): generate past the EOS token
};

// Parses and checks a request body; `chat` picks the endpoint's fields. Throws ApiError (400).
CompletionParams parse_completion(const std::string& body, bool chat);

}  // namespace deepinfer::serve
