// The `mpi` backend, run by ctest under `mpirun -np N --oversubscribe`: every op against the
// same closed forms as the local tests, plus the > INT_MAX paths (derived datatypes, chunking,
// point-to-point) exercised with small buffers by lowering the count limit.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "comm/mpi/mpi_group.h"
#include "comm/platform.h"
#include "core/check.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using test::payload;

LaunchOptions mpi_opts() {
  LaunchOptions o;
  o.comm = CommKind::mpi;
  o.world = 0;  // whatever mpirun started
  o.timeout_s = 60;
  return o;
}

constexpr size_t kOdd = 1237;
constexpr size_t kMiB = size_t(1) << 20;

// Runs every op once with `count`-sized payloads and checks the results on this rank.
void check_all_ops(Group& g, size_t count) {
  const int n = g.size(), me = g.rank();
  SCOPED_TRACE(fmt::format("rank {} of {}, count {}", me, n, count));
  {  // all_gather, bytes of i64
    auto send = payload(count, 8, uint64_t(me), 1);
    std::vector<std::byte> recv(count * 8 * size_t(n));
    g.all_gather(send.data(), recv.data(), count, DType::i64);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(std::equal(recv.begin() + std::ptrdiff_t(size_t(r) * count * 8),
                             recv.begin() + std::ptrdiff_t(size_t(r + 1) * count * 8),
                             payload(count, 8, uint64_t(r), 1).begin()))
          << "all_gather block " << r;
  }
  {  // all_gather in place
    std::vector<int32_t> buf(count * size_t(n), -1);
    for (size_t i = 0; i < count; ++i) buf[size_t(me) * count + i] = me * 7 + int(i);
    g.all_gather(buf.data() + size_t(me) * count, buf.data(), count, DType::i32);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[size_t(r) * count + i], r * 7 + int(i));
  }
  {  // all_gather_v with empty contributions
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[size_t(r)] = size_t(r % 3) * count;
    auto send = payload(counts[size_t(me)], 4, uint64_t(me), 2);
    std::vector<std::byte> recv(std::accumulate(counts.begin(), counts.end(), size_t(0)) * 4);
    g.all_gather_v(send.data(), counts[size_t(me)], recv.data(), counts, DType::i32);
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      const auto want = payload(counts[size_t(r)], 4, uint64_t(r), 2);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + std::ptrdiff_t(off * 4)))
          << "all_gather_v block " << r;
      off += counts[size_t(r)];
    }
  }
  {  // all_reduce: integer closed forms, exact float sums, f64 min
    std::vector<int32_t> s32(count), mx(count);
    std::vector<int64_t> s64(count);
    std::vector<float> f(count);
    std::vector<double> dmin(count);
    for (size_t i = 0; i < count; ++i) {
      s32[i] = int32_t((me + 1) * int(i % 13) - 5);
      mx[i] = int32_t((me * 7 + int(i)) % n);
      s64[i] = int64_t(me + 1) << 40;
      f[i] = 0.5f * float(me + 1) * float(i % 17 + 1);
      dmin[i] = -double((me * 5 + int(i)) % n);
    }
    g.all_reduce(s32.data(), count, DType::i32, ReduceOp::sum);
    g.all_reduce(mx.data(), count, DType::i32, ReduceOp::max);
    g.all_reduce(s64.data(), count, DType::i64, ReduceOp::sum);
    g.all_reduce(f.data(), count, DType::f32, ReduceOp::sum);
    g.all_reduce(dmin.data(), count, DType::f64, ReduceOp::min);
    const int64_t tri = int64_t(n) * (n + 1) / 2;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(s32[i], int32_t(int64_t(i % 13) * tri - 5 * n)) << i;
      ASSERT_EQ(mx[i], n - 1) << i;
      ASSERT_EQ(s64[i], tri << 40) << i;
      ASSERT_EQ(f[i], 0.5f * float(tri) * float(i % 17 + 1)) << i;
      ASSERT_EQ(dmin[i], -double(n - 1)) << i;
    }
  }
  {  // reduce_scatter: exactly summable values (any addition order gives them)
    std::vector<float> send(count * size_t(n)), recv(count, -1);
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < count; ++i)
        send[size_t(b) * count + i] = float(me + 1) + float(b) * 64 + float(i % 29);
    g.reduce_scatter(send.data(), recv.data(), count);
    const float tri = float(n) * float(n + 1) / 2;
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[i], tri + float(n) * (float(me) * 64 + float(i % 29))) << i;
  }
  {  // all_to_all
    std::vector<std::byte> send(count * 2 * size_t(n)), recv(count * 2 * size_t(n));
    for (int j = 0; j < n; ++j)
      test::fill_payload(send.data() + size_t(j) * count * 2, count, 2, uint64_t(me), uint64_t(j));
    g.all_to_all(send.data(), recv.data(), count, DType::bf16);
    for (int r = 0; r < n; ++r) {
      const auto want = payload(count, 2, uint64_t(r), uint64_t(me));
      EXPECT_TRUE(std::equal(want.begin(), want.end(),
                             recv.begin() + std::ptrdiff_t(size_t(r) * count * 2)))
          << "a2a from " << r;
    }
  }
  {  // all_to_all_v: uneven with empty pairs
    auto split = [&](int i, int j) { return size_t((i + 2 * j) % 4) * count; };
    std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      sc[size_t(j)] = split(me, j);
      rc[size_t(j)] = split(j, me);
    }
    std::vector<std::byte> send(std::accumulate(sc.begin(), sc.end(), size_t(0)) * 4);
    std::vector<std::byte> recv(std::accumulate(rc.begin(), rc.end(), size_t(0)) * 4);
    size_t off = 0;
    for (int j = 0; j < n; ++j) {
      test::fill_payload(send.data() + off * 4, sc[size_t(j)], 4, uint64_t(me), uint64_t(j));
      off += sc[size_t(j)];
    }
    g.all_to_all_v(send.data(), sc, recv.data(), rc, DType::i32);
    off = 0;
    for (int r = 0; r < n; ++r) {
      const auto want = payload(rc[size_t(r)], 4, uint64_t(r), uint64_t(me));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + std::ptrdiff_t(off * 4)))
          << "a2av from " << r;
      off += rc[size_t(r)];
    }
  }
  {  // all_to_all_v_rows: 12-byte rows picked in reversed order from a base; same splits as above
    auto split = [&](int i, int j) { return size_t((i + 2 * j) % 4) * count; };
    constexpr size_t kRow = 12;
    std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0);
    std::vector<size_t> rr(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      offsets[size_t(j) + 1] = offsets[size_t(j)] + int64_t(split(me, j));
      rr[size_t(j)] = split(j, me);
    }
    const size_t rows_out = size_t(offsets.back());
    std::vector<std::byte> packed(rows_out * kRow), base(rows_out * kRow + kRow);
    for (int j = 0; j < n; ++j)
      test::fill_payload(packed.data() + size_t(offsets[size_t(j)]) * kRow, split(me, j) * kRow, 1,
                         uint64_t(me), uint64_t(j) + 100);
    std::vector<int64_t> rows(rows_out);
    for (size_t q = 0; q < rows_out; ++q) {
      rows[q] = int64_t(rows_out - q);  // base row 0 is never sent
      std::memcpy(base.data() + size_t(rows[q]) * kRow, packed.data() + q * kRow, kRow);
    }
    std::vector<std::byte> recv(std::accumulate(rr.begin(), rr.end(), size_t(0)) * kRow);
    g.all_to_all_v_rows(base.data(), kRow, rows, offsets, recv.data(), rr);
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      const auto want = payload(rr[size_t(r)] * kRow, 1, uint64_t(r), uint64_t(me) + 100);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + std::ptrdiff_t(off)))
          << "a2av rows from " << r;
      off += rr[size_t(r)] * kRow;
    }
  }
  for (int root : {0, n - 1}) {  // broadcast
    auto buf =
        me == root ? payload(count, 8, 77, uint64_t(root)) : std::vector<std::byte>(count * 8);
    g.broadcast(buf.data(), count, DType::f64, root);
    EXPECT_EQ(buf, payload(count, 8, 77, uint64_t(root))) << "broadcast root " << root;
  }
  g.barrier();
}

TEST(Mpi, EveryOpEverySize) {
  run_ranks(mpi_opts(), [](Group& g) {
    EXPECT_EQ(g.backend(), "mpi");
    EXPECT_TRUE(g.capabilities().ordered_reduce);  // all_to_all + ascending-rank sum
    for (size_t count : {size_t(0), size_t(1), kOdd, kMiB / 8 / size_t(g.size()) + 3})
      check_all_ops(g, count);
  });
}

TEST(Mpi, ExposeReadsEveryRanksRegions) {
  run_ranks(mpi_opts(), [](Group& g) {
    ASSERT_EQ(g.peer_memory(), PeerMemory::window);  // ctest starts every rank on this host
    int staged = 0;
    EXPECT_EQ(test::expose_mismatches(g, &staged), 0);
    EXPECT_GE(staged, 2) << "expose_staging offered no place once the window was large enough";
  });
}

// Peers write the regions' window copies; the closing barrier copies them back (region 0 of the
// second round was built in the window and needs no copy), and a later expose still works.
TEST(Mpi, ExposeWritableLandsInEveryRanksRegions) {
  run_ranks(mpi_opts(), [](Group& g) {
    ASSERT_EQ(g.peer_memory(), PeerMemory::window);
    EXPECT_EQ(test::expose_writable_mismatches(g), 0);
    EXPECT_EQ(test::expose_mismatches(g), 0);
  });
}

// With the count limit at 1000, every op takes its > INT_MAX path: derived datatypes with a
// remainder, chunked all_reduce / reduce_scatter, and point-to-point _v exchanges.
TEST(Mpi, BigCountPathsWithALoweredLimit) {
  comm::set_mpi_count_limit_for_testing(1000);
  run_ranks(mpi_opts(), [](Group& g) {
    for (size_t count : {size_t(1), kOdd, size_t(5000)}) check_all_ops(g, count);
  });
  comm::set_mpi_count_limit_for_testing(0);
}

// Real > INT_MAX messages (label `large`, run with --gtest_also_run_disabled_tests; about
// 3.3 GB of memory per process): a 2 GiB + 4099 byte broadcast (derived datatype) and an
// all_gather_v whose total exceeds INT_MAX bytes (point-to-point path).
TEST(Mpi, DISABLED_HugeMessages) {
  LaunchOptions o = mpi_opts();
  o.timeout_s =
      600;  // a first 2 GiB message is slow on a loaded machine (page faults, registration)
  run_ranks(o, [](Group& g) {
    auto byte_at = [](size_t i, int r) {
      return uint8_t((i * 131 + size_t(r) * 17 + (i >> 20)) & 0xff);
    };
    {
      const size_t big = (size_t(1) << 31) + 4099;
      std::vector<uint8_t> b(big, 0);
      if (g.rank() == 0)
        for (size_t i = 0; i < big; ++i) b[i] = byte_at(i, 0);
      g.broadcast(b.data(), big, DType::u8, 0);
      size_t wrong = 0;
      for (size_t i = 0; i < big; ++i) wrong += b[i] != byte_at(i, 0);
      EXPECT_EQ(wrong, 0u) << "broadcast of " << big << " bytes";
    }
    {
      const size_t per = ((size_t(1) << 31) + 77) / size_t(g.size()) + 1;
      std::vector<size_t> counts(static_cast<size_t>(g.size()), per);
      std::vector<uint8_t> send(per), recv(per * size_t(g.size()));
      for (size_t i = 0; i < per; ++i) send[i] = byte_at(i, g.rank());
      g.all_gather_v(send.data(), per, recv.data(), counts, DType::u8);
      size_t wrong = 0;
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < per; ++i) wrong += recv[size_t(r) * per + i] != byte_at(i, r);
      EXPECT_EQ(wrong, 0u) << "all_gather_v of " << per * size_t(g.size()) << " bytes";
    }
  });
}

TEST(Mpi, PlacementMatchesTheLauncher) {
  run_ranks(mpi_opts(), [](Group& g) {
    auto p = launcher_placement();
    ASSERT_TRUE(p);
    EXPECT_EQ(p->rank, g.rank());
    EXPECT_EQ(p->world, g.size());
  });
}

}  // namespace
}  // namespace deepinfer
