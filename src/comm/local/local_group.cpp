#include "comm/local/local_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <type_traits>

#include "core/check.h"
#include "core/cpu_clones.h"

namespace deepinfer::comm {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// dst[i] = ((src[0][i] + src[1][i]) + ...) + src[n-1][i], 64 columns at a time with the sums in
// registers: one pass over the sources and one store, not a copy of src[0] with the others
// folded in one by one (docs/performance.md §4). dst may be one of the sources.
DI_CPU_CLONES void sum_in_rank_order(const float* const* src, int n, float* dst, size_t count) {
  constexpr size_t kCols = 64;
  size_t c = 0;
  for (; c + kCols <= count; c += kCols) {
    float acc[kCols];
    for (size_t i = 0; i < kCols; ++i) acc[i] = src[0][c + i];
    for (int r = 1; r < n; ++r)
      for (size_t i = 0; i < kCols; ++i) acc[i] += src[r][c + i];
    for (size_t i = 0; i < kCols; ++i) dst[c + i] = acc[i];
  }
  for (; c < count; ++c) {
    float acc = src[0][c];
    for (int r = 1; r < n; ++r) acc += src[r][c];
    dst[c] = acc;
  }
}

inline void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

// a ⊕ b for the fold; integer sums wrap (two's complement) instead of being UB.
template <class T, ReduceOp kOp>
inline T combine(T a, T b) {
  if constexpr (kOp == ReduceOp::sum) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return T(U(a) + U(b));
    } else {
      return a + b;
    }
  } else if constexpr (kOp == ReduceOp::max) {
    return b > a ? b : a;
  } else {
    return b < a ? b : a;
  }
}

// acc[i] = acc[i] ⊕ x[i]
template <class T, ReduceOp kOp>
void fold_typed(std::byte* acc_b, const std::byte* x_b, size_t n) {
  T* acc = reinterpret_cast<T*>(acc_b);
  const T* x = reinterpret_cast<const T*>(x_b);
  for (size_t i = 0; i < n; ++i) acc[i] = combine<T, kOp>(acc[i], x[i]);
}

template <class T>
void fold_op(std::byte* acc, const std::byte* x, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return fold_typed<T, ReduceOp::sum>(acc, x, n);
    case ReduceOp::max:
      return fold_typed<T, ReduceOp::max>(acc, x, n);
    case ReduceOp::min:
      return fold_typed<T, ReduceOp::min>(acc, x, n);
  }
}

void fold(std::byte* acc, const std::byte* x, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      return fold_op<float>(acc, x, n, op);
    case DType::f64:
      return fold_op<double>(acc, x, n, op);
    case DType::i32:
      return fold_op<int32_t>(acc, x, n, op);
    case DType::i64:
      return fold_op<int64_t>(acc, x, n, op);
    default:
      DI_FAIL("all_reduce supports f32, f64, i32 and i64, got {}", dtype_name(dtype));
  }
}

// Rank r's share [lo, hi) of `count` elements split into `n` contiguous slices.
inline size_t slice_begin(size_t count, int n, int r) {
  return count / size_t(n) * size_t(r) + std::min(count % size_t(n), size_t(r));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// LocalWorld

LocalWorld::LocalWorld(int size, double timeout_s)
    : size_(size),
      timeout_s_(timeout_s),
      spin_(size <= int(std::max(1u, std::thread::hardware_concurrency()))),
      states_(size_t(size)),
      left_(size_t(size), 0) {
  DI_CHECK(size >= 1 && size <= kMaxLocalWorld, "local world size must be in [1, {}], got {}",
           kMaxLocalWorld, size);
  DI_CHECK(timeout_s > 0, "comm timeout must be > 0 s, got {}", timeout_s);
}

void LocalWorld::leave_locked(int rank) {
  if (left_[size_t(rank)]) return;
  left_[size_t(rank)] = 1;
  ++left_count_;
}

void LocalWorld::fail_locked(std::unique_lock<std::mutex>& lock, int rank, const CallDesc& desc,
                             bool arrived, bool lent, std::string timeout_msg) {
  if (arrived) --arrived_;
  leave_locked(rank);
  cv_.notify_all();  // a peer holding for its lent memory may be waiting for this rank
  // Every rank is now at this meeting or gone, or between meetings, where it may still read what
  // this rank lent it. The world is broken or a rank has returned, so no meeting completes any
  // more: each of those peers fails at its next one (at once) or ends its function, and only
  // then may this rank unwind. That wait is bounded by the peers' own work, which run_ranks
  // waits for anyway before it returns.
  if (lent) cv_.wait(lock, [&] { return arrived_ + left_count_ >= size_; });
  if (!timeout_msg.empty()) throw CommTimeout(timeout_msg);
  if (!broken_reason_.empty())
    throw CommTimeout(
        fmt::format("{} on rank {} of {} abandoned because another rank failed first: {}",
                    op_name(desc.op), rank, size_, broken_reason_));
  throw CommTimeout(fmt::format(
      "{} on rank {} of {} can never complete: rank {} already returned from its function — every "
      "rank must make the same collective calls",
      op_name(desc.op), rank, size_, exited_rank_));
}

void LocalWorld::arrive_and_wait(int rank, const CallDesc& desc, size_t bytes,
                                 Clock::time_point deadline, bool lent) {
  std::unique_lock lock(mu_);
  if (broken_flag_.load(std::memory_order_relaxed) || exited_rank_ >= 0)
    fail_locked(lock, rank, desc, false, lent);
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  if (++arrived_ == size_) {
    arrived_ = 0;
    generation_.store(gen + 1, std::memory_order_release);
    lock.unlock();
    cv_.notify_all();
    return;
  }
  if (spin_) {
    lock.unlock();
    for (int i = 0; i < kBarrierSpinIters; ++i) {
      if (generation_.load(std::memory_order_acquire) != gen) return;
      if (broken_flag_.load(std::memory_order_relaxed)) break;
      // After ~10 us, yield now and then: a peer that the scheduler put on this same CPU then
      // runs at once instead of after the whole spin (docs/performance.md §4); a CPU of its own
      // makes the yield return at once.
      if (i >= kBarrierPureSpinIters && i % 64 == 0)
        std::this_thread::yield();
      else
        cpu_relax();
    }
    lock.lock();
  }
  while (generation_.load(std::memory_order_acquire) == gen) {
    if (broken_flag_.load(std::memory_order_relaxed) || exited_rank_ >= 0)
      fail_locked(lock, rank, desc, true, lent);
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        generation_.load(std::memory_order_acquire) == gen) {
      if (broken_flag_.load(std::memory_order_relaxed)) fail_locked(lock, rank, desc, true, lent);
      std::string msg = timeout_message(op_name(desc.op), timeout_s_, rank, size_, bytes);
      broken_reason_ = msg;
      broken_flag_.store(true, std::memory_order_release);
      fail_locked(lock, rank, desc, true, lent, std::move(msg));
    }
  }
}

void LocalWorld::mark_broken(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (broken_flag_.load(std::memory_order_relaxed)) return;  // keep the first (root) reason
    broken_reason_ = reason;
    broken_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void LocalWorld::mark_exited(int rank) {
  {
    std::lock_guard lock(mu_);
    if (exited_rank_ < 0) exited_rank_ = rank;
  }
  cv_.notify_all();
}

void LocalWorld::mark_left(int rank) {
  {
    std::lock_guard lock(mu_);
    leave_locked(rank);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------
// LocalGroup

LocalGroup::LocalGroup(std::shared_ptr<LocalWorld> world, int rank)
    : world_(std::move(world)), rank_(rank) {
  DI_CHECK(rank >= 0 && rank < world_->size(), "rank {} out of range for a world of {}", rank,
           world_->size());
}

const LocalSlot& LocalGroup::peer(int r) const { return world_->state(r).slots[parity_]; }

std::byte* LocalGroup::stage_inline(const void* payload, size_t bytes) {
  if (bytes > kLocalInlineBytes) return nullptr;
  std::byte* at = world_->state(rank_).inline_payload[parity_];
  copy_bytes(at, static_cast<const std::byte*>(payload), bytes);
  return at;
}

LocalSlot& LocalGroup::begin(const CallDesc& desc, size_t bytes) {
  LocalRankState& st = world_->state(rank_);
  parity_ = int(st.calls++ & 1);
  desc_ = desc;
  bytes_ = bytes;
  deadline_ = deadline_after(world_->timeout_s());
  LocalSlot& s = st.slots[parity_];
  s = LocalSlot{};
  s.desc = desc;
  return s;
}

void LocalGroup::meet(bool lent) {
  world_->arrive_and_wait(rank_, desc_, bytes_, deadline_, lent || exposed_);
}

void LocalGroup::sync_start() {
  meet(false);  // nobody has read this call's buffers yet
  if (std::string why = check_match(); !why.empty()) {
    // Every rank reaches the same verdict; meet once more so no rank unwinds (freeing the
    // counts its peers are still checking) before all are done reading.
    meet(true);
    throw Error(why);
  }
}

void LocalGroup::sync_end() { meet(true); }

// Every rank runs the same checks in the same order on the same published data, so all ranks
// agree on the verdict and all throw (none copies from a peer that is about to unwind).
std::string LocalGroup::check_match() const {
  const int n = size();
  const LocalSlot& s0 = peer(0);
  for (int r = 1; r < n; ++r) {
    const LocalSlot& sr = peer(r);
    if (!(sr.desc == s0.desc))
      return fmt::format(
          "collective mismatch seen on rank {} of {}: rank 0 called {} but rank {} called {} — "
          "every "
          "rank must make the same collective calls, in the same order, with matching counts",
          rank_, n, describe(s0.desc), r, describe(sr.desc));
  }
  if (s0.desc.op == OpKind::all_to_all_v) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const size_t sent = peer(i).send_counts[j], expected = peer(j).recv_counts[i];
        if (sent != expected)
          return fmt::format(
              "all_to_all_v counts disagree (seen on rank {} of {}): rank {} sends {} elements to "
              "rank {}, but rank {} expects {} from rank {}",
              rank_, n, i, sent, j, j, expected, i);
      }
  } else if (s0.desc.op == OpKind::all_gather_v) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const size_t sent = peer(i).send_count, expected = peer(j).recv_counts[i];
        if (sent != expected)
          return fmt::format(
              "all_gather_v counts disagree (seen on rank {} of {}): rank {} sends {} elements, "
              "but rank {} expects {} from it",
              rank_, n, i, sent, j, expected);
      }
  }
  return {};
}

void LocalGroup::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  LocalSlot& s = begin({OpKind::all_gather, dtype, ReduceOp::sum, 0, count}, bytes);
  const std::byte* staged = stage_inline(send, bytes);
  s.send = staged ? staged : static_cast<const std::byte*>(send);
  sync_start();
  auto* out = static_cast<std::byte*>(recv);
  const int n = size();
  for (int i = 0; i < n; ++i) {
    const int r = (rank_ + i) % n;  // staggered so ranks do not all read rank 0 at once
    copy_bytes(out + size_t(r) * bytes, peer(r).send, bytes);
  }
  if (!staged) sync_end();
}

void LocalGroup::all_gather_v(const void* send, size_t send_count, void* recv,
                              std::span<const size_t> recv_counts, DType dtype) {
  const int n = size();
  DI_CHECK(recv_counts.size() == size_t(n), "all_gather_v: recv_counts has {} entries, world is {}",
           recv_counts.size(), n);
  const size_t es = dtype_size(dtype);
  LocalSlot& s = begin({OpKind::all_gather_v, dtype, ReduceOp::sum, 0, 0}, send_count * es);
  s.send = static_cast<const std::byte*>(send);
  s.send_count = send_count;
  s.recv_counts = recv_counts.data();
  sync_start();
  std::vector<size_t> offset(size_t(n) + 1, 0);
  for (int r = 0; r < n; ++r) offset[size_t(r) + 1] = offset[size_t(r)] + recv_counts[size_t(r)];
  auto* out = static_cast<std::byte*>(recv);
  for (int i = 0; i < n; ++i) {
    const int r = (rank_ + i) % n;
    copy_bytes(out + offset[size_t(r)] * es, peer(r).send, recv_counts[size_t(r)] * es);
  }
  sync_end();  // also with a small payload: peers' checks read recv_counts, which is the caller's
}

void LocalGroup::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  DI_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64,
           "all_reduce supports f32, f64, i32 and i64, got {}", dtype_name(dtype));
  const size_t es = dtype_size(dtype);
  const int n = size();
  LocalSlot& s = begin({OpKind::all_reduce, dtype, op, 0, count}, count * es);
  if (const std::byte* staged = stage_inline(buf, count * es)) {
    // Small: every rank folds all inline copies in ascending rank order (the same bits on
    // every rank) after one meeting.
    s.send = staged;
    sync_start();
    auto* out = static_cast<std::byte*>(buf);
    copy_bytes(out, peer(0).send, count * es);
    for (int r = 1; r < n; ++r) fold(out, peer(r).send, count, dtype, op);
    return;
  }
  s.recv = static_cast<std::byte*>(buf);
  sync_start();
  // Phase 1: reduce my slice of every rank's buffer into my scratch, folding in ascending rank
  // order so each element is computed exactly once and every rank gets the same bits.
  const size_t lo = slice_begin(count, n, rank_), hi = slice_begin(count, n, rank_ + 1);
  LocalRankState& st = world_->state(rank_);
  // Safe to resize now: every peer has arrived at this call, so none still reads my old scratch.
  if (st.scratch.size() < (hi - lo) * es) st.scratch.resize((hi - lo) * es);
  std::byte* acc = st.scratch.data();
  s.scratch = acc;
  for (size_t c0 = lo; c0 < hi; c0 += kReduceChunkElems) {
    const size_t m = std::min(kReduceChunkElems, hi - c0);
    std::byte* a = acc + (c0 - lo) * es;
    std::memcpy(a, peer(0).recv + c0 * es, m * es);
    for (int r = 1; r < n; ++r) fold(a, peer(r).recv + c0 * es, m, dtype, op);
  }
  sync_end();
  // Phase 2: gather every slice into my buffer. Nobody reads my buffer any more, and a peer's
  // scratch stays valid until that peer passes barrier 1 of the next call, which needs me.
  auto* out = static_cast<std::byte*>(buf);
  for (int i = 0; i < n; ++i) {
    const int r = (rank_ + i) % n;
    const size_t rlo = slice_begin(count, n, r), rhi = slice_begin(count, n, r + 1);
    copy_bytes(out + rlo * es, peer(r).scratch, (rhi - rlo) * es);
  }
}

void LocalGroup::reduce_scatter(const float* send, float* recv, size_t count) {
  const int n = size();
  LocalSlot& s = begin({OpKind::reduce_scatter, DType::f32, ReduceOp::sum, 0, count},
                       count * sizeof(float) * size_t(n));
  s.send = reinterpret_cast<const std::byte*>(send);
  sync_start();
  // My block of every rank's send, summed in rank order; only I read my block of my own send,
  // so recv may alias it.
  reduce_src_.resize(size_t(n));
  for (int r = 0; r < n; ++r)
    reduce_src_[size_t(r)] = reinterpret_cast<const float*>(peer(r).send) + size_t(rank_) * count;
  sum_in_rank_order(reduce_src_.data(), n, recv, count);
  sync_end();
}

void LocalGroup::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const int n = size();
  LocalSlot& s = begin({OpKind::all_to_all, dtype, ReduceOp::sum, 0, count}, bytes * size_t(n));
  s.send = static_cast<const std::byte*>(send);
  sync_start();
  auto* out = static_cast<std::byte*>(recv);
  for (int i = 0; i < n; ++i) {
    const int r = (rank_ + i) % n;
    copy_bytes(out + size_t(r) * bytes, peer(r).send + size_t(rank_) * bytes, bytes);
  }
  sync_end();
}

void LocalGroup::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                              std::span<const size_t> recv_counts, DType dtype) {
  const int n = size();
  DI_CHECK(send_counts.size() == size_t(n) && recv_counts.size() == size_t(n),
           "all_to_all_v: send_counts has {} and recv_counts {} entries; both must equal the world "
           "size {}",
           send_counts.size(), recv_counts.size(), n);
  const size_t es = dtype_size(dtype);
  size_t sent = 0;
  for (size_t c : send_counts) sent += c;
  LocalSlot& s = begin({OpKind::all_to_all_v, dtype, ReduceOp::sum, 0, 0}, sent * es);
  s.send = static_cast<const std::byte*>(send);
  s.send_counts = send_counts.data();
  s.recv_counts = recv_counts.data();
  sync_start();
  receive_all_to_all_v(static_cast<std::byte*>(recv), recv_counts, es);
  sync_end();
}

void LocalGroup::all_to_all_v_rows(const void* base, size_t row_bytes,
                                   std::span<const int64_t> rows, std::span<const int64_t> offsets,
                                   void* recv, std::span<const size_t> recv_rows) {
  const int n = size();
  check_rows_args(size_t(n), offsets.size(), recv_rows.size());
  row_send_bytes_.resize(size_t(n));
  for (int r = 0; r < n; ++r)
    row_send_bytes_[size_t(r)] = size_t(offsets[size_t(r) + 1] - offsets[size_t(r)]) * row_bytes;
  std::vector<size_t> recv_bytes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) recv_bytes[size_t(r)] = recv_rows[size_t(r)] * row_bytes;
  // Byte for byte an all_to_all_v of u8, so it meets peers that call the packed form.
  LocalSlot& s = begin({OpKind::all_to_all_v, DType::u8, ReduceOp::sum, 0, 0},
                       size_t(offsets[size_t(n)]) * row_bytes);
  s.send = static_cast<const std::byte*>(base);
  s.send_counts = row_send_bytes_.data();
  s.recv_counts = recv_bytes.data();
  s.rows = rows.data();
  s.row_offsets = offsets.data();
  s.row_bytes = row_bytes;
  sync_start();
  receive_all_to_all_v(static_cast<std::byte*>(recv), recv_bytes, 1);
  sync_end();
}

void LocalGroup::receive_all_to_all_v(std::byte* out, std::span<const size_t> recv_counts,
                                      size_t es) const {
  const int n = size();
  std::vector<size_t> recv_offset(size_t(n) + 1, 0);
  for (int r = 0; r < n; ++r)
    recv_offset[size_t(r) + 1] = recv_offset[size_t(r)] + recv_counts[size_t(r)];
  for (int i = 0; i < n; ++i) {
    const int r = (rank_ + i) % n;
    const LocalSlot& p = peer(r);
    std::byte* dst = out + recv_offset[size_t(r)] * es;
    if (p.rows) {  // straight from the peer's rows: no pack copy anywhere
      for (int64_t q = p.row_offsets[rank_]; q < p.row_offsets[rank_ + 1]; ++q, dst += p.row_bytes)
        copy_bytes(dst, p.send + size_t(p.rows[q]) * p.row_bytes, p.row_bytes);
      continue;
    }
    size_t src_offset = 0;  // where rank r's block for me starts in its send buffer
    for (int j = 0; j < rank_; ++j) src_offset += p.send_counts[j];
    copy_bytes(dst, p.send + src_offset * es, recv_counts[size_t(r)] * es);
  }
}

void LocalGroup::broadcast(void* buf, size_t count, DType dtype, int root) {
  const int n = size();
  DI_CHECK(root >= 0 && root < n, "broadcast root {} out of range for a world of {}", root, n);
  const size_t bytes = count * dtype_size(dtype);
  LocalSlot& s =
      begin({OpKind::broadcast, dtype, ReduceOp::sum, root, count}, rank_ == root ? bytes : 0);
  std::byte* staged = rank_ == root ? stage_inline(buf, bytes) : nullptr;
  s.recv = staged ? staged : static_cast<std::byte*>(buf);
  // Every rank must agree on the meeting count: the size decides, the same on every rank.
  const bool one_meeting = bytes <= kLocalInlineBytes;
  sync_start();
  if (rank_ != root) copy_bytes(static_cast<std::byte*>(buf), peer(root).recv, bytes);
  if (!one_meeting) sync_end();
}

void LocalGroup::expose(std::span<const std::span<const std::byte>> regions,
                        std::vector<const std::byte*>& peers) {
  std::vector<const std::byte*> mine(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) mine[i] = regions[i].data();
  peers.assign(regions.size() * size_t(size()), nullptr);
  all_gather(mine.data(), peers.data(), mine.size() * sizeof(const std::byte*), DType::u8);
  exposed_ = true;
}

void LocalGroup::expose_writable(std::span<const std::span<std::byte>> regions,
                                 std::vector<std::byte*>& peers) {
  std::vector<std::byte*> mine(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) mine[i] = regions[i].data();
  peers.assign(regions.size() * size_t(size()), nullptr);
  all_gather(mine.data(), peers.data(), mine.size() * sizeof(std::byte*), DType::u8);
  exposed_ = true;
}

void LocalGroup::barrier() {
  begin({OpKind::barrier, DType::u8, ReduceOp::sum, 0, 0}, 0);
  sync_start();      // slots are double-buffered, so one meeting is enough
  exposed_ = false;  // every peer is done with the regions this rank exposed
}

}  // namespace deepinfer::comm
