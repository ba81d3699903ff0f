// `deepinfer bench serve`: C streaming clients over real HTTP against the OpenAI server (started
// in this process unless --url), for each concurrency C. Each client sends greedy completions of
// --prompt-tokens random token ids with ignore_eos and --max-tokens, one after another, until
// --requests requests are done. One JSON line per C: requests, errors, aggregate output
// tokens/s, time to first token and inter-chunk latency percentiles, and speedup over C = 1.
#include <deepinfer/error.h>
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "model/config.h"
#include "serve/serve.h"
#include "synthetic_model.h"

namespace deepinfer::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeCli {
  std::string model = "models/tiny";
  std::string url;
  std::string concurrency = "1,4,16,64";
  int64_t prompt_tokens = 128;
  int64_t max_tokens = 128;
  int64_t requests = 0;  // per C; 0: 2·C, at least 8
  int ep = 1;
  std::string comm;
  std::string synthetic_dir = "build/synthetic-v3-fp8";
  int64_t max_batch = 64;
};

struct Sample {
  bool ok = false;
  int64_t tokens = 0;
  int64_t bytes = 0;  // response bytes received
  double ttft = 0;
  std::vector<double> gaps;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

// One streaming completion; parses SSE chunks as they arrive.
Sample one_request(const std::string& host, int port, const json& body) {
  Sample s;
  httplib::Client cli(host, port);
  cli.set_read_timeout(600, 0);
  cli.set_tcp_nodelay(true);
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  std::string buf;
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    s.bytes += int64_t(n);
    for (size_t eol; (eol = buf.find("\n\n")) != std::string::npos;) {
      const std::string ev = buf.substr(0, eol);
      buf.erase(0, eol + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) return false;
      if (j.contains("usage") && j["usage"].is_object())
        s.tokens = j["usage"].value("completion_tokens", int64_t(0));
      if (!j.contains("choices") || j["choices"].empty()) continue;
      if (j["choices"][0].value("text", std::string()).empty()) continue;
      const auto now = Clock::now();
      if (first)
        s.ttft = seconds(now - t0);
      else
        s.gaps.push_back(seconds(now - last));
      first = false;
      last = now;
    }
    return true;
  };
  auto res = cli.send(req);
  s.ok = res && res->status == 200 && done && s.tokens > 0;
  return s;
}

int run_bench_serve(BenchServeCli o) {
  std::vector<int> levels;
  {
    std::stringstream ss(o.concurrency);
    for (std::string x; std::getline(ss, x, ',');) {
      int c = 0;
      try {
        c = std::stoi(x);
      } catch (...) {
      }
      if (c < 1)
        DI_USAGE("--concurrency: expects positive integers separated by commas, got '{}'",
                 o.concurrency);
      levels.push_back(c);
    }
  }
  std::string host = "127.0.0.1";
  int port = 0;
  int64_t vocab = 0;
  std::thread server_thread;
  serve::Scheduler* scheduler = nullptr;
  std::exception_ptr server_error;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  if (!o.url.empty()) {
    const std::string u = o.url.rfind("http://", 0) == 0 ? o.url.substr(7) : o.url;
    const auto colon = u.rfind(':');
    if (colon == std::string::npos) DI_USAGE("--url: expects http://HOST:PORT, got '{}'", o.url);
    host = u.substr(0, colon);
    port = std::atoi(u.c_str() + colon + 1);
    httplib::Client cli(host, port);
    auto r = cli.Get("/v1/models");
    if (!r || r->status != 200)
      DI_FAIL("--url {}: GET /v1/models failed; is the server up?", o.url);
    vocab = 2048;  // ids below every vocabulary we ship
  } else {
    std::string dir = o.model;
    serve::ServeOptions so;
    if (o.model == "synthetic") {
      dir = o.synthetic_dir;
      write_synthetic_model(dir);
    }
    try {
      model::check_model_dir(dir);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    vocab = model::load_config(dir).vocab_size;
    so.launch.model_dir = dir;
    so.launch.ep = o.ep;
    so.launch.comm = resolve_comm(o.comm);
    check_mpi_world(so.launch.comm, o.ep, "--ep");
    so.http.port = 0;
    so.max_batch = o.max_batch;
    so.kv_pages = o.max_batch * ((o.prompt_tokens + o.max_tokens + 63) / 64);
    int64_t top = 1;
    for (int c : levels) top = std::max<int64_t>(top, c);
    so.http.http_threads = int(std::min<int64_t>(1024, top + 16));
    server_thread = std::thread([&] {
      try {
        serve::serve(so, [&](int p, serve::Scheduler& s) {
          std::lock_guard lk(mu);
          port = p;
          scheduler = &s;
          ready = true;
          cv.notify_all();
        });
      } catch (...) {
        server_error = std::current_exception();
      }
      std::lock_guard lk(mu);
      ready = true;
      cv.notify_all();
    });
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return ready; });
    if (server_error) {
      lk.unlock();
      server_thread.join();
      std::rethrow_exception(server_error);
    }
  }
  std::mt19937 rng(1234);
  double base_tps = 0;
  for (int C : levels) {
    const int64_t n = o.requests > 0 ? o.requests : std::max<int64_t>(8, 2 * C);
    std::atomic<int64_t> next{0};
    std::vector<Sample> samples(static_cast<size_t>(n));
    std::vector<json> bodies;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> ids(size_t(o.prompt_tokens));
      for (auto& t : ids) t = int32_t(2 + rng() % uint32_t(std::max<int64_t>(vocab - 2, 1)));
      bodies.push_back({{"prompt", ids},
                        {"max_tokens", o.max_tokens},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}});
    }
    const auto t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < C; ++c)
      clients.emplace_back([&] {
        for (int64_t i; (i = next++) < n;)
          samples[size_t(i)] = one_request(host, port, bodies[size_t(i)]);
      });
    for (auto& t : clients) t.join();
    const double wall = seconds(Clock::now() - t0);
    int64_t errors = 0, tokens = 0, bytes = 0;
    std::vector<double> ttft, itl;
    for (const auto& s : samples) {
      if (!s.ok) {
        ++errors;
        continue;
      }
      tokens += s.tokens;
      bytes += s.bytes;
      ttft.push_back(s.ttft);
      itl.insert(itl.end(), s.gaps.begin(), s.gaps.end());
    }
    const double tps = double(tokens) / wall;
    if (base_tps == 0) base_tps = tps;
    // The benchmark contract's fields: the limit is the C = 1 rate of this run.
    json line = {{"bench", "serve"},
                 {"case", fmt::format("c{}", C)},
                 {"concurrency", C},
                 {"seconds", wall},
                 {"bytes", bytes},
                 {"limit", "c1_tokens_per_s"},
                 {"limit_value", base_tps},
                 {"ratio", tps / base_tps},
                 {"requests", n},
                 {"errors", errors},
                 {"prompt_tokens", o.prompt_tokens},
                 {"max_tokens", o.max_tokens},
                 {"tokens_per_s", tps},
                 {"ttft_p50_s", percentile(ttft, 0.5)},
                 {"ttft_p99_s", percentile(ttft, 0.99)},
                 {"itl_p50_s", percentile(itl, 0.5)},
                 {"itl_p99_s", percentile(itl, 0.99)},
                 {"speedup", tps / base_tps},
                 {"correct", errors == 0}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  if (server_thread.joinable()) {
    scheduler->drain(0);
    server_thread.join();
    if (server_error) std::rethrow_exception(server_error);
  }
  return 0;
}

DEEPINFER_COMMAND(
    "bench", "serve",
    "Streaming clients over HTTP against the OpenAI server: tokens/s, TTFT and ITL per "
    "concurrency; JSON lines",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchServeCli>();
      app.add_option("--model", o->model,
                     "Model folder, or `synthetic` (default models/tiny); the server runs in "
                     "this process");
      app.add_option("--url", o->url, "Bench a running server instead (http://HOST:PORT)");
      app.add_option("--concurrency", o->concurrency,
                     "Client counts, comma-separated (default 1,4,16,64)");
      app.add_option("--prompt-tokens", o->prompt_tokens, "Prompt length (default 128)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_option("--max-tokens", o->max_tokens, "Tokens per completion (default 128)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_option("--requests", o->requests,
                     "Requests per concurrency (default 2 x C, at least 8)")
          ->check(integer_in(0, int64_t(1) << 20));
      app.add_option("--ep", o->ep, "Server ranks (threads with --comm local)")
          ->check(integer_in(1, 4096));
      app.add_option("--comm", o->comm, "Server backend local|mpi")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--max-batch", o->max_batch, "Server sequences per rank (default 64)")
          ->check(integer_in(1, 4096));
      app.add_option("--synthetic-dir", o->synthetic_dir,
                     "Where the synthetic model is written (default build/synthetic-v3-fp8)");
      return [o] { return run_bench_serve(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
