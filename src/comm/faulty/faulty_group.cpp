#include "comm/faulty/faulty_group.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "comm/common.h"
#include "comm/group_decorator.h"
#include "core/check.h"
#include "core/log.h"

namespace deepinfer {

namespace {
constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kFaults{{
    {"int32-ag-corrupt",
     "all_gather of i32 with output >= 1 MiB at >= 16 ranks: values with |v| >= 2^24 lose their "
     "low "
     "bits, as if the backend went through float"},
    {"a2av-hang",
     "all_to_all_v with uneven splits at >= 4 ranks never completes on the highest rank; the other "
     "ranks time out"},
    {"a2a-diverge",
     "all_to_all_v: each rank picks its lowering from its LOCAL splits; a rank whose own "
     "send_counts "
     "are all equal assumes equal receive blocks too and misplaces (zero-fills) data whenever its "
     "recv_counts are not all equal (sender-dependent or empty splits)"},
    {"rank-exit",
     "the highest rank dies in its 2nd collective call (local: its thread stops without telling "
     "peers; mpi: the process stops answering and exits with status 1 after the deadline); "
     "the peers must time out"},
}};
}  // namespace

std::span<const std::pair<std::string_view, std::string_view>> fault_names() { return kFaults; }

namespace comm {
namespace {

enum class Fault : uint8_t { int32_ag_corrupt, a2av_hang, a2a_diverge, rank_exit };

Fault parse_fault(const std::string& name) {
  if (name == "int32-ag-corrupt") return Fault::int32_ag_corrupt;
  if (name == "a2av-hang") return Fault::a2av_hang;
  if (name == "a2a-diverge") return Fault::a2a_diverge;
  if (name == "rank-exit") return Fault::rank_exit;
  std::string known;
  for (const auto& [n, d] : kFaults) known += fmt::format("\n  {:<17} {}", n, d);
  DI_FAIL("unknown fault '{}'; known faults:{}", name, known);
}

bool all_equal(std::span<const size_t> v) {
  for (size_t x : v)
    if (x != v[0]) return false;
  return true;
}

// What a float-based transport does to an int32: round to 24 significant bits (saturating).
int32_t through_float(int32_t v) {
  const double f = double(float(v));
  if (f >= 2147483647.0) return std::numeric_limits<int32_t>::max();
  return int32_t(f);
}

// Every collective is counted (rank-exit) and may be broken; peer memory is never offered, so
// nothing goes around the collectives it breaks.
class FaultyGroup final : public GroupDecorator {
 public:
  FaultyGroup(std::unique_ptr<Group> inner, std::string name, double timeout_s)
      : GroupDecorator(std::move(inner)),
        name_(std::move(name)),
        fault_(parse_fault(name_)),
        timeout_s_(timeout_s) {}

  std::string backend() const override {
    return fmt::format("faulty({})/{}", name_, inner().backend());
  }
  Capabilities capabilities() const override {
    Capabilities c = inner().capabilities();
    if (breaks_all_to_all_v()) c.all_to_all_v = false;
    return c;
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    enter(OpKind::all_gather);
    inner().all_gather(send, recv, count, dtype);
    if (fault_ == Fault::int32_ag_corrupt && dtype == DType::i32 && size() >= kAgCorruptMinWorld &&
        count * 4 * size_t(size()) >= kAgCorruptMinBytes) {
      auto* v = static_cast<int32_t*>(recv);
      for (size_t i = 0, n = count * size_t(size()); i < n; ++i)
        if (std::abs(int64_t(v[i])) >= (int64_t(1) << 24)) v[i] = through_float(v[i]);
    }
  }
  void all_gather_v(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    enter(OpKind::all_gather_v);
    inner().all_gather_v(send, send_count, recv, recv_counts, dtype);
  }
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    enter(OpKind::all_reduce);
    inner().all_reduce(buf, count, dtype, op);
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    enter(OpKind::reduce_scatter);
    inner().reduce_scatter(send, recv, count);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    enter(OpKind::all_to_all);
    inner().all_to_all(send, recv, count, dtype);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType dtype) override {
    enter(OpKind::all_to_all_v);
    if (fault_ == Fault::a2av_hang && size() >= kA2avHangMinWorld && rank() == size() - 1 &&
        !(all_equal(send_counts) && all_equal(recv_counts))) {
      hang(OpKind::all_to_all_v, send_counts, dtype);
    }
    if (fault_ == Fault::a2a_diverge && size() > 1 && all_equal(send_counts)) {
      diverged_all_to_all_v(send, send_counts, recv, recv_counts, dtype);
      return;
    }
    inner().all_to_all_v(send, send_counts, recv, recv_counts, dtype);
  }
  // The same exchange as all_to_all_v: where the fault breaks all_to_all_v it breaks this too
  // (Group's default packs the rows and calls this->all_to_all_v); else the inner group's own.
  void all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                         std::span<const int64_t> offsets, void* recv,
                         std::span<const size_t> recv_rows) override {
    if (breaks_all_to_all_v()) {
      Group::all_to_all_v_rows(base, row_bytes, rows, offsets, recv, recv_rows);
      return;
    }
    enter(OpKind::all_to_all_v);
    inner().all_to_all_v_rows(base, row_bytes, rows, offsets, recv, recv_rows);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    enter(OpKind::broadcast);
    inner().broadcast(buf, count, dtype, root);
  }
  void barrier() override {
    enter(OpKind::barrier);
    inner().barrier();
  }

  // No peer memory whatever the inner group has: a peer read would bypass the broken collectives.
  PeerMemory peer_memory() const override { return PeerMemory::none; }
  void expose(std::span<const std::span<const std::byte>> regions,
              std::vector<const std::byte*>& peers) override {
    Group::expose(regions, peers);  // throws: no peer memory
  }
  void expose_writable(std::span<const std::span<std::byte>>, std::vector<std::byte*>&) override {
    DI_FAIL("{}: expose_writable on a group without peer memory", backend());
  }
  std::byte* expose_staging(size_t) override { return nullptr; }

 private:
  bool breaks_all_to_all_v() const {
    return fault_ == Fault::a2av_hang || fault_ == Fault::a2a_diverge;
  }

  // Counts calls and fires `rank-exit`.
  void enter(OpKind op) {
    const int call = calls_++;
    if (fault_ != Fault::rank_exit || call != kRankExitCall || rank() != size() - 1) return;
    const std::string msg =
        fmt::format("rank {} of {} dies in the middle of {} (injected fault rank-exit)", rank(),
                    size(), op_name(op));
    log_error("{}", msg);
    if (inner().backend() == "mpi") {
      // A dead process that the launcher has not noticed yet: it never answers, the peers hit
      // their deadline and abort the job (deterministically printing the CommTimeout); if they
      // somehow do not, it exits with status 1 right after.
      std::fflush(nullptr);
      std::this_thread::sleep_for(
          std::chrono::duration<double>(timeout_s_ + kRankExitLingerSeconds));
      ::_exit(1);
    }
    throw RankDied(msg);
  }

  // a2av-hang: this rank never enters the collective; it waits out the deadline (so the
  // process still exits) while the peers time out waiting for it.
  [[noreturn]] void hang(OpKind op, std::span<const size_t> send_counts, DType dtype) {
    log_warn("{} hangs on rank {} of {} (injected fault a2av-hang)", op_name(op), rank(), size());
    const auto deadline = deadline_after(timeout_s_);
    while (Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    size_t sent = 0;
    for (size_t c : send_counts) sent += c;
    throw CommTimeout(
        timeout_message(op_name(op), timeout_s_, rank(), size(), sent * dtype_size(dtype)) +
        " [injected fault a2av-hang: this rank hung]");
  }

  // a2a-diverge: this rank's send splits are even, so it "lowers" to all_to_all and assumes its
  // receive blocks are `c` elements each at stride `c`. The bytes travel correctly (so no
  // transport misbehaves), but land where the even lowering would have put them.
  void diverged_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                             std::span<const size_t> recv_counts, DType dtype) {
    const size_t es = dtype_size(dtype);
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    std::vector<std::byte> tmp(total * es);
    inner().all_to_all_v(send, send_counts, tmp.data(), recv_counts, dtype);
    const size_t c = send_counts[0];
    auto* out = static_cast<std::byte*>(recv);
    if (total) std::memset(out, 0, total * es);
    size_t off = 0;
    for (size_t j = 0; j < recv_counts.size(); ++j) {
      const size_t dst = j * c;
      const size_t n = dst < total ? std::min({c, recv_counts[j], total - dst}) : 0;
      if (n) std::memcpy(out + dst * es, tmp.data() + off * es, n * es);
      off += recv_counts[j];
    }
  }

  std::string name_;
  Fault fault_;
  double timeout_s_;
  int calls_ = 0;
};

}  // namespace

void check_fault_name(const std::string& name) { parse_fault(name); }

int fault_min_world(const std::string& name) {
  switch (parse_fault(name)) {
    case Fault::int32_ag_corrupt:
      return kAgCorruptMinWorld;
    case Fault::a2av_hang:
      return kA2avHangMinWorld;
    case Fault::a2a_diverge:
      return 2;  // needs a peer whose splits differ
    case Fault::rank_exit:
      return 1;
  }
  return 1;
}

std::unique_ptr<Group> make_faulty_group(std::unique_ptr<Group> inner, const std::string& fault,
                                         double timeout_s) {
  return std::make_unique<FaultyGroup>(std::move(inner), fault, timeout_s);
}

}  // namespace comm
}  // namespace deepinfer
