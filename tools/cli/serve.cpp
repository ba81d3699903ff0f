// `deepinfer serve`: an OpenAI-compatible HTTP server over EP ranks (docs/serve.md). Rank 0's
// process owns HTTP and the scheduler; every rank (threads with --comm local, processes under
// mpirun) follows the scheduler's step plans. The server listens before the weights load
// (/health says 503 until then) and prints `listening on http://HOST:PORT` on stderr when it
// accepts requests. SIGINT/SIGTERM: stop admitting, finish what runs (at most --drain-timeout
// seconds), exit 0; when mpirun sends it (it is ending the job), within mpirun's grace before its
// SIGKILL, and what is still open then ends with an error. A failed rank ends every open request
// with an error and exits non-zero.
#include "serve/serve.h"

#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
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
  HeadOption head;
};

// Under a launcher, how much of its SIGTERM-to-SIGKILL grace the requests in flight may use: the
// rest is for their error answers to reach the clients before the SIGKILL.
constexpr double kLauncherKillMarginSeconds = 1.0;  // at most half the grace

// SIGINT/SIGTERM set a flag (any thread may receive them) and note whether our parent sent it:
// under mpirun that is the launcher's daemon ending the job. A watcher thread reacts outside the
// signal handler. Lock-free atomics, not volatile sig_atomic_t: that only serves a handler and
// code of the same thread, and here the handler runs on whichever thread took the signal (a data
// race ThreadSanitizer reported in the tsan stage).
static_assert(std::atomic<int>::is_always_lock_free, "async-signal-safe only when lock-free");
std::atomic<int> g_signal{0};
std::atomic<int> g_from_parent{0};
extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
  g_from_parent.store(info != nullptr && info->si_pid == getppid(), std::memory_order_relaxed);
  g_signal.store(sig, std::memory_order_release);  // publishes g_from_parent with it
}

class SignalWatch {
 public:
  SignalWatch() {
    struct sigaction sa {};
    sa.sa_sigaction = on_stop_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    thread_ = std::thread([this] {
      while (!done_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (g_signal.exchange(0, std::memory_order_acquire) != 0)
          on_signal(g_from_parent.load(std::memory_order_relaxed) != 0);
        fail_when_due();
      }
    });
  }
  ~SignalWatch() {
    done_ = true;
    thread_.join();
  }
  // Set once rank 0 schedules (a signal then drains; before, it ends the process), cleared before
  // the scheduler goes away.
  void set_scheduler(serve::Scheduler* s) {
    std::lock_guard lk(mu_);
    scheduler_ = s;
  }
  double drain_timeout_s = 30;
  // Open MPI's SIGTERM-to-SIGKILL grace (launcher_kill_grace_s), for rank 0 under mpirun.
  std::optional<double> launcher_grace_s;
  // A rank other than 0 of a launch (mpirun forwards the signal to every rank): rank 0 drains,
  // and its last step plan ends this rank too; exiting here would cut the requests in flight.
  std::atomic<bool> follower{false};

 private:
  void on_signal(bool from_parent) {
    if (follower) return;
    std::lock_guard lk(mu_);
    if (!scheduler_) {
      std::fprintf(stderr, "serve: stopped while loading\n");
      std::_Exit(0);
    }
    if (from_parent && launcher_grace_s) {
      // mpirun ends the job (a rank or host failed, or mpirun was signalled): SIGKILL follows
      // after its grace. The requests in flight get most of it; whatever is still open then ends
      // with an error answer, whether or not the step loop is stuck in a collective with a lost
      // rank (docs/serve.md §4).
      const double grace = *launcher_grace_s;
      const double t =
          std::min(drain_timeout_s, grace - std::min(kLauncherKillMarginSeconds, grace / 2));
      std::fprintf(stderr,
                   "serve: stopping: the launcher is ending the job (a rank or its host failed, "
                   "or mpirun was signalled) and kills every rank in %.1f s; finishing the "
                   "requests in flight for at most %.1f s\n",
                   grace, t);
      scheduler_->drain(t);
      fail_at_ = Clock::now() +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
      return;
    }
    std::fprintf(stderr, "serve: stopping: finishing the requests in flight (at most %.0f s)\n",
                 drain_timeout_s);
    scheduler_->drain(drain_timeout_s);
  }
  void fail_when_due() {
    std::lock_guard lk(mu_);
    if (!fail_at_ || Clock::now() < *fail_at_) return;
    fail_at_.reset();
    if (scheduler_)
      scheduler_->fail_all(
          "the server stopped before the request finished: its launcher is ending the job (a "
          "rank or its host failed, or mpirun was signalled)");
  }
  using Clock = std::chrono::steady_clock;
  std::mutex mu_;
  serve::Scheduler* scheduler_ = nullptr;
  std::optional<Clock::time_point> fail_at_;
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
  so.launch.fp8_head = o.head.fp8();
  o.speculative.apply(so);
  std::signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails instead
  SignalWatch signals;
  signals.drain_timeout_s = o.drain_timeout_s;
  signals.follower =
      so.launch.comm == CommKind::mpi && launcher_placement() && launcher_placement()->rank != 0;
  if (so.launch.comm == CommKind::mpi) signals.launcher_grace_s = launcher_kill_grace_s();
  serve::serve(
      so,
      [&](int port, serve::Scheduler& scheduler) {
        signals.set_scheduler(&scheduler);
        std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), port);
        std::fflush(stderr);
      },
      [&] { signals.set_scheduler(nullptr); });
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
      o->head.add_to(app);
      return [o] { return run_serve(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
