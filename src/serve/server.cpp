#include "serve/server.h"

#include <deepinfer/error.h>
#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "runtime/requests.h"
#include "serve/openai.h"
#include "serve/stop_strings.h"

namespace deepinfer::serve {

namespace {

using json = nlohmann::json;

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lk(mu);
  return fmt::format("{}-{:016x}", prefix, rng());
}

// Turns a job's tokens into text as they arrive: complete UTF-8 only, stop strings cut (the
// match and everything after it are never returned).
class JobText {
 public:
  JobText(const Tokenizer& tok, Job& job, Scheduler& sched, std::vector<std::string> stops)
      : job_(job), sched_(sched), dec_(tok), stops_(std::move(stops)) {}

  struct Update {
    std::string text;
    bool done = false;
  };
  // Waits up to `wait` for tokens or the end; returns the text that became final.
  Update poll(std::chrono::milliseconds wait) {
    std::vector<int32_t> fresh;
    bool finished;
    {
      std::unique_lock lk(job_.mu);
      job_.cv.wait_for(lk, wait, [&] { return job_.tokens.size() > consumed_ || job_.finished; });
      fresh.assign(job_.tokens.begin() + int64_t(consumed_), job_.tokens.end());
      finished = job_.finished;
      if (finished) {
        error_ = job_.error;
        engine_reason_ = job_.finish_reason;
      }
    }
    Update u;
    for (int32_t t : fresh) {
      ++consumed_;
      auto out = stops_.push(dec_.push(t));
      u.text += out.text;
      if (out.stopped) {
        finish_reason_ = "stop";
        sched_.cancel(job_);  // frees its pages at the next step
        u.done = true;
        return u;
      }
    }
    if (finished) {
      auto out = stops_.push(dec_.flush());
      u.text += out.text;
      if (!out.stopped) u.text += stops_.flush();
      finish_reason_ = out.stopped ? "stop" : engine_reason_;
      u.done = true;
    }
    return u;
  }
  const std::string& error() const { return error_; }
  const std::string& finish_reason() const { return finish_reason_; }
  int64_t completion_tokens() const { return int64_t(consumed_); }

 private:
  Job& job_;
  Scheduler& sched_;
  StreamDecoder dec_;
  StopMatcher stops_;
  size_t consumed_ = 0;
  std::string error_, engine_reason_, finish_reason_;
};

// Invalid UTF-8 a client sent can reach a message (the JSON parser quotes the bytes it read):
// replace it rather than throw from dump().
void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

struct Server::Impl {
  ServerOptions opts;
  ServedModel model;
  Metrics metrics;
  httplib::Server http;
  std::thread thread;
  std::atomic<Scheduler*> scheduler{nullptr};
  std::mutex state_mu;
  std::string failed;  // non-empty once the engine failed
  int bound_port = 0;
  const int64_t created = int64_t(std::time(nullptr));

  Impl(const ServerOptions& o, ServedModel m) : opts(o), model(std::move(m)) {}

  std::string failure() {
    std::lock_guard lk(state_mu);
    return failed;
  }

  void check_auth(const httplib::Request& req) const {
    if (opts.api_key.empty()) return;
    if (req.get_header_value("Authorization") != "Bearer " + opts.api_key)
      throw ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                     "authentication_error", "", "invalid_api_key");
  }

  Scheduler& ready_scheduler() {
    if (auto f = failure(); !f.empty())
      throw ApiError(500, "the engine failed: " + f, "server_error");
    Scheduler* s = scheduler.load();
    if (!s)
      throw ApiError(503, "the model is still loading; retry when GET /health is 200",
                     "service_unavailable");
    return *s;
  }

  // Prompt ids and the runtime request from the API fields; ApiError when they do not fit.
  runtime::Request make_request(const CompletionParams& p) const {
    runtime::Request r;
    if (p.chat) {
      try {
        r.prompt = model.encode_chat(p.messages);
      } catch (const Error& e) {  // e.g. the template's raise_exception on these messages
        throw ApiError(400, fmt::format("the chat template refused the messages: {}", e.what()),
                       "invalid_request_error", "messages");
      }
    } else if (p.prompt) {
      EncodeOptions eo;
      eo.invalid_utf8 = InvalidUtf8::error;
      try {
        r.prompt = model.tokenizer->encode(*p.prompt, eo);
      } catch (const Error& e) {
        throw ApiError(400, fmt::format("the prompt cannot be encoded: {}", e.what()),
                       "invalid_request_error", "prompt");
      }
    } else {
      r.prompt = p.prompt_ids;
    }
    const int64_t room = model.context - int64_t(r.prompt.size());
    r.max_new_tokens =
        p.max_tokens.value_or(std::max<int64_t>(1, std::min(opts.default_max_tokens, room)));
    r.sampling = p.sampling;
    if (!p.seed_given) r.sampling.seed = std::random_device{}();
    if (!p.ignore_eos) r.stop_ids = model.stop_ids;
    if (auto problem = runtime::request_problem(r, model.vocab_size, model.context);
        !problem.empty())
      throw ApiError(400, problem, "invalid_request_error",
                     p.max_tokens && room > 0 ? "max_tokens" : (p.chat ? "messages" : "prompt"));
    return r;
  }

  json usage(int64_t prompt, int64_t completion) const {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }

  json choice(bool chat, bool stream, const std::string& text, const json& finish) const {
    json c = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
    if (!chat)
      c["text"] = text;
    else if (stream)
      c["delta"] = text.empty() ? json::object() : json{{"content", text}};
    else
      c["message"] = {{"role", "assistant"}, {"content", text}};
    return c;
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    check_auth(req);
    Scheduler& sched = ready_scheduler();
    const CompletionParams p = parse_completion(req.body, chat);
    if (!p.model.empty() && p.model != opts.served_model_name)
      throw ApiError(404,
                     fmt::format("the model '{}' does not exist; this server serves '{}'", p.model,
                                 opts.served_model_name),
                     "not_found_error", "model", "model_not_found");
    auto job = std::make_shared<Job>();
    job->req = make_request(p);
    const int64_t prompt_tokens = int64_t(job->req.prompt.size());
    switch (sched.submit(job)) {
      case Admission::queued:
        break;
      case Admission::queue_full:
        res.set_header("Retry-After", "1");
        throw ApiError(429, "the server is busy: its request queue is full; retry later",
                       "rate_limit_error", "", "queue_full");
      case Admission::never_fits:
        throw ApiError(400,
                       fmt::format("the prompt ({} tokens) + max_tokens ({}) need more KV cache "
                                   "than one rank has; lower max_tokens or shorten the prompt",
                                   prompt_tokens, job->req.max_new_tokens),
                       "invalid_request_error", "max_tokens");
      case Admission::stopping:
        throw ApiError(503, "the server is shutting down", "service_unavailable");
    }
    metrics.on_prompt_tokens(prompt_tokens);
    const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
    const char* object =
        chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    auto text = std::make_shared<JobText>(*model.tokenizer, *job, sched, p.stop);
    auto envelope = [this, id, object] {
      return json{{"id", id},
                  {"object", object},
                  {"created", int64_t(std::time(nullptr))},
                  {"model", opts.served_model_name}};
    };
    if (!p.stream) {
      std::string out;
      for (;;) {
        auto u = text->poll(std::chrono::milliseconds(200));
        out += u.text;
        if (u.done) break;
      }
      if (!text->error().empty())
        throw ApiError(500, "generation failed: " + text->error(), "server_error");
      json body = envelope();
      body["choices"] = json::array({choice(chat, false, out, text->finish_reason())});
      body["usage"] = usage(prompt_tokens, text->completion_tokens());
      send_json(res, 200, body);
      return;
    }
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, text, envelope, chat, include_usage = p.include_usage, prompt_tokens, sched = &sched,
         this](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string s = "data: " + j.dump() + "\n\n";
            return sink.write(s.data(), s.size());
          };
          auto chunk = [&](const std::string& t, const json& finish) {
            json j = envelope();
            j["choices"] = json::array({choice(chat, true, t, finish)});
            if (include_usage) j["usage"] = nullptr;
            return send(j);
          };
          bool ok = true;
          if (chat) {
            json j = envelope();
            j["choices"] = json::array({{{"index", 0},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
            ok = send(j);
          }
          while (ok) {
            auto u = text->poll(std::chrono::milliseconds(200));
            if (!u.text.empty()) ok = chunk(u.text, nullptr);
            if (!ok || !u.done) continue;
            if (!text->error().empty()) {
              send(ApiError(500, "generation failed: " + text->error(), "server_error").body());
              sink.done();
              return true;
            }
            ok = chunk("", text->finish_reason());
            if (ok && include_usage) {
              json j = envelope();
              j["choices"] = json::array();
              j["usage"] = usage(prompt_tokens, text->completion_tokens());
              ok = send(j);
            }
            if (ok) {
              const std::string done = "data: [DONE]\n\n";
              ok = sink.write(done.data(), done.size());
            }
            if (ok) sink.done();
            return ok;
          }
          sched->cancel(*job);  // the client left: free its pages at the next step
          return false;
        },
        [job, sched = &sched](bool) { sched->cancel(*job); });
  }

  template <class F>
  void guarded(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_json(res, e.status, e.body());
    } catch (const std::exception& e) {
      send_json(res, 500, ApiError(500, e.what(), "server_error").body());
    }
  }

  void routes() {
    http.set_payload_max_length(opts.max_body_bytes);
    http.set_tcp_nodelay(true);  // one small SSE chunk per token: no Nagle delay
    // httplib's 5 s defaults drop a connection whose request a busy client sends late.
    http.set_read_timeout(60, 0);
    http.set_keep_alive_timeout(30);
    const size_t threads = size_t(std::max(4, opts.http_threads));
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
      guarded(r, [&] { completion(q, r, false); });
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
      guarded(r, [&] { completion(q, r, true); });
    });
    http.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
      guarded(r, [&] {
        check_auth(q);
        send_json(r, 200,
                  {{"object", "list"},
                   {"data",
                    {{{"id", opts.served_model_name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "deepinfer"},
                      {"max_model_len", model.context}}}}});
      });
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      const std::string f = failure();
      if (!f.empty())
        send_json(r, 503, {{"status", "failed"}, {"error", f}});
      else if (!scheduler.load())
        send_json(r, 503, {{"status", "loading"}});
      else
        send_json(r, 200, {{"status", "ok"}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      Scheduler* s = scheduler.load();
      r.set_content(metrics.render(s ? s->snapshot() : SchedulerSnapshot{}),
                    "text/plain; version=0.0.4");
    });
    // httplib's own answers (413 for a large body, 404 for an unknown path) get an API error body.
    http.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      const std::string msg = r.status == 413 ? "the request body is too large"
                              : r.status == 404
                                  ? fmt::format("no route for {} {}", q.method, q.path)
                                  : fmt::format("HTTP {}", r.status);
      const char* type = r.status == 413   ? "invalid_request_error"
                         : r.status == 404 ? "not_found_error"
                                           : "server_error";
      send_json(r, r.status, ApiError(r.status, msg, type).body());
    });
    http.set_logger([this](const httplib::Request& q, const httplib::Response& r) {
      if (q.path.rfind("/v1/", 0) == 0) metrics.on_request(r.status);
      log_debug("serve: {} {} -> {}", q.method, q.path, r.status);
    });
  }
};

Server::Server(const ServerOptions& opts, ServedModel model)
    : impl_(std::make_unique<Impl>(opts, std::move(model))) {}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  s.routes();
  if (s.opts.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.opts.host);
    if (s.bound_port < 0) s.bound_port = 0;
  } else if (s.http.bind_to_port(s.opts.host, s.opts.port)) {
    s.bound_port = s.opts.port;
  }
  if (s.bound_port <= 0)
    DI_FAIL(
        "cannot listen on {}:{} (in use, or not an address of this host); pick another --port "
        "or --host",
        s.opts.host, s.opts.port);
  s.thread = std::thread([&s] { s.http.listen_after_bind(); });
}

int Server::port() const { return impl_->bound_port; }

void Server::set_ready(Scheduler* scheduler) { impl_->scheduler = scheduler; }

void Server::set_failed(const std::string& why) {
  std::lock_guard lk(impl_->state_mu);
  impl_->failed = why;
}

void Server::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->http.stop();
  impl_->thread.join();
}

Metrics& Server::metrics() { return impl_->metrics; }

}  // namespace deepinfer::serve
