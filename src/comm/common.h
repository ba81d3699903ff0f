// Shared pieces of the comm backends: op names, call descriptors (for mismatch errors),
// the timeout message, and the limits every backend uses (docs/architecture.md §8: constants in one
// place).
#pragma once

#include <deepinfer/comm.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <string>
#include <string_view>

namespace deepinfer::comm {

// Limits and tuning, with units.
constexpr int kMaxLocalWorld = 1024;               // ranks (threads) in one `local` world
constexpr size_t kReduceChunkElems = 4096;         // elements folded per cache-resident block
constexpr int kBarrierSpinIters = 4000;            // pause-loops before sleeping on the condvar
constexpr int kBarrierPureSpinIters = 500;         // of which the first (~10 us) never yield
constexpr size_t kMpiMaxCount = INT_MAX;           // MPI's int count/displacement limit
constexpr size_t kMpiBigTypeChunkBytes = 1 << 20;  // unit of the derived type for > INT_MAX bytes
constexpr double kMpiSpinSeconds =
    0.1;  // MPI_Test busy-poll before yielding (as blocking MPI does)
constexpr double kMpiSpinSecondsOversubscribed = 50e-6;  // more ranks than cores on this node
constexpr double kMpiYieldSeconds = 1.0;  // then sched_yield polls; sleep only in long stalls
constexpr std::chrono::microseconds kMpiPollSleep{50};
// A rank that called MPI_Abort and still lives this long after ends itself (_exit): the
// launcher that should kill it may be behind a network partition (docs/architecture.md §3).
constexpr double kMpiAbortGraceSeconds = 5.0;

using Clock = std::chrono::steady_clock;

enum class OpKind : uint8_t {
  all_gather,
  all_gather_v,
  all_reduce,
  reduce_scatter,
  all_to_all,
  all_to_all_v,
  broadcast,
  barrier
};

std::string_view op_name(OpKind op);

// all_to_all_v_rows arguments: offsets [world + 1], recv_rows [world]; an Error otherwise.
void check_rows_args(size_t world, size_t offsets, size_t recv_rows);
std::string_view reduce_op_name(ReduceOp op);

// What one rank asked for; two ranks in the same collective must agree on all of it.
// Per-peer counts of the _v ops are checked separately.
struct CallDesc {
  OpKind op = OpKind::barrier;
  DType dtype = DType::u8;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  size_t count = 0;
  bool operator==(const CallDesc&) const = default;
};
std::string describe(const CallDesc& d);  // "all_gather(count 10, i32)"

// "all_to_all_v timed out after 5.0 s on rank 3 of 8 (1048576 bytes sent); a peer hung or
// died — check the other ranks' errors, or raise DEEPINFER_COMM_TIMEOUT_S"
std::string timeout_message(std::string_view op, double timeout_s, int rank, int size,
                            size_t bytes);

Clock::time_point deadline_after(double seconds);

// The resolved deadline of one run: LaunchOptions.timeout_s if > 0, else the knob.
double resolve_timeout(double launch_timeout_s);

// Thrown by the `rank-exit` fault on the `local` backend: the rank thread stops as a crashed
// process would, and run_ranks does NOT tell the peers (they must time out on their own).
class RankDied : public Error {
 public:
  using Error::Error;
};

}  // namespace deepinfer::comm
