// `bench decode --ab`: two deepinfer processes, this one (A) and a peer it starts (B, another
// binary or other knobs), decode the same sequences taking turns one engine step at a time, so
// each binary's steps sit next to the other's in time. On a shared VM whose read bandwidth moves
// ±25% between minutes, two whole runs cannot see a 5% change; adjacent steps can
// (docs/performance.md §1).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace deepinfer::cli {

// Which process runs global slot s: A B B A A B B A ... (ABBA), so a drift of the machine during
// a pair of slots favours neither side.
inline int slot_owner(int64_t s) { return int(((s + 1) / 2) % 2); }

class StepTurns {
 public:
  // A: starts `argv` (argv[0] the binary; "--ab-peer R,W" is appended) with `env` added to this
  // process's environment. The peer attaches to the pipe ends it is given.
  static StepTurns spawn(std::vector<std::string> argv, const std::vector<std::string>& env);
  static StepTurns attach(const std::string& fds);  // B: "R,W" from --ab-peer
  StepTurns(StepTurns&& o) noexcept;
  StepTurns& operator=(StepTurns&&) = delete;
  ~StepTurns();

  bool is_a() const { return me_ == 0; }
  // Blocks until this process may run its next slot (the peer handed the turn over or is done).
  void acquire();
  // This process ran its slot: the turn goes to the peer where the ABBA order says, after
  // `before_handover` (e.g. letting this process's idle threads fall asleep, so their polling
  // does not take CPU time from the peer's step).
  void release(const std::function<void()>& before_handover = {});
  // This process has no more slots: the peer runs the rest alone. Call once, between slots.
  void finish();
  // After both finished: B sends, A receives (length-prefixed; T trivially copyable).
  template <class T>
  void send(const std::vector<T>& v) {
    const uint64_t n = v.size();
    write_all(&n, sizeof n);
    write_all(v.data(), n * sizeof(T));
  }
  template <class T>
  std::vector<T> receive() {
    uint64_t n = 0;
    read_all(&n, sizeof n);
    std::vector<T> v(n);
    read_all(v.data(), n * sizeof(T));
    return v;
  }
  // A: waits for the peer to exit; throws if it failed.
  void wait_peer();

 private:
  StepTurns(int me, int in, int out, pid_t pid, std::string peer)
      : me_(me), in_(in), out_(out), pid_(pid), peer_(std::move(peer)) {}
  void write_all(const void* p, size_t n);
  void read_all(void* p, size_t n);
  bool holding() const { return peer_done_ || slot_owner(slot_) == me_; }

  int me_;
  int in_, out_;
  pid_t pid_;         // A: the peer's pid; B: -1
  std::string peer_;  // what the errors call the peer
  int64_t slot_ = 0;  // the next global slot
  bool peer_done_ = false;
  bool finished_ = false;
};

}  // namespace deepinfer::cli
