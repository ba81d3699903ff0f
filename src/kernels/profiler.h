// The decode profile (docs/performance.md §8): where one forward's time goes, per kernel op and
// per model part, so the gap to the roofline is named, not guessed. A Profiler installed on a
// rank's thread (ScopedProfiler) sees every kernel call that thread dispatches (its wall time and
// the part of it spent waiting for pool workers) and every KernelTag scope (inclusive wall time;
// scopes marked ScopeKind::collective are where the rank talks to its group). With limits set, each
// GEMM call is also held against its own roofline: the slower of reading its weights at the read
// bandwidth and running its flops at the peak of the instruction it runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace deepinfer::kernels {

enum class ScopeKind : uint8_t { compute, collective };

// What a kernel call cannot do with less: the weight bytes it streams and its flops (GEMMs; zero
// for the other ops, whose floor the profile does not claim). fp8: it runs the fp8 GEMM kernel,
// whose instruction may differ from the bf16 GEMM's (AMX).
struct KernelWork {
  double weight_bytes = 0, flops = 0;
  bool fp8 = false;
  KernelWork& operator+=(const KernelWork& o) {
    weight_bytes += o.weight_bytes;
    flops += o.flops;
    return *this;
  }
};

// The limits a call's floor is taken against, for the threads this profiler's rank runs on.
struct RooflineLimits {
  double read_gbps = 0;        // a read-only pass
  double peak_gflops = 0;      // the bf16 GEMMs' instruction
  double fp8_peak_gflops = 0;  // the fp8 GEMMs' instruction
};

class Profiler {
 public:
  struct OpStat {
    int64_t calls = 0;
    double seconds = 0;    // wall time of the calls on the dispatching thread
    double pool_wait = 0;  // of which: waiting for pool workers after its own chunks
    double weight_bytes = 0, flops = 0;
    double floor = 0;  // Σ over calls of max(weight_bytes / read, flops / peak), in seconds
    OpStat& operator+=(const OpStat& o) {
      calls += o.calls;
      seconds += o.seconds;
      pool_wait += o.pool_wait;
      weight_bytes += o.weight_bytes;
      flops += o.flops;
      floor += o.floor;
      return *this;
    }
  };
  struct ScopeStat {
    ScopeKind kind = ScopeKind::compute;
    int64_t entries = 0;
    double seconds = 0;  // inclusive wall time
  };

  // Set before the calls: each call's floor is taken when it is counted. Unset (zero): no floors.
  void set_limits(const RooflineLimits& l) { limits_ = l; }
  const RooflineLimits& limits() const { return limits_; }

  void on_kernel(std::string_view op, std::string_view tag, double seconds, double pool_wait,
                 const KernelWork& work = {});
  void on_scope(std::string_view tag, ScopeKind kind, double seconds);
  void reset();

  // (tag, op) -> stats; tag is the KernelTag path at the call ("" outside any).
  const std::map<std::pair<std::string, std::string>, OpStat>& kernels() const { return kernels_; }
  // tag path -> stats.
  const std::map<std::string, ScopeStat>& scopes() const { return scopes_; }

  // The profile as a text table, every figure in ms per step over `steps` steps whose total wall
  // time was `total_seconds`: one block per op (summed over layers) and one per top-level part
  // (embed, layer0, ..., head, sample), each split into kernel compute, pool waiting, collective
  // time (collective scopes less the kernels inside them) and everything else; then the time
  // outside every scope. With limits, the op block also gives each op's floor (the sum of its
  // calls' rooflines) and how many times it the op took, and a line sums the floors of the step.
  std::string table(int64_t steps, double total_seconds) const;

 private:
  std::map<std::pair<std::string, std::string>, OpStat> kernels_;
  std::map<std::string, ScopeStat> scopes_;
  RooflineLimits limits_;
};

// This thread's profiler (the innermost ScopedProfiler), or nullptr.
Profiler* active_profiler();

class ScopedProfiler {
 public:
  explicit ScopedProfiler(Profiler* p);
  ~ScopedProfiler();
  ScopedProfiler(const ScopedProfiler&) = delete;
  ScopedProfiler& operator=(const ScopedProfiler&) = delete;

 private:
  Profiler* saved_;
};

}  // namespace deepinfer::kernels
