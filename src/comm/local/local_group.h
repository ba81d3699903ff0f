// `local` backend: N ranks as N threads of one process. Each collective publishes every
// rank's pointers in a shared LocalWorld, meets at a generation barrier, copies straight from
// the peers' buffers (one copy), and meets again before any buffer may be reused. Small payloads
// travel in the rank's own state instead, and then one meeting suffices.
#pragma once

#include <deepinfer/comm.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/common.h"

namespace deepinfer::comm {

// What one rank publishes for one call. Slots are double-buffered by call parity, so a rank
// may publish call k+1 while a slow peer still reads call k's descriptor.
struct LocalSlot {
  CallDesc desc;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  const size_t* send_counts = nullptr;  // all_to_all_v: [size]
  const size_t* recv_counts = nullptr;  // all_to_all_v, all_gather_v: [size]
  size_t send_count = 0;                // all_gather_v
  // all_to_all_v from rows (send_counts then in bytes): rank r's rows are
  // rows[row_offsets[r] .. row_offsets[r + 1]) of send, row_bytes each.
  const int64_t* rows = nullptr;
  const int64_t* row_offsets = nullptr;
  size_t row_bytes = 0;
  const std::byte* scratch = nullptr;  // all_reduce: this rank's reduced slice
};

// Payloads up to this size travel inside the rank's state instead of its caller's buffer, so the
// collective needs one meeting, not two: no rank rewrites call k's copy before its call k+2, which
// it reaches only after every peer has arrived at call k+1, that is, has finished reading call k.
constexpr size_t kLocalInlineBytes = 1024;

struct alignas(64) LocalRankState {
  LocalSlot slots[2];
  alignas(64) std::byte inline_payload[2][kLocalInlineBytes];  // by call parity
  std::vector<std::byte> scratch;  // all_reduce slice; resized only after barrier 1
  uint64_t calls = 0;
};

// The state shared by the rank threads of one run.
class LocalWorld {
 public:
  LocalWorld(int size, double timeout_s);

  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }
  LocalRankState& state(int rank) { return states_[size_t(rank)]; }

  // Generation barrier with a deadline. Throws CommTimeout when the deadline passes (and
  // marks the world broken) or when the world is already broken / a rank has returned.
  // `lent`: peers may still be reading (or writing) this rank's memory until they arrive here
  // (barrier 2 of a one-copy collective; the barrier closing an expose). A failing rank then
  // does not throw, and so cannot unwind and free that memory, before every peer has arrived
  // at this meeting or left the world (docs/architecture.md §3, "a failing rank holds").
  void arrive_and_wait(int rank, const CallDesc& desc, size_t bytes, Clock::time_point deadline,
                       bool lent);

  // A rank failed: every waiting and future collective fails fast with `reason`.
  void mark_broken(const std::string& reason);
  // A rank returned from its function: collectives still waiting on it can never complete.
  void mark_exited(int rank);
  // A rank's thread is done (returned, failed or died): it touches no peer's memory any more.
  // Tells nobody anything else (a silent death still leaves its peers to the deadline).
  void mark_left(int rank);
  bool broken() const { return broken_flag_.load(std::memory_order_acquire); }

 private:
  // Throws why `rank`'s call fails; with `lent`, first waits until no peer can still be reading
  // its memory. `arrived`: the rank is counted among this meeting's arrivals.
  [[noreturn]] void fail_locked(std::unique_lock<std::mutex>& lock, int rank, const CallDesc& desc,
                                bool arrived, bool lent, std::string timeout_msg = {});
  void leave_locked(int rank);

  const int size_;
  const double timeout_s_;
  const bool spin_;
  std::vector<LocalRankState> states_;

  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;         // at the current meeting; it never completes once the world is broken
  std::vector<char> left_;  // by rank: failed out of a collective or done (see mark_left)
  int left_count_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> broken_flag_{false};
  std::string broken_reason_;
  int exited_rank_ = -1;
};

class LocalGroup final : public Group {
 public:
  LocalGroup(std::shared_ptr<LocalWorld> world, int rank);

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  std::string backend() const override { return "local"; }
  Capabilities capabilities() const override { return {}; }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void all_gather_v(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, size_t count) override;
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override;
  void all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                         std::span<const int64_t> offsets, void* recv,
                         std::span<const size_t> recv_rows) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void barrier() override;
  PeerMemory peer_memory() const override { return PeerMemory::address_space; }
  void expose(std::span<const std::span<const std::byte>> regions,
              std::vector<const std::byte*>& peers) override;
  // Peers write the regions where they are (one address space).
  void expose_writable(std::span<const std::span<std::byte>> regions,
                       std::vector<std::byte*>& peers) override;

 private:
  LocalSlot& begin(const CallDesc& desc, size_t bytes);  // publishes desc, starts the clock
  void sync_start();  // barrier 1 + check that every rank made the same call
  void sync_end();    // barrier 2: peers are done with this rank's buffers
  // One meeting of this call; `lent`: peers may be using this rank's memory until they get here.
  void meet(bool lent);
  const LocalSlot& peer(int r) const;
  // Copies a small payload into this rank's inline buffer for this call and returns it, or
  // returns nullptr when it does not fit (the caller then meets twice).
  std::byte* stage_inline(const void* payload, size_t bytes);
  std::string check_match() const;  // empty, or why the ranks' calls do not match
  // The receive half of all_to_all_v(_rows), after sync_start: copies every peer's block for this
  // rank, from its packed buffer or straight from its rows.
  void receive_all_to_all_v(std::byte* out, std::span<const size_t> recv_counts, size_t es) const;

  std::shared_ptr<LocalWorld> world_;
  const int rank_;
  CallDesc desc_;
  size_t bytes_ = 0;
  int parity_ = 0;
  Clock::time_point deadline_;
  bool exposed_ = false;  // an expose's regions are in the peers' hands until the next barrier
  std::vector<size_t> row_send_bytes_;    // all_to_all_v_rows: the bytes to each rank, published
  std::vector<const float*> reduce_src_;  // reduce_scatter: my block of each rank's send
};

}  // namespace deepinfer::comm
