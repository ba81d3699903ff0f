// `deepinfer bench collectives`: bus bandwidth of the Group's collectives (nccl-tests'
// definition, doc/PERFORMANCE.md) with the ratio to a limit measured in the same run:
//   mpi:   the raw MPI call (MPI_Allgather, ...) on MPI_COMM_WORLD, same bytes, interleaved;
//   local: single-thread memcpy of the same bytes per rank on this machine.
// One JSON object per line (the benchmark contract); results are checked in the same run.
#include <deepinfer/comm.h>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/conformance/patterns.h"
#include "command.h"
#include "core/check.h"
#include "core/env.h"

namespace deepinfer::cli {
namespace {

constexpr int kDefaultWorld = 2;
constexpr int kDefaultIters = 20;
constexpr int kWarmupIters = 3;
constexpr uint64_t kSalt = 0xbe7c4c011ull;

struct BenchOptions {
  std::string comm;
  int world = 0;
  std::string bytes = "4M";
  int iters = kDefaultIters;
};

enum class Op : uint8_t { all_gather, all_to_all, all_to_all_v, reduce_scatter, all_reduce };
constexpr Op kOps[] = {Op::all_gather, Op::all_to_all, Op::all_to_all_v, Op::reduce_scatter,
                       Op::all_reduce};

const char* op_name(Op op) {
  switch (op) {
    case Op::all_gather:
      return "all_gather";
    case Op::all_to_all:
      return "all_to_all";
    case Op::all_to_all_v:
      return "all_to_all_v";
    case Op::reduce_scatter:
      return "reduce_scatter";
    case Op::all_reduce:
      return "all_reduce";
  }
  return "?";
}
const char* raw_name(Op op) {
  switch (op) {
    case Op::all_gather:
      return "raw MPI_Allgather";
    case Op::all_to_all:
      return "raw MPI_Alltoall";
    case Op::all_to_all_v:
      return "raw MPI_Alltoallv";
    case Op::reduce_scatter:
      return "raw MPI_Reduce_scatter_block";
    case Op::all_reduce:
      return "raw MPI_Allreduce";
  }
  return "?";
}

// "4M", "4MiB", "512K", "1G", "1000" -> bytes.
size_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    DI_FAIL("--bytes '{}' is not a size; use e.g. 4M, 512K, 1G or a number of bytes", s);
  }
  std::string unit = s.substr(pos);
  if (unit.size() > 1 && (unit.substr(1) == "iB" || unit.substr(1) == "B"))
    unit = unit.substr(0, 1);
  size_t mul = 1;
  if (unit == "K" || unit == "k")
    mul = size_t(1) << 10;
  else if (unit == "M" || unit == "m")
    mul = size_t(1) << 20;
  else if (unit == "G" || unit == "g")
    mul = size_t(1) << 30;
  else if (!unit.empty() && unit != "B")
    DI_FAIL("--bytes '{}': unknown unit '{}' (use K, M or G)", s, unit);
  return size_t(v) * mul;
}

std::string human(size_t bytes) {
  if (bytes % (size_t(1) << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes % (size_t(1) << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Single-thread memcpy of `bytes`, GB/s (median of `iters` after warm-up).
double memcpy_gbps(size_t bytes, int iters) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{0});
  std::vector<double> t;
  for (int it = 0; it < kWarmupIters + iters; ++it) {
    const double t0 = now_s();
    std::memcpy(dst.data(), src.data(), bytes);
    const double t1 = now_s();
    if (it >= kWarmupIters) t.push_back(t1 - t0);
    src[size_t(it) % bytes] = dst[(size_t(it) * 7) % bytes];  // keep the copies observable
  }
  return double(bytes) / median(t) / 1e9;
}

// all_to_all_v splits: uneven per peer, same total per rank (for an even world).
size_t a2av_count(int s, int d, size_t block) {
  return (s + d) % 2 ? block + block / 4 : block - block / 4;
}

float reduce_value(int r, size_t i) { return float((size_t(r) * 7 + i) % 17); }  // exact sums

// One op's buffers and expected results on this rank.
struct Setup {
  Op op;
  int world = 1, rank = 0;
  size_t bytes = 0;       // per-rank payload (--bytes)
  size_t count = 0;       // elements per block (u8 for moves, f32 for reductions)
  size_t nccl_bytes = 0;  // nccl-tests' S: the size algbw divides
  double bus_factor = 1;  // busbw = algbw * bus_factor
  std::vector<std::byte> send, recv, init;
  std::vector<size_t> send_counts, recv_counts;
  std::vector<int> mpi_sc, mpi_sd, mpi_rc, mpi_rd;  // raw MPI_Alltoallv
};

Setup make_setup(Op op, int world, int rank, size_t bytes) {
  using conformance::block_seed;
  using conformance::fill_pattern;
  Setup s;
  s.op = op;
  s.world = world;
  s.rank = rank;
  s.bytes = bytes;
  const size_t w = size_t(world);
  const double ring = world > 1 ? double(world - 1) / world : 1.0;  // world 1: report algbw
  switch (op) {
    case Op::all_gather:
      s.count = bytes;
      s.nccl_bytes = bytes * w;
      s.bus_factor = ring;
      s.send.resize(bytes);
      fill_pattern(s.send.data(), bytes, DType::u8, block_seed(kSalt, rank, 0));
      s.recv.resize(bytes * w);
      break;
    case Op::all_to_all:
      s.count = bytes / w;
      s.nccl_bytes = s.count * w;
      s.bus_factor = ring;
      s.send.resize(s.count * w);
      for (int d = 0; d < world; ++d)
        fill_pattern(s.send.data() + size_t(d) * s.count, s.count, DType::u8,
                     block_seed(kSalt, rank, d));
      s.recv.resize(s.count * w);
      break;
    case Op::all_to_all_v: {
      s.count = bytes / w;
      s.send_counts.resize(w);
      s.recv_counts.resize(w);
      size_t st = 0, rt = 0;
      for (int p = 0; p < world; ++p) {
        s.send_counts[size_t(p)] = a2av_count(rank, p, s.count);
        s.recv_counts[size_t(p)] = a2av_count(p, rank, s.count);
        s.mpi_sc.push_back(int(s.send_counts[size_t(p)]));
        s.mpi_sd.push_back(int(st));
        s.mpi_rc.push_back(int(s.recv_counts[size_t(p)]));
        s.mpi_rd.push_back(int(rt));
        st += s.send_counts[size_t(p)];
        rt += s.recv_counts[size_t(p)];
      }
      s.nccl_bytes = st;
      s.bus_factor = ring;
      s.send.resize(st);
      for (int d = 0; d < world; ++d)
        fill_pattern(s.send.data() + size_t(s.mpi_sd[size_t(d)]), s.send_counts[size_t(d)],
                     DType::u8, block_seed(kSalt, rank, d));
      s.recv.resize(rt);
      break;
    }
    case Op::reduce_scatter: {
      s.count = bytes / (4 * w);
      s.nccl_bytes = s.count * w * 4;
      s.bus_factor = ring;
      std::vector<float> v(s.count * w);
      for (size_t i = 0; i < v.size(); ++i) v[i] = reduce_value(rank, i);
      s.send.resize(v.size() * 4);
      std::memcpy(s.send.data(), v.data(), s.send.size());
      s.recv.resize(s.count * 4);
      break;
    }
    case Op::all_reduce: {
      s.count = bytes / 4;
      s.nccl_bytes = s.count * 4;
      s.bus_factor = world > 1 ? 2.0 * (world - 1) / world : 1.0;
      std::vector<float> v(s.count);
      for (size_t i = 0; i < v.size(); ++i) v[i] = reduce_value(rank, i);
      s.init.resize(v.size() * 4);
      std::memcpy(s.init.data(), v.data(), s.init.size());
      s.recv = s.init;  // in place
      break;
    }
  }
  return s;
}

// Untimed per-iteration preparation (all_reduce works in place).
void prepare(Setup& s) {
  if (s.op == Op::all_reduce) std::memcpy(s.recv.data(), s.init.data(), s.init.size());
}

void run_ours(Group& g, Setup& s) {
  switch (s.op) {
    case Op::all_gather:
      g.all_gather(s.send.data(), s.recv.data(), s.count, DType::u8);
      break;
    case Op::all_to_all:
      g.all_to_all(s.send.data(), s.recv.data(), s.count, DType::u8);
      break;
    case Op::all_to_all_v:
      g.all_to_all_v(s.send.data(), s.send_counts, s.recv.data(), s.recv_counts, DType::u8);
      break;
    case Op::reduce_scatter:
      g.reduce_scatter(reinterpret_cast<const float*>(s.send.data()),
                       reinterpret_cast<float*>(s.recv.data()), s.count);
      break;
    case Op::all_reduce:
      g.all_reduce(s.recv.data(), s.count, DType::f32, ReduceOp::sum);
      break;
  }
}

void check_mpi(int rc, const char* call) {
  DI_CHECK(rc == MPI_SUCCESS, "{} failed with MPI error {}", call, rc);
}

void run_raw(Setup& s) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int n = int(s.count);
  switch (s.op) {
    case Op::all_gather:
      check_mpi(MPI_Allgather(s.send.data(), n, MPI_BYTE, s.recv.data(), n, MPI_BYTE, comm),
                "MPI_Allgather");
      break;
    case Op::all_to_all:
      check_mpi(MPI_Alltoall(s.send.data(), n, MPI_BYTE, s.recv.data(), n, MPI_BYTE, comm),
                "MPI_Alltoall");
      break;
    case Op::all_to_all_v:
      check_mpi(MPI_Alltoallv(s.send.data(), s.mpi_sc.data(), s.mpi_sd.data(), MPI_BYTE,
                              s.recv.data(), s.mpi_rc.data(), s.mpi_rd.data(), MPI_BYTE, comm),
                "MPI_Alltoallv");
      break;
    case Op::reduce_scatter:
      check_mpi(MPI_Reduce_scatter_block(s.send.data(), s.recv.data(), n, MPI_FLOAT, MPI_SUM, comm),
                "MPI_Reduce_scatter_block");
      break;
    case Op::all_reduce:
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, s.recv.data(), n, MPI_FLOAT, MPI_SUM, comm),
                "MPI_Allreduce");
      break;
  }
}

// Wrong elements of this rank's output.
size_t count_wrong(const Setup& s) {
  using conformance::block_seed;
  using conformance::pattern_bits;
  size_t wrong = 0;
  auto check_u8 = [&](const std::byte* p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; ++i)
      wrong += uint8_t(p[i]) != uint8_t(pattern_bits(DType::u8, seed + i));
  };
  auto check_f32 = [&](size_t n, auto expected) {
    for (size_t i = 0; i < n; ++i) {
      float have;
      std::memcpy(&have, s.recv.data() + i * 4, 4);
      wrong += have != expected(i);
    }
  };
  switch (s.op) {
    case Op::all_gather:
      for (int r = 0; r < s.world; ++r)
        check_u8(s.recv.data() + size_t(r) * s.count, s.count, block_seed(kSalt, r, 0));
      break;
    case Op::all_to_all:
      for (int r = 0; r < s.world; ++r)
        check_u8(s.recv.data() + size_t(r) * s.count, s.count, block_seed(kSalt, r, s.rank));
      break;
    case Op::all_to_all_v:
      for (int r = 0; r < s.world; ++r)
        check_u8(s.recv.data() + size_t(s.mpi_rd[size_t(r)]), s.recv_counts[size_t(r)],
                 block_seed(kSalt, r, s.rank));
      break;
    case Op::reduce_scatter:
      check_f32(s.count, [&](size_t i) {
        float sum = 0;
        for (int r = 0; r < s.world; ++r) sum += reduce_value(r, size_t(s.rank) * s.count + i);
        return sum;
      });
      break;
    case Op::all_reduce:
      check_f32(s.count, [&](size_t i) {
        float sum = 0;
        for (int r = 0; r < s.world; ++r) sum += reduce_value(r, i);
        return sum;
      });
      break;
  }
  return wrong;
}

struct Timing {
  double ours = 0, raw = 0;  // median seconds, slowest rank per iteration
  size_t wrong_ours = 0, wrong_raw = 0;
};

// Times `iters` calls after warm-up; each call starts after a barrier and counts as the
// slowest rank's time. With `raw`, the raw MPI call is interleaved with ours.
Timing time_op(Group& g, Setup& s, int iters, bool raw) {
  const int total = kWarmupIters + iters;
  std::vector<double> ours(static_cast<size_t>(total)), mpi(static_cast<size_t>(total), 0.0);
  for (int it = 0; it < total; ++it) {
    prepare(s);
    g.barrier();
    double t0 = now_s();
    run_ours(g, s);
    ours[size_t(it)] = now_s() - t0;
    if (raw) {
      prepare(s);
      check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
      t0 = now_s();
      run_raw(s);
      mpi[size_t(it)] = now_s() - t0;
    }
  }
  Timing t;
  // Check the raw call's output (last), then ours again, so both are verified.
  if (raw) t.wrong_raw = count_wrong(s);
  std::fill(s.recv.begin(), s.recv.end(), std::byte{0xa5});  // ours must write every element
  prepare(s);
  run_ours(g, s);
  t.wrong_ours = count_wrong(s);
  g.all_reduce(ours.data(), ours.size(), DType::f64, ReduceOp::max);
  g.all_reduce(mpi.data(), mpi.size(), DType::f64, ReduceOp::max);
  int64_t wrong[2] = {int64_t(t.wrong_ours), int64_t(t.wrong_raw)};
  g.all_reduce(wrong, 2, DType::i64, ReduceOp::sum);
  t.wrong_ours = size_t(wrong[0]);
  t.wrong_raw = size_t(wrong[1]);
  t.ours = median(std::vector<double>(ours.begin() + kWarmupIters, ours.end()));
  t.raw = median(std::vector<double>(mpi.begin() + kWarmupIters, mpi.end()));
  return t;
}

int run_bench(const BenchOptions& o) {
  LaunchOptions lo;
  lo.comm = resolve_comm(o.comm);
  lo.world = o.world > 0 ? o.world : (lo.comm == CommKind::local ? kDefaultWorld : 0);
  const size_t bytes = parse_bytes(o.bytes);
  DI_CHECK(bytes >= 1024 && bytes <= (size_t(1) << 30), "--bytes must be in [1K, 1G], got {}",
           o.bytes);
  DI_CHECK(o.iters >= 1, "--iters must be >= 1, got {}", o.iters);
  const bool mpi = lo.comm == CommKind::mpi;
  // local: the limit is measured before the rank threads start, so they cannot disturb it.
  const double memcpy_limit = mpi ? 0.0 : memcpy_gbps(bytes, o.iters);
  int code = 0;
  run_ranks(lo, [&](Group& g) {
    const int world = g.size();
    for (Op op : kOps) {
      Setup s = make_setup(op, world, g.rank(), bytes);
      const Timing t = time_op(g, s, o.iters, mpi);
      if (g.rank() != 0) continue;
      const double algbw = double(s.nccl_bytes) / t.ours / 1e9;
      const double busbw = algbw * s.bus_factor;
      const double limit = mpi ? double(s.nccl_bytes) / t.raw / 1e9 * s.bus_factor : memcpy_limit;
      const bool correct = t.wrong_ours == 0 && t.wrong_raw == 0;
      if (!correct) code = 1;
      std::printf(
          "{\"bench\":\"collectives\",\"case\":\"%s %s/rank, %d ranks, "
          "%s\",\"op\":\"%s\",\"backend\":\"%s\","
          "\"world\":%d,\"seconds\":%.9g,\"bytes\":%zu,\"gbps\":%.4f,\"algbw_gbps\":%.4f,\"limit\":"
          "\"%s\","
          "\"limit_value\":%.4f,\"ratio\":%.4f,\"iters\":%d,\"correct\":%s,\"wrong\":%zu,\"wrong_"
          "limit\":%zu}\n",
          op_name(op), human(bytes).c_str(), world, g.backend().c_str(), op_name(op),
          g.backend().c_str(), world, t.ours, s.nccl_bytes, busbw, algbw,
          mpi ? raw_name(op) : "memcpy", limit, busbw / limit, o.iters, correct ? "true" : "false",
          t.wrong_ours, t.wrong_raw);
      std::fflush(stdout);
    }
  });
  return code;
}

DEEPINFER_COMMAND(
    "bench", "collectives",
    "Bus bandwidth of all_gather, all_to_all(_v), reduce_scatter, all_reduce vs raw MPI (mpi) or "
    "memcpy "
    "(local), measured in the same run; JSON lines",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchOptions>();
      app.add_option("--comm", o->comm,
                     "Backend: local (threads) or mpi (under mpirun); default DEEPINFER_COMM")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--world", o->world,
                     fmt::format("Ranks: local threads (default {}); mpi checks it", kDefaultWorld))
          ->check(CLI::Range(1, 1024));
      app.add_option("--bytes", o->bytes, "Payload per rank, e.g. 4M (default), 512K, 1G");
      app.add_option("--iters", o->iters,
                     fmt::format("Timed iterations after {} warm-up (default {})", kWarmupIters,
                                 kDefaultIters))
          ->check(CLI::PositiveNumber);
      return [o] { return run_bench(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
