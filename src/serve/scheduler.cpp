#include "serve/scheduler.h"

#include <deepinfer/error.h>

#include <algorithm>

#include "core/byte_io.h"
#include "core/check.h"

namespace deepinfer::serve {

namespace {

void write_request(ByteWriter& w, const runtime::Request& r) {
  w.pod(r.id);
  w.vec(r.prompt);
  w.pod(r.max_new_tokens);
  w.pod(r.sampling);
  w.vec(r.stop_ids);
}

runtime::Request read_request(ByteReader& rd) {
  runtime::Request r;
  r.id = rd.pod<int64_t>();
  r.prompt = rd.vec<int32_t>();
  r.max_new_tokens = rd.pod<int64_t>();
  r.sampling = rd.pod<runtime::SamplingConfig>();
  r.stop_ids = rd.vec<int32_t>();
  return r;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<uint8_t> encode_plan(const StepPlan& plan) {
  ByteWriter w;
  w.pod(uint8_t(plan.stop));
  w.pod(uint8_t(plan.run));
  w.pod(uint64_t(plan.starts.size()));
  for (const auto& s : plan.starts) {
    w.pod(s.rank);
    write_request(w, s.req);
  }
  w.pod(uint64_t(plan.cancels.size()));
  for (const auto& c : plan.cancels) {
    w.pod(c.rank);
    w.pod(c.id);
  }
  return std::move(w.bytes);
}

StepPlan decode_plan(const std::vector<uint8_t>& bytes) {
  ByteReader rd(bytes.data(), bytes.size());
  StepPlan p;
  p.stop = rd.pod<uint8_t>() != 0;
  p.run = rd.pod<uint8_t>() != 0;
  const auto ns = rd.pod<uint64_t>();
  for (uint64_t i = 0; i < ns; ++i) {
    StepPlan::Start s;
    s.rank = rd.pod<int32_t>();
    s.req = read_request(rd);
    p.starts.push_back(std::move(s));
  }
  const auto nc = rd.pod<uint64_t>();
  for (uint64_t i = 0; i < nc; ++i) {
    StepPlan::Cancel c;
    c.rank = rd.pod<int32_t>();
    c.id = rd.pod<int64_t>();
    p.cancels.push_back(c);
  }
  DI_CHECK(rd.done(), "step plan: {} trailing bytes", rd.end - rd.p);
  return p;
}

Scheduler::Scheduler(const SchedulerOptions& opts, SchedulerObserver* observer)
    : opts_(opts),
      observer_(observer),
      free_pages_(size_t(opts.world), opts.pages_per_rank),
      active_(size_t(opts.world), 0) {
  DI_CHECK(opts.world >= 1 && opts.pages_per_rank > 0 && opts.max_batch > 0 && opts.max_queue >= 0,
           "scheduler options: world {}, pages {}, max_batch {}, max_queue {}", opts.world,
           opts.pages_per_rank, opts.max_batch, opts.max_queue);
}

Admission Scheduler::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard lk(mu_);
  if (draining_ || failed_) return Admission::stopping;
  if (runtime::pages_needed(job->req) > opts_.pages_per_rank) return Admission::never_fits;
  if (int64_t(queue_.size()) >= opts_.max_queue) return Admission::queue_full;
  job->req.id = next_id_++;
  job->submitted = Clock::now();
  queue_.push_back(job);
  wake_.notify_all();
  return Admission::queued;
}

void Scheduler::cancel(Job& job) {
  job.cancel = true;
  std::lock_guard lk(mu_);
  wake_.notify_all();
}

void Scheduler::drain(double timeout_s) {
  std::lock_guard lk(mu_);
  if (draining_) return;
  draining_ = true;
  drain_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(timeout_s));
  wake_.notify_all();
}

void Scheduler::finish_locked(Job& job, const std::string& reason, const std::string& error) {
  std::lock_guard jl(job.mu);
  if (job.finished) return;
  job.finished = true;
  job.finish_reason = reason;
  job.error = error;
  job.cv.notify_all();
}

void Scheduler::fail_all(const std::string& error) {
  std::lock_guard lk(mu_);
  failed_ = true;
  for (auto& [id, r] : running_) finish_locked(*r.job, "error", error);
  for (auto& j : queue_) finish_locked(*j, "error", error);
  running_.clear();
  queue_.clear();
  wake_.notify_all();
}

SchedulerSnapshot Scheduler::snapshot() const {
  std::lock_guard lk(mu_);
  SchedulerSnapshot s;
  s.running = int64_t(running_.size());
  s.queued = int64_t(queue_.size());
  for (int64_t f : free_pages_) {
    s.pages_free += f;
    s.pages_used += opts_.pages_per_rank - f;
  }
  return s;
}

// Least loaded first: fewest running sequences, then most free pages, then the lowest rank.
int Scheduler::choose_rank_locked(int64_t pages) const {
  int best = -1;
  for (int r = 0; r < opts_.world; ++r) {
    const size_t i = size_t(r);
    if (active_[i] >= opts_.max_batch || free_pages_[i] < pages) continue;
    if (best < 0 || active_[i] < active_[size_t(best)] ||
        (active_[i] == active_[size_t(best)] && free_pages_[i] > free_pages_[size_t(best)]))
      best = r;
  }
  return best;
}

StepPlan Scheduler::next_plan() {
  std::unique_lock lk(mu_);
  auto has_work = [&] {
    if (failed_ || !running_.empty() || draining_) return true;
    return !queue_.empty();
  };
  if (!has_work()) wake_.wait_for(lk, std::chrono::duration<double>(opts_.heartbeat_s), has_work);
  StepPlan plan;
  if (failed_) {
    plan.stop = true;
    return plan;
  }
  // Cancels first: their pages are free for this step's admissions.
  const bool out_of_time = draining_ && Clock::now() >= drain_deadline_;
  for (auto it = running_.begin(); it != running_.end();) {
    Job& job = *it->second.job;
    if (!job.cancel && !out_of_time) {
      ++it;
      continue;
    }
    plan.cancels.push_back({it->second.rank, it->first});
    free_pages_[size_t(it->second.rank)] += it->second.pages;
    --active_[size_t(it->second.rank)];
    finish_locked(job, job.cancel ? "cancelled" : "error",
                  job.cancel ? "" : "the server stopped before the request finished");
    it = running_.erase(it);
  }
  std::erase_if(queue_, [&](const std::shared_ptr<Job>& j) {
    if (!j->cancel && !out_of_time) return false;
    finish_locked(*j, j->cancel ? "cancelled" : "error",
                  j->cancel ? "" : "the server stopped before the request started");
    return true;
  });
  // FIFO: the head waits until it fits somewhere; nothing overtakes it.
  while (!queue_.empty()) {
    const auto& job = queue_.front();
    const int64_t pages = runtime::pages_needed(job->req);
    const int r = choose_rank_locked(pages);
    if (r < 0) break;
    free_pages_[size_t(r)] -= pages;
    ++active_[size_t(r)];
    plan.starts.push_back({int32_t(r), job->req});
    running_[job->req.id] = Running{job, int32_t(r), pages, Clock::now()};
    queue_.pop_front();
  }
  plan.run = !running_.empty();
  plan.stop = draining_ && running_.empty() && queue_.empty();
  return plan;
}

void Scheduler::deliver(const std::vector<runtime::StepEvent>& events) {
  std::lock_guard lk(mu_);
  const auto now = Clock::now();
  int64_t generated = 0;
  for (const auto& ev : events) {
    auto it = running_.find(ev.id);
    if (it == running_.end()) continue;  // cancelled in this plan
    Running& run = it->second;
    Job& job = *run.job;
    ++generated;
    {
      std::lock_guard jl(job.mu);
      if (observer_) {
        if (job.tokens.empty())
          observer_->on_first_token(seconds(now - job.submitted));
        else
          observer_->on_token_gap(seconds(now - run.last_token));
      }
      job.tokens.push_back(ev.token);
      job.cv.notify_all();
    }
    run.last_token = now;
    if (ev.finished) {
      free_pages_[size_t(run.rank)] += run.pages;
      --active_[size_t(run.rank)];
      finish_locked(job, ev.result.finish_reason, "");
      running_.erase(it);
    }
  }
  if (observer_ && generated) observer_->on_tokens(generated);
}

void serve_rank(Group& group, runtime::Engine& engine, Scheduler* scheduler) {
  const int me = group.rank();
  DI_CHECK((me == 0) == (scheduler != nullptr), "serve_rank: rank 0 and only rank 0 schedules");
  for (;;) {
    std::vector<uint8_t> bytes;
    StepPlan plan;
    if (scheduler) {
      plan = scheduler->next_plan();
      bytes = encode_plan(plan);
    }
    int64_t n = int64_t(bytes.size());
    group.broadcast(&n, 1, DType::i64, 0);
    bytes.resize(size_t(n));
    group.broadcast(bytes.data(), size_t(n), DType::u8, 0);
    if (!scheduler) plan = decode_plan(bytes);
    if (plan.stop) return;
    for (const auto& c : plan.cancels)
      if (c.rank == me) engine.cancel(c.id);
    for (const auto& s : plan.starts)
      if (s.rank == me) engine.start(s.req);
    if (!plan.run) continue;
    const std::vector<runtime::StepEvent> events = engine.step();
    // Every rank's events to rank 0 (all_gather_v: the Group has no gather; the bytes are few).
    ByteWriter w;
    for (const auto& ev : events) {
      w.pod(ev.id);
      w.pod(ev.token);
      w.pod(uint8_t(ev.finished));
      w.str(ev.finished ? ev.result.finish_reason : std::string());
    }
    const int W = group.size();
    std::vector<int64_t> sizes(static_cast<size_t>(W));
    int64_t mine = int64_t(w.bytes.size());
    group.all_gather(&mine, sizes.data(), 1, DType::i64);
    std::vector<size_t> counts(static_cast<size_t>(W));
    size_t total = 0;
    for (int r = 0; r < W; ++r) total += counts[size_t(r)] = size_t(sizes[size_t(r)]);
    std::vector<uint8_t> all(std::max<size_t>(total, 1));
    group.all_gather_v(w.bytes.data(), w.bytes.size(), all.data(), counts, DType::u8);
    if (!scheduler) continue;
    std::vector<runtime::StepEvent> gathered;
    ByteReader rd(all.data(), total);
    while (!rd.done()) {
      runtime::StepEvent ev;
      ev.id = rd.pod<int64_t>();
      ev.token = rd.pod<int32_t>();
      ev.finished = rd.pod<uint8_t>() != 0;
      ev.result.finish_reason = rd.str();
      gathered.push_back(std::move(ev));
    }
    scheduler->deliver(gathered);
  }
}

}  // namespace deepinfer::serve
