// The collective conformance suite (docs/architecture.md §3, §7): every op of `Group` x dtype
// (full-range values) x size (0, 1, odd, >= 1 MiB) x split pattern, with payloads that encode their
// origin so each wrong element is attributed, and closed-form expected results for reductions. Runs
// on every rank of a group; results are agreed across ranks after each op.
#pragma once

#include <deepinfer/comm.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace deepinfer::conformance {

// Sizes, in one place. Large cases size the per-rank OUTPUT buffer to kLargeBytes (an
// all_gather block is kLargeBytes / world), so a 64-rank run stays at a few seconds.
constexpr size_t kLargeBytes = size_t(1) << 20;
constexpr size_t kOddCount = 1237;
constexpr double kBarrierSkewSeconds = 0.02;  // the last rank enters the barrier this late

// Which dtypes also run the >= 1 MiB size. Every op, dtype, split pattern, root and the
// sizes 0, 1 and odd run at every level.
//   quick:    i32 for every op, f32 sum for all_reduce, reduce_scatter.
//   standard: also f64 and u8 moves, bf16 broadcast, one reduction per dtype (the default).
//   full:     every dtype and reduction (the `large` stage).
enum class Coverage : uint8_t { quick, standard, full };

struct SuiteOptions {
  Coverage coverage = Coverage::standard;
};

struct CaseResult {
  std::string op;       // "all_to_all_v"
  std::string dtype;    // "i32", or "-" for barrier
  std::string name;     // "uneven", "sum", "root 3", "-"
  std::string size;     // "0", "1", "odd", ">=1MiB"
  size_t elements = 0;  // per-rank output elements (largest rank for the _v ops)
  uint64_t wrong = 0;   // wrong elements over all ranks
  std::string detail;   // empty when passed, else what went wrong and where
  bool passed() const { return detail.empty(); }
  std::string label(int world) const;  // "all_gather i32 >=1MiB at 16 ranks"
};

// Why the suite stopped early: a collective threw (CommTimeout when a peer hung or died).
struct SuiteStop {
  bool stopped = false;
  bool timeout = false;
  std::string where;    // "all_to_all_v i32 uneven odd" or "agreeing all_gather results"
  std::string message;  // the exception's message
  std::exception_ptr error;
};

struct SuiteReport {
  int world = 0;
  int rank = 0;
  std::string backend;
  std::vector<CaseResult> cases;   // agreed across ranks (the case in flight at a stop: local)
  std::vector<std::string> notes;  // cases not run, and why
  SuiteStop stop;
  Capabilities verified{false, false, false};  // lowerings whose every case passed
  size_t passed() const;
  size_t failed() const;
  bool ok() const { return failed() == 0 && !stop.stopped; }
};

// Runs the suite on this rank; collective, so every rank of `group` must call it. Never
// throws for a failing or hanging collective: the report says what happened.
SuiteReport run_suite(Group& group, const SuiteOptions& opts);

// The table (op, dtype, case, size, elements, result), the failures with their details, a
// stop line if the suite stopped, and last `collectives: N passed, M failed`.
// `extra_lines` (other ranks' stops) go just before that last line.
std::string format_report(const SuiteReport& report,
                          const std::vector<std::string>& extra_lines = {});

}  // namespace deepinfer::conformance
