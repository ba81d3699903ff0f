// `deepinfer serve`: an OpenAI-compatible HTTP server over EP ranks (docs/serve.md). Rank 0's
// process owns HTTP and the scheduler; every rank (threads with --comm local, processes under
// mpirun) follows the scheduler's step plans. The server listens before the weights load
// (/health says 503 until then) and prints `listening on http://HOST:PORT` on stderr when it
// accepts requests. SIGINT/SIGTERM: stop admitting, finish what runs (at most --drain-timeout
// seconds), exit 0. A failed rank ends every open request with an error and exits non-zero.
#include "serve/serve.h"

#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "comm/platform.h"
#include "command.h"
#include "model/config.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct ServeCli {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  int ep = 1;
  std::string comm;
  int64_t max_batch = 32;
  int64_t max_queue = 256;
  int64_t kv_pages = 0;
  int64_t max_tokens_per_step = 256;
  int64_t default_max_tokens = 256;
  std::string served_model_name;
  std::string api_key;
  double drain_timeout_s = 30;
  std::string gemm = "fp8";
  std::string quantize;
  SpeculativeOptions speculative;
};

// SIGINT/SIGTERM set a flag (any thread may receive them); a watcher thread reacts outside the
// signal handler.
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

class SignalWatch {
 public:
  SignalWatch() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    thread_ = std::thread([this] {
      while (!done_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (g_signal) {
          g_signal = 0;
          on_signal();
        }
      }
    });
  }
  ~SignalWatch() {
    done_ = true;
    thread_.join();
  }
  // Set once rank 0 schedules: from then on a signal drains. Before, it ends the process.
  std::atomic<serve::Scheduler*> scheduler{nullptr};
  double drain_timeout_s = 30;
  // A rank other than 0 of a launch (mpirun forwards the signal to every rank): rank 0 drains,
  // and its last step plan ends this rank too; exiting here would cut the requests in flight.
  std::atomic<bool> follower{false};

 private:
  void on_signal() {
    if (follower) return;
    if (serve::Scheduler* s = scheduler.load()) {
      std::fprintf(stderr, "serve: stopping: finishing the requests in flight (at most %.0f s)\n",
                   drain_timeout_s);
      s->drain(drain_timeout_s);
    } else {
      std::fprintf(stderr, "serve: stopped while loading\n");
      std::_Exit(0);
    }
  }
  std::atomic<bool> done_{false};
  std::thread thread_;
};

int run_serve(const ServeCli& o) {
  serve::ServeOptions so;
  so.launch.comm = resolve_comm(o.comm);
  check_mpi_world(so.launch.comm, o.ep, "--ep");
  try {
    model::check_model_dir(o.model);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.drain_timeout_s < 0) DI_USAGE("--drain-timeout must be >= 0 seconds");
  so.launch.model_dir = o.model;
  so.launch.ep = o.ep;
  so.launch.gemm = o.gemm == "bf16" ? model::GemmMode::bf16 : model::GemmMode::fp8;
  so.launch.quantize_fp8 = o.quantize == "fp8";
  so.launch.progress = true;
  so.http.host = o.host;
  so.http.port = o.port;
  so.http.served_model_name = o.served_model_name;
  so.http.api_key = o.api_key;
  so.http.default_max_tokens = o.default_max_tokens;
  so.http.http_threads = int(std::min<int64_t>(1024, o.max_batch * o.ep + o.max_queue / 4 + 16));
  so.max_batch = o.max_batch;
  so.max_queue = o.max_queue;
  so.kv_pages = o.kv_pages;
  so.max_tokens_per_step = o.max_tokens_per_step;
  so.launch.mtp = o.speculative.on();
  so.draft_tokens = o.speculative.engine_draft_tokens();
  std::signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails instead
  SignalWatch signals;
  signals.drain_timeout_s = o.drain_timeout_s;
  signals.follower =
      so.launch.comm == CommKind::mpi && launcher_placement() && launcher_placement()->rank != 0;
  serve::serve(
      so,
      [&](int port, serve::Scheduler& scheduler) {
        signals.scheduler = &scheduler;
        std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), port);
        std::fflush(stderr);
      },
      [&] { signals.scheduler = nullptr; });
  if (!launcher_placement() || launcher_placement()->rank == 0)
    std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

DEEPINFER_COMMAND(
    "", "serve",
    "Serve a model over HTTP with the OpenAI API (completions, chat completions, streaming)",
    [](CLI::App& app) {
      auto o = std::make_shared<ServeCli>();
      app.add_option("--model", o->model,
                     "Checkpoint folder (config.json, safetensors, tokenizer.json)")
          ->required();
      app.add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
      app.add_option("--port", o->port, "Port (default 8000; 0 = any free port)")
          ->check(integer_in(0, 65535));
      app.add_option("--ep", o->ep,
                     "Ranks: threads with --comm local; under mpirun the launch's size")
          ->check(integer_in(1, 4096));
      app.add_option("--comm", o->comm,
                     "Collective backend local|mpi (default: mpi under a multi-process launch, "
                     "else DEEPINFER_COMM)")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--max-batch", o->max_batch, "Sequences in flight per rank (default 32)")
          ->check(integer_in(1, 4096));
      app.add_option("--max-queue", o->max_queue,
                     "Requests waiting for room beyond those running; more get 429 (default 256)")
          ->check(integer_in(0, int64_t(1) << 20));
      app.add_option("--kv-pages", o->kv_pages,
                     "KV cache pages (64 tokens) per rank (default: --max-batch sequences of "
                     "min(context, 2048) tokens)")
          ->check(integer_in(0, int64_t(1) << 30));
      app.add_option("--max-step-tokens", o->max_tokens_per_step,
                     "New tokens per forward per rank: decodes first, prompts prefill in chunks "
                     "in the rest (default 256)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_option("--default-max-tokens", o->default_max_tokens,
                     "max_tokens of a request that gives none (default 256, capped by the "
                     "context)")
          ->check(integer_in(1, int64_t(1) << 20));
      app.add_option("--served-model-name", o->served_model_name,
                     "The model's name in the API (default: the model folder's name)");
      app.add_option("--api-key", o->api_key,
                     "Require 'Authorization: Bearer KEY' on /v1/* (default: no key)");
      app.add_option("--drain-timeout", o->drain_timeout_s,
                     "Seconds SIGINT/SIGTERM waits for running requests (default 30)")
          ->check(a_number());
      app.add_option("--gemm", o->gemm, "Linear layers: fp8 (block-scaled, default) or bf16")
          ->check(CLI::IsMember({"fp8", "bf16"}));
      app.add_option("--quantize", o->quantize,
                     "fp8: quantize BF16 weights to FP8 128x128 at load (for --gemm fp8)")
          ->check(CLI::IsMember({"fp8"}));
      o->speculative.add_to(app);
      return [o] { return run_serve(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
