// The OpenAI-compatible HTTP front (docs/serve.md), on cpp-httplib: POST /v1/completions,
// POST /v1/chat/completions (JSON or SSE streaming), GET /v1/models, GET /health, GET /metrics.
// It lives in rank 0's process; requests become Jobs for the Scheduler, and the HTTP thread
// turns the job's tokens into text (complete UTF-8, stop strings cut) as they arrive.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Server::port)
  std::string served_model_name;
  std::string api_key;                      // non-empty: /v1/* needs "Authorization: Bearer KEY"
  size_t max_body_bytes = size_t(4) << 20;  // larger bodies get 413
  int64_t default_max_tokens = 256;  // when a request gives no max_tokens (capped by context)
  int http_threads = 64;             // connections served at once
};

// What the server needs to know of the model.
struct ServedModel {
  const Tokenizer* tokenizer = nullptr;
  int64_t vocab_size = 0;
  int64_t context = 0;            // max_position_embeddings
  std::vector<int32_t> stop_ids;  // end-of-sequence ids (dropped with ignore_eos)
  // Chat prompt ids (the model's chat template or the DeepSeek-V3 format), add_generation_prompt.
  std::function<std::vector<int32_t>(const std::vector<ChatMessage>&)> encode_chat;
};

class Server {
 public:
  Server(const ServerOptions& opts, ServedModel model);
  ~Server();
  // Binds and serves on a background thread; /health answers 503 until set_ready. Throws Error
  // when the address cannot be bound.
  void start();
  int port() const;
  // The model is loaded and `scheduler` runs: completions are accepted, /health is 200.
  void set_ready(Scheduler* scheduler);
  // The engine failed: /health is 503 again, new requests get 500.
  void set_failed(const std::string& why);
  void stop();  // stops listening and joins the server thread
  Metrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::serve
