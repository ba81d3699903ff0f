// A fixed thread pool for kernels: parallel_for splits [0, n) into contiguous ranges.
#pragma once

#include <cstdint>
#include <functional>

namespace deepinfer {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // 0 = hardware threads
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // How parallel_for cuts [0, n). `even`: equal chunks, a few per thread. `tapering`: chunks
  // that shrink toward the end (each about the work left ÷ twice the threads, never under
  // `grain`), so the threads finish within one small chunk of each other while most of the work
  // still goes in long contiguous ranges: for weight streaming, where per-core speed varies.
  // `per_thread`: one equal contiguous range a thread (fewer where grain says so): for short
  // streaming calls, where every further chunk costs more than the imbalance it would save.
  enum class Schedule { even, tapering, per_thread };

  int num_threads() const;
  // Calls fn(begin, end) on disjoint ranges covering [0, n), at least `grain` items each,
  // and returns when all are done. The calling thread takes part. Exceptions propagate.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                    Schedule schedule = Schedule::even);
  // Returns once every worker sleeps (idle workers poll a while before sleeping), or after
  // `timeout_us`: for a benchmark that hands the CPUs to another process and must not leave this
  // pool's polling on them (bench decode --ab). True if they all sleep.
  bool wait_until_asleep(int64_t timeout_us = 1000000);

 private:
  void shutdown();  // stops and joins the workers, frees impl_
  struct Impl;
  Impl* impl_;
};

// The process-wide pool sized by DEEPINFER_THREADS. Ranks that are threads of one process
// share it (work from different ranks is serialised per call, never deadlocked).
ThreadPool& global_pool();

// The pool of this thread's rank: the innermost ScopedThreadPool on this thread, else nullptr.
// Work that may run on several rank threads at once uses it, never global_pool(), which would
// serialise the ranks.
ThreadPool* scoped_pool();

// Nanoseconds this thread, as a parallel_for caller, has waited for the pool's workers after
// finishing its own chunks (load imbalance plus wake-up latency), summed since it started. The
// decode profile (docs/performance.md) reads it around each kernel call.
int64_t pool_wait_ns();

class ScopedThreadPool {
 public:
  explicit ScopedThreadPool(ThreadPool& pool);
  ~ScopedThreadPool();
  ScopedThreadPool(const ScopedThreadPool&) = delete;
  ScopedThreadPool& operator=(const ScopedThreadPool&) = delete;

 private:
  ThreadPool* saved_;
};

}  // namespace deepinfer
