// Every collective of the `local` backend at world sizes 1..64, sizes {0, 1, odd, >= 1 MiB},
// checked against closed forms / a serial host fold computed independently of the backend.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>

#include "comm/local/local_group.h"
#include "core/check.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using test::local_opts;
using test::mix;
using test::payload;

constexpr int kWorlds[] = {1, 2, 3, 4, 8, 16, 32, 64};
constexpr size_t kOdd = 1237;
constexpr size_t kMiB = size_t(1) << 20;

// Element counts to test at world size n for elements of `es` bytes: 0, 1, odd, and a
// per-rank block such that the output is >= 1 MiB for small worlds.
std::vector<size_t> counts_for(int n, size_t es) {
  std::vector<size_t> c{0, 1, kOdd};
  if (n <= 4) c.push_back(kMiB / es / size_t(n) + 3);
  return c;
}

// Collects failures from rank threads; gtest assertions are thread-safe but we also want a
// per-rank count so one broken rank does not print a million lines.
struct Mismatches {
  std::atomic<size_t> n{0};
  std::mutex mu;
  std::string first;
  void add(std::string what) {
    if (n++ == 0) {
      std::lock_guard l(mu);
      first = std::move(what);
    }
  }
  ::testing::AssertionResult none() const {
    if (n.load() == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << n.load() << " mismatches, first: " << first;
  }
};

class LocalWorldSize : public ::testing::TestWithParam<int> {};

TEST_P(LocalWorldSize, AllGather) {
  const int n = GetParam();
  for (DType dt : {DType::u8, DType::i32, DType::i64}) {
    const size_t es = dtype_size(dt);
    for (size_t count : counts_for(n, es)) {
      Mismatches bad;
      run_ranks(local_opts(n), [&](Group& g) {
        auto send = payload(count, es, uint64_t(g.rank()), 1);
        std::vector<std::byte> recv(count * es * size_t(n), std::byte{0xAB});
        g.all_gather(send.data(), recv.data(), count, dt);
        for (int r = 0; r < n; ++r)
          if (count && std::memcmp(recv.data() + size_t(r) * count * es,
                                   payload(count, es, uint64_t(r), 1).data(), count * es) != 0)
            bad.add(
                fmt::format("rank {} block {} count {} {}", g.rank(), r, count, dtype_name(dt)));
      });
      EXPECT_TRUE(bad.none());
    }
  }
}

TEST_P(LocalWorldSize, ExposeReadsEveryRanksRegions) {
  std::atomic<int> bad{0};
  run_ranks(local_opts(GetParam()), [&](Group& g) {
    if (g.peer_memory() != PeerMemory::address_space) bad += 1000;
    int staged = 0;
    bad += test::expose_mismatches(g, &staged);
    bad += 100 * staged;  // nothing to stage: local exposes regions where they are
  });
  EXPECT_EQ(bad.load(), 0);
}

// Peers write the regions themselves; the group's default (the capabilities wrapper's way) too.
TEST_P(LocalWorldSize, ExposeWritableLandsInEveryRanksRegions) {
  std::atomic<int> bad{0};
  run_ranks(local_opts(GetParam()), [&](Group& g) { bad += test::expose_writable_mismatches(g); });
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(LocalWorldSize, AllGatherInPlace) {
  const int n = GetParam();
  Mismatches bad;
  run_ranks(local_opts(n), [&](Group& g) {
    const size_t count = kOdd;
    std::vector<int32_t> buf(count * size_t(n), -1);
    for (size_t i = 0; i < count; ++i)
      buf[size_t(g.rank()) * count + i] = int32_t(g.rank() * 100000 + int(i));
    g.all_gather(buf.data() + size_t(g.rank()) * count, buf.data(), count, DType::i32);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        if (buf[size_t(r) * count + i] != int32_t(r * 100000 + int(i)))
          bad.add(fmt::format("r{} [{}][{}]", g.rank(), r, i));
  });
  EXPECT_TRUE(bad.none());
}

TEST_P(LocalWorldSize, AllGatherV) {
  const int n = GetParam();
  for (size_t scale : {size_t(0), size_t(1), kOdd}) {
    // Rank r contributes (r % 3) * scale elements: includes empty contributions.
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[size_t(r)] = size_t(r % 3) * scale;
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      auto send = payload(counts[size_t(g.rank())], 8, uint64_t(g.rank()), 2);
      std::vector<std::byte> recv(total * 8);
      g.all_gather_v(send.data(), counts[size_t(g.rank())], recv.data(), counts, DType::i64);
      size_t off = 0;
      for (int r = 0; r < n; ++r) {
        const size_t c = counts[size_t(r)];
        if (c &&
            std::memcmp(recv.data() + off * 8, payload(c, 8, uint64_t(r), 2).data(), c * 8) != 0)
          bad.add(fmt::format("rank {} block {}", g.rank(), r));
        off += c;
      }
    });
    EXPECT_TRUE(bad.none());
  }
}

// Integer reductions: closed forms.
TEST_P(LocalWorldSize, AllReduceIntegerClosedForm) {
  const int n = GetParam();
  for (size_t count : counts_for(n, 4)) {
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      const int64_t r = g.rank();
      std::vector<int32_t> sum(count), mx(count), mn(count);
      std::vector<int64_t> sum64(count);
      for (size_t i = 0; i < count; ++i) {
        const int64_t k = int64_t(i % 13);
        sum[i] = int32_t((r + 1) * k - 5);
        mx[i] = int32_t((r * 7 + int64_t(i)) % n) - 1000;
        mn[i] = int32_t((r * 7 + int64_t(i)) % n) + 1000;
        sum64[i] = (r + 1) * (int64_t(1) << 40) + int64_t(i);
      }
      g.all_reduce(sum.data(), count, DType::i32, ReduceOp::sum);
      g.all_reduce(mx.data(), count, DType::i32, ReduceOp::max);
      g.all_reduce(mn.data(), count, DType::i32, ReduceOp::min);
      g.all_reduce(sum64.data(), count, DType::i64, ReduceOp::sum);
      const int64_t tri = int64_t(n) * (n + 1) / 2;
      for (size_t i = 0; i < count; ++i) {
        // (r*7 + i) % n over all r covers the max n-1 whenever gcd(7, n) == 1 (true for our n).
        if (sum[i] != int32_t(int64_t(i % 13) * tri - 5 * n) || mx[i] != n - 1 - 1000 ||
            mn[i] != 1000 || sum64[i] != tri * (int64_t(1) << 40) + int64_t(n) * int64_t(i)) {
          bad.add(fmt::format("rank {} i {}: sum {} max {} min {} sum64 {}", r, i, sum[i], mx[i],
                              mn[i], sum64[i]));
          break;
        }
      }
    });
    EXPECT_TRUE(bad.none());
  }
}

// Float reductions: exact closed form on representable values, and bit-identical to a serial
// ascending-rank fold on values that round.
TEST_P(LocalWorldSize, AllReduceFloat) {
  const int n = GetParam();
  for (size_t count : counts_for(n, 8)) {
    Mismatches bad;
    std::vector<std::vector<float>> seen(static_cast<size_t>(n));
    run_ranks(local_opts(n), [&](Group& g) {
      const int r = g.rank();
      std::vector<float> exact(count), rounding(count), mx(count);
      std::vector<double> d(count), dmin(count);
      for (size_t i = 0; i < count; ++i) {
        exact[i] = 0.5f * float(r + 1) * float(i % 17 + 1);
        rounding[i] = 0.1f * float(r + 1) + 1e-3f * float(i % 101);
        mx[i] = std::ldexp(float(int(mix(uint64_t(r), i) % 2001) - 1000), -3);
        d[i] = double(r + 1) * 0.25 + double(i);
        dmin[i] = -double((r * 5 + int(i)) % n);
      }
      g.all_reduce(exact.data(), count, DType::f32, ReduceOp::sum);
      g.all_reduce(rounding.data(), count, DType::f32, ReduceOp::sum);
      g.all_reduce(mx.data(), count, DType::f32, ReduceOp::max);
      g.all_reduce(d.data(), count, DType::f64, ReduceOp::sum);
      g.all_reduce(dmin.data(), count, DType::f64, ReduceOp::min);
      const float tri = float(n) * float(n + 1) / 2;
      for (size_t i = 0; i < count; ++i) {
        float fold = 0.1f * 1.0f + 1e-3f * float(i % 101);  // serial ascending-rank fold
        float fmx = std::ldexp(float(int(mix(0, i) % 2001) - 1000), -3);
        for (int q = 1; q < n; ++q) {
          fold += 0.1f * float(q + 1) + 1e-3f * float(i % 101);
          fmx = std::max(fmx, std::ldexp(float(int(mix(uint64_t(q), i) % 2001) - 1000), -3));
        }
        const bool ok = exact[i] == 0.5f * tri * float(i % 17 + 1) &&
                        std::memcmp(&rounding[i], &fold, 4) == 0 && mx[i] == fmx &&
                        d[i] == 0.25 * double(tri) + double(n) * double(i) &&
                        dmin[i] == -double(n - 1);
        if (!ok) {
          bad.add(fmt::format(
              "rank {} i {}: exact {} rounding {} (fold {}) max {} (want {}) d {} dmin {}", r, i,
              exact[i], rounding[i], fold, mx[i], fmx, d[i], dmin[i]));
          break;
        }
      }
    });
    EXPECT_TRUE(bad.none());
  }
}

TEST_P(LocalWorldSize, ReduceScatter) {
  const int n = GetParam();
  for (size_t count : counts_for(n, 4 * size_t(n))) {
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      const int r = g.rank();
      std::vector<float> send(count * size_t(n)), recv(count, -1.0f);
      for (int b = 0; b < n; ++b)
        for (size_t i = 0; i < count; ++i)
          send[size_t(b) * count + i] = float(r + 1) * 0.3f + float(b) + 1e-2f * float(i % 97);
      g.reduce_scatter(send.data(), recv.data(), count);
      const int b = r;  // my block
      for (size_t i = 0; i < count; ++i) {
        float fold = 0.3f + float(b) + 1e-2f * float(i % 97);
        for (int q = 1; q < n; ++q) fold += float(q + 1) * 0.3f + float(b) + 1e-2f * float(i % 97);
        if (std::memcmp(&fold, &recv[i], 4) != 0) {
          bad.add(fmt::format("rank {} i {}: {} want {}", r, i, recv[i], fold));
          break;
        }
      }
    });
    EXPECT_TRUE(bad.none());
  }
}

TEST_P(LocalWorldSize, AllToAll) {
  const int n = GetParam();
  for (size_t count : counts_for(n, 2 * size_t(n))) {
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      const int me = g.rank();
      std::vector<std::byte> send(count * 2 * size_t(n)), recv(count * 2 * size_t(n));
      for (int j = 0; j < n; ++j)
        test::fill_payload(send.data() + size_t(j) * count * 2, count, 2, uint64_t(me),
                           uint64_t(j));
      g.all_to_all(send.data(), recv.data(), count, DType::bf16);
      for (int r = 0; r < n; ++r)
        if (count &&
            std::memcmp(recv.data() + size_t(r) * count * 2,
                        payload(count, 2, uint64_t(r), uint64_t(me)).data(), count * 2) != 0)
          bad.add(fmt::format("rank {} block from {}", me, r));
    });
    EXPECT_TRUE(bad.none());
  }
}

// c(i -> j) elements: uneven, with empty pairs.
size_t split(int i, int j, size_t scale) { return size_t((i + 2 * j) % 4) * scale; }

TEST_P(LocalWorldSize, AllToAllV) {
  const int n = GetParam();
  std::vector<size_t> scales{0, 1, kOdd};
  if (n <= 4) scales.push_back(kMiB / 4 / 4);
  for (size_t scale : scales) {
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      const int me = g.rank();
      std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) {
        sc[size_t(j)] = split(me, j, scale);
        rc[size_t(j)] = split(j, me, scale);
        st += sc[size_t(j)];
        rt += rc[size_t(j)];
      }
      std::vector<std::byte> send(st * 4), recv(rt * 4);
      size_t off = 0;
      for (int j = 0; j < n; ++j) {
        test::fill_payload(send.data() + off * 4, sc[size_t(j)], 4, uint64_t(me), uint64_t(j));
        off += sc[size_t(j)];
      }
      g.all_to_all_v(send.data(), sc, recv.data(), rc, DType::i32);
      off = 0;
      for (int r = 0; r < n; ++r) {
        const size_t c = rc[size_t(r)];
        if (c && std::memcmp(recv.data() + off * 4, payload(c, 4, uint64_t(r), uint64_t(me)).data(),
                             c * 4) != 0)
          bad.add(fmt::format("rank {} block from {} scale {}", me, r, scale));
        off += c;
      }
    });
    EXPECT_TRUE(bad.none());
  }
}

TEST_P(LocalWorldSize, Broadcast) {
  const int n = GetParam();
  for (size_t count : counts_for(n, 8)) {
    for (int root : {0, n - 1, n / 2}) {
      Mismatches bad;
      run_ranks(local_opts(n), [&](Group& g) {
        auto buf = g.rank() == root ? payload(count, 8, 99, uint64_t(root))
                                    : std::vector<std::byte>(count * 8);
        g.broadcast(buf.data(), count, DType::f64, root);
        if (buf != payload(count, 8, 99, uint64_t(root)))
          bad.add(fmt::format("rank {} root {}", g.rank(), root));
      });
      EXPECT_TRUE(bad.none());
    }
  }
}

TEST_P(LocalWorldSize, BarrierOrdersPhases) {
  const int n = GetParam();
  std::atomic<int> arrived{0};
  Mismatches bad;
  run_ranks(local_opts(n), [&](Group& g) {
    for (int round = 1; round <= 3; ++round) {
      if (g.rank() == n - 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a late rank
      arrived++;
      g.barrier();
      if (arrived.load() < round * n)
        bad.add(fmt::format("rank {} left barrier {} early", g.rank(), round));
      g.barrier();  // nobody starts the next round before everyone checked
    }
  });
  EXPECT_TRUE(bad.none());
}

// Many back-to-back calls of mixed ops: exercises the double-buffered slots and scratch reuse.
TEST_P(LocalWorldSize, MixedSequence) {
  const int n = GetParam();
  Mismatches bad;
  run_ranks(local_opts(n), [&](Group& g) {
    for (int it = 0; it < 20; ++it) {
      const size_t count = size_t(it % 5) * 37;
      std::vector<int64_t> v(count, g.rank() + it);
      g.all_reduce(v.data(), count, DType::i64, ReduceOp::sum);
      const int64_t want = int64_t(n) * (n - 1) / 2 + int64_t(n) * it;
      for (int64_t x : v)
        if (x != want) bad.add(fmt::format("it {} rank {}: {} want {}", it, g.rank(), x, want));
      int32_t mine = g.rank() * 3 + it;
      std::vector<int32_t> all(static_cast<size_t>(n));
      g.all_gather(&mine, all.data(), 1, DType::i32);
      for (int r = 0; r < n; ++r)
        if (all[size_t(r)] != r * 3 + it)
          bad.add(fmt::format("it {} rank {} ag[{}]", it, g.rank(), r));
      if (it % 7 == 0) g.barrier();
    }
  });
  EXPECT_TRUE(bad.none());
}

// Small payloads travel inline and meet once: a rank may start call k+1 while a peer still reads
// call k. Thousands of back-to-back calls, each with new values, at the inline limit and one byte
// over it, on more rank threads than CPUs (so ranks are preempted mid-call), must never show a
// value from another call.
TEST(LocalGroup, BackToBackSmallCollectivesNeverMixCalls) {
  for (int n : {3, 8}) {
    Mismatches bad;
    run_ranks(local_opts(n), [&](Group& g) {
      const int me = g.rank();
      for (int it = 0; it < 1500; ++it) {
        const size_t bytes = it % 2 ? comm::kLocalInlineBytes : comm::kLocalInlineBytes + 8;
        const size_t count = bytes / 8;
        std::vector<int64_t> mine(count), all(count * size_t(n));
        for (size_t i = 0; i < count; ++i) mine[i] = int64_t(it) * 1000003 + me * 1009 + int64_t(i);
        g.all_gather(mine.data(), all.data(), count * 8, DType::u8);
        for (int r = 0; r < n; ++r)
          if (all[size_t(r) * count + count - 1] !=
              int64_t(it) * 1000003 + r * 1009 + int64_t(count - 1))
            bad.add(fmt::format("all_gather it {} rank {} block {}", it, me, r));
        std::vector<int64_t> sum(count, int64_t(it) + me);
        g.all_reduce(sum.data(), count, DType::i64, ReduceOp::sum);
        if (sum[0] != int64_t(n) * it + int64_t(n) * (n - 1) / 2 || sum[count - 1] != sum[0])
          bad.add(fmt::format("all_reduce it {} rank {}: {}", it, me, sum[0]));
        std::vector<int64_t> b(count, me == it % n ? int64_t(it) : -1);
        g.broadcast(b.data(), count, DType::i64, it % n);
        if (b[0] != it || b[count - 1] != it)
          bad.add(fmt::format("broadcast it {} rank {}: {}", it, me, b[0]));
      }
    });
    EXPECT_TRUE(bad.none()) << "world " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalWorldSize, ::testing::ValuesIn(kWorlds),
                         [](const auto& info) { return fmt::format("n{}", info.param); });

TEST(LocalGroup, ReportsRankSizeBackendCapabilities) {
  std::vector<int> ranks(5, -1);
  run_ranks(local_opts(5), [&](Group& g) {
    ranks[size_t(g.rank())] = g.rank();
    EXPECT_EQ(g.size(), 5);
    EXPECT_EQ(g.backend(), "local");
    const Capabilities c = g.capabilities();
    EXPECT_TRUE(c.all_to_all && c.all_to_all_v && c.ordered_reduce);
  });
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(LocalGroup, AllReduceRejectsUnsupportedDType) {
  EXPECT_THROW(run_ranks(local_opts(2),
                         [](Group& g) {
                           std::vector<std::byte> b(4);
                           g.all_reduce(b.data(), 2, DType::bf16, ReduceOp::sum);
                         }),
               Error);
}

TEST(LocalGroup, InvalidWorldIsAnError) {
  EXPECT_THROW(run_ranks(local_opts(0), [](Group&) {}), Error);
}

}  // namespace
}  // namespace deepinfer
