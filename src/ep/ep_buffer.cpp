// EPBuffer: input agreement, record packing, the common unpack into DeepEP's outputs (so both
// algorithms produce bit-identical results), and the combine arithmetic of DESIGN §4.
#include <deepinfer/ep.h>

#include <algorithm>
#include <array>
#include <cstring>

#include <mutex>
#include <set>

#include "core/log.h"
#include "core/stream_copy.h"
#include "core/thread_pool.h"
#include "ep/allgather/ag.h"
#include "ep/alltoall/a2a.h"
#include "ep/handle.h"
#include "ep/row_math.h"
#include "ep/sizing.h"
#include "ep/validate.h"

namespace deepinfer {

using ep::HandleData;
using ep::RecordLayout;

namespace {

using ep::rows::canon;

// A received row and where it came from: where its x bytes, scales (fp8), K weights and K ids
// are (in a record, or in the source rank's own arrays).
struct RowRef {
  int32_t src_rank;
  int32_t src_token;
  const std::byte* x;
  const std::byte* scales;
  const std::byte* weights;
  const std::byte* idx;
};
// The fields of a packed record `rec` (x at x, in the record or apart).
RowRef record_row(const RecordLayout& rl, int32_t src_rank, int32_t src_token, const std::byte* x,
                  const std::byte* rec) {
  return {src_rank, src_token, x, rec + rl.off_scales, rec + rl.off_weights, rec + rl.off_idx};
}

// Everything a record is packed from.
struct PackSource {
  const std::byte* x;   // [T, x_bytes]
  const float* scales;  // [T, P] or null
  const float* weights; // [T, K]
  const int64_t* idx;   // [T, K]
};

// Every byte is written once (fields, then the alignment gaps as zeros): no memset of the whole
// record first, which would double the stores of this copy-bound loop.
void pack_record(const RecordLayout& rl, const PackSource& s, int p, int k, int64_t t,
                 std::byte* dst, bool with_token) {
  auto zero = [&](size_t from, size_t to) {
    if (to > from) std::memset(dst + from, 0, to - from);
  };
  if (rl.has_x) std::memcpy(dst, s.x + size_t(t) * rl.x_bytes, rl.x_bytes);
  zero(rl.has_x ? rl.x_bytes : 0, rl.off_scales);
  if (rl.scale_bytes) std::memcpy(dst + rl.off_scales, s.scales + t * p, rl.scale_bytes);
  zero(rl.off_scales + rl.scale_bytes, rl.off_weights);
  std::memcpy(dst + rl.off_weights, s.weights + t * k, size_t(k) * 4);
  zero(rl.off_weights + size_t(k) * 4, rl.off_idx);
  std::memcpy(dst + rl.off_idx, s.idx + t * k, size_t(k) * 8);
  if (with_token) std::memcpy(dst + rl.off_token, &t, 8);
  zero(rl.off_token + (with_token ? 8 : 0), rl.bytes);
}

// Padding row of the ag all_gather: no expert selects it.
void pack_padding(const RecordLayout& rl, int k, std::byte* dst) {
  std::memset(dst, 0, rl.bytes);
  const int64_t masked = -1;
  for (int j = 0; j < k; ++j) std::memcpy(dst + rl.off_idx + size_t(j) * 8, &masked, 8);
}

}  // namespace

// x bytes one a2a dispatch moves, over all ranks, from which the sources write them
// (a2a_push_rows): a typical server L3 (32 MiB per CCD on EPYC) holds no more.
constexpr uint64_t kEpStreamMinBytes = uint64_t(32) << 20;

struct EPBuffer::Impl {
  Group& group;
  EPConfig cfg;
  int world = 1, rank = 0;
  int local_experts = 1;  // L
  std::vector<int32_t> owner;  // [E] the rank holding expert e (e / L without a division per slot)
  // Whether a slot's expert id e (-1: masked) lives on rank r.
  bool on_rank(int64_t e, int r) const { return e >= 0 && owner[size_t(e)] == r; }
  EpAlgo algo = EpAlgo::ag;
  ep::EpSizes sizes;
  // Reused across calls (sized by ep_size_hint, grown on demand).
  std::vector<std::byte> send_buf, recv_buf, recv_x, comb_send, comb_recv;
  std::vector<std::byte> x_spare, y_spare;  // dispatch_input / combine_input outside a shared window
  std::vector<float> red_send, red_recv, acc;
  std::vector<uint8_t> filled;  // ag combine: which rows of a chunk hold a received row
  std::vector<int> part_count, group_count, group_end;
  std::vector<float> slot_w;
  std::vector<const uint16_t*> part_ptr;
  std::vector<int64_t> selected;
  std::vector<const std::byte*> slot_ptr, exposed;
  ep::a2a::Scratch scratch;
  EpCallStats stats;

  Impl(Group& g, const EPConfig& c) : group(g), cfg(c) {}

  // Once per process and message (rank 0): the lowering a backend gets is news once, not per call.
  void log_once(const std::string& what) const {
    static std::mutex mu;
    static std::set<std::string> logged;
    if (rank != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    if (logged.insert(what + " on " + group.backend()).second) log_info("ep: {} on {}", what, group.backend());
  }

  PackSource source(const Tensor& x, const Tensor& scales, const Tensor& weights, const Tensor& idx) const {
    return {static_cast<const std::byte*>(x.raw()),
            cfg.dispatch_dtype == DispatchDType::fp8 ? scales.data<float>() : nullptr,
            weights.data<float>(), idx.data<int64_t>()};
  }

  // Own tokens grouped by destination rank, ascending within each: one pass counts, one places.
  // last[r]: the last token counted for (or placed at) rank r, so a token reaches each rank once.
  void build_send_lists(HandleData& h) const {
    const int k = cfg.num_topk;
    const int64_t* idx = h.num_tokens ? h.topk_idx.data<int64_t>() : nullptr;
    std::vector<int64_t> last(static_cast<size_t>(world));
    auto for_each_destination = [&](auto&& fn) {
      std::fill(last.begin(), last.end(), -1);
      for (int64_t t = 0; t < h.num_tokens; ++t)
        for (int j = 0; j < k; ++j) {
          const int64_t e = idx[t * k + j];
          if (e < 0) continue;
          const size_t r = size_t(owner[size_t(e)]);
          if (last[r] != t) last[r] = t, fn(r, t);
        }
    };
    h.send_offsets.assign(size_t(world) + 1, 0);
    for_each_destination([&](size_t r, int64_t) { ++h.send_offsets[r + 1]; });
    for (int r = 0; r < world; ++r) h.send_offsets[size_t(r) + 1] += h.send_offsets[size_t(r)];
    h.send_tokens.resize(size_t(h.send_offsets[size_t(world)]));
    std::vector<int64_t> cursor(h.send_offsets.begin(), h.send_offsets.end() - 1);
    for_each_destination([&](size_t r, int64_t t) { h.send_tokens[size_t(cursor[r]++)] = t; });
  }

  // ag: pack [R, rec] into this rank's block of the gather buffer, gather in place (the block
  // is not copied again), and list the received rows.
  void ag_exchange(const HandleData& h, const PackSource& src, bool cached, std::vector<RowRef>& rows) {
    const RecordLayout& rl = sizes.ag_record;
    const int64_t r_rows = h.ag_rows;
    const int k = cfg.num_topk, p = cfg.scale_cols();
    if (recv_buf.size() < size_t(world) * size_t(r_rows) * rl.bytes)
      recv_buf.resize(size_t(world) * size_t(r_rows) * rl.bytes);
    std::byte* own = recv_buf.data() + size_t(rank) * size_t(r_rows) * rl.bytes;
    for (int64_t t = 0; t < r_rows; ++t) {
      std::byte* dst = own + size_t(t) * rl.bytes;
      if (t < h.num_tokens) pack_record(rl, src, p, k, t, dst, false);
      else pack_padding(rl, k, dst);
    }
    ep::ag::gather(group, own, r_rows, rl.bytes, recv_buf.data(), stats);
    rows.clear();
    if (cached) {
      for (size_t i = 0; i < h.recv_src_rank.size(); ++i) {
        const int64_t g = int64_t(h.recv_src_rank[i]) * r_rows + h.recv_src_token[i];
        const std::byte* rec = recv_buf.data() + size_t(g) * rl.bytes;
        rows.push_back(record_row(rl, h.recv_src_rank[i], h.recv_src_token[i], rec, rec));
      }
      return;
    }
    const int64_t lo = int64_t(rank) * local_experts;
    ep::ag::select(recv_buf.data(), world, r_rows, rl, k, lo, lo + local_experts, selected);
    for (int64_t g : selected) {
      const std::byte* rec = recv_buf.data() + size_t(g) * rl.bytes;
      rows.push_back(record_row(rl, int32_t(g / r_rows), int32_t(g % r_rows), rec, rec));
    }
  }

  // a2a: exchange under the plan and list the received rows. Where all_to_all_v is trusted and
  // the call is large, the x rows go by all_to_all_v_rows straight from the caller's x (no pack
  // copy) into x_dst when given (the output itself: no unpack copy either) and the small
  // [scales|weights|idx|token] records by a second all_to_all_v; else whole records are packed
  // for the plan's lowering (a small call saves a collective round that way).
  void a2a_exchange(const HandleData& h, const PackSource& src, std::vector<RowRef>& rows, std::byte* x_dst) {
    const int k = cfg.num_topk, p = cfg.scale_cols();
    const size_t n_send = h.send_tokens.size();
    std::vector<int64_t> sc(static_cast<size_t>(world)), rc(static_cast<size_t>(world));
    int64_t n_recv = 0;
    for (int r = 0; r < world; ++r) {
      sc[size_t(r)] = h.plan.send(rank, r);
      rc[size_t(r)] = h.plan.send(r, rank);
      n_recv += rc[size_t(r)];
    }
    log_once(fmt::format("a2a dispatch lowering = {}", ep::a2a::to_string(h.plan.lowering)));
    const bool split = rows_apart(h);
    const RecordLayout& rl = split ? sizes.a2a_meta : sizes.a2a_record;
    if (send_buf.size() < n_send * rl.bytes) send_buf.resize(n_send * rl.bytes);
    for (size_t i = 0; i < n_send; ++i)
      pack_record(rl, src, p, k, h.send_tokens[i], send_buf.data() + i * rl.bytes, true);
    if (recv_buf.size() < size_t(n_recv) * rl.bytes) recv_buf.resize(size_t(n_recv) * rl.bytes);
    ep::a2a::exchange(group, h.plan.lowering, h.plan.max_split, sc, rc, send_buf.data(), recv_buf.data(), rl.bytes,
                      scratch, stats);
    const std::byte* x_recv = nullptr;
    if (split) {
      if (!x_dst) {
        if (recv_x.size() < size_t(n_recv) * rl.x_bytes) recv_x.resize(size_t(n_recv) * rl.x_bytes);
        x_dst = recv_x.data();
      }
      std::vector<size_t> recv_rows(rc.begin(), rc.end());
      group.all_to_all_v_rows(src.x, rl.x_bytes, h.send_tokens, h.send_offsets, x_dst, recv_rows);
      stats.collectives += 1;
      stats.bytes_sent += n_send * rl.x_bytes;
      stats.bytes_recv += size_t(n_recv) * rl.x_bytes;
      x_recv = x_dst;
    }
    list_received(h, rl, x_recv, rows);
  }

  // The a2a rows received into recv_buf as records of rl, source ranks in order, with their
  // x in the record or, given x_apart, at the same position there.
  void list_received(const HandleData& h, const RecordLayout& rl, const std::byte* x_apart,
                     std::vector<RowRef>& rows) const {
    rows.clear();
    size_t pos = 0;
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < h.plan.send(r, rank); ++i, ++pos) {
        const std::byte* rec = recv_buf.data() + pos * rl.bytes;
        int64_t t;
        std::memcpy(&t, rec + rl.off_token, 8);
        rows.push_back(record_row(rl, int32_t(r), int32_t(t), x_apart ? x_apart + pos * rl.x_bytes : rec, rec));
      }
  }

  // Whether an a2a call on peer memory takes the direct lowering: per EPConfig::peer_memory, and
  // under `automatic` once the received rows (row_bytes each) average kEpDirectMinBytes per rank.
  // The split matrix is the same on every rank, so is the answer.
  bool use_direct(const HandleData& h, size_t row_bytes) const {
    if (cfg.peer_memory != EpPeerMemory::automatic) return cfg.peer_memory == EpPeerMemory::on;
    return large_call(h, row_bytes);
  }
  // The a2a call moves kEpDirectMinBytes per rank on average (rows of row_bytes): bandwidth,
  // not collective rounds, sets its time. The same answer on every rank.
  bool large_call(const HandleData& h, size_t row_bytes) const {
    return uint64_t(h.plan.total) * row_bytes >= uint64_t(world) * kEpDirectMinBytes;
  }
  // x was built in the group's expose staging place (dispatch_input), so exposing it copies nothing.
  bool x_in_place(const Tensor& x) const {
    return group.peer_memory() == PeerMemory::window && (x.nbytes() == 0 || x.raw() == group.expose_staging(x.nbytes()));
  }
  // The direct dispatch where the sources write (a2a_push_rows): in one address space, without
  // the expand layout (whose rows go to per-expert places only the receiver knows), and where the
  // x rows all ranks move exceed what a cache keeps (kEpStreamMinBytes). The same on every rank.
  bool sources_write(const HandleData& h) const {
    return group.peer_memory() == PeerMemory::address_space && !cfg.expand &&
           uint64_t(h.plan.total) * sizes.ag_record.x_bytes >= kEpStreamMinBytes;
  }
  // a2a combine reads the peers' y where they are (the direct lowering).
  bool reads_peer_y(const HandleData& h) const {
    return algo == EpAlgo::a2a && group.peer_memory() != PeerMemory::none && use_direct(h, size_t(cfg.hidden) * 2);
  }
  // a2a dispatch under the `v` lowering sends x rows apart from their records for a large call.
  bool rows_apart(const HandleData& h) const {
    return h.plan.lowering == ep::a2a::Lowering::v && large_call(h, sizes.ag_record.x_bytes);
  }

  // a2a dispatch, direct lowering (peers share the address space): every rank exposes its x, scales,
  // weights, ids and send list, and lists its rows where the sources hold them; unpack then
  // copies them straight into the outputs. Nothing is packed or exchanged; the caller closes
  // with a barrier once the rows are read.
  void a2a_direct_rows(const HandleData& h, const PackSource& src, std::vector<RowRef>& rows) {
    const size_t k = size_t(cfg.num_topk), t_count = size_t(h.num_tokens);
    const size_t x_bytes = sizes.ag_record.x_bytes, scale_bytes = sizes.ag_record.scale_bytes;
    const std::array<std::span<const std::byte>, 5> regions{
        std::span(src.x, t_count * x_bytes),
        std::as_bytes(std::span(src.scales, src.scales ? t_count * scale_bytes / 4 : 0)),
        std::as_bytes(std::span(src.weights, t_count * k)),
        std::as_bytes(std::span(src.idx, t_count * k)),
        std::as_bytes(std::span(h.send_tokens)),
    };
    group.expose(regions, exposed);
    log_once("a2a dispatch lowering = direct (peer memory)");
    rows.clear();
    uint64_t bytes = 0;
    for (int r = 0; r < world; ++r) {
      const std::byte* const* at = exposed.data() + size_t(r) * regions.size();
      int64_t q = h.plan.send_offset(r, rank);
      for (const int64_t end = q + h.plan.send(r, rank); q < end; ++q) {
        int64_t t;
        std::memcpy(&t, at[4] + size_t(q) * 8, 8);
        const size_t tt = size_t(t);
        rows.push_back({int32_t(r), int32_t(t), at[0] + tt * x_bytes, at[1] + tt * scale_bytes, at[2] + tt * k * 4,
                        at[3] + tt * k * 8});
        bytes += x_bytes + scale_bytes + k * 12 + 8;
      }
    }
    stats.collectives += 2;  // the expose and the closing barrier
    stats.lowering = "direct";
    stats.bytes_recv += bytes;
  }

  // a2a dispatch, direct lowering where the sources write (one address space, non-expand layout,
  // a call too large for the cache: sources_write): every rank exposes where its received rows
  // go (x straight into its output x_dst, the rest as meta records) and each source writes its
  // own rows there, at their place in (source rank, source token) order. A source reads each x
  // row once, in order, for all its destinations, where under a2a_direct_rows every destination
  // reads it again from scattered places; x goes by streaming stores, so no destination line is
  // read in first or pulled back from this core's cache by its reader. The closing barrier comes
  // before the unpack, which finds the rows in place and reads only this rank's memory.
  // local W=8 (155 MB moved): 5.4-6.1 ms against 7.1-8.8 reading; W=2 (7 MB, in cache) is
  // faster reading: 0.41-0.49 ms against 0.56-0.60. Returns the output x.
  Tensor a2a_push_rows(const HandleData& h, const PackSource& src, std::vector<RowRef>& rows) {
    const RecordLayout& rl = sizes.a2a_meta;
    const int k = cfg.num_topk, p = cfg.scale_cols();
    const size_t x_bytes = rl.x_bytes;
    const int64_t n_recv = a2a_recv_rows(h);
    Tensor x_out = Tensor::empty(x_dtype(), {n_recv, cfg.hidden});
    auto* x_dst = static_cast<std::byte*>(x_out.raw());
    if (recv_buf.size() < size_t(n_recv) * rl.bytes) recv_buf.resize(size_t(n_recv) * rl.bytes);
    const std::array<std::span<const std::byte>, 2> regions{std::span<const std::byte>(x_dst, size_t(n_recv) * x_bytes),
                                                            std::span<const std::byte>(recv_buf.data(), size_t(n_recv) * rl.bytes)};
    group.expose(regions, exposed);
    log_once("a2a dispatch lowering = direct-push (peer memory, the sources write)");
    // Per destination: the next of its send list, and where that row goes in its outputs.
    std::vector<int64_t> next(h.send_offsets.begin(), h.send_offsets.end() - 1), at(static_cast<size_t>(world));
    for (int d = 0; d < world; ++d) at[size_t(d)] = h.plan.recv_offset(rank, d);
    uint64_t sent = 0;
    for (int64_t t = 0; t < h.num_tokens; ++t)
      for (int i = 0; i < world; ++i) {
        const int d = (rank + i) % world;  // staggered, as the other lowerings read their peers
        const size_t di = size_t(d);
        if (next[di] == h.send_offsets[di + 1] || h.send_tokens[size_t(next[di])] != t) continue;
        ++next[di];
        const size_t row = size_t(at[di]++);
        auto* peer_x = const_cast<std::byte*>(exposed[di * 2]);
        auto* peer_meta = const_cast<std::byte*>(exposed[di * 2 + 1]);
        copy_streaming(peer_x + row * x_bytes, src.x + size_t(t) * x_bytes, x_bytes);
        pack_record(rl, src, p, k, t, peer_meta + row * rl.bytes, true);
        sent += x_bytes + rl.bytes;
      }
    streaming_fence();
    group.barrier();  // every row has landed; no peer writes here, or reads this rank's x, after it
    list_received(h, rl, x_dst, rows);
    stats.collectives += 2;  // the expose and the closing barrier
    stats.lowering = "direct-push";
    stats.bytes_sent += sent;
    stats.bytes_recv += uint64_t(n_recv) * (x_bytes + rl.bytes);
    return x_out;
  }

  DType x_dtype() const { return cfg.dispatch_dtype == DispatchDType::fp8 ? DType::e4m3 : DType::bf16; }
  // The rows an a2a dispatch brings this rank: its column of the split matrix.
  int64_t a2a_recv_rows(const HandleData& h) const {
    int64_t n = 0;
    for (int r = 0; r < world; ++r) n += h.plan.send(r, rank);
    return n;
  }
  // The a2a dispatch output x, allocated before the exchange so the rows land in it directly
  // (non-expand layout over all_to_all_v_rows); else undefined.
  Tensor a2a_x_out(const HandleData& h) const {
    if (cfg.expand || !rows_apart(h)) return {};
    return Tensor::empty(x_dtype(), {a2a_recv_rows(h), cfg.hidden});
  }

  // The common unpack: received records -> DeepEP's outputs. fill_handle: record the receive
  // side in h (uncached); cached dispatch recomputes the same values and leaves h alone.
  DispatchOutput unpack(const std::vector<RowRef>& rows, HandleData* h_fill, const HandleData& h,
                        Tensor x_out = {}) const {
    const int k = cfg.num_topk, p = cfg.scale_cols();
    const size_t x_bytes = sizes.ag_record.x_bytes, scale_bytes = sizes.ag_record.scale_bytes;
    const int64_t n = int64_t(rows.size());
    const int64_t lo = int64_t(rank) * local_experts;
    const bool fp8 = cfg.dispatch_dtype == DispatchDType::fp8;
    const DType xdt = x_dtype();
    const int64_t m = cfg.num_max_tokens_per_rank;

    std::vector<int32_t> local_idx(size_t(n) * size_t(k));
    std::vector<float> weights(size_t(n) * size_t(k));
    std::vector<int64_t> count_raw(size_t(local_experts), 0), per_rank(size_t(world), 0);
    for (int64_t i = 0; i < n; ++i) {
      const RowRef& row = rows[size_t(i)];
      std::memcpy(weights.data() + i * k, row.weights, size_t(k) * 4);
      per_rank[size_t(rows[size_t(i)].src_rank)] += 1;
      for (int j = 0; j < k; ++j) {
        int64_t e;
        std::memcpy(&e, row.idx + size_t(j) * 8, 8);
        const bool mine = e >= lo && e < lo + local_experts;
        local_idx[size_t(i * k + j)] = mine ? int32_t(e - lo) : -1;
        if (mine) count_raw[size_t(e - lo)] += 1;
      }
    }
    std::vector<int64_t> count_aligned(static_cast<size_t>(local_experts)), seg_start(static_cast<size_t>(local_experts));
    int64_t s_total = 0;
    for (int j = 0; j < local_experts; ++j) {
      count_aligned[size_t(j)] = int64_t(ep::align_up(size_t(count_raw[size_t(j)]), size_t(cfg.expert_alignment)));
      seg_start[size_t(j)] = s_total;
      s_total += count_aligned[size_t(j)];
    }

    DispatchOutput out;
    out.num_recv_tokens = n;
    out.num_recv_tokens_per_rank = per_rank;
    out.num_recv_tokens_per_expert = count_raw;
    out.num_recv_tokens_per_expert_aligned = count_aligned;
    std::vector<int64_t> expand_slot;
    if (!cfg.expand) {
      out.x = x_out.defined() ? std::move(x_out) : Tensor::empty(xdt, {n, cfg.hidden});  // [N, H]
      if (fp8) out.scales = Tensor::empty(DType::f32, {n, p});      // [N, P]
      out.topk_idx = Tensor::empty(DType::i64, {n, k});             // [N, K]
      out.topk_weights = Tensor::empty(DType::f32, {n, k});         // [N, K]
      out.src = Tensor::empty(DType::i64, {n});                     // [N]
      auto* ox = static_cast<std::byte*>(out.x.raw());
      for (int64_t i = 0; i < n; ++i) {
        const RowRef& r = rows[size_t(i)];
        if (r.x != ox + size_t(i) * x_bytes) std::memcpy(ox + size_t(i) * x_bytes, r.x, x_bytes);
        if (fp8) std::memcpy(out.scales.data<float>() + i * p, r.scales, scale_bytes);
        for (int j = 0; j < k; ++j) out.topk_idx.data<int64_t>()[i * k + j] = local_idx[size_t(i * k + j)];
        out.src.data<int64_t>()[i] = int64_t(r.src_rank) * m + r.src_token;
      }
      if (n) std::memcpy(out.topk_weights.raw(), weights.data(), weights.size() * 4);
    } else {
      out.x = Tensor::zeros(xdt, {s_total, cfg.hidden});                // [S, H]
      if (fp8) out.scales = Tensor::zeros(DType::f32, {s_total, p});   // [S, P]
      out.topk_idx = Tensor::empty(DType::i64, {s_total});             // [S]
      out.topk_weights = Tensor::zeros(DType::f32, {s_total});         // [S]
      out.src = Tensor::empty(DType::i64, {s_total});                  // [S]
      out.expand_row = Tensor::empty(DType::i64, {s_total});           // [S]
      std::fill_n(out.topk_idx.data<int64_t>(), s_total, -1);
      std::fill_n(out.src.data<int64_t>(), s_total, -1);
      std::fill_n(out.expand_row.data<int64_t>(), s_total, -1);
      expand_slot.assign(size_t(n) * size_t(k), -1);
      std::vector<int64_t> cursor = seg_start;
      auto* ox = static_cast<std::byte*>(out.x.raw());
      for (int64_t i = 0; i < n; ++i) {
        const RowRef& r = rows[size_t(i)];
        for (int j = 0; j < k; ++j) {
          const int32_t le = local_idx[size_t(i * k + j)];
          if (le < 0) continue;
          const int64_t s = cursor[size_t(le)]++;
          expand_slot[size_t(i * k + j)] = s;
          std::memcpy(ox + size_t(s) * x_bytes, r.x, x_bytes);
          if (fp8) std::memcpy(out.scales.data<float>() + s * p, r.scales, scale_bytes);
          out.topk_idx.data<int64_t>()[s] = le;
          out.topk_weights.data<float>()[s] = weights[size_t(i * k + j)];
          out.src.data<int64_t>()[s] = int64_t(r.src_rank) * m + r.src_token;
          out.expand_row.data<int64_t>()[s] = i;
        }
      }
    }
    if (h_fill) {
      h_fill->num_recv = n;
      h_fill->recv_src_rank.resize(size_t(n));
      h_fill->recv_src_token.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) {
        h_fill->recv_src_rank[size_t(i)] = rows[size_t(i)].src_rank;
        h_fill->recv_src_token[size_t(i)] = rows[size_t(i)].src_token;
      }
      h_fill->num_recv_per_rank = std::move(per_rank);
      h_fill->recv_local_idx = std::move(local_idx);
      h_fill->recv_weights = std::move(weights);
      h_fill->count_raw = std::move(count_raw);
      h_fill->count_aligned = std::move(count_aligned);
      h_fill->seg_start = std::move(seg_start);
      h_fill->num_expanded = s_total;
      h_fill->expand_slot = std::move(expand_slot);
    } else {
      DI_CHECK(n == h.num_recv && s_total == h.num_expanded,
               "ep cached dispatch: received {} rows ({} expanded), the handle expects {} ({}); the "
               "handle belongs to a different dispatch",
               n, s_total, h.num_recv, h.num_expanded);
    }
    return out;
  }

  // Every rank validates locally, then one MAX all_reduce agrees on "any rank invalid" (so all
  // ranks throw together) and on the global max T (ag's R).
  int64_t agree(const std::string& err, int64_t num_tokens, const char* op) {
    std::array<int64_t, 2> v{err.empty() ? 0 : int64_t(world - rank), num_tokens};
    group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
    stop_if_invalid(err, v[0] != 0 ? int(world - v[0]) : -1, op);
    return v[1];
  }
  // After an agreement: every rank throws when one passed invalid input (bad_rank >= 0).
  void stop_if_invalid(const std::string& err, int bad_rank, const char* op) const {
    if (!err.empty()) DI_FAIL("ep {} on rank {}/{}: {}", op, rank, world, err);
    if (bad_rank >= 0)
      DI_FAIL("ep {}: rank {} passed invalid input (its error names the problem); rank {} stops too, "
              "no data was moved", op, bad_rank, rank);
  }

  DispatchOutput dispatch(const DispatchInput& in) {
    stats = {};
    const std::string err = ep::check_dispatch_input(in, cfg);
    const int64_t t_count = err.empty() ? in.topk_idx.dim(0) : 0;
    // ag agrees (and learns the global max T) in one all_reduce; a2a in its plan's all_gather.
    const int64_t max_t = algo == EpAlgo::ag ? agree(err, t_count, "dispatch") : 0;
    auto h = std::make_shared<HandleData>();
    h->algo = algo;
    h->world = world;
    h->rank = rank;
    h->num_tokens = t_count;
    if (err.empty()) {
      h->topk_idx = in.topk_idx.clone();
      h->topk_weights = in.topk_weights.clone();
    }
    build_send_lists(*h);
    if (algo == EpAlgo::ag) {
      h->ag_rows = cfg.ag_rows == AgRows::max ? max_t : cfg.num_max_tokens_per_rank;
    } else {
      std::vector<int64_t> counts(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) counts[size_t(r)] = h->send_offsets[size_t(r) + 1] - h->send_offsets[size_t(r)];
      h->plan = ep::a2a::make_plan(group, counts, err.empty(), err.empty() && x_in_place(in.x));
      stop_if_invalid(err, h->plan.first_invalid_rank, "dispatch");
    }
    stats.collectives += 1;  // the agreement all_reduce (ag) or the plan all_gather (a2a)
    DispatchOutput out = exchange_and_unpack(*h, source(in.x, in.scales, h->topk_weights, h->topk_idx), h.get());
    out.handle.data = std::move(h);
    return out;
  }

  // Both dispatches after the routing is known (h): move the rows, then unpack. h_fill: the
  // uncached dispatch records the receive side there.
  DispatchOutput exchange_and_unpack(const HandleData& h, const PackSource& src, HandleData* h_fill) {
    std::vector<RowRef> rows;
    if (algo == EpAlgo::ag) {
      ag_exchange(h, src, h_fill == nullptr, rows);
      return unpack(rows, h_fill, h);
    }
    // Direct dispatch only where exposing x copies nothing: in one address space, or where every
    // rank's x sits in its window staging place (agreed in the plan: uncached dispatch only).
    // Else the exposed x would be one copy more than the exchange (mpi W=2: 1.06 vs 0.80 ms).
    const bool x_readable = group.peer_memory() == PeerMemory::address_space || (h_fill && h.plan.all_x_in_place);
    if (x_readable && use_direct(h, sizes.ag_record.x_bytes)) {
      if (sources_write(h)) {
        Tensor x_out = a2a_push_rows(h, src, rows);
        return unpack(rows, h_fill, h, std::move(x_out));
      }
      a2a_direct_rows(h, src, rows);
      DispatchOutput out = unpack(rows, h_fill, h);
      group.barrier();  // the sources' buffers stay put until every rank has read its rows
      return out;
    }
    Tensor x_out = a2a_x_out(h);
    a2a_exchange(h, src, rows, x_out.defined() ? static_cast<std::byte*>(x_out.raw()) : nullptr);
    return unpack(rows, h_fill, h, std::move(x_out));
  }

  void check_handle(const Handle& handle, const char* op) const {
    DI_CHECK(handle.valid(), "ep {}: the handle is empty; pass the handle of a dispatch", op);
    const HandleData& h = *handle.data;
    DI_CHECK(h.world == world && h.rank == rank && h.algo == algo,
             "ep {}: the handle comes from another EPBuffer (rank {}/{} algo {}, this is rank {}/{} algo {})",
             op, h.rank, h.world, to_string(h.algo), rank, world, to_string(algo));
  }

  DispatchOutput dispatch_cached(const Tensor& x, const Tensor& scales, const Handle& handle) {
    stats = {};
    check_handle(handle, "cached dispatch");
    const HandleData& h = *handle.data;
    const std::string err = ep::check_x(x, scales, h.num_tokens, cfg);
    if (!err.empty()) DI_FAIL("ep cached dispatch on rank {}/{}: {}", rank, world, err);
    DispatchOutput out = exchange_and_unpack(h, source(x, scales, h.topk_weights, h.topk_idx), nullptr);
    out.handle = handle;
    return out;
  }

  // y row of received row i for slot k.
  const uint16_t* y_row(const HandleData& h, const uint16_t* y, int64_t i, int j) const {
    const int64_t row = cfg.expand ? h.expand_slot[size_t(i * cfg.num_topk + j)] : i;
    return y + size_t(row) * size_t(cfg.hidden);
  }

  // partial[h] = canon(bf16(Σ_local w_k·y_k[h])) in slot order (fast mode), as bf16 bits and/or
  // their f32 values.
  void local_partial(const HandleData& h, const uint16_t* y, int64_t i, uint16_t* bits, float* f32) const {
    const int k = cfg.num_topk;
    std::array<float, 64> w;
    std::array<const uint16_t*, 64> rows;
    int m = 0;
    for (int j = 0; j < k; ++j) {
      if (h.recv_local_idx[size_t(i * k + j)] < 0) continue;
      w[size_t(m)] = h.recv_weights[size_t(i * k + j)];
      rows[size_t(m++)] = y_row(h, y, i, j);
    }
    ep::rows::weighted_sum(w.data(), rows.data(), m, size_t(cfg.hidden), true, bits, f32);
  }

  // [rows, H] of dt in a buffer reused call after call (grown on demand): a serving loop writes a
  // layer's x or y there, and the next layer's call takes the same bytes back.
  Tensor spare(std::vector<std::byte>& buf, DType dt, int64_t rows) const {
    const size_t bytes = size_t(rows) * size_t(cfg.hidden) * dtype_size(dt);
    if (buf.size() < bytes) buf.resize(bytes);
    return Tensor::borrow(buf.data(), dt, {rows, cfg.hidden});
  }

  Tensor dispatch_input(int64_t num_tokens) {
    DI_CHECK(num_tokens >= 0 && num_tokens <= cfg.num_max_tokens_per_rank,
             "ep dispatch_input on rank {}/{}: {} tokens, the buffer takes 0..{}", rank, world, num_tokens,
             cfg.num_max_tokens_per_rank);
    const DType dt = x_dtype();
    // Room for every region a2a_direct_rows exposes (the send list at most T·W ids), so that
    // expose never grows the window under x, which the caller may still read after dispatch.
    const size_t t = size_t(num_tokens), k = size_t(cfg.num_topk);
    const size_t room = t * sizes.ag_record.x_bytes + t * sizes.ag_record.scale_bytes + t * k * 12 + t * size_t(world) * 8 + 5 * 64;
    if (algo == EpAlgo::a2a && group.peer_memory() == PeerMemory::window && t != 0)
      if (std::byte* at = group.expose_staging(room)) return Tensor::borrow(at, dt, {num_tokens, cfg.hidden});
    return spare(x_spare, dt, num_tokens);
  }

  Tensor combine_input(const Handle& handle) {
    check_handle(handle, "combine_input");
    const HandleData& h = *handle.data;
    const int64_t rows = cfg.expand ? h.num_expanded : h.num_recv;
    // Combine exposes y as its first region (then the expand slots): built in the staging place,
    // with room for both, it is not copied and the window does not grow under it.
    const size_t room = size_t(rows) * size_t(cfg.hidden) * 2 + (cfg.expand ? h.expand_slot.size() * 8 : 0) + 2 * 64;
    if (reads_peer_y(h))
      if (std::byte* at = group.expose_staging(room))
        return Tensor::borrow(at, DType::bf16, {rows, cfg.hidden});
    return spare(y_spare, DType::bf16, rows);
  }

  CombineOutput combine(const Tensor& y, const Handle& handle) {
    stats = {};
    check_handle(handle, "combine");
    const HandleData& h = *handle.data;
    const int64_t rows = cfg.expand ? h.num_expanded : h.num_recv;
    DI_CHECK((y.defined() || (y.ndim() == 2 && y.numel() == 0)) && y.dtype() == DType::bf16 && y.ndim() == 2 && y.dim(0) == rows &&
                 y.dim(1) == cfg.hidden && y.is_contiguous(),
             "ep combine on rank {}/{}: y must be a contiguous bf16 [{}={}, H={}] tensor, got {}", rank,
             world, cfg.expand ? "S" : "N", rows, cfg.hidden, y.defined() ? y.describe() : "undefined");
    CombineOutput out;
    out.x = Tensor::empty(DType::bf16, {h.num_tokens, cfg.hidden});   // [T, H]
    out.topk_weights = Tensor::zeros(DType::f32, {h.num_tokens, cfg.num_topk});  // [T, K]
    if (algo == EpAlgo::ag) combine_ag(h, y.data<uint16_t>(), out);
    else combine_a2a(h, y.data<uint16_t>(), out);
    return out;
  }

  void combine_ag(const HandleData& h, const uint16_t* y, CombineOutput& out) {
    const int k = cfg.num_topk, hd = cfg.hidden;
    const bool exact = cfg.combine == CombineMode::exact;
    const size_t cols = ep::ag_combine_cols(cfg);
    ep::ag::ReduceParams rp;
    rp.reduce = cfg.reduce;
    rp.rows = h.ag_rows;
    rp.cols = cols;
    rp.chunk_rows = sizes.combine_chunk_rows;  // ep_size_hint
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    uint16_t* ox = out.x.data<uint16_t>();
    float* ow = out.topk_weights.data<float>();
    // Writes every float of the chunk, each once: the received rows in full (zeros for the slots
    // of other ranks' experts), then zeros for the rows this rank has nothing for.
    auto fill = [&](int64_t begin, int64_t end, float* send) {
      const int64_t span = end - begin;
      filled.assign(size_t(world) * size_t(span), 0);
      for (int64_t i = 0; i < h.num_recv; ++i) {
        const int64_t t = h.recv_src_token[size_t(i)];
        if (t < begin || t >= end) continue;
        const size_t at = size_t(h.recv_src_rank[size_t(i)]) * size_t(span) + size_t(t - begin);
        filled[at] = 1;
        float* base = send + at * cols;
        for (int j = 0; j < k; ++j) {
          const bool local = h.recv_local_idx[size_t(i * k + j)] >= 0;
          if (exact && local)
            ep::rows::scale_bf16(h.recv_weights[size_t(i * k + j)], y_row(h, y, i, j),
                                 base + size_t(j) * size_t(hd), size_t(hd));
          else if (exact)
            std::fill_n(base + size_t(j) * size_t(hd), hd, 0.0f);
          base[cols - size_t(k) + size_t(j)] = local ? canon(h.recv_weights[size_t(i * k + j)]) : 0.0f;
        }
        if (!exact) local_partial(h, y, i, nullptr, base);
      }
      for (size_t at = 0; at < filled.size(); ++at)
        if (!filled[at]) std::fill_n(send + at * cols, cols, 0.0f);
    };
    if (acc.size() < size_t(hd)) acc.resize(size_t(hd));
    auto consume = [&](int64_t begin, int64_t end, const float* own) {
      for (int64_t t = begin; t < std::min(end, h.num_tokens); ++t) {
        const float* row = own + size_t(t - begin) * cols;
        if (exact) {
          std::fill_n(acc.data(), hd, 0.0f);
          for (int j = 0; j < k; ++j)
            if (own_idx[t * k + j] >= 0) ep::rows::add_f32(row + size_t(j) * size_t(hd), acc.data(), size_t(hd));
          ep::rows::to_bf16(acc.data(), ox + t * hd, size_t(hd));
        } else {
          ep::rows::to_bf16(row, ox + t * hd, size_t(hd));
        }
        for (int j = 0; j < k; ++j)
          ow[t * k + j] = own_idx[t * k + j] < 0 ? 0.0f : row[cols - size_t(k) + size_t(j)];
      }
    };
    ep::ag::reduce(group, rp, fill, consume, red_send, red_recv, stats);
  }

  // a2a combine, "direct" lowering (the group has peer memory): each owner reads its tokens'
  // expert outputs straight from the peers' y and forms what the exchange lowering would have
  // sent and summed (fast: per-rank partials in slot order, summed in ascending rank order;
  // exact: w·y in slot order), in one pass that writes nothing but the output. Collectives: the
  // expose (every rank's y is complete once it has exposed it; mpi copies it into the shared
  // window) and a closing barrier (no rank returns, and frees its y, while a peer still reads it).
  void combine_direct(const HandleData& h, const uint16_t* y, CombineOutput& out) {
    const int k = cfg.num_topk;
    const size_t hd = size_t(cfg.hidden);
    const bool exact = cfg.combine == CombineMode::exact;
    const int64_t y_rows = cfg.expand ? h.num_expanded : h.num_recv;
    // Expand layout: the y row of (received row i, slot j) is expand_slot[i·K + j].
    const std::array<std::span<const std::byte>, 2> regions{
        std::as_bytes(std::span(y, size_t(y_rows) * hd)),
        std::as_bytes(std::span(cfg.expand ? h.expand_slot.data() : nullptr, cfg.expand ? h.expand_slot.size() : 0))};
    group.expose(regions, exposed);
    log_once(fmt::format("a2a combine ({}) lowering = direct (peer memory)", to_string(cfg.combine)));
    auto peer_y = [&](int r) { return reinterpret_cast<const uint16_t*>(exposed[size_t(r) * 2]); };
    auto peer_slot = [&](int r) { return reinterpret_cast<const int64_t*>(exposed[size_t(r) * 2 + 1]); };

    // Per token: its slots' weights and y rows, by rank ascending then slot ascending (fast), or
    // by slot (exact); group_end[t·K + g] closes the t's g-th rank group.
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    const float* own_w = h.topk_weights.data<float>();
    float* ow = out.topk_weights.data<float>();
    part_ptr.assign(size_t(h.num_tokens) * size_t(k), nullptr);
    slot_w.assign(size_t(h.num_tokens) * size_t(k), 0.0f);
    group_end.assign(size_t(h.num_tokens) * size_t(k), 0);
    part_count.assign(size_t(h.num_tokens), 0);  // addends so far
    group_count.assign(size_t(h.num_tokens), 0);
    uint64_t bytes_read = 0;
    for (int r = 0; r < world; ++r) {
      // Rank r received its rows in (source rank, source token) order: this rank's start there.
      int64_t row = h.plan.recv_offset(rank, r);
      for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q, ++row) {
        const int64_t t = h.send_tokens[size_t(q)];
        if (!cfg.expand) bytes_read += hd * 2;  // one y row per received row, else one per slot
        for (int j = 0; j < k; ++j) {
          const int64_t e = own_idx[t * k + j];
          if (!on_rank(e, r)) continue;
          if (cfg.expand) bytes_read += hd * 2;
          const int64_t y_row = cfg.expand ? peer_slot(r)[row * k + j] : row;
          const size_t a = exact ? size_t(t * k + j) : size_t(t * k + part_count[size_t(t)]++);
          part_ptr[a] = peer_y(r) + size_t(y_row) * hd;
          slot_w[a] = exact ? canon(own_w[t * k + j]) : own_w[t * k + j];
          ow[t * k + j] = canon(own_w[t * k + j]);
        }
        if (!exact) group_end[size_t(t * k + group_count[size_t(t)]++)] = part_count[size_t(t)];
      }
    }
    uint16_t* ox = out.x.data<uint16_t>();
    auto sum_tokens = [&](int64_t t_begin, int64_t t_end) {
      std::array<float, 64> w;
      std::array<const uint16_t*, 64> ys;
      for (int64_t t = t_begin; t < t_end; ++t) {
        const uint16_t* const* rows = part_ptr.data() + t * k;
        if (!exact) {
          ep::rows::sum_of_partials(slot_w.data() + t * k, rows, group_end.data() + t * k, group_count[size_t(t)],
                                    hd, ox + size_t(t) * hd);
          continue;
        }
        int m = 0;  // masked slots and slots of a token that reached no expert drop out
        for (int j = 0; j < k; ++j)
          if (rows[j]) w[size_t(m)] = slot_w[size_t(t * k + j)], ys[size_t(m++)] = rows[j];
        ep::rows::weighted_sum(w.data(), ys.data(), m, hd, false, ox + size_t(t) * hd, nullptr);
      }
    };
    // Tokens are independent: a rank with a pool of its own (several CPUs) splits them, in
    // pieces of at least 256K columns so a small call stays on this thread.
    if (ThreadPool* pool = scoped_pool())
      pool->parallel_for(h.num_tokens, std::max<int64_t>(1, (int64_t(1) << 18) / int64_t(hd)), sum_tokens);
    else
      sum_tokens(0, h.num_tokens);
    group.barrier();
    stats.collectives += 2;
    stats.lowering = "direct";
    stats.bytes_recv += bytes_read;
  }

  void combine_a2a(const HandleData& h, const uint16_t* y, CombineOutput& out) {
    if (reads_peer_y(h)) return combine_direct(h, y, out);
    const int k = cfg.num_topk, hd = cfg.hidden;
    const bool exact = cfg.combine == CombineMode::exact;
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    const Capabilities caps = group.capabilities();
    std::vector<int64_t> sc(size_t(world), 0), rc(size_t(world), 0);
    size_t rec;
    ep::a2a::Lowering lowering = h.plan.lowering;
    int64_t pad = h.plan.max_split;
    if (exact) {
      // One record per (received row, local slot): [w f32 | pad | y bf16 H]; the owner forms the
      // product, the same fp32 value the expert rank would have sent.
      rec = ep::align_up(8 + size_t(hd) * 2, ep::kRecordAlign);
      for (int64_t i = 0; i < h.num_recv; ++i)
        for (int j = 0; j < k; ++j) sc[size_t(h.recv_src_rank[size_t(i)])] += h.recv_local_idx[size_t(i * k + j)] >= 0;
      for (int r = 0; r < world; ++r)
        for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q) {
          const int64_t t = h.send_tokens[size_t(q)];
          for (int j = 0; j < k; ++j) rc[size_t(r)] += on_rank(own_idx[t * k + j], r);
        }
      // Slot counts are not globally known: v where trusted, else pad to a bound every rank
      // derives from the split matrix.
      lowering = caps.all_to_all_v ? ep::a2a::Lowering::v : ep::a2a::Lowering::padded;
      pad = h.plan.max_split * std::min(k, local_experts);
      if (lowering == ep::a2a::Lowering::padded && !caps.all_to_all)
        lowering = ep::a2a::choose_lowering({}, caps);  // throws: nothing trusted
    } else {
      // One record per received row: [K weights f32 | partial bf16 H].
      rec = ep::align_up(size_t(k) * 4 + size_t(hd) * 2, ep::kRecordAlign);
      for (int r = 0; r < world; ++r) {
        sc[size_t(r)] = h.plan.send(r, rank);
        rc[size_t(r)] = h.plan.send(rank, r);
      }
    }
    int64_t n_send = 0, n_recv = 0;
    for (int r = 0; r < world; ++r) n_send += sc[size_t(r)], n_recv += rc[size_t(r)];
    if (comb_send.size() < size_t(n_send) * rec) comb_send.resize(size_t(n_send) * rec);
    if (comb_recv.size() < size_t(n_recv) * rec) comb_recv.resize(size_t(n_recv) * rec);
    std::byte* sp = comb_send.data();
    for (int64_t i = 0; i < h.num_recv; ++i) {  // rows are grouped by source rank, ascending
      if (exact) {
        for (int j = 0; j < k; ++j) {
          if (h.recv_local_idx[size_t(i * k + j)] < 0) continue;
          const float w = canon(h.recv_weights[size_t(i * k + j)]);
          std::memcpy(sp, &w, 4);
          std::memset(sp + 4, 0, 4);
          std::memcpy(sp + 8, y_row(h, y, i, j), size_t(hd) * 2);
          if (rec > 8 + size_t(hd) * 2) std::memset(sp + 8 + size_t(hd) * 2, 0, rec - 8 - size_t(hd) * 2);
          sp += rec;
        }
      } else {
        for (int j = 0; j < k; ++j) {
          const float w = h.recv_local_idx[size_t(i * k + j)] >= 0 ? canon(h.recv_weights[size_t(i * k + j)]) : 0.0f;
          std::memcpy(sp + size_t(j) * 4, &w, 4);
        }
        local_partial(h, y, i, reinterpret_cast<uint16_t*>(sp + size_t(k) * 4), nullptr);
        const size_t used = size_t(k) * 4 + size_t(hd) * 2;
        if (rec > used) std::memset(sp + used, 0, rec - used);
        sp += rec;
      }
    }
    log_once(fmt::format("a2a combine ({}) lowering = {}", to_string(cfg.combine), ep::a2a::to_string(lowering)));
    ep::a2a::exchange(group, lowering, pad, sc, rc, comb_send.data(), comb_recv.data(), rec, scratch, stats);

    uint16_t* ox = out.x.data<uint16_t>();
    float* ow = out.topk_weights.data<float>();
    const std::byte* rp = comb_recv.data();
    if (exact) {
      slot_ptr.assign(size_t(h.num_tokens) * size_t(k), nullptr);
      for (int r = 0; r < world; ++r)
        for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q) {
          const int64_t t = h.send_tokens[size_t(q)];
          for (int j = 0; j < k; ++j)
            if (on_rank(own_idx[t * k + j], r)) {
              slot_ptr[size_t(t * k + j)] = rp;
              rp += rec;
            }
        }
      std::array<float, 64> w;
      std::array<const uint16_t*, 64> ys;
      for (int64_t t = 0; t < h.num_tokens; ++t) {
        int m = 0;
        for (int j = 0; j < k; ++j) {
          const std::byte* r = slot_ptr[size_t(t * k + j)];
          if (!r) continue;
          std::memcpy(&w[size_t(m)], r, 4);
          ys[size_t(m++)] = reinterpret_cast<const uint16_t*>(r + 8);
          ow[t * k + j] = w[size_t(m - 1)];
        }
        // Σ canon(w·y) from +0: canon of an addend changes nothing (x + -0 == x, and a
        // round-to-nearest sum is -0 only when both addends are), so the plain sum is exact.
        ep::rows::weighted_sum(w.data(), ys.data(), m, size_t(hd), false, ox + t * hd, nullptr);
      }
    } else {
      // Partials summed in ascending rank order: rank r's records come before rank r+1's, so
      // listing them per token while walking the ranks in order keeps that order.
      const size_t per = size_t(std::min(world, k));  // a token's partials: one per rank it went to
      part_ptr.assign(size_t(h.num_tokens) * per, nullptr);
      part_count.assign(size_t(h.num_tokens), 0);
      for (int r = 0; r < world; ++r)
        for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q, rp += rec) {
          const int64_t t = h.send_tokens[size_t(q)];
          part_ptr[size_t(t) * per + size_t(part_count[size_t(t)]++)] =
              reinterpret_cast<const uint16_t*>(rp + size_t(k) * 4);
          for (int j = 0; j < k; ++j)
            if (on_rank(own_idx[t * k + j], r))
              std::memcpy(&ow[t * k + j], rp + size_t(j) * 4, 4);
        }
      for (int64_t t = 0; t < h.num_tokens; ++t)
        ep::rows::weighted_sum(nullptr, part_ptr.data() + size_t(t) * per,
                               part_count[size_t(t)], size_t(hd), false, ox + t * hd, nullptr);
    }
  }
};

EPBuffer::EPBuffer(Group& group, const EPConfig& config) : impl_(std::make_unique<Impl>(group, config)) {
  Impl& s = *impl_;
  s.world = group.size();
  s.rank = group.rank();
  std::string err;
  try {
    config.validate(s.world);
  } catch (const Error& e) {
    err = e.what();
  }
  const int64_t bad = err.empty() ? 0 : 1;
  if (err.empty()) {
    s.local_experts = config.num_experts / s.world;
    s.owner.resize(size_t(config.num_experts));
    for (int64_t e = 0; e < config.num_experts; ++e) s.owner[size_t(e)] = int32_t(e / s.local_experts);
    s.algo = resolve_ep_algo(config.algo, group.capabilities());
    s.sizes = ep::ep_size_hint(config, s.world);
  }
  // One MAX all_reduce of (v, -v) pairs: every rank learns min and max of each field.
  const std::array<std::pair<const char*, int64_t>, 12> fields{{
      {"(a rank's config is invalid)", bad},
      {"num_experts", config.num_experts},
      {"hidden", config.hidden},
      {"num_topk", config.num_topk},
      {"num_max_tokens_per_rank", config.num_max_tokens_per_rank},
      {"dispatch_dtype", int64_t(config.dispatch_dtype)},
      {"expert_alignment", config.expert_alignment},
      {"expand", config.expand},
      {"algo (resolved)", int64_t(s.algo)},
      {"combine", int64_t(config.combine)},
      {"ag_rows/reduce", int64_t(config.ag_rows) * 2 + int64_t(config.reduce)},
      {"peer_memory", int64_t(config.peer_memory)},
  }};
  std::array<int64_t, 2 * fields.size()> v{};
  for (size_t i = 0; i < fields.size(); ++i) {
    v[2 * i] = fields[i].second;
    v[2 * i + 1] = -fields[i].second;
  }
  group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (!err.empty()) DI_FAIL("EPBuffer on rank {}/{}: {}", s.rank, s.world, err);
  if (v[0] != 0) DI_FAIL("EPBuffer on rank {}/{}: another rank's EPConfig is invalid (see its error)", s.rank, s.world);
  for (size_t i = 1; i < fields.size(); ++i)
    if (v[2 * i] != -v[2 * i + 1])
      DI_FAIL("EPBuffer on rank {}/{}: EPConfig.{} differs across ranks (min {}, max {}); every rank "
              "must construct the EPBuffer with the same value",
              s.rank, s.world, fields[i].first, -v[2 * i + 1], v[2 * i]);
  if (s.rank == 0)
    log_debug("ep: EPBuffer W={} {} -> algorithm {} on {}", s.world, config.describe(), to_string(s.algo),
              group.backend());
  if (config.algo == EpAlgo::automatic)
    s.log_once(fmt::format("auto -> {} (W={}, all_to_all_v {})", to_string(s.algo), s.world,
                           group.capabilities().all_to_all_v ? "trusted" : "not trusted"));
}

EPBuffer::~EPBuffer() = default;

DispatchOutput EPBuffer::dispatch(const DispatchInput& in) { return impl_->dispatch(in); }
DispatchOutput EPBuffer::dispatch(const Tensor& x, const Tensor& scales, const Handle& handle) {
  return impl_->dispatch_cached(x, scales, handle);
}
CombineOutput EPBuffer::combine(const Tensor& y, const Handle& handle) { return impl_->combine(y, handle); }
Tensor EPBuffer::combine_input(const Handle& handle) { return impl_->combine_input(handle); }
Tensor EPBuffer::dispatch_input(int64_t num_tokens) { return impl_->dispatch_input(num_tokens); }
const EPConfig& EPBuffer::config() const { return impl_->cfg; }
int EPBuffer::world_size() const { return impl_->world; }
EpAlgo EPBuffer::algorithm() const { return impl_->algo; }
const EpCallStats& EPBuffer::last_stats() const { return impl_->stats; }

}  // namespace deepinfer
