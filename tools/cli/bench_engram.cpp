// `deepinfer bench engram`: EngramBuffer fetches per lowering (ag, a2a, direct where the group has
// peer memory), one JSON line each, like `bench ep`: seconds (median over ranks-max), bytes (the
// [row | sf] entries the owners send, averaged over ranks), GB/s, and the ratio to a raw
// all_to_all_v of the same entries (the Group's, on the same counts) timed right after each fetch
// in the same run. Every lowering's output is compared with the ag lowering's, byte for byte
// ("correct": rank 0's rows equal ag's).
#include <deepinfer/comm.h>
#include <deepinfer/engram.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "runtime/launch.h"

namespace deepinfer::cli {
namespace {

struct BenchEngramCli {
  std::string comm;
  int world = 0;
  int64_t rows = 65521;  // n per rank (prime)
  int hidden = 128;
  int tokens = 512;
  int ids = 24;  // J
  std::string dtype = "bf16";
  int iters = 10;
  int warmup = 3;
};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int run_bench_engram(const BenchEngramCli& o) {
  LaunchOptions lo;
  lo.comm = resolve_comm(o.comm);
  lo.world = o.world > 0 ? o.world : (lo.comm == CommKind::local ? 4 : 0);
  int failures = 0;
  runtime::run_ranks_with_pools(lo, [&](Group& g) {
    const int w = g.size(), me = g.rank();
    const bool fp8 = o.dtype == "fp8";
    const int p = fp8 ? o.hidden / 128 + 1 : 0;
    const int64_t n = o.rows;
    Tensor shard = Tensor::empty(fp8 ? DType::e4m3 : DType::bf16, {n, o.hidden}), sf;
    auto* bytes = static_cast<uint8_t*>(shard.raw());
    for (size_t i = 0; i < shard.nbytes(); ++i) bytes[i] = uint8_t(mix(uint64_t(me) << 40 | i));
    if (fp8) {
      sf = Tensor::empty(DType::f32, {n, p});
      for (int64_t i = 0; i < n * p; ++i) sf.data<float>()[i] = float(i % 977) + 0.5f;
    }
    std::vector<int32_t> idx(size_t(o.tokens) * size_t(o.ids));
    for (size_t i = 0; i < idx.size(); ++i)
      idx[i] = int32_t(mix(uint64_t(me) * 1000003 + i) % uint64_t(int64_t(w) * n));
    const Tensor it = Tensor::borrow(idx.data(), DType::i32, {o.tokens, o.ids});

    // The raw exchange: the entries a2a's owners send, on the same counts.
    const size_t entry = size_t(o.hidden) * (fp8 ? 1 : 2) + size_t(p) * 4;
    std::vector<int32_t> ids = idx;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<int64_t> mine(size_t(w), 0), all(size_t(w) * size_t(w));
    for (int32_t id : ids) mine[size_t(id / n)] += 1;
    g.all_gather(mine.data(), all.data(), size_t(w), DType::i64);
    const size_t ws = size_t(w);
    std::vector<size_t> sc(ws), rc(ws);
    double total = 0;
    for (size_t r = 0; r < size_t(w); ++r) {
      sc[r] = size_t(all[r * size_t(w) + size_t(me)]) * entry;
      rc[r] = size_t(mine[r]) * entry;
    }
    for (int64_t v : all) total += double(v) * double(entry);
    const double avg_bytes = total / double(w);
    size_t ns = 0, nr = 0;
    for (size_t r = 0; r < size_t(w); ++r) ns += sc[r], nr += rc[r];
    std::vector<std::byte> send(std::max<size_t>(ns, 1)), recv(std::max<size_t>(nr, 1));

    std::vector<EngramAlgo> algos{EngramAlgo::ag};
    if (g.capabilities().all_to_all_v) algos.push_back(EngramAlgo::a2a);
    if (g.peer_memory() != PeerMemory::none) algos.push_back(EngramAlgo::direct);
    Tensor want;
    int64_t differ = 0;
    for (EngramAlgo algo : algos) {
      EngramConfig cfg;
      cfg.hidden = o.hidden;
      cfg.dtype = fp8 ? EngramDType::fp8 : EngramDType::bf16;
      cfg.scale_cols = p;
      cfg.algo = algo;
      EngramBuffer buf(g, cfg);
      buf.write(shard, sf);
      EngramResult last;
      std::vector<double> t_fetch, t_raw;
      auto timed = [&g](const std::function<void()>& fn) {
        g.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        g.all_reduce(&dt, 1, DType::f64, ReduceOp::max);
        return dt;
      };
      for (int i = 0; i < o.warmup + o.iters; ++i) {
        const double a = timed([&] { last = buf.fetch(it); });
        const double b =
            timed([&] { g.all_to_all_v(send.data(), sc, recv.data(), rc, DType::u8); });
        if (i >= o.warmup) t_fetch.push_back(a), t_raw.push_back(b);
      }
      std::sort(t_fetch.begin(), t_fetch.end());
      std::sort(t_raw.begin(), t_raw.end());
      const double s = t_fetch[t_fetch.size() / 2], raw = t_raw[t_raw.size() / 2];
      bool same = true;
      if (!want.defined())
        want = last.data.clone();
      else
        same = std::memcmp(want.raw(), last.data.raw(), want.nbytes()) == 0;
      differ += same ? 0 : 1;
      if (me == 0) {
        const std::string c =
            fmt::format("{} W={} n={} H={} {} T={} J={} {}", g.backend(), w, n, o.hidden, o.dtype,
                        o.tokens, o.ids, to_string(buf.path()));
        std::printf(
            "{\"bench\": \"engram\", \"case\": \"%s\", \"seconds\": %.6g, \"bytes\": %.0f, "
            "\"gbps\": %.4g, \"limit\": \"raw Group all_to_all_v\", \"limit_value\": %.4g, "
            "\"ratio\": %.4g, \"correct\": %s}\n",
            c.c_str(), s, avg_bytes, avg_bytes / s / 1e9, avg_bytes / raw / 1e9, raw / s,
            same ? "true" : "false");
        std::fflush(stdout);
      }
    }
    g.all_reduce(&differ, 1, DType::i64, ReduceOp::sum);
    if (me == 0) {
      failures = int(differ);
      std::printf("bench engram: lowerings %s\n", differ ? "DIFFER" : "agree byte for byte");
    }
  });
  return failures ? 1 : 0;
}

DEEPINFER_COMMAND(
    "bench", "engram",
    "EngramBuffer fetch per lowering vs a raw all_to_all_v of the same rows (JSON lines)",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchEngramCli>();
      app.add_option("--comm", o->comm, "local or mpi (default DEEPINFER_COMM)")
          ->check(CLI::IsMember({"local", "mpi"}));
      app.add_option("--world", o->world,
                     "Ranks (local threads, default 4; mpi: checked against mpirun -np)")
          ->check(CLI::Range(1, 1024));
      app.add_option("--rows", o->rows, "Rows per rank n (default 65521)")
          ->check(CLI::Range(int64_t(1), int64_t(1) << 26));
      app.add_option("--hidden", o->hidden, "Row width H (default 128)")
          ->check(CLI::Range(1, 1 << 16));
      app.add_option("--tokens", o->tokens, "Tokens per rank T (default 512)")
          ->check(CLI::Range(0, 1 << 20));
      app.add_option("--ids", o->ids, "Ids per token J (default 24)")->check(CLI::Range(1, 1024));
      app.add_option("--dtype", o->dtype, "bf16 (default) or fp8 (+ scale factors)")
          ->check(CLI::IsMember({"bf16", "fp8"}));
      app.add_option("--iters", o->iters, "Timed repetitions (median reported, default 10)")
          ->check(CLI::Range(1, 1000));
      app.add_option("--warmup", o->warmup, "Untimed repetitions first (default 3)")
          ->check(CLI::Range(0, 1000));
      return [o] { return run_bench_engram(*o); };
    });

}  // namespace
}  // namespace deepinfer::cli
