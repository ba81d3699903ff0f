// Deadlines, fail-fast, mismatch detection, run_ranks error propagation, and every injected
// fault of `faulty`, on the `local` backend (timeouts of 0.5 s keep this quick).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/common.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using test::local_opts;
using test::payload;
using Seconds = std::chrono::duration<double>;

constexpr double kTimeout = 0.5;
constexpr double kSlack = 1.5;  // scheduling noise on a loaded 2-core CI machine

double elapsed_since(std::chrono::steady_clock::time_point t0) {
  return Seconds(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn under run_ranks and returns the rethrown error's message (and its type in *timeout).
std::string run_expect_error(const LaunchOptions& o, const std::function<void(Group&)>& fn,
                             bool* timeout = nullptr) {
  try {
    run_ranks(o, fn);
  } catch (const CommTimeout& e) {
    if (timeout) *timeout = true;
    return e.what();
  } catch (const Error& e) {
    if (timeout) *timeout = false;
    return e.what();
  }
  ADD_FAILURE() << "run_ranks did not throw";
  return {};
}

// Per-rank record of what each rank saw, for assertions after run_ranks returns.
struct RankLog {
  std::mutex mu;
  std::vector<std::string> messages;
  std::vector<double> seconds;
  std::atomic<int> timeouts{0};
  void add(std::string m, double s) {
    std::lock_guard l(mu);
    messages.push_back(std::move(m));
    seconds.push_back(s);
  }
};

TEST(LocalDeadline, RankThatSkipsACollectiveGivesCommTimeout) {
  // Rank 3 never enters the all_gather (it is "hung" for longer than the deadline).
  RankLog log;
  const auto t0 = std::chrono::steady_clock::now();
  bool is_timeout = false;
  const std::string msg = run_expect_error(
      local_opts(4, kTimeout),
      [&](Group& g) {
        if (g.rank() == 3) {
          std::this_thread::sleep_for(Seconds(kTimeout * 3));
          return;
        }
        std::vector<int32_t> send(1000, 1), recv(4000);
        try {
          g.all_gather(send.data(), recv.data(), 1000, DType::i32);
        } catch (const CommTimeout& e) {
          log.timeouts++;
          log.add(e.what(), elapsed_since(t0));
          throw;
        }
      },
      &is_timeout);
  EXPECT_TRUE(is_timeout);
  EXPECT_EQ(log.timeouts.load(), 3);
  for (double s : log.seconds) {
    EXPECT_GE(s, kTimeout * 0.9);
    EXPECT_LT(s, kTimeout + kSlack);
  }
  // The root timeout names op, rank, size and bytes, and says what to do.
  EXPECT_NE(msg.find("all_gather timed out after 0.5 s on rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of 4 (4000 bytes sent)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DEEPINFER_COMM_TIMEOUT_S"), std::string::npos) << msg;
}

TEST(LocalDeadline, RankThatReturnsEarlyFailsPeersFast) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = run_expect_error(local_opts(3, 30.0), [&](Group& g) {
    if (g.rank() == 0) return;  // makes one call fewer than its peers
    g.barrier();
  });
  EXPECT_LT(elapsed_since(t0), 5.0) << "peers waited for the deadline instead of failing fast";
  EXPECT_NE(msg.find("rank 0 already returned"), std::string::npos) << msg;
}

TEST(LocalDeadline, FailedRankBreaksTheWorldAndRootCauseIsRethrown) {
  const auto t0 = std::chrono::steady_clock::now();
  bool is_timeout = true;
  const std::string msg = run_expect_error(
      local_opts(8, 30.0),
      [&](Group& g) {
        g.barrier();
        if (g.rank() == 5) throw Error("rank five broke");
        std::vector<float> v(100, 1.0f);
        g.all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
      },
      &is_timeout);
  EXPECT_LT(elapsed_since(t0), 5.0);
  EXPECT_FALSE(is_timeout) << "the consequent CommTimeouts must not hide the root cause";
  EXPECT_EQ(msg, "rank five broke");
}

TEST(LocalDeadline, BrokenWorldFailsLaterCollectivesImmediately) {
  RankLog log;
  run_expect_error(local_opts(4, kTimeout), [&](Group& g) {
    try {
      if (g.rank() != 0) g.barrier();  // rank 0 is late for it: the others time out
    } catch (const CommTimeout&) {
    }
    if (g.rank() == 0) std::this_thread::sleep_for(Seconds(kTimeout * 2));
    const auto t1 = std::chrono::steady_clock::now();
    try {
      g.barrier();
    } catch (const CommTimeout& e) {
      log.add(e.what(), elapsed_since(t1));
      throw;
    }
  });
  ASSERT_EQ(log.seconds.size(), 4u);
  for (double s : log.seconds) EXPECT_LT(s, 0.2);  // no second full deadline
}

// A rank whose barrier after an expose times out must not unwind (freeing its regions) while a
// slow peer still reads them: it holds until that peer reaches a meeting. The fast ranks here
// overwrite their region the moment their barrier throws, as reusing freed memory would; the slow
// rank reads only after their deadline and must still find every region intact. (Without the
// hold, the asan stage saw this as a heap-use-after-free in ExposeReadsEveryRanksRegions/n64.)
TEST(LocalDeadline, TimedOutRankKeepsExposedRegionsUntilPeersStopReading) {
  constexpr int kWorld = 3;
  constexpr size_t kBytes = 4096;
  std::atomic<int> wrong{0}, timeouts{0}, threw_before_read{0};
  std::atomic<bool> read_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  bool is_timeout = false;
  const std::string msg = run_expect_error(
      local_opts(kWorld, kTimeout),
      [&](Group& g) {
        auto mine = payload(kBytes, 1, 7, uint64_t(g.rank()));
        std::vector<const std::byte*> peers;
        g.expose(std::array{std::span<const std::byte>(mine)}, peers);
        const bool slow = g.rank() == kWorld - 1;
        if (slow) {
          std::this_thread::sleep_for(Seconds(kTimeout * 3));  // past the peers' deadline
          for (int r = 0; r < kWorld; ++r)
            if (std::memcmp(peers[size_t(r)], payload(kBytes, 1, 7, uint64_t(r)).data(), kBytes))
              wrong++;
          read_done = true;
        }
        try {
          g.barrier();
        } catch (const CommTimeout&) {
          if (!slow) {
            timeouts++;
            if (!read_done) threw_before_read++;
          }
          std::fill(mine.begin(), mine.end(), std::byte{0xEE});
          throw;
        }
      },
      &is_timeout);
  EXPECT_TRUE(is_timeout) << msg;
  EXPECT_NE(msg.find("barrier timed out after 0.5 s"), std::string::npos) << msg;
  EXPECT_EQ(timeouts.load(), kWorld - 1);
  EXPECT_EQ(threw_before_read.load(), 0) << "a rank unwound while a peer still read its region";
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LT(elapsed_since(t0), kTimeout * 3 + kSlack) << "held longer than the slow peer's reads";
}

TEST(LocalMismatch, DifferentOpsAreAnErrorNamingBoth) {
  const std::string msg = run_expect_error(local_opts(2, 10.0), [](Group& g) {
    int32_t x[2] = {};
    if (g.rank() == 0)
      g.all_gather(x, x, 1, DType::i32);
    else
      g.barrier();
  });
  EXPECT_NE(msg.find("rank 0 called all_gather(count 1, i32) but rank 1 called barrier()"),
            std::string::npos)
      << msg;
}

TEST(LocalMismatch, DifferentCountsAreAnError) {
  const std::string msg = run_expect_error(local_opts(3, 10.0), [](Group& g) {
    std::vector<float> v(10);
    g.all_reduce(v.data(), g.rank() == 2 ? 7 : 10, DType::f32, ReduceOp::sum);
  });
  EXPECT_NE(msg.find("rank 2 called all_reduce(count 7, f32, sum)"), std::string::npos) << msg;
}

TEST(LocalMismatch, InconsistentAllToAllVCountsAreAnError) {
  const std::string msg = run_expect_error(local_opts(2, 10.0), [](Group& g) {
    std::vector<size_t> sc{1, 2}, rc{1, 2};
    if (g.rank() == 1) rc = {3, 1};  // rank 0 sends 2 to rank 1, rank 1 expects 3
    std::vector<int32_t> s(8), r(8);
    g.all_to_all_v(s.data(), sc, r.data(), rc, DType::i32);
  });
  EXPECT_NE(msg.find("rank 0 sends 2 elements to rank 1, but rank 1 expects 3 from rank 0"),
            std::string::npos)
      << msg;
}

TEST(LocalMismatch, WorldStaysUsableAfterAMismatch) {
  // Every rank sees the same mismatch and throws, so the world is still consistent.
  std::atomic<int> ok{0};
  run_ranks(local_opts(4, 10.0), [&](Group& g) {
    std::vector<int64_t> v(4, 1);
    try {
      g.all_reduce(v.data(), g.rank() == 1 ? 3 : 4, DType::i64, ReduceOp::sum);
      ADD_FAILURE() << "mismatch not detected";
    } catch (const CommTimeout&) {
      ADD_FAILURE() << "a mismatch is an Error, not a timeout";
    } catch (const Error&) {
    }
    v.assign(4, 1);
    g.all_reduce(v.data(), 4, DType::i64, ReduceOp::sum);
    if (v == std::vector<int64_t>(4, 4)) ok++;
  });
  EXPECT_EQ(ok.load(), 4);
}

// ---------------------------------------------------------------------------------------
// Faults

TEST(Faulty, UnknownFaultListsTheKnownOnes) {
  const std::string msg = run_expect_error(local_opts(2, 10.0, "no-such-fault"), [](Group&) {});
  for (const auto& [name, help] : fault_names())
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_EQ(fault_names().size(), 4u);
}

TEST(Faulty, BackendNameAndCapabilities) {
  run_ranks(local_opts(2, 10.0, "a2av-hang"), [](Group& g) {
    EXPECT_EQ(g.backend(), "faulty(a2av-hang)/local");
    EXPECT_FALSE(g.capabilities().all_to_all_v);
    EXPECT_TRUE(g.capabilities().all_to_all);
  });
  run_ranks(local_opts(2, 10.0, "a2a-diverge"),
            [](Group& g) { EXPECT_FALSE(g.capabilities().all_to_all_v); });
  run_ranks(local_opts(2, 10.0, "int32-ag-corrupt"),
            [](Group& g) { EXPECT_TRUE(g.capabilities().all_to_all_v); });
}

// all_gather of i32 values near ±2^31: returns the number of wrong elements seen by rank 0.
size_t ag_i32_wrong(int world, size_t count, const std::string& fault, DType dtype = DType::i32) {
  std::atomic<size_t> wrong{0};
  run_ranks(local_opts(world, 20.0, fault), [&](Group& g) {
    auto value = [](int r, size_t i) {
      return int32_t(0x7FFF0001 - int64_t(r) * 7919 - int64_t(i) * 3) * (i % 2 ? 1 : -1);
    };
    std::vector<int32_t> send(count), recv(count * size_t(world));
    for (size_t i = 0; i < count; ++i) send[i] = value(g.rank(), i);
    g.all_gather(send.data(), recv.data(), count, dtype);
    if (g.rank() != 0) return;
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < count; ++i)
        if (recv[size_t(r) * count + i] != value(r, i)) wrong++;
  });
  return wrong.load();
}

TEST(Faulty, Int32AllGatherCorruptFiresOnlyWhereSpecified) {
  // 16 ranks x 16384 i32 = 1 MiB output: corrupted (every value here has |v| >= 2^24).
  EXPECT_GT(ag_i32_wrong(16, 16384, "int32-ag-corrupt"), 16384u * 8);
  EXPECT_EQ(ag_i32_wrong(16, 16384, ""), 0u);                              // the healthy backend
  EXPECT_EQ(ag_i32_wrong(8, 32768, "int32-ag-corrupt"), 0u);               // too few ranks
  EXPECT_EQ(ag_i32_wrong(16, 1000, "int32-ag-corrupt"), 0u);               // too small
  EXPECT_EQ(ag_i32_wrong(16, 16384, "int32-ag-corrupt", DType::f32), 0u);  // not i32
}

TEST(Faulty, Int32CorruptionKeepsSmallValues) {
  std::atomic<size_t> wrong_small{0}, wrong_large{0};
  run_ranks(local_opts(16, 20.0, "int32-ag-corrupt"), [&](Group& g) {
    const size_t count = 16384;
    std::vector<int32_t> send(count), recv(count * 16);
    for (size_t i = 0; i < count; ++i)
      send[i] = i % 2 ? int32_t(i) : int32_t((1 << 24) + 2 * int(i) + 1);
    g.all_gather(send.data(), recv.data(), count, DType::i32);
    for (size_t k = 0; k < recv.size(); ++k) {
      const size_t i = k % count;
      const int32_t want = i % 2 ? int32_t(i) : int32_t((1 << 24) + 2 * int(i) + 1);
      if (recv[k] != want) (i % 2 ? wrong_small : wrong_large)++;
      // Corrupted values are exactly what a float round trip gives.
      if (i % 2 == 0 && recv[k] != int32_t(float(want)))
        ADD_FAILURE() << "not a float round trip at " << k;
    }
  });
  EXPECT_EQ(wrong_small.load(), 0u);
  EXPECT_GT(wrong_large.load(), 0u);
}

TEST(Faulty, A2avHangTimesOutEveryRankWithinTheDeadline) {
  RankLog log;
  const auto t0 = std::chrono::steady_clock::now();
  bool is_timeout = false;
  const std::string msg = run_expect_error(
      local_opts(4, kTimeout, "a2av-hang"),
      [&](Group& g) {
        // Even splits work.
        std::vector<size_t> even(4, 2), uneven{1, 2, 3, size_t(g.rank())};
        std::vector<int32_t> s(16), r(16);
        g.all_to_all_v(s.data(), even, r.data(), even, DType::i32);
        std::vector<size_t> rc(4);
        for (int j = 0; j < 4; ++j)
          rc[size_t(j)] = j == 3 ? size_t(g.rank()) : size_t(g.rank() + 1);
        // uneven: rank i sends (j+1) to j < 3 and i to rank 3; rank j receives accordingly.
        for (int j = 0; j < 4; ++j) uneven[size_t(j)] = j == 3 ? size_t(g.rank()) : size_t(j + 1);
        for (int i = 0; i < 4; ++i)
          rc[size_t(i)] = g.rank() == 3 ? size_t(i) : size_t(g.rank() + 1);
        try {
          g.all_to_all_v(s.data(), uneven, r.data(), rc, DType::i32);
        } catch (const CommTimeout& e) {
          log.add(e.what(), elapsed_since(t0));
          throw;
        }
        ADD_FAILURE() << "rank " << g.rank() << " completed the hung all_to_all_v";
      },
      &is_timeout);
  EXPECT_TRUE(is_timeout);
  EXPECT_NE(msg.find("all_to_all_v timed out"), std::string::npos) << msg;
  ASSERT_EQ(log.seconds.size(), 4u);
  for (double s : log.seconds) EXPECT_LT(s, kTimeout + kSlack);
}

TEST(Faulty, A2avHangNeedsFourRanks) {
  run_ranks(local_opts(3, 5.0, "a2av-hang"), [&](Group& g) {
    std::vector<size_t> sc(3), rc(3);
    for (int j = 0; j < 3; ++j) {
      sc[size_t(j)] = size_t(j + 1);
      rc[size_t(j)] = size_t(g.rank() + 1);
    }
    std::vector<int32_t> s(6), r(9);
    g.all_to_all_v(s.data(), sc, r.data(), rc, DType::i32);
  });
}

// Sender-dependent splits: rank r sends r+1 elements to everyone (locally even) but receives
// j+1 from rank j (uneven). Returns wrong elements over all ranks.
size_t a2a_sender_splits_wrong(int n, const std::string& fault) {
  std::atomic<size_t> wrong{0};
  run_ranks(local_opts(n, 10.0, fault), [&](Group& g) {
    const int me = g.rank();
    std::vector<size_t> sc(static_cast<size_t>(n), size_t(me + 1)), rc(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) rc[size_t(j)] = size_t(j + 1);
    const size_t rt = std::accumulate(rc.begin(), rc.end(), size_t(0));
    std::vector<int64_t> send(size_t(n) * size_t(me + 1)), recv(rt, -1);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k <= me; ++k)
        send[size_t(j) * size_t(me + 1) + size_t(k)] = me * 1000000 + j * 1000 + k;
    g.all_to_all_v(send.data(), sc, recv.data(), rc, DType::i64);
    size_t off = 0;
    for (int j = 0; j < n; ++j)
      for (int k = 0; k <= j; ++k)
        if (recv[off++] != j * 1000000 + me * 1000 + k) wrong++;
  });
  return wrong.load();
}

TEST(Faulty, A2aDivergeMisroutesWhenLocalSplitsMislead) {
  EXPECT_EQ(a2a_sender_splits_wrong(4, ""), 0u);
  EXPECT_GT(a2a_sender_splits_wrong(4, "a2a-diverge"), 0u);
  EXPECT_GT(a2a_sender_splits_wrong(3, "a2a-diverge"), 0u);
}

TEST(Faulty, A2aDivergeIsHarmlessOnEvenSplits) {
  std::atomic<size_t> wrong{0};
  run_ranks(local_opts(4, 10.0, "a2a-diverge"), [&](Group& g) {
    std::vector<size_t> c(4, 3);
    std::vector<int32_t> s(12), r(12);
    for (int i = 0; i < 12; ++i) s[size_t(i)] = g.rank() * 100 + i;
    g.all_to_all_v(s.data(), c, r.data(), c, DType::i32);
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k)
        if (r[size_t(j * 3 + k)] != j * 100 + g.rank() * 3 + k) wrong++;
  });
  EXPECT_EQ(wrong.load(), 0u);
}

TEST(Faulty, RankExitMakesPeersTimeOut) {
  RankLog log;
  std::atomic<int> first_call_done{0};
  const auto t0 = std::chrono::steady_clock::now();
  bool is_timeout = false;
  const std::string msg = run_expect_error(
      local_opts(4, kTimeout, "rank-exit"),
      [&](Group& g) {
        g.barrier();  // call 0 succeeds
        first_call_done++;
        std::vector<int32_t> s(10, g.rank()), r(40);
        try {
          g.all_gather(s.data(), r.data(), 10, DType::i32);  // call 1: rank 3 dies in it
        } catch (const CommTimeout& e) {
          log.add(e.what(), elapsed_since(t0));
          throw;
        }
        ADD_FAILURE() << "rank " << g.rank() << " finished the collective its peer died in";
      },
      &is_timeout);
  EXPECT_EQ(first_call_done.load(), 4);
  EXPECT_TRUE(is_timeout) << msg;
  EXPECT_NE(msg.find("all_gather timed out after 0.5 s"), std::string::npos) << msg;
  ASSERT_EQ(log.seconds.size(), 3u);  // ranks 0..2; rank 3 is dead
  for (double s : log.seconds) {
    EXPECT_GE(s, kTimeout * 0.9);
    EXPECT_LT(s, kTimeout + kSlack);
  }
}

TEST(Faulty, RankExitAloneIsReported) {
  const std::string msg = run_expect_error(local_opts(1, kTimeout, "rank-exit"), [](Group& g) {
    g.barrier();
    g.barrier();
  });
  EXPECT_NE(msg.find("rank 0 of 1 dies in the middle of barrier"), std::string::npos) << msg;
}

}  // namespace
}  // namespace deepinfer
