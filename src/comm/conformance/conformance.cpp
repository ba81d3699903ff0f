#include "comm/conformance/conformance.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <thread>
#include <type_traits>

#include "comm/conformance/patterns.h"
#include "comm/conformance/reduce_gen.h"
#include "core/check.h"

namespace deepinfer::conformance {

namespace {

constexpr std::byte kSentinel{0xa5};  // prefilled output: an element never written stays this
constexpr size_t kGuardBytes = 64;    // after every output buffer: catches writes past its end
constexpr size_t kOddUnit = 309;      // odd per-peer unit of the _v ops (totals near kOddCount)

// The dtypes each op sweeps. Byte-moving ops see dtype only as an element size (and as a
// fault-injection hook); reductions run on every dtype the interface allows.
constexpr std::array kMoveDtypes = {DType::i32, DType::i64,  DType::f32,
                                    DType::f64, DType::bf16, DType::u8};
constexpr std::array kVDtypes = {DType::i32, DType::f64, DType::bf16, DType::u8};
constexpr std::array kBcastDtypes = {DType::i32, DType::f64, DType::bf16, DType::u8};
constexpr std::array kReduceDtypes = {DType::f32, DType::f64, DType::i32, DType::i64};
constexpr std::array kReduceOps = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};

// Which dtypes also run the >= 1 MiB size (every dtype runs 0, 1 and odd). Large cases
// dominate the run time at 64 ranks, so `standard` keeps the ones that matter: i32 (full-range
// ints; what int32-ag-corrupt breaks) everywhere, plus 8- and 1-byte elements for plain moves.
enum class OpClass : uint8_t { move, vmove, bcast };
bool large_move(OpClass c, DType t, Coverage cov) {
  if (cov == Coverage::full || t == DType::i32) return true;
  if (cov == Coverage::quick) return false;
  switch (c) {
    case OpClass::move:
      return t == DType::f64 || t == DType::u8;
    case OpClass::bcast:
      return t == DType::bf16;
    case OpClass::vmove:
      return false;
  }
  return false;
}
// standard: one reduction per dtype at >= 1 MiB (f32 sum, f64 max, i32 min, i64 sum).
bool large_reduce(size_t dtype_index, ReduceOp op, Coverage cov) {
  if (cov == Coverage::full) return true;
  if (cov == Coverage::quick) return dtype_index == 0 && op == ReduceOp::sum;
  return size_t(op) == dtype_index % 3;
}

// A buffer reused across cases: fresh multi-MiB allocations per case cost page faults that
// dominate at 64 ranks.
class Arena {
 public:
  std::byte* get(size_t bytes) {
    bytes = std::max(bytes, kGuardBytes);  // never null, even for 0-element cases
    if (mem_.size() < bytes) mem_.resize(bytes);
    return mem_.data();
  }

 private:
  std::vector<std::byte> mem_;
};

constexpr uint32_t kFlagOverrun = 1;       // bytes after the output buffer were written
constexpr uint32_t kFlagSendModified = 2;  // the send buffer changed
constexpr uint32_t kFlagBarrierEarly = 4;  // a rank left the barrier before another entered

// One rank's verdict on one case: fixed size, so every rank's records travel in one all_gather.
struct Record {
  uint64_t wrong = 0;
  int64_t index = -1;  // first wrong element: index within its source block (or the output)
  int32_t src = -1;    // its source rank; -1 for reductions
  uint32_t flags = 0;
  uint64_t expected = 0;
  uint64_t got = 0;

  void mismatch(int64_t idx, int src_rank, uint64_t want, uint64_t have) {
    if (wrong++ == 0) {
      index = idx;
      src = src_rank;
      expected = want;
      got = have;
    }
  }
  bool failed() const { return wrong != 0 || flags != 0; }
};
static_assert(std::is_trivially_copyable_v<Record> && sizeof(Record) == 40);

// An output buffer prefilled with the sentinel, followed by a guard zone.
class OutBuffer {
 public:
  OutBuffer(Arena& arena, size_t bytes) : bytes_(bytes), mem_(arena.get(bytes + kGuardBytes)) {
    std::memset(mem_, int(kSentinel), bytes + kGuardBytes);
  }
  std::byte* data() { return mem_; }
  const std::byte* data() const { return mem_; }
  bool guard_intact() const {
    return std::all_of(mem_ + bytes_, mem_ + bytes_ + kGuardBytes,
                       [](std::byte b) { return b == kSentinel; });
  }

 private:
  size_t bytes_;
  std::byte* mem_;
};

// A send buffer and a copy of it, to detect a backend that writes into its input.
class SendBuffer {
 public:
  SendBuffer(Arena& arena, Arena& copy, size_t bytes)
      : bytes_(bytes), mem_(arena.get(bytes)), copy_(copy.get(bytes)) {}
  std::byte* data() { return mem_; }
  void snapshot() { std::memcpy(copy_, mem_, bytes_); }
  bool modified() const { return std::memcmp(copy_, mem_, bytes_) != 0; }

 private:
  size_t bytes_;
  std::byte* mem_;
  std::byte* copy_;
};

template <size_t kEs>
void check_block_es(Record& rec, const std::byte* p, size_t n, DType dt, uint64_t seed, int src) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t have = 0;
    std::memcpy(&have, p + i * kEs, kEs);
    const uint64_t want = pattern_bits(dt, seed + i);
    if (have != want) [[unlikely]]
      rec.mismatch(int64_t(i), src, want, have);
  }
}

// Checks n elements at p against pattern (dt, seed), attributing mismatches to `src`.
void check_block(Record& rec, const std::byte* p, size_t n, DType dt, uint64_t seed, int src) {
  switch (dtype_size(dt)) {
    case 8:
      check_block_es<8>(rec, p, n, dt, seed, src);
      break;
    case 4:
      check_block_es<4>(rec, p, n, dt, seed, src);
      break;
    case 2:
      check_block_es<2>(rec, p, n, dt, seed, src);
      break;
    default:
      check_block_es<1>(rec, p, n, dt, seed, src);
      break;
  }
}

void check_buffers(Record& rec, const OutBuffer& out, const SendBuffer& send) {
  if (!out.guard_intact()) rec.flags |= kFlagOverrun;
  if (send.modified()) rec.flags |= kFlagSendModified;
}

template <class T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

enum class Split : uint8_t { even, uneven, empty, mixed, zero };

std::string_view split_name(Split s) {
  switch (s) {
    case Split::even:
      return "even";
    case Split::uneven:
      return "uneven";
    case Split::empty:
      return "empty-peers";
    case Split::mixed:
      return "mixed";
    case Split::zero:
      return "all-empty";
  }
  return "?";
}

// Elements rank s sends rank d in all_to_all_v with per-peer unit u. `empty-peers`: some ranks
// send nothing to some peers (rank 0 to itself among them); `mixed`: even ranks send even splits
// and odd ranks uneven ones, so ranks disagree on whether the call is "even".
size_t a2av_count(Split sp, int s, int d, size_t u) {
  const size_t uneven = u * size_t(1 + (s + 2 * d) % 4) + size_t((s + d) % 2);
  switch (sp) {
    case Split::even:
      return u;
    case Split::uneven:
      return uneven;
    case Split::empty:
      return (s + d) % 3 == 0 ? 0 : uneven;
    case Split::mixed:
      return s % 2 == 0 ? u : uneven;
    case Split::zero:
      return 0;
  }
  return 0;
}

// The most elements any rank receives in all_to_all_v with unit u.
size_t a2av_max_recv(Split sp, int world, size_t u) {
  size_t best = 0;
  for (int d = 0; d < world; ++d) {
    size_t t = 0;
    for (int s = 0; s < world; ++s) t += a2av_count(sp, s, d, u);
    best = std::max(best, t);
  }
  return best;
}

// Elements rank r contributes to all_gather_v.
size_t agv_count(Split sp, int r, size_t u) {
  const size_t uneven = u * size_t(1 + r % 4) + size_t(r % 2);
  switch (sp) {
    case Split::uneven:
      return uneven;
    case Split::empty:
      return r % 3 == 1 ? 0 : uneven;
    case Split::zero:
      return 0;
    default:
      return u;
  }
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

class Suite {
 public:
  Suite(Group& group, const SuiteOptions& opts)
      : g_(group), opts_(opts), world_(group.size()), me_(group.rank()) {}

  SuiteReport run();

 private:
  struct Pending {
    CaseResult result;
    DType fmt_dtype;
    Record rec;
  };
  using OpFn = void (Suite::*)();

  // Sizes every op sweeps: 0, 1, odd and one with >= kLargeBytes of output per rank, given
  // how many output elements one unit of `n` makes (world for all_gather, 1 for all_reduce).
  std::vector<std::pair<std::string, size_t>> sizes(DType dt, size_t out_per_unit,
                                                    bool large) const {
    std::vector<std::pair<std::string, size_t>> s = {{"0", 0}, {"1", 1}, {"odd", kOddCount}};
    if (large) {
      const size_t unit_bytes = dtype_size(dt) * out_per_unit;
      s.emplace_back(">=1MiB", (kLargeBytes + unit_bytes - 1) / unit_bytes);
    }
    return s;
  }

  uint64_t next_salt() { return mix64(0xc0117ec7ull + ++case_counter_); }

  void begin(std::string op, std::string dtype, std::string name, std::string size,
             size_t elements) {
    current_ = CaseResult{
        std::move(op), std::move(dtype), std::move(name), std::move(size), elements, 0, {}};
    where_ = fmt::format("{} ({} elements out per rank)", current_.label(world_), elements);
    in_case_ = true;
  }
  void finish(DType fmt_dtype, const Record& rec) {
    pending_.push_back({current_, fmt_dtype, rec});
    in_case_ = false;
  }

  void run_op(std::string_view op, OpFn fn) {
    (this->*fn)();
    agree(op);
  }

  void op_barrier();
  void op_broadcast();
  void op_all_gather();
  void op_all_gather_v();
  void op_all_reduce();
  void op_reduce_scatter();
  void op_all_to_all();
  void op_all_to_all_v();
  void op_all_to_all_v_rows();
  void op_expose();

  template <class T>
  void all_reduce_case(DType dt, ReduceOp op, const std::string& size, size_t n);
  void reduce_scatter_ordered(size_t n);
  void agree(std::string_view op);
  // `total_wrong`: over all ranks; the first wrong element is the one `on_rank` saw.
  std::string detail(const Record& rec, int on_rank, DType fmt_dtype, uint64_t total_wrong) const;

  Group& g_;
  const SuiteOptions& opts_;
  int world_;
  int me_;
  uint64_t case_counter_ = 0;
  SuiteReport report_;
  std::vector<Pending> pending_;
  std::set<std::string, std::less<>> agreed_ops_;
  CaseResult current_;
  std::string where_;
  bool in_case_ = false;
  Arena send_arena_, copy_arena_, out_arena_;
};

void Suite::op_barrier() {
  // The last rank enters late; no rank may leave before it entered (same-host clocks only).
  begin("barrier", "-", "skewed entry", "-", 0);
  using namespace std::chrono;
  if (me_ == world_ - 1 && world_ > 1)
    std::this_thread::sleep_for(duration<double>(kBarrierSkewSeconds));
  const int64_t enter = duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
  g_.barrier();
  const int64_t leave = duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
  const int64_t host = int64_t(mix64(std::hash<std::string>{}(host_name())));
  std::array<int64_t, 3> mine = {enter, leave, host};
  std::vector<int64_t> all(3 * size_t(world_));
  g_.all_gather(mine.data(), all.data(), 3, DType::i64);
  Record rec;
  bool same_host = true;
  int latest = 0;
  for (int r = 0; r < world_; ++r) {
    same_host &= all[3 * size_t(r) + 2] == host;
    if (all[3 * size_t(r)] > all[3 * size_t(latest)]) latest = r;
  }
  if (same_host && all[3 * size_t(me_) + 1] < all[3 * size_t(latest)]) {
    rec.flags |= kFlagBarrierEarly;
    rec.mismatch(me_, latest, uint64_t(all[3 * size_t(latest)]),
                 uint64_t(all[3 * size_t(me_) + 1]));
  }
  finish(DType::i64, rec);

  begin("barrier", "-", "x20", "-", 0);
  for (int i = 0; i < 20; ++i) g_.barrier();
  finish(DType::i64, Record{});
}

void Suite::op_broadcast() {
  std::vector<int> roots = {0, world_ / 2, world_ - 1};
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  for (DType dt : kBcastDtypes) {
    for (const auto& [size, n] : sizes(dt, 1, large_move(OpClass::bcast, dt, opts_.coverage))) {
      for (int root : roots) {
        begin("broadcast", std::string(dtype_name(dt)), fmt::format("root {}", root), size, n);
        const size_t es = dtype_size(dt);
        const uint64_t seed = block_seed(next_salt(), root, 0);
        OutBuffer buf(out_arena_, n * es);
        if (me_ == root) fill_pattern(buf.data(), n, dt, seed);
        g_.broadcast(buf.data(), n, dt, root);
        Record rec;
        check_block(rec, buf.data(), n, dt, seed, root);
        if (!buf.guard_intact()) rec.flags |= kFlagOverrun;
        finish(dt, rec);
      }
    }
  }
}

void Suite::op_all_gather() {
  for (DType dt : kMoveDtypes) {
    for (const auto& [size, n] :
         sizes(dt, size_t(world_), large_move(OpClass::move, dt, opts_.coverage))) {
      begin("all_gather", std::string(dtype_name(dt)), "-", size, n * size_t(world_));
      const size_t es = dtype_size(dt);
      const uint64_t salt = next_salt();
      SendBuffer send(send_arena_, copy_arena_, n * es);
      fill_pattern(send.data(), n, dt, block_seed(salt, me_, 0));
      send.snapshot();
      OutBuffer recv(out_arena_, size_t(world_) * n * es);
      g_.all_gather(send.data(), recv.data(), n, dt);
      Record rec;
      for (int r = 0; r < world_; ++r)
        check_block(rec, recv.data() + size_t(r) * n * es, n, dt, block_seed(salt, r, 0), r);
      check_buffers(rec, recv, send);
      finish(dt, rec);
    }
  }
}

void Suite::op_all_gather_v() {
  for (DType dt : kVDtypes) {
    const size_t es = dtype_size(dt);
    for (Split sp : {Split::uneven, Split::empty, Split::zero}) {
      // Per-rank units: 1, odd, and one giving >= kLargeBytes in total.
      std::vector<std::pair<std::string, size_t>> units = {{"1", 1}, {"odd", kOddUnit}};
      if (sp == Split::zero)
        units = {{"0", 1}};
      else if (large_move(OpClass::vmove, dt, opts_.coverage)) {
        size_t per_unit = 0;
        for (int r = 0; r < world_; ++r) per_unit += agv_count(sp, r, 1);
        if (per_unit > 0)
          units.emplace_back(">=1MiB", (kLargeBytes + per_unit * es - 1) / (per_unit * es));
      }
      for (const auto& [size, u] : units) {
        std::vector<size_t> counts(static_cast<size_t>(world_));
        size_t total = 0;
        for (int r = 0; r < world_; ++r) total += counts[size_t(r)] = agv_count(sp, r, u);
        begin("all_gather_v", std::string(dtype_name(dt)), std::string(split_name(sp)), size,
              total);
        const uint64_t salt = next_salt();
        const size_t mine = counts[size_t(me_)];
        SendBuffer send(send_arena_, copy_arena_, mine * es);
        fill_pattern(send.data(), mine, dt, block_seed(salt, me_, 0));
        send.snapshot();
        OutBuffer recv(out_arena_, total * es);
        g_.all_gather_v(send.data(), mine, recv.data(), counts, dt);
        Record rec;
        size_t off = 0;
        for (int r = 0; r < world_; ++r) {
          check_block(rec, recv.data() + off * es, counts[size_t(r)], dt, block_seed(salt, r, 0),
                      r);
          off += counts[size_t(r)];
        }
        check_buffers(rec, recv, send);
        finish(dt, rec);
      }
    }
  }
}

template <class T>
void Suite::all_reduce_case(DType dt, ReduceOp op, const std::string& size, size_t n) {
  begin("all_reduce", std::string(dtype_name(dt)),
        std::string(op == ReduceOp::sum   ? "sum"
                    : op == ReduceOp::max ? "max"
                                          : "min"),
        size, n);
  const ReduceGen<T> gen(world_, op, next_salt());
  OutBuffer buf(out_arena_, n * sizeof(T));
  for (size_t i = 0; i < n; ++i) {
    const T v = gen.value(gen.terms(i), int((size_t(me_) + i) % size_t(world_)));
    std::memcpy(buf.data() + i * sizeof(T), &v, sizeof(T));
  }
  g_.all_reduce(buf.data(), n, dt, op);
  Record rec;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t want = bits_of(gen.expected(gen.terms(i)));
    const uint64_t have = load_bits(buf.data() + i * sizeof(T), sizeof(T));
    if (have != want) [[unlikely]]
      rec.mismatch(int64_t(i), -1, want, have);
  }
  if (!buf.guard_intact()) rec.flags |= kFlagOverrun;
  finish(dt, rec);
}

void Suite::op_all_reduce() {
  for (size_t di = 0; di < kReduceDtypes.size(); ++di) {
    const DType dt = kReduceDtypes[di];
    for (const auto& [size, n] : sizes(dt, 1, true)) {
      for (ReduceOp op : kReduceOps) {
        if (n * dtype_size(dt) >= kLargeBytes && !large_reduce(di, op, opts_.coverage)) continue;
        switch (dt) {
          case DType::f32:
            all_reduce_case<float>(dt, op, size, n);
            break;
          case DType::f64:
            all_reduce_case<double>(dt, op, size, n);
            break;
          case DType::i32:
            all_reduce_case<int32_t>(dt, op, size, n);
            break;
          default:
            all_reduce_case<int64_t>(dt, op, size, n);
            break;
        }
      }
    }
  }
}

void Suite::op_reduce_scatter() {
  // send: W blocks of n f32; rank d's output is the sum of everyone's block d. Inputs as for
  // all_reduce (exact sums in any order), indexed by the global position d * n + i.
  for (const auto& [size, n] : sizes(DType::f32, size_t(world_), true)) {
    begin("reduce_scatter", "f32", "exact sum", size, n);
    const ReduceGen<float> gen(world_, ReduceOp::sum, next_salt());
    const size_t total = n * size_t(world_);
    SendBuffer send(send_arena_, copy_arena_, total * sizeof(float));
    auto* sendf = reinterpret_cast<float*>(send.data());
    for (size_t gi = 0; gi < total; ++gi)
      sendf[gi] = gen.value(gen.terms(gi), int((size_t(me_) + gi) % size_t(world_)));
    send.snapshot();
    OutBuffer recv(out_arena_, n * sizeof(float));
    g_.reduce_scatter(sendf, reinterpret_cast<float*>(recv.data()), n);
    Record rec;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t want = bits_of(gen.expected(gen.terms(size_t(me_) * n + i)));
      const uint64_t have = load_bits(recv.data() + i * sizeof(float), sizeof(float));
      if (have != want) [[unlikely]]
        rec.mismatch(int64_t(i), -1, want, have);
    }
    check_buffers(rec, recv, send);
    finish(DType::f32, rec);
  }
  if (g_.capabilities().ordered_reduce) {
    for (size_t n : {size_t(1), kOddCount}) reduce_scatter_ordered(n);
  } else {
    report_.notes.push_back(fmt::format(
        "reduce_scatter f32 ascending-order sums: not run ({} does not claim ordered_reduce)",
        g_.backend()));
  }
}

// Inexact inputs: the output must be bit-identical to adding the ranks' values in ascending
// rank order, as Capabilities::ordered_reduce promises.
void Suite::reduce_scatter_ordered(size_t n) {
  begin("reduce_scatter", "f32", "ascending order", n == 1 ? "1" : "odd", n);
  const uint64_t salt = next_salt();
  auto value = [&](int r, size_t gi) {
    const uint64_t h = mix64(salt ^ mix64((uint64_t(r) << 40) | gi));
    return std::ldexp(float(int32_t(uint32_t(h >> 32))), -30 + int(h & 7));  // ~[-4, 4], 32 bits
  };
  const size_t total = n * size_t(world_);
  auto* send = reinterpret_cast<float*>(send_arena_.get(total * sizeof(float)));
  for (size_t gi = 0; gi < total; ++gi) send[gi] = value(me_, gi);
  OutBuffer recv(out_arena_, n * sizeof(float));
  g_.reduce_scatter(send, reinterpret_cast<float*>(recv.data()), n);
  Record rec;
  for (size_t i = 0; i < n; ++i) {
    const size_t gi = size_t(me_) * n + i;
    float acc = value(0, gi);
    for (int r = 1; r < world_; ++r) acc = acc + value(r, gi);
    const uint64_t want = bits_of(float(acc));
    const uint64_t have = load_bits(recv.data() + i * sizeof(float), sizeof(float));
    if (have != want) [[unlikely]]
      rec.mismatch(int64_t(i), -1, want, have);
  }
  if (!recv.guard_intact()) rec.flags |= kFlagOverrun;
  finish(DType::f32, rec);
}

void Suite::op_all_to_all() {
  for (DType dt : kMoveDtypes) {
    for (const auto& [size, n] :
         sizes(dt, size_t(world_), large_move(OpClass::move, dt, opts_.coverage))) {
      begin("all_to_all", std::string(dtype_name(dt)), "even", size, n * size_t(world_));
      const size_t es = dtype_size(dt);
      const uint64_t salt = next_salt();
      SendBuffer send(send_arena_, copy_arena_, size_t(world_) * n * es);
      for (int d = 0; d < world_; ++d)
        fill_pattern(send.data() + size_t(d) * n * es, n, dt, block_seed(salt, me_, d));
      send.snapshot();
      OutBuffer recv(out_arena_, size_t(world_) * n * es);
      g_.all_to_all(send.data(), recv.data(), n, dt);
      Record rec;
      for (int s = 0; s < world_; ++s)
        check_block(rec, recv.data() + size_t(s) * n * es, n, dt, block_seed(salt, s, me_), s);
      check_buffers(rec, recv, send);
      finish(dt, rec);
    }
  }
}

void Suite::op_all_to_all_v() {
  for (DType dt : kVDtypes) {
    const size_t es = dtype_size(dt);
    for (Split sp : {Split::even, Split::uneven, Split::empty, Split::mixed, Split::zero}) {
      std::vector<std::pair<std::string, size_t>> units = {{"1", 1}, {"odd", kOddUnit}};
      if (sp == Split::zero)
        units = {{"0", 1}};
      else if (large_move(OpClass::vmove, dt, opts_.coverage)) {
        // The smallest unit that gives some rank >= kLargeBytes of output.
        auto max_recv = [&](size_t u) { return a2av_max_recv(sp, world_, u) * es; };
        if (max_recv(1) > 0) {  // (at 1 rank, `empty-peers` sends nothing at all)
          size_t u = std::max<size_t>(1, kLargeBytes / max_recv(1));
          while (max_recv(u) < kLargeBytes) u += u / 8 + 1;
          units.emplace_back(">=1MiB", u);
        }
      }
      for (const auto& [size, u] : units) {
        std::vector<size_t> send_counts(static_cast<size_t>(world_)),
            recv_counts(static_cast<size_t>(world_));
        size_t send_total = 0, recv_total = 0;
        for (int p = 0; p < world_; ++p) {
          send_total += send_counts[size_t(p)] = a2av_count(sp, me_, p, u);
          recv_total += recv_counts[size_t(p)] = a2av_count(sp, p, me_, u);
        }
        const size_t max_total = a2av_max_recv(sp, world_, u);
        begin("all_to_all_v", std::string(dtype_name(dt)), std::string(split_name(sp)), size,
              max_total);
        const uint64_t salt = next_salt();
        SendBuffer send(send_arena_, copy_arena_, send_total * es);
        size_t off = 0;
        for (int d = 0; d < world_; ++d) {
          fill_pattern(send.data() + off * es, send_counts[size_t(d)], dt,
                       block_seed(salt, me_, d));
          off += send_counts[size_t(d)];
        }
        send.snapshot();
        OutBuffer recv(out_arena_, recv_total * es);
        g_.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dt);
        Record rec;
        off = 0;
        for (int s = 0; s < world_; ++s) {
          check_block(rec, recv.data() + off * es, recv_counts[size_t(s)], dt,
                      block_seed(salt, s, me_), s);
          off += recv_counts[size_t(s)];
        }
        check_buffers(rec, recv, send);
        finish(dt, rec);
      }
    }
  }
}

// all_to_all_v_rows: rows of an odd size picked from a base in reversed order (one spare base
// row is never sent); even ranks call it, odd ranks the packed all_to_all_v of the same bytes,
// which the contract allows; receivers check every byte as in all_to_all_v.
void Suite::op_all_to_all_v_rows() {
  constexpr size_t kRowBytes = 72 + 5;
  for (Split sp : {Split::uneven, Split::empty, Split::mixed, Split::zero}) {
    for (size_t u : {size_t(1), size_t(17)}) {
      if (sp == Split::zero && u != 1) continue;
      std::vector<int64_t> offsets(static_cast<size_t>(world_) + 1, 0);
      std::vector<size_t> recv_rows(static_cast<size_t>(world_)),
          send_bytes(static_cast<size_t>(world_)), recv_bytes(static_cast<size_t>(world_));
      size_t recv_total = 0;
      for (int p = 0; p < world_; ++p) {
        offsets[size_t(p) + 1] = offsets[size_t(p)] + int64_t(a2av_count(sp, me_, p, u));
        send_bytes[size_t(p)] = a2av_count(sp, me_, p, u) * kRowBytes;
        recv_total += recv_rows[size_t(p)] = a2av_count(sp, p, me_, u);
        recv_bytes[size_t(p)] = recv_rows[size_t(p)] * kRowBytes;
      }
      const size_t max_total = a2av_max_recv(sp, world_, u) * kRowBytes;
      begin("all_to_all_v_rows", "u8", fmt::format("{} {}B rows", split_name(sp), kRowBytes),
            fmt::format("{}", u), max_total);
      const uint64_t salt = next_salt();
      const size_t n_rows = size_t(offsets.back());
      // The packed bytes each destination must get, then the base rows they are picked from:
      // row q of the packed send is base row rows[q] = n_rows - 1 - q.
      std::vector<std::byte> packed(std::max<size_t>(1, n_rows * kRowBytes));
      size_t off = 0;
      for (int d = 0; d < world_; ++d) {
        fill_pattern(packed.data() + off, send_bytes[size_t(d)], DType::u8,
                     block_seed(salt, me_, d));
        off += send_bytes[size_t(d)];
      }
      std::vector<int64_t> rows(n_rows);
      SendBuffer base(send_arena_, copy_arena_, (n_rows + 1) * kRowBytes);
      std::memset(base.data(), 0xA5, (n_rows + 1) * kRowBytes);
      for (size_t q = 0; q < n_rows; ++q) {
        rows[q] = int64_t(n_rows - 1 - q);
        std::memcpy(base.data() + size_t(rows[q]) * kRowBytes, packed.data() + q * kRowBytes,
                    kRowBytes);
      }
      base.snapshot();
      OutBuffer recv(out_arena_, recv_total * kRowBytes);
      if (me_ % 2 == 0)
        g_.all_to_all_v_rows(base.data(), kRowBytes, rows, offsets, recv.data(), recv_rows);
      else
        g_.all_to_all_v(packed.data(), send_bytes, recv.data(), recv_bytes, DType::u8);
      Record rec;
      off = 0;
      for (int q = 0; q < world_; ++q) {
        check_block(rec, recv.data() + off, recv_bytes[size_t(q)], DType::u8,
                    block_seed(salt, q, me_), q);
        off += recv_bytes[size_t(q)];
      }
      check_buffers(rec, recv, base);
      finish(DType::u8, rec);
    }
  }
}

// expose (where the group has peer memory): two regions per rank whose sizes differ by rank, the
// second empty on odd ranks, at odd sizes and >= 1 MiB; every rank checks every rank's regions
// byte for byte where expose says they are, then the closing barrier; the exposed bytes must
// come through unmodified.
void Suite::op_expose() {
  if (g_.peer_memory() == PeerMemory::none) return;  // the same answer on every rank
  for (size_t u : {size_t(1), size_t(4099), kLargeBytes}) {
    auto bytes = [&](int r, int i) {
      return i == 0 ? u + size_t(r % 3) * 37 : (r % 2 ? 0 : u / 2 + 11);
    };
    size_t total = 0;
    for (int r = 0; r < world_; ++r) total += bytes(r, 0) + bytes(r, 1);
    begin("expose", "u8", "2 regions, sizes by rank", fmt::format("{}", u), total);
    const uint64_t salt = next_salt();
    SendBuffer mine(send_arena_, copy_arena_, bytes(me_, 0) + bytes(me_, 1));
    fill_pattern(mine.data(), bytes(me_, 0), DType::u8, block_seed(salt, me_, 0));
    fill_pattern(mine.data() + bytes(me_, 0), bytes(me_, 1), DType::u8, block_seed(salt, me_, 1));
    mine.snapshot();
    const std::array<std::span<const std::byte>, 2> regions{
        std::span<const std::byte>(mine.data(), bytes(me_, 0)),
        std::span<const std::byte>(mine.data() + bytes(me_, 0), bytes(me_, 1))};
    std::vector<const std::byte*> peers;
    g_.expose(regions, peers);
    Record rec;
    if (peers.size() != size_t(world_) * 2) {
      rec.mismatch(0, -1, size_t(world_) * 2, peers.size());
    } else {
      for (int r = 0; r < world_; ++r)
        for (int i = 0; i < 2; ++i)
          check_block(rec, peers[size_t(r) * 2 + size_t(i)], bytes(r, i), DType::u8,
                      block_seed(salt, r, i), r);
    }
    g_.barrier();
    if (mine.modified()) rec.flags |= kFlagSendModified;
    finish(DType::u8, rec);
  }
}

std::string Suite::detail(const Record& rec, int on_rank, DType fmt_dtype,
                          uint64_t total_wrong) const {
  std::string s;
  if (rec.flags & kFlagBarrierEarly) {
    return fmt::format("rank {} left the barrier {:.3f} ms before rank {} entered it", rec.index,
                       double(int64_t(rec.expected) - int64_t(rec.got)) / 1e6, rec.src);
  }
  if (rec.wrong) {
    s = fmt::format("{} wrong elements, first on rank {}", total_wrong, on_rank);
    s += rec.src >= 0 ? fmt::format(" at src rank {} index {}", rec.src, rec.index)
                      : fmt::format(" at index {}", rec.index);
    s += fmt::format(": expected {} got {}", format_bits(fmt_dtype, rec.expected),
                     format_bits(fmt_dtype, rec.got));
  }
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : "; ") + part; };
  if (rec.flags & kFlagOverrun)
    add(fmt::format("rank {} found bytes written past the end of its output", on_rank));
  if (rec.flags & kFlagSendModified)
    add(fmt::format("rank {}'s send buffer was modified", on_rank));
  return s;
}

// Every rank's records go to every rank (all_gather of bytes), cross-checked against an
// all_reduce of the failure counts, so all ranks print and exit alike.
void Suite::agree(std::string_view op) {
  where_ = fmt::format("agreeing the {} results across ranks", op);
  const size_t n = pending_.size();
  std::vector<Record> mine(n), all(n * size_t(world_));
  int64_t counts[2] = {0, 0};  // failed cases, wrong elements
  for (size_t c = 0; c < n; ++c) {
    mine[c] = pending_[c].rec;
    counts[0] += mine[c].failed();
    counts[1] += int64_t(mine[c].wrong);
  }
  g_.all_gather(mine.data(), all.data(), n * sizeof(Record), DType::u8);
  const int64_t local_counts[2] = {counts[0], counts[1]};
  g_.all_reduce(counts, 2, DType::i64, ReduceOp::sum);

  int64_t gathered_failed = 0, gathered_wrong = 0;
  bool own_block_ok =  // n = 0: no records (memcmp may not see the null data of empty vectors)
      n == 0 || std::memcmp(all.data() + size_t(me_) * n, mine.data(), n * sizeof(Record)) == 0;
  for (size_t c = 0; c < n; ++c) {
    CaseResult res = pending_[c].result;
    int first = -1;  // lowest rank that saw this case fail
    for (int r = 0; r < world_; ++r) {
      const Record& rec = all[size_t(r) * n + c];
      gathered_failed += rec.failed();
      gathered_wrong += int64_t(rec.wrong);
      res.wrong += rec.wrong;
      if (rec.failed() && first < 0) first = r;
    }
    if (first >= 0)
      res.detail = detail(all[size_t(first) * n + c], first, pending_[c].fmt_dtype, res.wrong);
    report_.cases.push_back(std::move(res));
  }
  if (!own_block_ok || gathered_failed != counts[0] || gathered_wrong != counts[1]) {
    CaseResult res{"agreement", "u8", std::string(op), "-", n * sizeof(Record), 0, {}};
    res.detail = fmt::format(
        "the per-rank results of {} gathered with all_gather(u8) do not match: own block {}, "
        "failed cases {} gathered vs {} by all_reduce(i64 sum), wrong elements {} vs {} (this "
        "rank: {} / {})",
        op, own_block_ok ? "intact" : "corrupted", gathered_failed, counts[0], gathered_wrong,
        counts[1], local_counts[0], local_counts[1]);
    report_.cases.push_back(std::move(res));
  }
  pending_.clear();
  agreed_ops_.insert(std::string(op));
}

SuiteReport Suite::run() {
  report_.world = world_;
  report_.rank = me_;
  report_.backend = g_.backend();
  try {
    run_op("barrier", &Suite::op_barrier);
    run_op("broadcast", &Suite::op_broadcast);
    run_op("all_gather", &Suite::op_all_gather);
    run_op("all_gather_v", &Suite::op_all_gather_v);
    run_op("all_reduce", &Suite::op_all_reduce);
    run_op("reduce_scatter", &Suite::op_reduce_scatter);
    run_op("all_to_all", &Suite::op_all_to_all);
    run_op("all_to_all_v", &Suite::op_all_to_all_v);
    run_op("all_to_all_v_rows", &Suite::op_all_to_all_v_rows);
    run_op("expose", &Suite::op_expose);
  } catch (const std::exception& e) {
    SuiteStop& st = report_.stop;
    st.stopped = true;
    st.timeout = dynamic_cast<const CommTimeout*>(&e) != nullptr;
    st.where = where_;
    st.message = e.what();
    st.error = std::current_exception();
    // This rank's own view of the op's finished cases (not agreed), then the case in flight.
    for (auto& p : pending_) {
      CaseResult res = p.result;
      res.wrong = p.rec.wrong;
      if (p.rec.failed())
        res.detail = detail(p.rec, me_, p.fmt_dtype, p.rec.wrong) + " (this rank's view)";
      report_.cases.push_back(std::move(res));
    }
    pending_.clear();
    if (in_case_) {
      CaseResult res = current_;
      res.detail = fmt::format("{}: {}", st.timeout ? "timed out" : "error", st.message);
      report_.cases.push_back(std::move(res));
    }
  }
  auto op_passed = [this](std::string_view op) {
    if (!agreed_ops_.count(op)) return false;
    return std::all_of(report_.cases.begin(), report_.cases.end(),
                       [op](const CaseResult& c) { return c.op != op || c.passed(); });
  };
  report_.verified.all_to_all = op_passed("all_to_all");
  report_.verified.all_to_all_v = op_passed("all_to_all_v");
  report_.verified.ordered_reduce = g_.capabilities().ordered_reduce && op_passed("reduce_scatter");
  return std::move(report_);
}

}  // namespace

std::string CaseResult::label(int world) const {
  std::string s = op;
  for (const std::string* part : {&dtype, &name, &size})
    if (*part != "-") s += " " + *part;
  return s + fmt::format(" at {} ranks", world);
}

size_t SuiteReport::passed() const {
  return size_t(
      std::count_if(cases.begin(), cases.end(), [](const CaseResult& c) { return c.passed(); }));
}
size_t SuiteReport::failed() const { return cases.size() - passed(); }

SuiteReport run_suite(Group& group, const SuiteOptions& opts) { return Suite(group, opts).run(); }

std::string format_report(const SuiteReport& r, const std::vector<std::string>& extra_lines) {
  std::string out =
      fmt::format("deepinfer check collectives: backend {}, {} ranks\n", r.backend, r.world);
  out += fmt::format("{:<15} {:<6} {:<14} {:<7} {:>9}  {}\n", "op", "dtype", "case", "size",
                     "elements", "result");
  for (const auto& c : r.cases)
    out += fmt::format("{:<15} {:<6} {:<14} {:<7} {:>9}  {}\n", c.op, c.dtype, c.name, c.size,
                       c.elements, c.passed() ? "PASS" : "FAIL");
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  for (const auto& c : r.cases)
    if (!c.passed()) out += fmt::format("FAIL {}: {}\n", c.label(r.world), c.detail);
  if (r.stop.stopped) {
    out += fmt::format("collectives: stopped on rank {} {} in {}: {}\n", r.rank,
                       r.stop.timeout ? "after a timeout" : "after an error", r.stop.where,
                       r.stop.message);
  }
  for (const auto& line : extra_lines) out += line + "\n";
  out += fmt::format("collectives: {} passed, {} failed\n", r.passed(), r.failed());
  return out;
}

}  // namespace deepinfer::conformance
