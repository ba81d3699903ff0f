#include "comm/mpi/mpi_group.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "core/log.h"

namespace deepinfer::comm {
namespace {

void free_win(MPI_Win& w) {
  if (w == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(w);
  MPI_Win_free(&w);  // collective: every rank frees (grows) the window at the same call
}

std::atomic<size_t> g_count_limit{kMpiMaxCount};
size_t count_limit() { return g_count_limit.load(std::memory_order_relaxed); }

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return std::string(buf, size_t(len));
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) DI_FAIL("{} failed: {}", what, mpi_error_string(rc));
}

// A datatype + count describing `bytes` contiguous bytes: MPI_BYTE while the count fits the
// int limit, else one element of a derived type (chunks + remainder) whose extent is `bytes`.
class BytesType {
 public:
  explicit BytesType(size_t bytes) {
    const size_t limit = count_limit();
    if (bytes <= limit) {
      count_ = int(bytes);
      return;
    }
    const size_t chunk = std::min(kMpiBigTypeChunkBytes, limit);
    const size_t q = bytes / chunk, r = bytes % chunk;
    DI_CHECK(q <= size_t(INT32_MAX), "message of {} bytes is too large", bytes);
    MPI_Datatype unit, body, whole;
    check_mpi(MPI_Type_contiguous(int(chunk), MPI_BYTE, &unit), "MPI_Type_contiguous");
    check_mpi(MPI_Type_contiguous(int(q), unit, &body), "MPI_Type_contiguous");
    if (r == 0) {
      whole = body;
    } else {
      int lens[2] = {1, int(r)};
      MPI_Aint displs[2] = {0, MPI_Aint(q * chunk)};
      MPI_Datatype types[2] = {body, MPI_BYTE};
      check_mpi(MPI_Type_create_struct(2, lens, displs, types, &whole), "MPI_Type_create_struct");
      MPI_Type_free(&body);
    }
    check_mpi(MPI_Type_create_resized(whole, 0, MPI_Aint(bytes), &type_),
              "MPI_Type_create_resized");
    check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
    MPI_Type_free(&whole);
    MPI_Type_free(&unit);
    count_ = 1;
    owned_ = true;
  }
  ~BytesType() {
    if (owned_) MPI_Type_free(&type_);
  }
  BytesType(BytesType&& o) noexcept : type_(o.type_), count_(o.count_), owned_(o.owned_) {
    o.owned_ = false;
  }
  BytesType(const BytesType&) = delete;
  BytesType& operator=(const BytesType&) = delete;
  BytesType& operator=(BytesType&&) = delete;

  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
  bool owned_ = false;
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    default:
      DI_FAIL("all_reduce supports f32, f64, i32 and i64, got {}", dtype_name(t));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

constexpr int kP2pTag = 7301;
// reduce_scatter gathers at most this many bytes per round.
constexpr size_t kReduceScatterPackBytes = size_t(64) << 20;

bool fits(size_t v) { return v <= count_limit(); }

}  // namespace

void set_mpi_count_limit_for_testing(size_t limit) {
  g_count_limit = limit == 0 ? kMpiMaxCount : limit;
}

void mpi_init_once() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  DI_CHECK(!finalized,
           "MPI was already finalised in this process, so the mpi backend cannot start again");
  if (initialized) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED)
    log_warn(
        "MPI provides thread level {} < MPI_THREAD_SERIALIZED; call collectives from one thread "
        "only",
        provided);
  // Finalised at exit so run_ranks may be called more than once per process.
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
}

MpiGroup::MpiGroup(double timeout_s) : timeout_s_(timeout_s) {
  DI_CHECK(timeout_s > 0, "comm timeout must be > 0 s, got {}", timeout_s);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm node;
  int node_ranks = 1;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &node_ranks);
    // Every rank sees the same node_ranks == size_ (all on one host, or not), so peer_memory()
    // agrees everywhere.
    if (node_ranks == size_)
      node_comm_ = node;
    else
      MPI_Comm_free(&node);
  }
  const bool oversubscribed = node_ranks > int(std::max(1u, std::thread::hardware_concurrency()));
  spin_s_ = oversubscribed ? kMpiSpinSecondsOversubscribed : kMpiSpinSeconds;
}

MpiGroup::~MpiGroup() {
  if (broken_) return;  // pending requests: freeing would hang (the job is aborted instead)
  free_window();
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiGroup::free_window() {
  free_win(window_);
  window_bytes_ = 0;
}

void MpiGroup::expose(std::span<const std::span<const std::byte>> regions,
                      std::vector<const std::byte*>& peers) {
  std::vector<std::byte*> at;
  expose_in_window(regions, at);
  peers.assign(at.begin(), at.end());
}

void MpiGroup::expose_writable(std::span<const std::span<std::byte>> regions,
                               std::vector<std::byte*>& peers) {
  std::vector<std::span<const std::byte>> ro(regions.begin(), regions.end());
  expose_in_window(ro, peers);
  const size_t n = regions.size();
  copy_back_from_.clear();
  copy_back_to_.clear();
  for (size_t i = 0; i < n; ++i) {
    std::byte* in_window = peers[size_t(rank_) * n + i];
    if (!regions[i].empty() && regions[i].data() != in_window) {
      copy_back_from_.emplace_back(in_window, regions[i].size());
      copy_back_to_.push_back(regions[i]);
    }
  }
  writable_open_ = true;
}

void MpiGroup::expose_in_window(std::span<const std::span<const std::byte>> regions,
                                std::vector<std::byte*>& peers) {
  DI_CHECK(peer_memory() != PeerMemory::none,
           "expose: the mpi ranks are not all on one host; check peer_memory() first");
  DI_CHECK(!writable_open_,
           "expose: a writable exposure is still open; the ranks must meet at barrier() first");
  const size_t n = regions.size(), w = size_t(size_);
  auto aligned = [](size_t b) { return (b + 63) / 64 * 64; };
  // Every rank's region sizes (the deadline-bound collective that also proves all ranks are here).
  std::vector<uint64_t> mine(n), sizes(n * w);
  for (size_t i = 0; i < n; ++i) mine[i] = regions[i].size();
  all_gather(mine.data(), sizes.data(), n * 8, DType::u8);
  size_t need = 0;
  for (size_t r = 0; r < w; ++r) {
    size_t b = 0;
    for (size_t i = 0; i < n; ++i) b += aligned(sizes[r * n + i]);
    need = std::max(need, b);
  }
  // Same sizes everywhere: all ranks grow here. The old window is freed only after the regions
  // are copied, since one may have been built in it (expose_staging).
  MPI_Win old = MPI_WIN_NULL;
  if (window_ == MPI_WIN_NULL || need > window_bytes_) {
    old = window_;
    window_ = MPI_WIN_NULL;
    const size_t bytes = std::max<size_t>(need + need / 4, size_t(1) << 20);
    void* base = nullptr;
    const int rc =
        MPI_Win_allocate_shared(MPI_Aint(bytes), 1, MPI_INFO_NULL, node_comm_, &base, &window_);
    if (rc != MPI_SUCCESS)
      DI_FAIL(
          "expose: MPI_Win_allocate_shared of {} bytes per rank failed ({}); free shared memory "
          "(/dev/shm) or set DEEPINFER_EP_PEER_MEMORY=off to move EP data through collectives",
          bytes, mpi_error_string(rc));
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_), "MPI_Win_lock_all");
    window_bytes_ = bytes;
    window_at_.assign(w, nullptr);
    for (int r = 0; r < size_; ++r) {
      MPI_Aint sz = 0;
      int unit = 0;
      void* at = nullptr;
      check_mpi(MPI_Win_shared_query(window_, r, &sz, &unit, &at), "MPI_Win_shared_query");
      window_at_[size_t(r)] = static_cast<std::byte*>(at);
    }
  }
  std::byte* own = window_at_[size_t(rank_)];
  for (size_t i = 0, off = 0; i < n; off += aligned(regions[i].size()), ++i)
    if (!regions[i].empty() && regions[i].data() != own + off)
      std::memcpy(own + off, regions[i].data(), regions[i].size());
  free_win(old);
  // Stores before the barrier are visible to the peers' loads after it (MPI-3 separate/unified
  // shared-memory model: sync, barrier, sync).
  MPI_Win_sync(window_);
  barrier();
  MPI_Win_sync(window_);
  peers.assign(n * w, nullptr);
  for (size_t r = 0; r < w; ++r)
    for (size_t i = 0, off = 0; i < n; off += aligned(sizes[r * n + i]), ++i)
      peers[r * n + i] = window_at_[r] + off;
}

std::byte* MpiGroup::expose_staging(size_t bytes) {
  if (peer_memory() == PeerMemory::none || window_ == MPI_WIN_NULL || bytes > window_bytes_)
    return nullptr;
  return window_at_[size_t(rank_)];
}

MpiGroup::Call MpiGroup::begin(OpKind op, size_t bytes) {
  if (broken_)
    throw CommTimeout(
        fmt::format("{} on rank {} of {} refused: an earlier collective on this group failed ({})",
                    op_name(op), rank_, size_, broken_reason_));
  return Call{op, bytes, deadline_after(timeout_s_)};
}

void MpiGroup::wait(const Call& call, std::vector<MPI_Request>& reqs) {
  if (reqs.empty()) return;
  const auto start = Clock::now();
  const auto spin_until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spin_s_));
  const auto yield_until = start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(kMpiYieldSeconds));
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      broken_ = true;
      broken_reason_ = fmt::format("{}: {}", op_name(call.op), mpi_error_string(rc));
      DI_FAIL("{} failed on rank {} of {} ({} bytes sent): {}", op_name(call.op), rank_, size_,
              call.bytes, mpi_error_string(rc));
    }
    if (done) return;
    const auto now = Clock::now();
    if (now >= call.deadline) {
      broken_ = true;
      std::string msg = timeout_message(op_name(call.op), timeout_s_, rank_, size_, call.bytes);
      broken_reason_ = msg;
      throw CommTimeout(msg);
    }
    // Busy-poll briefly (MPI progresses inside MPI_Test), then be polite to co-located ranks.
    if (now < spin_until) continue;
    if (now < yield_until)
      sched_yield();
    else
      std::this_thread::sleep_for(kMpiPollSleep);
  }
}

void MpiGroup::wait(const Call& call, MPI_Request req) {
  std::vector<MPI_Request> reqs{req};
  wait(call, reqs);
}

bool MpiGroup::any_rank_needs(const Call& call, bool local_flag) {
  int in = local_flag ? 1 : 0, out = 0;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm_, &req), "MPI_Iallreduce");
  wait(call, req);
  return out != 0;
}

void MpiGroup::p2p_exchange(const Call& call, const std::byte* send,
                            const std::vector<size_t>& send_bytes,
                            const std::vector<size_t>& send_offsets, std::byte* recv,
                            const std::vector<size_t>& recv_bytes,
                            const std::vector<size_t>& recv_offsets) {
  std::vector<BytesType> types;
  types.reserve(size_t(2 * size_));
  std::vector<MPI_Request> reqs;
  for (int i = 1; i < size_; ++i) {
    const int from = (rank_ - i + size_) % size_;
    const BytesType& t = types.emplace_back(recv_bytes[size_t(from)]);
    MPI_Request req;
    check_mpi(MPI_Irecv(recv + recv_offsets[size_t(from)], t.count(), t.type(), from, kP2pTag,
                        comm_, &req),
              "MPI_Irecv");
    reqs.push_back(req);
  }
  for (int i = 1; i < size_; ++i) {
    const int to = (rank_ + i) % size_;
    const BytesType& t = types.emplace_back(send_bytes[size_t(to)]);
    MPI_Request req;
    check_mpi(
        MPI_Isend(send + send_offsets[size_t(to)], t.count(), t.type(), to, kP2pTag, comm_, &req),
        "MPI_Isend");
    reqs.push_back(req);
  }
  const size_t me = size_t(rank_);
  DI_CHECK(send_bytes[me] == recv_bytes[me], "rank {} sends {} bytes to itself but expects {}",
           rank_, send_bytes[me], recv_bytes[me]);
  if (send_bytes[me] && recv + recv_offsets[me] != send + send_offsets[me])
    std::memmove(recv + recv_offsets[me], send + send_offsets[me], send_bytes[me]);
  wait(call, reqs);
}

void MpiGroup::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const Call call = begin(OpKind::all_gather, bytes);
  auto* out = static_cast<std::byte*>(recv);
  const bool in_place = send == out + size_t(rank_) * bytes;
  const BytesType t(bytes);  // same on every rank: count is the same everywhere
  MPI_Request req;
  check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, t.count(), t.type(), recv, t.count(),
                           t.type(), comm_, &req),
            "MPI_Iallgather");
  wait(call, req);
}

void MpiGroup::all_gather_v(const void* send, size_t send_count, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) {
  DI_CHECK(recv_counts.size() == size_t(size_),
           "all_gather_v: recv_counts has {} entries, world is {}", recv_counts.size(), size_);
  const size_t es = dtype_size(dtype);
  const Call call = begin(OpKind::all_gather_v, send_count * es);
  DI_CHECK(recv_counts[size_t(rank_)] == send_count,
           "all_gather_v on rank {}: sends {} elements but recv_counts[{}] = {}", rank_, send_count,
           rank_, recv_counts[size_t(rank_)]);
  std::vector<size_t> bytes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  size_t total = 0;
  for (size_t r = 0; r < size_t(size_); ++r) {
    bytes[r] = recv_counts[r] * es;
    offsets[r] = total;
    total += bytes[r];
  }
  auto* out = static_cast<std::byte*>(recv);
  // recv_counts are the same on every rank, so every rank takes the same path.
  if (fits(total)) {
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (size_t r = 0; r < size_t(size_); ++r) {
      counts[r] = int(bytes[r]);
      displs[r] = int(offsets[r]);
    }
    const bool in_place = send == out + offsets[size_t(rank_)];
    MPI_Request req;
    check_mpi(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, counts[size_t(rank_)], MPI_BYTE, recv,
                              counts.data(), displs.data(), MPI_BYTE, comm_, &req),
              "MPI_Iallgatherv");
    wait(call, req);
    return;
  }
  std::vector<size_t> send_bytes(static_cast<size_t>(size_), send_count * es),
      send_offsets(static_cast<size_t>(size_), 0);
  p2p_exchange(call, static_cast<const std::byte*>(send), send_bytes, send_offsets, out, bytes,
               offsets);
}

void MpiGroup::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const MPI_Datatype type = mpi_type(dtype);
  const size_t es = dtype_size(dtype);
  const Call call = begin(OpKind::all_reduce, count * es);
  auto* p = static_cast<std::byte*>(buf);
  const size_t step = count_limit();
  for (size_t off = 0; off < count; off += step) {
    const size_t n = std::min(step, count - off);
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, p + off * es, int(n), type, mpi_op(op), comm_, &req),
              "MPI_Iallreduce");
    wait(call, req);
  }
}

// Not MPI_Ireduce_scatter_block: Open MPI's non-blocking version (libnbc) is far slower than the
// blocking call at large sizes (docs/performance.md §4), and the blocking call
// cannot honour the deadline. An all_to_all of the blocks and a local sum moves the same bytes as
// a direct reduce-scatter, stays non-blocking, and fixes the addition order to ascending rank, so
// mpi claims ordered_reduce like local (EP fast combine then matches bit for bit across backends).
void MpiGroup::reduce_scatter(const float* send, float* recv, size_t count) {
  const size_t n = size_t(size_);
  const Call call = begin(OpKind::reduce_scatter, count * n * sizeof(float));
  if (count == 0) return;
  // Rounds of `chunk` elements per block, so the gathered blocks stay bounded; the path depends
  // only on `count` (the same on every rank).
  const size_t chunk = std::max<size_t>(1, kReduceScatterPackBytes / (n * sizeof(float)));
  const bool one_round = count <= chunk;
  thread_local std::vector<float> packed, gathered,
      out;  // reused: big buffers fault on first touch
  gathered.resize(std::min(chunk, count) * n);
  // recv may alias send: with several rounds, sums go to `out` until every round has read send.
  const bool aliased = recv + count > send && recv < send + count * n;
  float* dst = aliased && !one_round ? (out.resize(count), out.data()) : recv;
  for (size_t c0 = 0; c0 < count; c0 += chunk) {
    const size_t m = std::min(chunk, count - c0);
    const float* blocks = send;  // [n, m]: block r goes to rank r
    if (!one_round) {
      packed.resize(m * n);
      for (size_t r = 0; r < n; ++r)
        std::memcpy(packed.data() + r * m, send + r * count + c0, m * sizeof(float));
      blocks = packed.data();
    }
    const BytesType t(m * sizeof(float));
    MPI_Request req;
    check_mpi(MPI_Ialltoall(blocks, t.count(), t.type(), gathered.data(), t.count(), t.type(),
                            comm_, &req),
              "MPI_Ialltoall (reduce_scatter)");
    wait(call, req);
    float* o = dst + c0;
    std::memcpy(o, gathered.data(), m * sizeof(float));
    for (size_t r = 1; r < n; ++r) {
      const float* x = gathered.data() + r * m;
      for (size_t i = 0; i < m; ++i) o[i] += x[i];
    }
  }
  if (dst != recv) std::memcpy(recv, dst, count * sizeof(float));
}

void MpiGroup::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  const Call call = begin(OpKind::all_to_all, bytes * size_t(size_));
  const BytesType t(bytes);  // extent == bytes, so block r sits at r * bytes
  MPI_Request req;
  check_mpi(MPI_Ialltoall(send, t.count(), t.type(), recv, t.count(), t.type(), comm_, &req),
            "MPI_Ialltoall");
  wait(call, req);
}

void MpiGroup::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                            std::span<const size_t> recv_counts, DType dtype) {
  const size_t n = size_t(size_);
  DI_CHECK(send_counts.size() == n && recv_counts.size() == n,
           "all_to_all_v: send_counts has {} and recv_counts {} entries; both must equal the world "
           "size {}",
           send_counts.size(), recv_counts.size(), n);
  const size_t es = dtype_size(dtype);
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  size_t st = 0, rt = 0;
  for (size_t r = 0; r < n; ++r) {
    sb[r] = send_counts[r] * es;
    so[r] = st;
    st += sb[r];
    rb[r] = recv_counts[r] * es;
    ro[r] = rt;
    rt += rb[r];
  }
  const Call call = begin(OpKind::all_to_all_v, st);
  // Byte totals differ per rank, so the ranks agree on the path first (one tiny allreduce).
  const bool big = any_rank_needs(call, !fits(st) || !fits(rt));
  if (!big) {
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    for (size_t r = 0; r < n; ++r) {
      sc[r] = int(sb[r]);
      sd[r] = int(so[r]);
      rc[r] = int(rb[r]);
      rd[r] = int(ro[r]);
    }
    MPI_Request req;
    check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                             MPI_BYTE, comm_, &req),
              "MPI_Ialltoallv");
    wait(call, req);
    return;
  }
  p2p_exchange(call, static_cast<const std::byte*>(send), sb, so, static_cast<std::byte*>(recv), rb,
               ro);
}

// Each destination's rows as one hindexed datatype over base, so MPI reads them in place (its
// own copy into the transport is the only one) instead of from a packed copy.
void MpiGroup::all_to_all_v_rows(const void* base, size_t row_bytes, std::span<const int64_t> rows,
                                 std::span<const int64_t> offsets, void* recv,
                                 std::span<const size_t> recv_rows) {
  const size_t n = size_t(size_);
  check_rows_args(n, offsets.size(), recv_rows.size());
  const size_t st = size_t(offsets[n]) * row_bytes;
  size_t rt = 0;
  for (size_t r : recv_rows) rt += r * row_bytes;
  {
    const Call call = begin(OpKind::all_to_all_v, st);
    // MPI_Ialltoallw takes int counts and byte displacements: beyond them, the packed path.
    if (any_rank_needs(call, !fits(st) || !fits(rt) || !fits(row_bytes)))
      return Group::all_to_all_v_rows(base, row_bytes, rows, offsets, recv, recv_rows);
  }
  const Call call = begin(OpKind::all_to_all_v, st);
  struct Types {  // freed however the call ends
    std::vector<MPI_Datatype> v;
    ~Types() {
      for (MPI_Datatype& t : v)
        if (t != MPI_BYTE) MPI_Type_free(&t);
    }
  } send_types{std::vector<MPI_Datatype>(n, MPI_BYTE)};
  std::vector<MPI_Datatype> recv_types(n, MPI_BYTE);
  std::vector<int> sc(n, 0), sd(n, 0), rc(n), rd(n);
  std::vector<MPI_Aint> displs;
  size_t ro = 0;
  for (size_t r = 0; r < n; ++r) {
    const int64_t cnt = offsets[r + 1] - offsets[r];
    if (cnt > 0) {
      displs.resize(size_t(cnt));
      for (int64_t q = 0; q < cnt; ++q)
        displs[size_t(q)] = MPI_Aint(rows[size_t(offsets[r] + q)]) * MPI_Aint(row_bytes);
      check_mpi(MPI_Type_create_hindexed_block(int(cnt), int(row_bytes), displs.data(), MPI_BYTE,
                                               &send_types.v[r]),
                "MPI_Type_create_hindexed_block");
      check_mpi(MPI_Type_commit(&send_types.v[r]), "MPI_Type_commit");
      sc[r] = 1;
    }
    rc[r] = int(recv_rows[r] * row_bytes);
    rd[r] = int(ro);
    ro += recv_rows[r] * row_bytes;
  }
  MPI_Request req;
  check_mpi(MPI_Ialltoallw(base, sc.data(), sd.data(), send_types.v.data(), recv, rc.data(),
                           rd.data(), recv_types.data(), comm_, &req),
            "MPI_Ialltoallw");
  wait(call, req);
}

void MpiGroup::broadcast(void* buf, size_t count, DType dtype, int root) {
  DI_CHECK(root >= 0 && root < size_, "broadcast root {} out of range for a world of {}", root,
           size_);
  const size_t bytes = count * dtype_size(dtype);
  const Call call = begin(OpKind::broadcast, rank_ == root ? bytes : 0);
  const BytesType t(bytes);
  MPI_Request req;
  check_mpi(MPI_Ibcast(buf, t.count(), t.type(), root, comm_, &req), "MPI_Ibcast");
  wait(call, req);
}

void MpiGroup::barrier() {
  const Call call = begin(OpKind::barrier, 0);
  // Closing a writable exposure: the peers' stores before the barrier are visible after it
  // (sync, barrier, sync), then land in the regions that were copied into the window.
  const bool close = writable_open_;
  if (close) MPI_Win_sync(window_);
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  wait(call, req);
  if (!close) return;
  MPI_Win_sync(window_);
  for (size_t i = 0; i < copy_back_to_.size(); ++i)
    std::memcpy(copy_back_to_[i].data(), copy_back_from_[i].data(), copy_back_to_[i].size());
  copy_back_from_.clear();
  copy_back_to_.clear();
  writable_open_ = false;
}

}  // namespace deepinfer::comm
