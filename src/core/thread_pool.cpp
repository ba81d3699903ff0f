// Fixed thread pool. One parallel_for runs at a time per pool (callers from other threads
// wait their turn); a parallel_for issued from inside a running one executes inline.
#include "core/thread_pool.h"

#include <deepinfer/error.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/env.h"

namespace deepinfer {
namespace {
// Set while this thread executes a parallel_for body (as caller or worker): nested calls
// run inline instead of waiting for a pool that is busy with their parent.
thread_local int t_depth = 0;
thread_local ThreadPool* t_scoped = nullptr;  // scoped_pool()
thread_local int64_t t_pool_wait_ns = 0;      // pool_wait_ns()
// Chunks per thread: a little oversubscription evens out uneven chunk costs.
constexpr int64_t kChunksPerThread = 4;
// Idle workers (and a caller waiting for them) poll this long before sleeping on the condition
// variable: decode issues parallel_fors back to back, and a futex sleep/wake costs tens of us on
// a VM, which is most of a small kernel's time.
constexpr auto kSpin = std::chrono::microseconds(60);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls pred for up to kSpin; true as soon as it holds. Past kPollsBeforeYield polls it also yields
// the CPU every 64: the scheduler may have put the thread it waits for on this same CPU (a worker
// woken next to its caller: on an idle 2-vCPU VM, one `generate` in two ran 5x slower that way, the
// spinner holding the CPU the worker needed until its time slice ran out). With a CPU of its own
// the yield returns at once.
constexpr int kPollsBeforeYield = 256;  // about 10-15 us of polls first: most waits end sooner
template <class Pred>
bool spin_until(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 63) {
      if (std::chrono::steady_clock::now() >= until) return false;
      if (i >= kPollsBeforeYield) sched_yield();
    }
  }
}

// Schedule::tapering's chunk bounds: each chunk about the work left ÷ (2 × threads), at least
// grain, and no tail under grain. About 2 × threads × ln(n / grain) chunks, far below kChunkMask.
void tapering_bounds(int64_t n, int64_t grain, int64_t threads, std::vector<int64_t>& bounds) {
  bounds.assign(1, 0);
  for (int64_t at = 0; at < n;) {
    int64_t size = std::max(grain, (n - at + 2 * threads - 1) / (2 * threads));
    if (n - at - size < grain) size = n - at;
    at += size;
    bounds.push_back(at);
  }
}

struct DepthGuard {
  DepthGuard() { ++t_depth; }
  ~DepthGuard() { --t_depth; }
};
}  // namespace

struct ThreadPool::Impl {
  int num_threads = 1;
  std::vector<std::thread> workers;

  std::mutex call_mutex;  // serialises parallel_for calls from different threads

  std::mutex mutex;  // guards the job fields below
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  uint64_t generation = 0;
  bool stop = false;
  // Lock-free mirrors of generation / stop for the spin phase (written under mutex).
  std::atomic<uint64_t> generation_pub{0};
  std::atomic<bool> stop_pub{false};
  std::atomic<int> asleep{0};  // workers waiting on work_cv (wait_until_asleep)

  // The job: a caller waits for its chunks, not for the workers. A worker that wakes after the
  // caller (and the workers awake) ran every chunk finds none to claim and goes back to waiting;
  // before, the caller waited for each worker to check in, and where the scheduler had put a
  // worker on the caller's own CPU that wait lasted until the caller's time slice ran out.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  const int64_t* bounds = nullptr;  // tapering: chunk c is [bounds[c], bounds[c + 1])
  // Chunk claims: generation (high 24 bits), next chunk (20), chunks (20), so a claim is only
  // taken in the job it belongs to, and its chunk count is read in the same word.
  std::atomic<uint64_t> claim{0};
  std::atomic<int64_t> done{0};  // chunks of the current job run (or skipped after an error)
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // first exception, guarded by `mutex`

  static constexpr int kChunkBits = 20;
  static constexpr uint64_t kChunkMask = (uint64_t(1) << kChunkBits) - 1;
  static uint64_t claim_word(uint64_t gen, int64_t next, int64_t chunks) {
    return (gen << (2 * kChunkBits)) | (uint64_t(next) << kChunkBits) | uint64_t(chunks);
  }

  // Runs the chunks of job `gen` this thread can still claim. While it holds a claim the job's
  // caller is waiting (done < chunks), so fn and n are that job's.
  void run_chunks(uint64_t gen) {
    DepthGuard depth;
    const uint64_t tag = gen & ((uint64_t(1) << (64 - 2 * kChunkBits)) - 1);
    for (;;) {
      uint64_t cur = claim.load(std::memory_order_acquire);
      int64_t c = 0, chunks = 0;
      for (;;) {
        c = int64_t((cur >> kChunkBits) & kChunkMask);
        chunks = int64_t(cur & kChunkMask);
        if ((cur >> (2 * kChunkBits)) != tag || c >= chunks) return;
        if (claim.compare_exchange_weak(cur, cur + (uint64_t(1) << kChunkBits),
                                        std::memory_order_acq_rel))
          break;
      }
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          if (bounds)
            (*fn)(bounds[c], bounds[c + 1]);
          else
            (*fn)(c * n / chunks, (c + 1) * n / chunks);
        } catch (...) {
          std::lock_guard lock(mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        std::lock_guard lock(mutex);  // the caller may be about to sleep on done_cv
        done_cv.notify_one();
      }
    }
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] {
        return generation_pub.load(std::memory_order_acquire) != seen ||
               stop_pub.load(std::memory_order_relaxed);
      });
      {
        std::unique_lock lock(mutex);
        asleep.fetch_add(1, std::memory_order_relaxed);
        work_cv.wait(lock, [&] { return stop || generation != seen; });
        asleep.fetch_sub(1, std::memory_order_relaxed);
        if (stop) return;
        seen = generation;
      }
      run_chunks(seen);
    }
  }
};

namespace {
int resolve_num_threads(int num_threads) {
  DI_CHECK(num_threads >= 0, "ThreadPool needs num_threads >= 0 (0 = hardware threads), got {}",
           num_threads);
  return num_threads ? num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

// Validate before allocating so a bad size throws without leaking.
ThreadPool::ThreadPool(int num_threads) : impl_(nullptr) {
  num_threads = resolve_num_threads(num_threads);
  impl_ = new Impl;
  impl_->num_threads = num_threads;
  impl_->workers.reserve(size_t(num_threads - 1));
  try {
    for (int i = 0; i + 1 < num_threads; ++i)
      impl_->workers.emplace_back([this] { impl_->worker_loop(); });
  } catch (const std::system_error& e) {
    shutdown();
    throw Error(fmt::format("could not start {} thread-pool threads ({}); lower DEEPINFER_THREADS",
                            num_threads, e.what()));
  }
}

void ThreadPool::shutdown() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop = true;
    impl_->stop_pub = true;
  }
  impl_->work_cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  delete impl_;
  impl_ = nullptr;
}

ThreadPool::~ThreadPool() { shutdown(); }

int ThreadPool::num_threads() const { return impl_->num_threads; }

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn, Schedule schedule) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (impl_->workers.empty() || t_depth > 0) {  // inline: a nested call, or no workers
    DepthGuard depth;
    fn(0, n);
    return;
  }
  // Tapering bounds; this thread's own, stable while its call runs (a call nested in a chunk runs
  // inline above and does not touch them).
  thread_local std::vector<int64_t> bounds;
  if (schedule == Schedule::tapering) tapering_bounds(n, grain, impl_->num_threads, bounds);
  const int64_t per_thread = schedule == Schedule::per_thread ? 1 : kChunksPerThread;
  const int64_t chunks = schedule == Schedule::tapering
                             ? int64_t(bounds.size()) - 1
                             : std::min({n / grain, int64_t(impl_->num_threads) * per_thread,
                                         int64_t(Impl::kChunkMask)});
  if (chunks <= 1) {
    DepthGuard depth;
    fn(0, n);
    return;
  }
  Impl& p = *impl_;
  std::lock_guard call_lock(p.call_mutex);
  {
    std::lock_guard lock(p.mutex);
    p.fn = &fn;
    p.n = n;
    p.bounds = schedule == Schedule::tapering ? bounds.data() : nullptr;
    p.failed.store(false, std::memory_order_relaxed);
    p.error = nullptr;
    p.done.store(0, std::memory_order_relaxed);
    ++p.generation;
    p.claim.store(Impl::claim_word(p.generation, 0, chunks), std::memory_order_release);
    p.generation_pub.store(p.generation, std::memory_order_release);
  }
  p.work_cv.notify_all();
  p.run_chunks(p.generation);
  const auto wait_from = std::chrono::steady_clock::now();
  std::exception_ptr error;
  spin_until([&] { return p.done.load(std::memory_order_acquire) == chunks; });
  {
    std::unique_lock lock(p.mutex);
    p.done_cv.wait(lock, [&] { return p.done.load(std::memory_order_acquire) == chunks; });
    error = p.error;
    p.error = nullptr;
    p.fn = nullptr;
  }
  t_pool_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - wait_from)
                        .count();
  if (error) std::rethrow_exception(error);
}

bool ThreadPool::wait_until_asleep(int64_t timeout_us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(timeout_us);
  const int workers = int(impl_->workers.size());
  while (impl_->asleep.load(std::memory_order_relaxed) < workers) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

ThreadPool* scoped_pool() { return t_scoped; }
int64_t pool_wait_ns() { return t_pool_wait_ns; }
ScopedThreadPool::ScopedThreadPool(ThreadPool& pool) : saved_(t_scoped) { t_scoped = &pool; }
ScopedThreadPool::~ScopedThreadPool() { t_scoped = saved_; }

ThreadPool& global_pool() {
  static ThreadPool pool(knobs().threads);
  return pool;
}

}  // namespace deepinfer
