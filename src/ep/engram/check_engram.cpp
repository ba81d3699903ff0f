#include "ep/engram/check_engram.h"

#include <deepinfer/engram.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "ep/engram/path.h"

namespace deepinfer::ep::engram {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The table: byte k of global row g's data, and its scale factor s, depend only on (seed, g), so
// the reference sees every shard without communication.
struct Table {
  uint64_t seed;
  int hidden, scale_cols;
  size_t item;  // bytes per element
  size_t data_bytes() const { return size_t(hidden) * item; }
  void data_row(int64_t g, std::byte* dst) const {
    for (size_t k = 0; k < data_bytes(); ++k)
      dst[k] = std::byte(mix(seed ^ (uint64_t(g) << 20) ^ k) & 0xff);
  }
  void sf_row(int64_t g, float* dst) const {
    for (int k = 0; k < scale_cols; ++k)
      dst[k] = float(mix(seed * 31 + uint64_t(g) * 977 + uint64_t(k)) % 100000) / 4096.0f + 1e-3f;
  }
};

struct Pattern {
  const char* name;
  int j;
};

// This rank's indices for one pattern: [T, J] with T possibly 0.
std::vector<int32_t> make_indices(const Pattern& p, int rank, int world, int64_t n, uint64_t seed,
                                  int64_t& t) {
  const int64_t limit = int64_t(world) * n;
  const std::string name = p.name;
  t = name == "zero-tokens" && rank % 2 == 1 ? 0 : 3 + (rank * 5) % 7;
  if (name == "j32") t = 2 + rank % 3;
  if (name == "layers") t *= 3;  // [3, T, J]: T·3 rows
  std::vector<int32_t> idx(size_t(t) * size_t(p.j));
  for (size_t i = 0; i < idx.size(); ++i) {
    const uint64_t r = mix(seed * 1000003 + uint64_t(rank) * 7919 + i);
    if (name == "one-owner")  // every index on the last rank
      idx[i] = int32_t((world - 1) * n + int64_t(r % uint64_t(n)));
    else if (name == "duplicates")  // few distinct rows, each asked many times
      idx[i] = int32_t(r % 4 == 0 ? -1 : int64_t(r % 3) * (limit / 3));
    else  // uniform with about one -1 in eight
      idx[i] = r % 8 == 0 ? -1 : int32_t(int64_t(r >> 8) % limit);
  }
  return idx;
}

struct Runner {
  Group& g;
  const CheckEngramOptions& o;
  CheckEngramResult res;

  // Agrees on one case's outcome (failed on any rank = failed) and counts it.
  void count(const std::string& name, bool ok) {
    int64_t bad = ok ? 0 : 1;
    g.all_reduce(&bad, 1, DType::i64, ReduceOp::max);
    (bad ? res.failed : res.passed) += 1;
    if (g.rank() == 0 && (bad || o.verbose))
      log_info("check engram {} [{}]", bad ? "FAIL" : "ok", name);
  }

  bool check_fetch(const Table& tab, const std::vector<int32_t>& idx, int64_t t, int j,
                   const EngramResult& got, const std::string& name) {
    const size_t db = tab.data_bytes();
    std::vector<std::byte> want(db);
    std::vector<float> want_sf(size_t(tab.scale_cols));
    const int64_t rows = got.data.ndim() == 3 ? got.data.dim(0) * got.data.dim(1) : got.data.dim(0);
    if (rows != t || got.data.dim(-1) != int64_t(j) * tab.hidden) {
      log_error("check engram [{}] rank {}: data {}", name, g.rank(), got.data.describe());
      return false;
    }
    for (size_t p = 0; p < idx.size(); ++p) {
      if (idx[p] < 0) {
        std::fill(want.begin(), want.end(), std::byte{0});
        std::fill(want_sf.begin(), want_sf.end(), 0.0f);
      } else {
        tab.data_row(idx[p], want.data());
        tab.sf_row(idx[p], want_sf.data());
      }
      const auto* d = static_cast<const std::byte*>(got.data.raw()) + p * db;
      bool ok = std::memcmp(d, want.data(), db) == 0;
      if (tab.scale_cols)
        ok = ok && std::memcmp(got.sf.data<float>() + p * size_t(tab.scale_cols), want_sf.data(),
                               want_sf.size() * 4) == 0;
      if (!ok) {
        log_error("check engram [{}] rank {}: slot {} (index {}) differs", name, g.rank(), p,
                  idx[p]);
        return false;
      }
    }
    return true;
  }

  void run_case(EngramAlgo algo, EngramDType dt, int64_t n) {
    EngramConfig cfg;
    cfg.dtype = dt;
    cfg.hidden = dt == EngramDType::fp8 ? 100 : 72;
    cfg.scale_cols = dt == EngramDType::fp8 ? 3 : 0;
    cfg.algo = algo;
    const Table tab{o.seed, cfg.hidden, cfg.scale_cols, dt == EngramDType::fp8 ? 1u : 2u};
    EngramBuffer buf(g, cfg);
    Tensor shard =
               Tensor::empty(dt == EngramDType::fp8 ? DType::e4m3 : DType::bf16, {n, cfg.hidden}),
           sf;
    if (cfg.scale_cols) sf = Tensor::empty(DType::f32, {n, cfg.scale_cols});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t gid = int64_t(g.rank()) * n + i;
      tab.data_row(gid, static_cast<std::byte*>(shard.raw()) + size_t(i) * tab.data_bytes());
      if (cfg.scale_cols) tab.sf_row(gid, sf.data<float>() + i * cfg.scale_cols);
    }
    buf.write(shard, sf);
    const std::string base =
        fmt::format("algo={} path={} dtype={} n={}", to_string(algo), to_string(buf.path()),
                    dt == EngramDType::fp8 ? "fp8" : "bf16", n);
    static constexpr Pattern patterns[] = {{"uniform", 5},     {"duplicates", 6}, {"one-owner", 7},
                                           {"zero-tokens", 3}, {"j32", 32},       {"layers", 4}};
    for (const Pattern& p : patterns) {
      int64_t t = 0;
      const std::vector<int32_t> idx = make_indices(p, g.rank(), g.size(), n, o.seed, t);
      const bool layers = std::string(p.name) == "layers";
      const Tensor it = Tensor::borrow(
          const_cast<int32_t*>(idx.data()), DType::i32,
          layers ? std::vector<int64_t>{3, t / 3, p.j} : std::vector<int64_t>{t, p.j});
      const std::string name = base + " pattern=" + p.name;
      bool ok = false;
      try {
        const EngramResult r = buf.fetch(it);
        ok = check_fetch(tab, idx, t, p.j, r, name);
        if (layers)  // [L, T, J·H] and [L, T, J·P]
          ok = ok && r.data.ndim() == 3 && r.data.dim(0) == 3 &&
               (!tab.scale_cols || (r.sf.ndim() == 3 && r.sf.dim(0) == 3));
      } catch (const Error& e) {
        log_error("check engram [{}] rank {}: {}", name, g.rank(), e.what());
      }
      count(name, ok);
    }
    // Two fetches in flight, waited on in reverse order.
    {
      int64_t t1 = 0, t2 = 0;
      const std::vector<int32_t> i1 = make_indices(patterns[0], g.rank(), g.size(), n, o.seed, t1);
      const std::vector<int32_t> i2 =
          make_indices(patterns[0], g.rank(), g.size(), n, o.seed + 1, t2);
      EngramFetch f1 = buf.start_fetch(
          Tensor::borrow(const_cast<int32_t*>(i1.data()), DType::i32, {t1, patterns[0].j}));
      EngramFetch f2 = buf.start_fetch(
          Tensor::borrow(const_cast<int32_t*>(i2.data()), DType::i32, {t2, patterns[0].j}));
      const std::string name = base + " two fetches waited in reverse order";
      const EngramResult r2 = f2.wait(), r1 = f1.wait();
      count(name, check_fetch(tab, i2, t2, patterns[0].j, r2, name) &&
                      check_fetch(tab, i1, t1, patterns[0].j, r1, name));
    }
    // A bad index on the last rank only: an Error on every rank, and the buffer still fetches.
    for (int32_t bad : {int32_t(int64_t(g.size()) * n), int32_t(-2)}) {
      std::vector<int32_t> idx{0, -1};
      if (g.rank() == g.size() - 1) idx[1] = bad;
      bool threw = false;
      try {
        buf.fetch(Tensor::borrow(idx.data(), DType::i32, {1, 2}));
      } catch (const Error&) {
        threw = true;
      }
      idx[1] = -1;
      const std::string name = base + fmt::format(" index {} on the last rank", bad);
      bool ok = threw;
      if (!threw) log_error("check engram [{}] rank {}: no Error", name, g.rank());
      ok = ok && check_fetch(tab, idx, 1, 2,
                             buf.fetch(Tensor::borrow(idx.data(), DType::i32, {1, 2})), name);
      count(name, ok);
    }
  }

  void run_differing_n() {
    EngramConfig cfg;
    cfg.hidden = 8;
    EngramBuffer buf(g, cfg);
    const int64_t n = g.size() > 1 && g.rank() == 0 ? 5 : 7;
    bool threw = false;
    try {
      buf.write(Tensor::zeros(DType::bf16, {n, 8}));
    } catch (const Error&) {
      threw = true;
    }
    count("differing n is an Error on every rank", g.size() == 1 ? !threw : threw);
  }
};

}  // namespace

CheckEngramResult run_check_engram(Group& group, const CheckEngramOptions& opts) {
  Runner r{group, opts, {}};
  std::vector<EngramAlgo> algos{EngramAlgo::ag};
  if (group.capabilities().all_to_all_v) algos.push_back(EngramAlgo::a2a);
  if (group.peer_memory() != PeerMemory::none) algos.push_back(EngramAlgo::direct);
  algos.push_back(EngramAlgo::automatic);
  for (EngramAlgo a : algos)
    for (EngramDType dt : {EngramDType::bf16, EngramDType::fp8})
      for (int64_t n : {37, 2})  // primes; n = 2 makes most indices miss most ranks
        r.run_case(a, dt, n);
  r.run_differing_n();
  return r.res;
}

}  // namespace deepinfer::ep::engram
