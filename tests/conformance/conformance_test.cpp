// Tests of the conformance suite itself: its closed-form reduction results against brute force,
// its payloads' coverage of awkward values, and, with a wrapper that plants one bug per op,
// that the suite fails exactly that op (a suite that cannot fail proves nothing).
#include "comm/conformance/conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "comm/conformance/patterns.h"
#include "comm/conformance/reduce_gen.h"

namespace deepinfer::conformance {
namespace {

template <class T>
uint64_t bits(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

// The closed form must equal the reduction computed the slow way, in ascending and in
// descending rank order (the inputs promise exact, order-independent sums).
template <class T>
void check_closed_form(int world, ReduceOp op) {
  const ReduceGen<T> gen(world, op, 12345 + uint64_t(world));
  size_t denormals = 0, neg_zeros = 0, huge = 0;
  for (size_t i = 0; i < 4000; ++i) {
    const auto t = gen.terms(i);
    std::vector<T> v(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      v[size_t(r)] = gen.value(t, int((size_t(r) + i) % size_t(world)));
    T want{};
    if (op == ReduceOp::sum) {
      if constexpr (std::is_floating_point_v<T>) {
        T up = v[0], down = v.back();
        for (int r = 1; r < world; ++r) up = up + v[size_t(r)];
        for (int r = world - 2; r >= 0; --r) down = down + v[size_t(r)];
        ASSERT_EQ(bits(up), bits(down)) << "sum depends on order at i=" << i;
        want = up;
      } else {
        __int128 s = 0;
        for (T x : v) s += x;
        ASSERT_LE(s, __int128(std::numeric_limits<T>::max()));
        ASSERT_GE(s, __int128(std::numeric_limits<T>::min()));
        want = T(s);
      }
    } else {
      want = v[0];
      for (T x : v) want = op == ReduceOp::max ? std::max(want, x) : std::min(want, x);
    }
    ASSERT_EQ(bits(gen.expected(t)), bits(want))
        << "world " << world << " op " << int(op) << " i " << i;
    for (T x : v) {
      if constexpr (std::is_floating_point_v<T>) {
        denormals += std::fpclassify(x) == FP_SUBNORMAL;
        neg_zeros += x == T(0) && std::signbit(x);
        huge += std::fabs(x) > std::ldexp(T(1), std::numeric_limits<T>::max_exponent - 30);
      } else {
        huge +=
            x > std::numeric_limits<T>::max() / 4 * 3 || x < std::numeric_limits<T>::min() / 4 * 3;
      }
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    EXPECT_GT(denormals, 0u);
    EXPECT_GT(neg_zeros, 0u);
  }
  if (op != ReduceOp::sum || world == 1) {
    EXPECT_GT(huge, 0u) << "no values near the ends of the range";
  }
}

TEST(ReduceGen, ClosedFormMatchesBruteForce) {
  for (int world : {1, 2, 3, 5, 16, 64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      check_closed_form<float>(world, op);
      check_closed_form<double>(world, op);
      check_closed_form<int32_t>(world, op);
      check_closed_form<int64_t>(world, op);
    }
  }
}

TEST(Patterns, I32NearTheEndsOfTheRange) {
  size_t near = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const int64_t v = int32_t(uint32_t(pattern_bits(DType::i32, uint64_t(i))));
    near += std::abs(v) >= (int64_t(1) << 31) - (int64_t(1) << 24);
  }
  EXPECT_GT(near, size_t(n) * 8 / 10);
}

TEST(Patterns, F32CoversAwkwardValues) {
  size_t denormal = 0, neg_zero = 0, nonfinite = 0, large = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float f = std::bit_cast<float>(uint32_t(pattern_bits(DType::f32, i)));
    denormal += std::fpclassify(f) == FP_SUBNORMAL;
    neg_zero += f == 0.0f && std::signbit(f);
    nonfinite += !std::isfinite(f);
    large += std::isfinite(f) && std::fabs(f) > 1e37f;
  }
  EXPECT_GT(denormal, 1000u);
  EXPECT_GT(neg_zero, 1000u);
  EXPECT_GT(nonfinite, 1000u);
  EXPECT_GT(large, 1000u);
}

TEST(Patterns, FillMatchesPatternAndBlocksDiffer) {
  for (DType dt : {DType::i32, DType::i64, DType::f32, DType::f64, DType::bf16, DType::u8}) {
    std::vector<std::byte> buf(100 * dtype_size(dt));
    fill_pattern(buf.data(), 100, dt, 77);
    for (size_t i = 0; i < 100; ++i)
      EXPECT_EQ(load_bits(buf.data() + i * dtype_size(dt), dtype_size(dt)),
                pattern_bits(dt, 77 + i));
  }
  std::set<uint64_t> seeds;
  for (int s = 0; s < 64; ++s)
    for (int d = 0; d < 64; ++d) seeds.insert(block_seed(9, s, d));
  EXPECT_EQ(seeds.size(), 64u * 64u);
}

// One planted bug per op, on rank 1 (or every rank where the bug needs it).
enum class Bug {
  none,
  ag_bitflip,
  agv_last,
  ar_ulp,
  rs_ulp,
  a2a_swap,
  a2av_overrun,
  bcast_root0,
  barrier_noop,
  send_write
};

// The test name of each planted bug (gtest names: letters, digits and '_').
const char* bug_name(Bug bug) {
  switch (bug) {
    case Bug::none:
      return "none";
    case Bug::ag_bitflip:
      return "all_gather_bitflip";
    case Bug::agv_last:
      return "all_gather_v_last";
    case Bug::ar_ulp:
      return "all_reduce_ulp";
    case Bug::rs_ulp:
      return "reduce_scatter_ulp";
    case Bug::a2a_swap:
      return "all_to_all_swap";
    case Bug::a2av_overrun:
      return "all_to_all_v_overrun";
    case Bug::bcast_root0:
      return "broadcast_root0";
    case Bug::barrier_noop:
      return "barrier_noop";
    case Bug::send_write:
      return "send_buffer_write";
  }
  return "unknown";
}

class BuggyGroup final : public Group {
 public:
  BuggyGroup(Group& inner, Bug bug) : g_(inner), bug_(bug) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  std::string backend() const override { return "buggy/" + g_.backend(); }
  Capabilities capabilities() const override { return g_.capabilities(); }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    g_.all_gather(send, recv, count, dtype);
    if (bug_ == Bug::ag_bitflip && rank() == 1 && count > 0 && dtype == DType::f64)
      static_cast<std::byte*>(recv)[3] ^= std::byte{1};
    if (bug_ == Bug::send_write && count > 0 && dtype == DType::bf16)
      std::memset(const_cast<void*>(send), 0, 1);
  }
  void all_gather_v(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    g_.all_gather_v(send, send_count, recv, recv_counts, dtype);
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    if (bug_ == Bug::agv_last && rank() == 1 && total > 0)
      static_cast<std::byte*>(recv)[total * dtype_size(dtype) - 1] ^= std::byte{0x80};
  }
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    g_.all_reduce(buf, count, dtype, op);
    if (bug_ == Bug::ar_ulp && rank() == 1 && count > 0 && dtype == DType::f64) {
      auto* d = static_cast<double*>(buf);
      d[count - 1] = std::nextafter(d[count - 1], INFINITY);
    }
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    g_.reduce_scatter(send, recv, count);
    if (bug_ == Bug::rs_ulp && rank() == 1 && count > 0)
      recv[0] = std::nextafter(recv[0], INFINITY);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    g_.all_to_all(send, recv, count, dtype);
    if (bug_ == Bug::a2a_swap && rank() == 1 && count > 0 && size() > 1) {
      auto* p = static_cast<std::byte*>(recv);
      std::swap_ranges(p, p + count * dtype_size(dtype), p + count * dtype_size(dtype));
    }
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    g_.all_to_all_v(send, send_counts, recv, recv_counts, dtype);
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    if (bug_ == Bug::a2av_overrun && rank() == 1)
      static_cast<std::byte*>(recv)[total * dtype_size(dtype)] = std::byte{0};
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    g_.broadcast(buf, count, dtype, bug_ == Bug::bcast_root0 ? 0 : root);
  }
  void barrier() override {
    if (bug_ != Bug::barrier_noop) g_.barrier();
  }

 private:
  Group& g_;
  Bug bug_;
};

// Runs the suite at 4 local ranks through `bug`; returns rank 0's report.
SuiteReport run_buggy(Bug bug) {
  SuiteReport r0;
  LaunchOptions lo;
  lo.world = 4;
  lo.timeout_s = 30;
  run_ranks(lo, [&](Group& g) {
    BuggyGroup b(g, bug);
    SuiteReport r = run_suite(b, {Coverage::quick});
    if (g.rank() == 0) r0 = std::move(r);
  });
  return r0;
}

std::set<std::string> failed_ops(const SuiteReport& r) {
  std::set<std::string> ops;
  for (const auto& c : r.cases)
    if (!c.passed()) ops.insert(c.op);
  return ops;
}

TEST(Suite, PassesOnAHealthyBackend) {
  const SuiteReport r = run_buggy(Bug::none);
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_GT(r.passed(), 100u);
  EXPECT_TRUE(r.verified.all_to_all && r.verified.all_to_all_v);
}

struct BugCase {
  Bug bug;
  const char* op;
  const char* detail;          // must appear in the failing case's detail
  const char* also = nullptr;  // an op built on the broken one, which must fail too
};

// gtest prints a parameter (--gtest_list_tests, failures) by the bug's name, not its bytes.
void PrintTo(const BugCase& c, std::ostream* os) { *os << bug_name(c.bug) << " (" << c.op << ")"; }

class SuiteCatches : public ::testing::TestWithParam<BugCase> {};

TEST_P(SuiteCatches, ExactlyTheBrokenOp) {
  const BugCase& bc = GetParam();
  const SuiteReport r = run_buggy(bc.bug);
  EXPECT_FALSE(r.ok());
  std::set<std::string> expected{bc.op};
  if (bc.also) expected.insert(bc.also);
  EXPECT_EQ(failed_ops(r), expected) << format_report(r);
  bool found = false;
  for (const auto& c : r.cases)
    found |= !c.passed() && c.detail.find(bc.detail) != std::string::npos;
  EXPECT_TRUE(found) << "no failing " << bc.op << " case mentions '" << bc.detail << "'\n"
                     << format_report(r);
}

INSTANTIATE_TEST_SUITE_P(
    Bugs, SuiteCatches,
    ::testing::Values(
        BugCase{Bug::ag_bitflip, "all_gather", "first on rank 1 at src rank 0 index 0"},
        BugCase{Bug::agv_last, "all_gather_v", "first on rank 1 at src rank 3"},
        BugCase{Bug::ar_ulp, "all_reduce", "1 wrong elements, first on rank 1 at index"},
        BugCase{Bug::rs_ulp, "reduce_scatter", "first on rank 1 at index 0"},
        BugCase{Bug::a2a_swap, "all_to_all", "first on rank 1 at src rank 0 index 0"},
        BugCase{Bug::a2av_overrun, "all_to_all_v", "rank 1 found bytes written past the end",
                "all_to_all_v_rows"},  // the Group default packs, then all_to_all_v
        BugCase{Bug::bcast_root0, "broadcast", "wrong elements"},
        BugCase{Bug::barrier_noop, "barrier", "left the barrier"},
        BugCase{Bug::send_write, "all_gather", "send buffer was modified"}),
    [](const auto& info) { return std::string(bug_name(info.param.bug)); });

}  // namespace
}  // namespace deepinfer::conformance
