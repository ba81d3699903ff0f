#include "serve/serve.h"

#include <deepinfer/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "comm/platform.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/attention.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "serve/chat_template.h"

namespace deepinfer::serve {

ServedModel served_model(const Tokenizer& tok, const model::ModelConfig& cfg) {
  ServedModel m;
  m.tokenizer = &tok;
  m.vocab_size = cfg.vocab_size;
  m.context = cfg.max_position_embeddings;
  if (auto e = tok.eos_id())
    m.stop_ids.push_back(*e);
  else if (cfg.eos_token_id >= 0)
    m.stop_ids.push_back(int32_t(cfg.eos_token_id));
  // Parsed now: a template the interpreter does not support fails the start, not a request.
  auto format = std::make_shared<const ChatFormat>(tok);
  m.encode_chat = [format](const std::vector<ChatMessage>& msgs) { return format->encode(msgs); };
  return m;
}

void serve(const ServeOptions& opts, const std::function<void(int, Scheduler&)>& on_ready,
           const std::function<void()>& on_stop) {
  const model::ModelConfig cfg = model::load_config(opts.launch.model_dir);
  const Tokenizer tok = Tokenizer::from_dir(opts.launch.model_dir);
  const int64_t page = kernels::kMlaPageSize;
  const int64_t pages =
      opts.kv_pages > 0
          ? opts.kv_pages
          : opts.max_batch *
                ((std::min<int64_t>(cfg.max_position_embeddings, 2048) + page - 1) / page);
  ServerOptions http = opts.http;
  if (http.served_model_name.empty())
    http.served_model_name =
        std::filesystem::path(opts.launch.model_dir).lexically_normal().filename().string();
  if (http.served_model_name.empty())  // a folder given with a trailing slash
    http.served_model_name = std::filesystem::path(opts.launch.model_dir)
                                 .lexically_normal()
                                 .parent_path()
                                 .filename()
                                 .string();

  // The HTTP threads need a core of their own: kernel threads that share every core with them
  // wait at each parallel section's join for a worker the HTTP side has preempted, which costs
  // a scheduler time slice per kernel. Unless DEEPINFER_THREADS says otherwise, the kernels get
  // one core less (docs/serve.md).
  if (knobs().threads == 0) {
    Knobs k = knobs();
    k.threads = int(std::max(1u, std::thread::hardware_concurrency() - 1));
    set_knobs(k);
  }

  // Rank 0's process serves HTTP; it listens before the weights load (/health: 503).
  const auto here = launcher_placement();
  const bool hosts_http = opts.launch.comm == CommKind::local || !here || here->rank == 0;
  std::unique_ptr<Server> server;
  if (hosts_http) {
    server = std::make_unique<Server>(http, served_model(tok, cfg));
    server->start();
  }
  runtime::run_model_ranks(opts.launch, [&](runtime::RankContext& ctx) {
    runtime::EngineOptions eo;
    eo.model = model::ModelOptions::from_knobs();
    eo.max_tokens_per_step = opts.max_tokens_per_step;
    eo.max_batch = opts.max_batch;
    eo.kv_pages = pages;
    eo.draft_tokens = opts.draft_tokens;
    eo.draft_vocab = opts.draft_vocab;
    runtime::Engine engine(ctx.weights, ctx.group, eo);
    if (ctx.group.rank() != 0) {
      serve_rank(ctx.group, engine, nullptr);
      return;
    }
    DI_CHECK(server, "rank 0 runs in the process that serves HTTP");
    SchedulerOptions sc;
    sc.world = ctx.group.size();
    sc.pages_per_rank = pages;
    sc.max_batch = opts.max_batch;
    sc.max_queue = opts.max_queue;
    Scheduler scheduler(sc, &server->metrics());
    server->set_ready(&scheduler);
    if (on_ready) on_ready(server->port(), scheduler);
    try {
      serve_rank(ctx.group, engine, &scheduler);
    } catch (const std::exception& e) {
      if (on_stop) on_stop();
      scheduler.fail_all(e.what());
      server->set_failed(e.what());
      server->stop();  // the open requests answer with the error first
      throw;
    }
    if (on_stop) on_stop();
    server->stop();
  });
}

}  // namespace deepinfer::serve
