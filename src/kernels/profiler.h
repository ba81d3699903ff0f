// The decode profile (docs/performance.md §8): where one forward's time goes, per kernel op and
// per model part, so the gap to the roofline is named, not guessed. A Profiler installed on a
// rank's thread (ScopedProfiler) sees every kernel call that thread dispatches (its wall time and
// the part of it spent waiting for pool workers) and every KernelTag scope (inclusive wall time;
// scopes marked ScopeKind::collective are where the rank talks to its group).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace deepinfer::kernels {

enum class ScopeKind : uint8_t { compute, collective };

class Profiler {
 public:
  struct OpStat {
    int64_t calls = 0;
    double seconds = 0;    // wall time of the calls on the dispatching thread
    double pool_wait = 0;  // of which: waiting for pool workers after its own chunks
  };
  struct ScopeStat {
    ScopeKind kind = ScopeKind::compute;
    int64_t entries = 0;
    double seconds = 0;  // inclusive wall time
  };

  void on_kernel(std::string_view op, std::string_view tag, double seconds, double pool_wait);
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
  // outside every scope.
  std::string table(int64_t steps, double total_seconds) const;

 private:
  std::map<std::pair<std::string, std::string>, OpStat> kernels_;
  std::map<std::string, ScopeStat> scopes_;
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
