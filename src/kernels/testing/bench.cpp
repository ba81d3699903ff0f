// Bench helpers: timing, the measured limits (read bandwidth, memcpy bandwidth, fp32 FMA peak,
// BF16 dot-product peak), JSON output, and the sub-bench registry.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/testing/bench.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::testing::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iters` rounds of 12 independent FMA chains (enough to cover FMA latency × ports);
// returns the flops done (2 per lane per FMA) and writes a sum so nothing is optimised away.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f), a3 = hn::Set(d, 1.3f);
  auto a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f), a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f);
  auto a8 = hn::Set(d, 1.8f), a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  auto s =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink += hn::GetLane(hn::SumOfLanes(d, s));
  return double(iters) * 12.0 * double(hn::Lanes(d)) * 2.0;
}

// Reads [p, p + n) once (n a multiple of 256) as `streams` equal sequential parts walked side by
// side, `grain` bytes (64 or 256) of each in turn, prefetching `ahead` bytes ahead in each (into L2
// where `to_l2`, else L1); returns a sum of the words so the loads cannot be optimised away. The
// read-only pass behind read_gbps.
uint64_t ReadLoop(const uint8_t* p, size_t n, size_t ahead, size_t streams, size_t grain,
                  bool to_l2) {
  const hn::ScalableTag<uint64_t> d;
  const size_t N = hn::Lanes(d);
  const size_t part = n / 256 / streams * 256, step = grain / sizeof(uint64_t);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  for (size_t at = 0; at + grain <= part; at += grain)
    for (size_t q = 0; q < streams; ++q) {
      const auto* w = reinterpret_cast<const uint64_t*>(p + q * part + at);
      // The pass must measure the best read rate a kernel can reach, not the hardware
      // prefetcher's alone: the weight-streaming GEMMs prefetch in software too.
      for (size_t l = 0; l < grain; l += 64) {
        const uint8_t* line = reinterpret_cast<const uint8_t*>(w) + ahead + l;
        if (to_l2)
          __builtin_prefetch(line, 0, 2);  // prefetcht1, as the GEMMs' weight streams
        else
          hwy::Prefetch(line);
      }
      // Four independent adds where the grain holds four vectors, one chain otherwise.
      for (size_t v = 0; v + 4 * N <= step; v += 4 * N) {
        s0 = hn::Add(s0, hn::LoadU(d, w + v));
        s1 = hn::Add(s1, hn::LoadU(d, w + v + N));
        s2 = hn::Add(s2, hn::LoadU(d, w + v + 2 * N));
        s3 = hn::Add(s3, hn::LoadU(d, w + v + 3 * N));
      }
      for (size_t v = step / (4 * N) * (4 * N); v < step; v += N)
        s0 = hn::Add(s0, hn::LoadU(d, w + v));
    }
  // What the parts leave (the remainder past the last whole 256 bytes of each part).
  const size_t done = part / grain * grain;
  uint64_t tail = 0;
  for (size_t q = 0; q < streams; ++q)
    for (size_t i = q * part + done; i < (q + 1 == streams ? n : (q + 1) * part); i += 8)
      tail += *reinterpret_cast<const uint64_t*>(p + i);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)))) + tail;
}

}  // namespace deepinfer::kernels::testing::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <deepinfer/tensor.h>

#include "kernels/cpu/gemm_args.h"
#include "kernels/testing/bench.h"

namespace deepinfer::kernels::testing {

HWY_EXPORT(FmaLoop);
HWY_EXPORT(ReadLoop);

uint64_t read_pass_sum(const uint8_t* p, size_t n, size_t ahead, size_t streams, size_t grain,
                       bool to_l2) {
  return HWY_DYNAMIC_DISPATCH(ReadLoop)(p, n, ahead, streams, grain, to_l2);
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

#if defined(__x86_64__) && defined(__GNUC__)
// `iters` rounds of 12 independent VDPBF16PS chains; returns the flops done (2 products and 2 adds
// per bf16 pair: 64 per instruction), as FmaLoop does for fp32.
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotLoop(int64_t iters, float* sink) {
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80),
                 b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  __m512 acc[12];
  for (auto& v : acc) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (auto& v : acc) v = _mm512_dpbf16_ps(v, a, b);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  *sink += t[0];
  return double(iters) * 12.0 * 64.0;
}

// `iters` rounds of 4 independent TDPBF16PS into 4 accumulator tiles (16 × 16 f32, K = 32 bf16:
// 16384 flops each, counted as Bf16DotLoop counts). The caller has checked cpu::cpu_has_amx().
__attribute__((target("avx512f,avx512bf16,amx-tile,amx-bf16"))) double AmxDotLoop(int64_t iters,
                                                                                  float* sink) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16};
  } cfg;
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  std::fill(std::begin(a), std::end(a), uint16_t(0x3f80));
  std::fill(std::begin(b), std::end(b), uint16_t(0x33d6));
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  for (int64_t i = 0; i < iters / 16; ++i) {  // a tile product does 16× a VDPBF16PS's flops
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  *sink += c[0];
  return double(iters / 16) * 4.0 * 16384.0;
}
#else
double Bf16DotLoop(int64_t, float*) { return 0.0; }
double AmxDotLoop(int64_t, float*) { return 0.0; }
#endif

// Runs loop(iters, sink) on every pool thread at once; returns the total GFLOP/s.
double peak_gflops(BenchContext& ctx, double (*loop)(int64_t, float*)) {
  ThreadPool* pool = ctx.pool;
  const int threads = pool ? pool->num_threads() : 1;
  constexpr int64_t kIters = 20'000'000;
  std::vector<double> flops(size_t(threads), 0.0);
  std::vector<float> sinks(size_t(threads) * 16, 0.0f);  // one cache line per thread
  auto run = [&] {
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) flops[size_t(t)] = loop(kIters, &sinks[size_t(t) * 16]);
    };
    if (pool)
      pool->parallel_for(threads, 1, body);
    else
      body(0, 1);
  };
  const double s = ctx.time(run, 3, 0.0);
  double total = 0;
  for (double f : flops) total += f;
  return total / s / 1e9;
}

// One chunk per pool thread.
int64_t ctx_chunks(const BenchContext& ctx) {
  return std::max(1, ctx.pool ? ctx.pool->num_threads() : 1);
}

// GB/s of a pass over `bytes` split into one range per pool thread (bounds multiples of `align`),
// each range handed to pass(lo, hi, chunk): the median of timed runs after a warm-up.
double pass_gbps(BenchContext& ctx, size_t bytes, size_t align,
                 const std::function<void(size_t, size_t, int64_t)>& pass) {
  const int64_t chunks = ctx_chunks(ctx);
  const size_t units = bytes / align;
  auto run = [&] {
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        pass(units * size_t(c) / size_t(chunks) * align,
             c + 1 == chunks ? bytes : units * size_t(c + 1) / size_t(chunks) * align, c);
    };
    if (ctx.pool)
      ctx.pool->parallel_for(chunks, 1, body);
    else
      body(0, chunks);
  };
  return double(bytes) / ctx.time(run, 7, 0.3) / 1e9;
}

std::vector<std::pair<std::string, BenchFn>>& bench_registry() {
  static std::vector<std::pair<std::string, BenchFn>> r;
  return r;
}
}  // namespace

double BenchContext::time(const std::function<void()>& fn, int reps, double min_seconds) {
  auto t0 = Clock::now();
  fn();  // warm-up (page faults, caches, pool start)
  const double first = std::max(seconds_since(t0), 1e-9);
  const int n = std::clamp(int(min_seconds / first), reps, 200);
  std::vector<double> ts;
  for (int i = 0; i < n; ++i) {
    t0 = Clock::now();
    fn();
    ts.push_back(seconds_since(t0));
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

double BenchContext::memcpy_gbps(size_t bytes) {
  auto it = memcpy_cache.find(bytes);
  if (it != memcpy_cache.end()) return it->second;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double gbps = pass_gbps(*this, bytes, 1, [&](size_t lo, size_t hi, int64_t) {
    std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
  });
  memcpy_cache[bytes] = gbps;
  return gbps;
}

size_t beyond_cache_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where the OS does not say
  return std::max(size_t(64) << 20, l3 > 0 ? 2 * size_t(l3) : 0);
}

double BenchContext::read_gbps(size_t bytes) {
  if (read_cache.count(bytes)) return read_cache[bytes];
  bytes = (bytes + 255) / 256 * 256;
  // On the pages the runtime's weights get (detail::weight_alloc: huge pages where the OS gives
  // them), written once so every page is mapped before timing.
  const std::shared_ptr<std::byte> storage = detail::weight_alloc(bytes);
  auto* buf = reinterpret_cast<uint8_t*>(storage.get());
  std::memset(buf, 1, bytes);
  std::vector<uint64_t> sinks(size_t(ctx_chunks(*this)) * 8, 0);  // one cache line per chunk
  // The fastest of one sequential stream a chunk, prefetching 2 KiB ahead (best for one stream
  // here) or 8 KiB (what the decode-layout GEMM does), and four streams side by side, as the
  // decode-layout GEMM walks its panels and the M = 1 BF16 kernel its rows (on the EPYC VM
  // 1.3-1.5x one stream, and 64 bytes of each in turn 1.1-1.3x 256: docs/performance.md §8);
  // each prefetching into L1 and into L2, which the GEMMs do (§8, stop 44).
  struct Walk {
    size_t ahead, streams, grain;
  };
  double gbps = 0;
  for (const bool to_l2 : {false, true})
    for (const Walk& k : {Walk{2048, 1, 256}, Walk{8192, 1, 256}, Walk{2048, 4, 256},
                          Walk{1024, 4, 64}, Walk{2048, 4, 64}})
      gbps = std::max(gbps, pass_gbps(*this, bytes, 256, [&](size_t lo, size_t hi, int64_t c) {
                        sinks[size_t(c) * 8] +=
                            read_pass_sum(buf + lo, hi - lo, k.ahead, k.streams, k.grain, to_l2);
                      }));
  read_cache[bytes] = gbps;
  return gbps;
}

double BenchContext::fma_peak_gflops() {
  if (fma_cache <= 0)
    fma_cache = peak_gflops(*this, [](int64_t iters, float* sink) {
      return HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, sink);
    });
  return fma_cache;
}

double BenchContext::bf16_dot_peak_gflops() {
  if (bf16_dot_cache < 0)
    bf16_dot_cache = cpu::cpu_has_bf16_dot() ? peak_gflops(*this, &Bf16DotLoop) : 0.0;
  return bf16_dot_cache;
}

double BenchContext::amx_peak_gflops() {
  if (amx_cache < 0) amx_cache = cpu::cpu_has_amx() ? peak_gflops(*this, &AmxDotLoop) : 0.0;
  return amx_cache;
}

void BenchContext::emit(const BenchRecord& r) {
  nlohmann::ordered_json j;
  j["bench"] = r.bench;
  j["case"] = r.case_name;
  j["threads"] = threads;
  j["seconds"] = r.seconds;
  if (r.bytes > 0) {
    j["bytes"] = r.bytes;
    j["gbps"] = r.bytes / r.seconds / 1e9;
  }
  if (r.flops > 0) {
    j["flops"] = r.flops;
    j["gflops"] = r.flops / r.seconds / 1e9;
  }
  j["limit"] = r.limit;
  j["limit_value"] = r.limit_value;
  j["ratio"] = r.ratio;
  j["correct"] = r.correct;
  j["rel_err"] = r.rel_err;
  for (const auto& [k, v] : r.extra) j[k] = v;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

bool register_kernel_bench(const char* name, BenchFn fn) {
  bench_registry().emplace_back(name, fn);
  return true;
}

std::vector<std::pair<std::string, BenchFn>> kernel_benches() { return bench_registry(); }

}  // namespace deepinfer::kernels::testing
#endif  // HWY_ONCE
