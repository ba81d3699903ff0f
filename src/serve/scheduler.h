// The server's scheduler and the step loop every rank runs (docs/serve.md). Rank 0 owns the
// requests: HTTP threads submit jobs, the scheduler admits them by free KV pages in FIFO order,
// places each on the rank with the least load (data-parallel attention), and before every step
// broadcasts one plan (starts, cancels, run, stop) that every rank follows; after the step every
// rank's events (tokens, finishes) are gathered back to rank 0. Ranks never decide anything on
// their own, so requests cannot make them diverge.
#pragma once

#include <deepinfer/comm.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace deepinfer::serve {

using Clock = std::chrono::steady_clock;

// One client request, shared by the HTTP thread that made it and the scheduler.
struct Job {
  runtime::Request req;  // req.id is set by submit()

  // Written by the scheduler, read by the HTTP thread: under mu, cv notified on every change.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;  // generated so far
  bool finished = false;
  std::string finish_reason;  // "stop" | "length" (the engine's) or "cancelled"
  std::string error;          // set when the job failed (a rank failed, the server is stopping)

  // Set by the HTTP thread (the client left, or a stop string matched); the scheduler cancels the
  // sequence before the next step and frees its pages.
  std::atomic<bool> cancel{false};

  Clock::time_point submitted;
};

enum class Admission {
  queued,      // waits in the FIFO queue (or runs at the next step)
  queue_full,  // max_queue jobs already wait: try again later (HTTP 429)
  never_fits,  // needs more KV pages than one rank holds (HTTP 400)
  stopping,    // the server is draining (HTTP 503)
};

struct SchedulerOptions {
  int world = 1;
  int64_t pages_per_rank = 0;  // each rank's KV page pool (EngineOptions::kv_pages)
  int64_t max_batch = 64;      // sequences per rank
  int64_t max_queue = 256;     // jobs waiting beyond those running
  // With nothing to run, rank 0 still sends a plan this often, so the other ranks (blocked in the
  // plan's broadcast) never reach the collective deadline while the server is idle.
  double heartbeat_s = 1.0;
};

// The step's plan, the same bytes on every rank.
struct StepPlan {
  struct Start {
    int32_t rank = 0;
    runtime::Request req;
  };
  struct Cancel {
    int32_t rank = 0;
    int64_t id = 0;
  };
  bool stop = false;  // every rank leaves the loop
  bool run = false;   // some rank has a sequence: every rank steps
  std::vector<Start> starts;
  std::vector<Cancel> cancels;
};
std::vector<uint8_t> encode_plan(const StepPlan& plan);
StepPlan decode_plan(const std::vector<uint8_t>& bytes);

// What the scheduler saw happen, for the metrics (called under the scheduler's lock).
struct SchedulerObserver {
  virtual ~SchedulerObserver() = default;
  virtual void on_first_token(double ttft_s) = 0;
  virtual void on_token_gap(double itl_s) = 0;
  virtual void on_tokens(int64_t generated) = 0;
};

struct SchedulerSnapshot {
  int64_t running = 0, queued = 0, pages_used = 0, pages_free = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& opts, SchedulerObserver* observer = nullptr);

  // Any thread. Gives the job an id and queues it, or says why not (the job is untouched).
  Admission submit(const std::shared_ptr<Job>& job);
  // Any thread: asks for the job to end (same as setting job.cancel) and wakes the loop.
  void cancel(Job& job);
  // Any thread: stop admitting; running and queued jobs finish; after `timeout_s` the rest end
  // with an error. The loop then plans `stop`.
  void drain(double timeout_s);
  // Ends every job with `error` and plans `stop` (a rank failed: nothing more can run).
  void fail_all(const std::string& error);
  SchedulerSnapshot snapshot() const;

  // The step loop's side (rank 0 only).
  StepPlan next_plan();  // waits up to heartbeat_s while there is nothing to do
  void deliver(const std::vector<runtime::StepEvent>& events);

 private:
  struct Running {
    std::shared_ptr<Job> job;
    int32_t rank = 0;
    int64_t pages = 0;
    Clock::time_point last_token;
  };
  void finish_locked(Job& job, const std::string& reason, const std::string& error);
  int choose_rank_locked(int64_t pages) const;

  SchedulerOptions opts_;
  SchedulerObserver* observer_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, Running> running_;
  std::vector<int64_t> free_pages_, active_;  // per rank, mirrors each rank's engine
  int64_t next_id_ = 1;
  bool draining_ = false, failed_ = false;
  Clock::time_point drain_deadline_;
};

// Every rank: follows rank 0's plans (start, cancel, step) until the stop plan. Rank 0 passes its
// scheduler, which makes the plans and receives every rank's events; the others pass nullptr.
// A failed collective throws here (CommTimeout or Error) on the ranks that see it.
void serve_rank(Group& group, runtime::Engine& engine, Scheduler* scheduler);

}  // namespace deepinfer::serve
