#include "serve/openai.h"

#include <fmt/format.h>

#include <cmath>

#include "tokenizer/utf8.h"

namespace deepinfer::serve {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

const char* type_name(const json& v) { return v.type_name(); }

double number(const json& v, const char* name) {
  if (!v.is_number()) bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(name, fmt::format("'{}' must be finite", name));
  return d;
}

int64_t integer(const json& v, const char* name) {
  if (!v.is_number_integer())
    bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    bad(name, fmt::format("'{}' is too large", name));
  return v.get<int64_t>();
}

bool boolean(const json& v, const char* name) {
  if (!v.is_boolean())
    bad(name, fmt::format("'{}' must be true or false, got {}", name, type_name(v)));
  return v.get<bool>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& c, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return {};
  if (!c.is_array()) bad(param, param + " must be a string or an array of text parts");
  std::string out;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, param + ": only {\"type\": \"text\", \"text\": STRING} parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

nlohmann::json ApiError::body() const {
  // A message may quote the request's bytes (a JSON parse error shows the last ones read), which
  // need not be UTF-8: invalid sequences become U+FFFD, or dump() would throw.
  return {{"error",
           {{"message", utf8::sanitize(what())},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(utf8::sanitize(param))},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

CompletionParams parse_completion(const std::string& body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    bad("", fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad("", "the body must be a JSON object");
  CompletionParams p;
  p.chat = chat;
  p.sampling.temperature = 1.0f;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) bad("model", "'model' must be a string");
    p.model = j["model"].get<std::string>();
  }
  if (chat) {
    if (!j.contains("messages")) bad("messages", "'messages' is required");
    const json& m = j["messages"];
    if (!m.is_array() || m.empty()) bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < m.size(); ++i) {
      const json& msg = m[i];
      const std::string param = fmt::format("messages[{}]", i);
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
        bad(param, param + " must be an object with a string 'role'");
      std::string role = msg["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        bad(param + ".role",
            fmt::format("{}.role '{}' is not supported: use system, user or assistant", param,
                        role));
      p.messages.push_back({role, content_text(msg.value("content", json(nullptr)), i)});
    }
  } else {
    if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
    const json& pr = j["prompt"];
    if (pr.is_string()) {
      p.prompt = pr.get<std::string>();
    } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
      p.prompt = pr[0].get<std::string>();
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      for (const auto& t : pr) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          bad("prompt", "a token-id prompt must be an array of non-negative integers");
        p.prompt_ids.push_back(int32_t(t.get<int64_t>()));
      }
    } else if (pr.is_array() && pr.size() > 1) {
      bad("prompt", "one prompt per request: batches of prompts are not supported");
    } else {
      bad("prompt", "'prompt' must be a string or an array of token ids");
    }
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!j.contains(name) || j[name].is_null()) continue;
    const int64_t v = integer(j[name], name);
    if (v <= 0) bad(name, fmt::format("'{}' must be >= 1, got {}", name, v));
    p.max_tokens = v;
  }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    const double t = number(j["temperature"], "temperature");
    if (t < 0) bad("temperature", fmt::format("'temperature' must be >= 0, got {}", t));
    p.sampling.temperature = float(t);
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    const double t = number(j["top_p"], "top_p");
    if (!(t > 0 && t <= 1)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", t));
    p.sampling.top_p = float(t);
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const int64_t k = integer(j["top_k"], "top_k");
    // -1 is vLLM's "no filter"; 0 is ours.
    if (k < -1 || k > INT32_MAX) bad("top_k", fmt::format("'top_k' must be >= 0, got {}", k));
    p.sampling.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    p.sampling.seed = uint64_t(integer(j["seed"], "seed"));
    p.seed_given = true;
  }
  if (j.contains("n") && !j["n"].is_null() && integer(j["n"], "n") != 1)
    bad("n", "only n = 1 is supported");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of up to 4 strings");
    }
    for (const auto& x : p.stop)
      if (x.empty()) bad("stop", "a stop string must not be empty");
  }
  if (j.contains("stream") && !j["stream"].is_null()) p.stream = boolean(j["stream"], "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!p.stream) bad("stream_options", "'stream_options' is only allowed with stream: true");
    if (so.contains("include_usage"))
      p.include_usage = boolean(so["include_usage"], "stream_options.include_usage");
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null())
    p.ignore_eos = boolean(j["ignore_eos"], "ignore_eos");
  return p;
}

}  // namespace deepinfer::serve
