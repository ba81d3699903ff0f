// `deepinfer bench kernels`: a registry of sub-benches, each printing JSON lines with the ratio to
// a limit measured in the same run (docs/performance.md §1). Sub-benches register from any file
// linked into the CLI (e.g. tools/cli/bench_kernels_attention.cpp):
//   DEEPINFER_KERNEL_BENCH(mla_decode) {      // body receives `BenchContext& ctx`, returns
//   failures
//     ... time with ctx.time(fn) ...; ctx.emit({...}); return 0;
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace deepinfer::kernels::testing {

// One JSON line.
struct BenchRecord {
  std::string bench;       // sub-bench, e.g. "gemm_fp8_decode"
  std::string case_name;   // e.g. "m=1 n=2048 k=7168"
  double seconds = 0;      // median of the timed runs
  double bytes = 0;        // bytes the kernel must move (0 if compute-bound)
  double flops = 0;        // floating-point operations (0 if memory-bound)
  std::string limit;       // "read_gbps", "memcpy_gbps", "fma_peak_gflops", "openblas_sgemm_s", ...
  double limit_value = 0;  // the limit measured in this run
  double ratio = 0;        // achieved / limit (for a time-based limit: limit seconds / seconds)
  bool correct = true;     // the result was checked against the host reference in this run
  double rel_err = 0;      // that check's ‖a−b‖/‖b‖
  std::map<std::string, double> extra = {};  // more numbers worth printing
};

// The read pass behind every weight-streaming limit: large enough that no cache holds it.
inline constexpr size_t kReadPassBytes = size_t(1) << 30;
// What the read pass's loop reads over [p, p + n) (n a multiple of 256), as `streams` parts side
// by side, `grain` bytes (64 or 256) of each in turn, prefetched `ahead` bytes ahead (into L2 where
// `to_l2`, else L1): the sum of its 64-bit words (tests check it covers every byte once).
uint64_t read_pass_sum(const uint8_t* p, size_t n, size_t ahead, size_t streams, size_t grain,
                       bool to_l2 = false);
// Bytes that a rotation over copies of a kernel's inputs must exceed so that each call finds
// them in DRAM, not in a cache an earlier call warmed: twice the last-level cache the OS reports
// (a 2-vCPU VM here reports 480 MiB of L3 and reads 64 MiB at 1.7× its 1 GiB rate), at least 64
// MiB.
size_t beyond_cache_bytes();

struct BenchContext {
  int threads = 2;
  bool quick = false;
  ThreadPool* pool = nullptr;  // sized `threads`; installed as the kernel pool during the bench

  // Median seconds of `fn` over `reps` runs after one warm-up (reps adapted to >= min_seconds
  // total).
  double time(const std::function<void()>& fn, int reps = 5, double min_seconds = 0.2);
  // Read bandwidth (GB/s) of a read-only pass over `bytes` split over the pool: the limit of
  // weight streaming (a decode step reads its weights and writes almost nothing). Use >= 1 GiB so
  // no cache level holds the buffer.
  double read_gbps(size_t bytes);
  // read_gbps measured again now (a long bench on a shared machine sees the bandwidth move).
  double read_gbps_fresh(size_t bytes) {
    read_cache.erase(bytes);
    return read_gbps(bytes);
  }
  // memcpy bandwidth (bytes copied per second, GB/s) on buffers of `bytes`, split over the pool:
  // the limit of timed copies (each byte is read and written).
  double memcpy_gbps(size_t bytes);
  // fp32 FMA peak (GFLOP/s, 2 flops per FMA lane) of a Highway FMA loop on every pool thread.
  double fma_peak_gflops();
  // BF16 dot-product peak (GFLOP/s, VDPBF16PS: 64 flops each) on every pool thread; 0 where the CPU
  // cannot run the decode layout (cpu::cpu_has_bf16_dot).
  double bf16_dot_peak_gflops();
  // AMX BF16 tile-product peak (GFLOP/s, TDPBF16PS on 16 × 16 × 32 tiles) on every pool thread; 0
  // where the CPU or the OS has no AMX (cpu::cpu_has_amx).
  double amx_peak_gflops();
  // The three peaks above are measured again at their next call.
  void forget_peaks() {
    fma_cache = 0;
    bf16_dot_cache = amx_cache = -1;
  }
  // Prints `r` as one JSON line to stdout.
  void emit(const BenchRecord& r);

  std::map<size_t, double> read_cache, memcpy_cache;
  double fma_cache = 0;
  double bf16_dot_cache = -1;
  double amx_cache = -1;
};

using BenchFn = int (*)(BenchContext& ctx);  // returns the number of failed correctness checks
bool register_kernel_bench(const char* name, BenchFn fn);
std::vector<std::pair<std::string, BenchFn>> kernel_benches();

#define DEEPINFER_KERNEL_BENCH(fn)                                    \
  static int fn(::deepinfer::kernels::testing::BenchContext& ctx);    \
  static const bool DEEPINFER_KERNEL_BENCH_##fn =                     \
      ::deepinfer::kernels::testing::register_kernel_bench(#fn, &fn); \
  static int fn(::deepinfer::kernels::testing::BenchContext& ctx)

}  // namespace deepinfer::kernels::testing
