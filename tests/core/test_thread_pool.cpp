// ThreadPool: exact coverage of [0, n), grain, exceptions, nesting, and concurrent callers.
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/thread_pool.h"

namespace deepinfer {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnceWithGrain) {
  using Schedule = ThreadPool::Schedule;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (Schedule schedule : {Schedule::even, Schedule::tapering, Schedule::per_thread})
      for (int64_t n : {0, 1, 2, 3, 7, 31, 100, 1000, 12345}) {
        for (int64_t grain : {0, 1, 3, 64, 1000, 100000}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::mutex m;
          std::vector<std::pair<int64_t, int64_t>> ranges;
          pool.parallel_for(
              n, grain,
              [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
                std::lock_guard lock(m);
                ranges.emplace_back(b, e);
              },
              schedule);
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[size_t(i)].load(), 1)
                << "threads " << threads << " n " << n << " grain " << grain << " i " << i
                << " schedule " << int(schedule);
          if (n == 0) {
            EXPECT_TRUE(ranges.empty());
            continue;
          }
          for (auto [b, e] : ranges) {
            EXPECT_LT(b, e);
            EXPECT_GE(e - b, std::min(std::max<int64_t>(grain, 1), n)) << "range below grain";
          }
        }
      }
  }
}

// The ranges one parallel_for hands out, in order.
std::vector<std::pair<int64_t, int64_t>> sorted_ranges(ThreadPool& pool, int64_t n, int64_t grain,
                                                       ThreadPool::Schedule schedule) {
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(
      n, grain,
      [&](int64_t b, int64_t e) {
        std::lock_guard lock(m);
        ranges.emplace_back(b, e);
      },
      schedule);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

// Tapering chunks shrink from about n / (2 × threads) at the start to the grain at the end: the
// threads finish within one small chunk of each other, and most items go in long ranges.
TEST(ThreadPool, TaperingChunksShrinkTowardTheEnd) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    const int64_t n = 100000, grain = 500;
    const auto ranges = sorted_ranges(pool, n, grain, ThreadPool::Schedule::tapering);
    ASSERT_GT(ranges.size(), size_t(2 * threads));
    EXPECT_EQ(ranges.front().first, 0);
    EXPECT_EQ(ranges.back().second, n);
    EXPECT_EQ(ranges.front().second, (n + 2 * threads - 1) / (2 * threads))
        << "threads " << threads;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const int64_t size = ranges[i].second - ranges[i].first;
      EXPECT_GE(size, grain);
      if (i > 0) {
        EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
        // Non-increasing, except that the last chunk may take a remainder under two grains.
        if (i + 1 < ranges.size())
          EXPECT_LE(size, ranges[i - 1].second - ranges[i - 1].first);
        else
          EXPECT_LT(size, 2 * grain);
      }
    }
  }
}

// per_thread: one contiguous range a thread, their sizes within one item of each other; fewer
// ranges where the grain leaves fewer than a thread each.
TEST(ThreadPool, PerThreadCutsOneEqualRangeAThread) {
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (auto [n, grain] : {std::pair<int64_t, int64_t>{1000, 1}, {1001, 1}, {7, 1}, {1000, 400}}) {
      const auto ranges = sorted_ranges(pool, n, grain, ThreadPool::Schedule::per_thread);
      const std::string what = "threads " + std::to_string(threads) + " n " + std::to_string(n) +
                               " grain " + std::to_string(grain);
      ASSERT_EQ(int64_t(ranges.size()), std::min<int64_t>(threads, n / grain)) << what;
      EXPECT_EQ(ranges.front().first, 0) << what;
      EXPECT_EQ(ranges.back().second, n) << what;
      int64_t lo = n, hi = 0;
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (i > 0) {
          EXPECT_EQ(ranges[i].first, ranges[i - 1].second) << what;
        }
        lo = std::min(lo, ranges[i].second - ranges[i].first);
        hi = std::max(hi, ranges[i].second - ranges[i].first);
      }
      EXPECT_LE(hi - lo, 1) << what;
    }
  }
}

TEST(ThreadPool, WorkersReallyParticipate) {
  ThreadPool pool(4);
  std::mutex m;
  std::set<std::thread::id> ids;
  // Each range waits (with a deadline) until a second thread has shown up.
  pool.parallel_for(64, 1, [&](int64_t, int64_t) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    {
      std::lock_guard lock(m);
      ids.insert(std::this_thread::get_id());
    }
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(m);
        if (ids.size() >= 2) return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_GE(ids.size(), 2u);
}

// Workers poll after a call, then sleep: wait_until_asleep sees them all asleep, and the next call
// wakes them (bench decode --ab hands the CPUs to another process in between).
TEST(ThreadPool, WaitUntilAsleepSeesEveryWorkerSleepAndTheyWakeAgain) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int round = 0; round < 3; ++round) {
    pool.parallel_for(3000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_TRUE(pool.wait_until_asleep(10'000'000)) << "round " << round;
  }
  EXPECT_EQ(sum.load(), 3 * (2999 * 3000 / 2));
  ThreadPool alone(1);  // no workers: asleep at once
  EXPECT_TRUE(alone.wait_until_asleep(0));
}

TEST(ThreadPool, ExceptionPropagatesAndPoolStaysUsable) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 20; ++rep) {
    try {
      pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
        if (b <= 500 && 500 < e) throw std::runtime_error("bad index 500");
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "bad index 500");
    }
  }
  // Inline path (one range) too.
  EXPECT_THROW(pool.parallel_for(5, 100, [](int64_t, int64_t) { throw Error("inline"); }), Error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(ThreadPool, NestedCallRunsInlineWithoutDeadlock) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(16, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(100, 1, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum += i * 100 + j;
      });
  });
  EXPECT_EQ(sum.load(), 1599 * 1600 / 2);
  // A pool used from inside another pool's workers.
  ThreadPool inner(2);
  std::atomic<int64_t> count{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      inner.parallel_for(50, 1, [&](int64_t b2, int64_t e2) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 8 * 50);
}

TEST(ThreadPool, ConcurrentCallersFromEightThreads) {
  ThreadPool pool(4);
  constexpr int kCallers = 8, kCalls = 40;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int k = 0; k < kCalls; ++k) {
        const int64_t n = 500 + 37 * c + k;
        std::vector<int> hits(size_t(n), 0);
        pool.parallel_for(n, 7, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)] += 1;  // ranges are disjoint
        });
        for (int h : hits) wrong += h != 1;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPool, SizesAndGlobalPool) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(ThreadPool(0).num_threads(), hw);
  EXPECT_THROW(ThreadPool(-1), Error);
  const int want = knobs().threads == 0 ? hw : knobs().threads;
  EXPECT_EQ(global_pool().num_threads(), want);
  EXPECT_EQ(&global_pool(), &global_pool());
  std::atomic<int64_t> n{0};
  global_pool().parallel_for(10000, 16, [&](int64_t b, int64_t e) { n += e - b; });
  EXPECT_EQ(n.load(), 10000);
}

}  // namespace
}  // namespace deepinfer
