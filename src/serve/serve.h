// One call that serves a model until it is drained: the HTTP front in rank 0's process, an
// Engine per rank, rank 0's Scheduler and every rank's step loop (docs/serve.md). `deepinfer
// serve` and `deepinfer bench serve` both run it.
#pragma once

#include <functional>
#include <string>

#include "runtime/launch.h"
#include "serve/scheduler.h"
#include "serve/server.h"

namespace deepinfer::serve {

struct ServeOptions {
  runtime::LaunchModelOptions launch;  // model, ranks, backend, GEMM mode
  ServerOptions http;                  // http.served_model_name: "" = the model folder's name
  int64_t max_batch = 32;              // sequences per rank
  int64_t max_queue = 256;
  int64_t kv_pages = 0;  // per rank; 0: max_batch sequences of min(context, 2048) tokens
  int64_t max_tokens_per_step = 256;
  int64_t draft_tokens = 0;  // EngineOptions::draft_tokens (needs launch.mtp)
  int64_t draft_vocab = 0;   // EngineOptions::draft_vocab
};

// The ServedModel of a checkpoint folder: its tokenizer (kept alive by the caller), context,
// end-of-sequence ids, and chat prompts from the model's chat template when tokenizer_config.json
// has one, else the DeepSeek-V3 format.
ServedModel served_model(const Tokenizer& tok, const model::ModelConfig& cfg);

// Serves until the scheduler is drained (then returns) or a rank fails (then every open request
// ends with an error and the failure is rethrown). `on_ready(port, scheduler)` runs on rank 0
// once requests are accepted; `on_stop()` runs on rank 0 just before it stops accepting.
void serve(const ServeOptions& opts, const std::function<void(int, Scheduler&)>& on_ready,
           const std::function<void()>& on_stop = {});

}  // namespace deepinfer::serve
