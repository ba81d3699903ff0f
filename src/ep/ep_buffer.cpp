// EPBuffer: the input agreement, the facade over the lowerings (ep/path.h chooses one per call,
// each in a file of its own under allgather/ and alltoall/), and the common unpack into DeepEP's
// outputs, so every lowering produces bit-identical results (docs/ep.md).
#include <deepinfer/ep.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "ep/allgather/ag.h"
#include "ep/alltoall/lowerings.h"
#include "ep/handle.h"
#include "ep/input_places.h"
#include "ep/path.h"
#include "ep/records.h"
#include "ep/sizing.h"
#include "ep/validate.h"

namespace deepinfer {

using ep::HandleData;
using ep::RowRef;
using X = ep::InputPlaces::Kind;

struct EPBuffer::Impl {
  ep::Context c;
  // Each lowering's scratch, reused across calls (grown on demand).
  ep::ag::DispatchScratch ag_dispatch;
  ep::ag::CombineScratch ag_combine;
  ep::a2a::ExchangeDispatchScratch exchange_dispatch;
  ep::a2a::PullScratch pull;
  ep::a2a::PushScratch push;
  ep::a2a::ExchangeCombineScratch exchange_combine;
  ep::a2a::DirectCombineScratch direct_combine;
  ep::InputPlaces places;  // dispatch_input, combine_input and their lifetime rules

  Impl(Group& g, const EPConfig& cfg) : c(g, cfg) {}

  const EPConfig& cfg() const { return c.cfg; }

  ep::PackSource source(const Tensor& x, const Tensor& scales, const Tensor& weights,
                        const Tensor& idx) const {
    return {static_cast<const std::byte*>(x.raw()),
            cfg().dispatch_dtype == DispatchDType::fp8 ? scales.data<float>() : nullptr,
            weights.data<float>(), idx.data<int64_t>()};
  }

  ep::Path path_of(const HandleData& h, bool cached) const {
    return ep::choose_path(
        {cfg(), c.world, c.algo, c.group.peer_memory(), c.group.capabilities(), &h.plan, cached});
  }

  // The common unpack: received records -> DeepEP's outputs. fill_handle: record the receive
  // side in h (uncached); cached dispatch recomputes the same values and leaves h alone.
  DispatchOutput unpack(const std::vector<RowRef>& rows, HandleData* h_fill, const HandleData& h,
                        Tensor x_out = {}) const {
    const EPConfig& cfg = c.cfg;
    const int world = c.world, local_experts = c.local_experts;
    const int k = cfg.num_topk, p = cfg.scale_cols();
    const size_t x_bytes = c.sizes.ag_record.x_bytes, scale_bytes = c.sizes.ag_record.scale_bytes;
    const int64_t n = int64_t(rows.size());
    const int64_t lo = int64_t(c.rank) * local_experts;
    const bool fp8 = cfg.dispatch_dtype == DispatchDType::fp8;
    const DType xdt = c.x_dtype();
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
    std::vector<int64_t> count_aligned(static_cast<size_t>(local_experts)),
        seg_start(static_cast<size_t>(local_experts));
    int64_t s_total = 0;
    for (int j = 0; j < local_experts; ++j) {
      count_aligned[size_t(j)] =
          int64_t(ep::align_up(size_t(count_raw[size_t(j)]), size_t(cfg.expert_alignment)));
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
      if (fp8) out.scales = Tensor::empty(DType::f32, {n, p});                           // [N, P]
      out.topk_idx = Tensor::empty(DType::i64, {n, k});                                  // [N, K]
      out.topk_weights = Tensor::empty(DType::f32, {n, k});                              // [N, K]
      out.src = Tensor::empty(DType::i64, {n});                                          // [N]
      auto* ox = static_cast<std::byte*>(out.x.raw());
      for (int64_t i = 0; i < n; ++i) {
        const RowRef& r = rows[size_t(i)];
        if (r.x != ox + size_t(i) * x_bytes) std::memcpy(ox + size_t(i) * x_bytes, r.x, x_bytes);
        if (fp8) std::memcpy(out.scales.data<float>() + i * p, r.scales, scale_bytes);
        for (int j = 0; j < k; ++j)
          out.topk_idx.data<int64_t>()[i * k + j] = local_idx[size_t(i * k + j)];
        out.src.data<int64_t>()[i] = int64_t(r.src_rank) * m + r.src_token;
      }
      if (n) std::memcpy(out.topk_weights.raw(), weights.data(), weights.size() * 4);
    } else {
      out.x = Tensor::zeros(xdt, {s_total, cfg.hidden});              // [S, H]
      if (fp8) out.scales = Tensor::zeros(DType::f32, {s_total, p});  // [S, P]
      out.topk_idx = Tensor::empty(DType::i64, {s_total});            // [S]
      out.topk_weights = Tensor::zeros(DType::f32, {s_total});        // [S]
      out.src = Tensor::empty(DType::i64, {s_total});                 // [S]
      out.expand_row = Tensor::empty(DType::i64, {s_total});          // [S]
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
      DI_CHECK(
          n == h.num_recv && s_total == h.num_expanded,
          "ep cached dispatch: received {} rows ({} expanded), the handle expects {} ({}); the "
          "handle belongs to a different dispatch",
          n, s_total, h.num_recv, h.num_expanded);
    }
    return out;
  }

  // Every rank validates locally, then one MAX all_reduce agrees on "any rank invalid" (so all
  // ranks throw together) and on the global max T (ag's R).
  int64_t agree(const std::string& err, int64_t num_tokens, const char* op) {
    const int world = c.world;
    std::array<int64_t, 2> v{err.empty() ? 0 : int64_t(world - c.rank), num_tokens};
    c.group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
    stop_if_invalid(err, v[0] != 0 ? int(world - v[0]) : -1, op);
    return v[1];
  }
  // After an agreement: every rank throws when one passed invalid input (bad_rank >= 0).
  void stop_if_invalid(const std::string& err, int bad_rank, const char* op) const {
    if (!err.empty()) DI_FAIL("ep {} on rank {}/{}: {}", op, c.rank, c.world, err);
    if (bad_rank >= 0)
      DI_FAIL(
          "ep {}: rank {} passed invalid input (its error names the problem); rank {} stops too, "
          "no data was moved",
          op, bad_rank, c.rank);
  }

  DispatchOutput dispatch(const DispatchInput& in) {
    c.stats = {};
    places.check_free(c, X::y, "dispatch");
    const std::string err = ep::check_dispatch_input(in, cfg());
    const int64_t t_count = err.empty() ? in.topk_idx.dim(0) : 0;
    // ag agrees (and learns the global max T) in one all_reduce; a2a in its plan's all_gather.
    const int64_t max_t = c.algo == EpAlgo::ag ? agree(err, t_count, "dispatch") : 0;
    auto h = std::make_shared<HandleData>();
    h->algo = c.algo;
    h->world = c.world;
    h->rank = c.rank;
    h->owner = this;
    h->num_tokens = t_count;
    if (err.empty()) {
      h->topk_idx = in.topk_idx.clone();
      h->topk_weights = in.topk_weights.clone();
    }
    ep::build_send_lists(c, *h);
    if (c.algo == EpAlgo::ag) {
      h->ag_rows = cfg().ag_rows == AgRows::max ? max_t : cfg().num_max_tokens_per_rank;
    } else {
      std::vector<int64_t> counts(static_cast<size_t>(c.world));
      for (int r = 0; r < c.world; ++r)
        counts[size_t(r)] = h->send_offsets[size_t(r) + 1] - h->send_offsets[size_t(r)];
      // x was built in the group's expose staging place (dispatch_input): exposing it copies
      // nothing.
      const bool x_in_place =
          err.empty() && c.group.peer_memory() == PeerMemory::window &&
          (in.x.nbytes() == 0 || in.x.raw() == c.group.expose_staging(in.x.nbytes()));
      h->plan = ep::a2a::make_plan(c.group, counts, err.empty(), x_in_place);
      stop_if_invalid(err, h->plan.first_invalid_rank, "dispatch");
    }
    h->path = path_of(*h, false);
    c.stats.collectives += 1;  // the agreement all_reduce (ag) or the plan all_gather (a2a)
    DispatchOutput out = exchange_and_unpack(
        *h, h->path, source(in.x, in.scales, h->topk_weights, h->topk_idx), h.get());
    out.handle.data = std::move(h);
    return out;
  }

  // Both dispatches after the routing is known (h): move the rows by the path's lowering, then
  // unpack. h_fill: the uncached dispatch records the receive side there.
  DispatchOutput exchange_and_unpack(const HandleData& h, const ep::Path& path,
                                     const ep::PackSource& src, HandleData* h_fill) {
    std::vector<RowRef> rows;
    switch (path.dispatch) {
      case ep::DispatchPath::ag:
        ep::ag::dispatch(c, ag_dispatch, h, src, h_fill == nullptr, rows);
        return unpack(rows, h_fill, h);
      case ep::DispatchPath::push: {
        Tensor x_out = ep::a2a::dispatch_push(c, push, h, src, rows);
        return unpack(rows, h_fill, h, std::move(x_out));
      }
      case ep::DispatchPath::pull: {
        ep::a2a::dispatch_pull(c, pull, h, src, rows);
        DispatchOutput out = unpack(rows, h_fill, h);
        c.group.barrier();  // the sources' buffers stay put until every rank has read its rows
        return out;
      }
      case ep::DispatchPath::exchange:
      case ep::DispatchPath::exchange_rows:
        break;
    }
    Tensor x_out = ep::a2a::dispatch_exchange(c, exchange_dispatch, h, path, src, rows);
    return unpack(rows, h_fill, h, std::move(x_out));
  }

  void check_handle(const Handle& handle, const char* op) const {
    if (!handle.valid())
      DI_FAIL("ep {} on rank {}/{}: the handle is empty; pass the handle of a dispatch", op, c.rank,
              c.world);
    const HandleData& h = *handle.data;
    // Another buffer's handle holds its own E, K and sizes: reading them here would run past
    // this buffer's arrays.
    if (h.owner != this)
      DI_FAIL(
          "ep {} on rank {}/{}: the handle comes from another EPBuffer (rank {}/{} algo {}); "
          "pass the handle of this buffer's dispatch",
          op, c.rank, c.world, h.rank, h.world, to_string(h.algo));
  }

  DispatchOutput dispatch_cached(const Tensor& x, const Tensor& scales, const Handle& handle) {
    c.stats = {};
    check_handle(handle, "cached dispatch");
    places.check_free(c, X::y, "cached dispatch");
    const HandleData& h = *handle.data;
    const std::string err = ep::check_x(x, scales, h.num_tokens, cfg());
    if (!err.empty()) DI_FAIL("ep cached dispatch on rank {}/{}: {}", c.rank, c.world, err);
    DispatchOutput out = exchange_and_unpack(
        h, path_of(h, true), source(x, scales, h.topk_weights, h.topk_idx), nullptr);
    out.handle = handle;
    return out;
  }

  Tensor dispatch_input(int64_t num_tokens) {
    if (num_tokens < 0 || num_tokens > cfg().num_max_tokens_per_rank)
      DI_FAIL(
          "ep dispatch_input on rank {}/{}: {} tokens, the buffer takes 0..{} "
          "(num_max_tokens_per_rank)",
          c.rank, c.world, num_tokens, cfg().num_max_tokens_per_rank);
    places.check_free(c, X::x, "dispatch_input");
    places.check_free(c, X::y, "dispatch_input");
    const DType dt = c.x_dtype();
    // Room for every region the pull exposes (the send list at most T·W ids), so that expose
    // never grows the window under x, which the caller may still read after dispatch.
    const size_t t = size_t(num_tokens), k = size_t(cfg().num_topk);
    const size_t room = t * c.sizes.ag_record.x_bytes + t * c.sizes.ag_record.scale_bytes +
                        t * k * 12 + t * size_t(c.world) * 8 + 5 * 64;
    std::byte* at = nullptr;
    if (c.algo == EpAlgo::a2a && c.group.peer_memory() == PeerMemory::window && t != 0)
      at = c.group.expose_staging(room);
    return places.hand_out(c, X::x, at, dt, num_tokens);
  }

  Tensor combine_input(const Handle& handle) {
    check_handle(handle, "combine_input");
    places.check_free(c, X::x, "combine_input");
    places.check_free(c, X::y, "combine_input");
    const HandleData& h = *handle.data;
    const int64_t rows = cfg().expand ? h.num_expanded : h.num_recv;
    // Combine exposes y as its first region (then the expand slots): built in the staging place,
    // with room for both, it is not copied and the window does not grow under it.
    const size_t room = size_t(rows) * size_t(cfg().hidden) * 2 +
                        (cfg().expand ? h.expand_slot.size() * 8 : 0) + 2 * 64;
    std::byte* at =
        h.path.combine == ep::CombinePath::direct ? c.group.expose_staging(room) : nullptr;
    return places.hand_out(c, X::y, at, DType::bf16, rows);
  }

  CombineOutput combine(const Tensor& y, const Handle& handle) {
    c.stats = {};
    check_handle(handle, "combine");
    places.check_free(c, X::x, "combine");
    const HandleData& h = *handle.data;
    const int64_t rows = cfg().expand ? h.num_expanded : h.num_recv;
    if (!((y.defined() || (y.ndim() == 2 && y.numel() == 0)) && y.dtype() == DType::bf16 &&
          y.ndim() == 2 && y.dim(0) == rows && y.dim(1) == cfg().hidden && y.is_contiguous()))
      DI_FAIL("ep combine on rank {}/{}: y must be a contiguous bf16 [{}={}, H={}] tensor, got {}",
              c.rank, c.world, cfg().expand ? "S" : "N", rows, cfg().hidden,
              y.defined() ? y.describe() : "undefined");
    CombineOutput out;
    out.x = Tensor::empty(DType::bf16, {h.num_tokens, cfg().hidden});              // [T, H]
    out.topk_weights = Tensor::zeros(DType::f32, {h.num_tokens, cfg().num_topk});  // [T, K]
    const uint16_t* yp = y.data<uint16_t>();
    switch (h.path.combine) {
      case ep::CombinePath::ag:
        ep::ag::combine(c, ag_combine, h, yp, out);
        break;
      case ep::CombinePath::exchange:
        ep::a2a::combine_exchange(c, exchange_combine, h, yp, out);
        break;
      case ep::CombinePath::direct:
        ep::a2a::combine_direct(c, direct_combine, h, yp, out);
        break;
    }
    return out;
  }
};

EPBuffer::EPBuffer(Group& group, const EPConfig& config)
    : impl_(std::make_unique<Impl>(group, config)) {
  ep::Context& s = impl_->c;
  s.world = group.size();
  s.rank = group.rank();
  std::string err;
  try {
    config.validate(s.world);
  } catch (const Error& e) {
    err = e.what();
  }
  if (err.empty()) {
    s.local_experts = config.num_experts / s.world;
    s.owner.resize(size_t(config.num_experts));
    for (int64_t e = 0; e < config.num_experts; ++e)
      s.owner[size_t(e)] = int32_t(e / s.local_experts);
    s.algo = resolve_ep_algo(config.algo, group.capabilities());
    s.sizes = ep::ep_size_hint(config, s.world);
  }
  ep::agree_on_config(group, config, s.algo, err);
  if (s.rank == 0)
    log_debug("ep: EPBuffer W={} {} -> algorithm {} on {}", s.world, config.describe(),
              to_string(s.algo), group.backend());
  if (config.algo == EpAlgo::automatic)
    s.log_once(fmt::format("auto -> {} (W={}, all_to_all_v {})", to_string(s.algo), s.world,
                           group.capabilities().all_to_all_v ? "trusted" : "not trusted"));
}

EPBuffer::~EPBuffer() = default;

DispatchOutput EPBuffer::dispatch(const DispatchInput& in) { return impl_->dispatch(in); }
DispatchOutput EPBuffer::dispatch(const Tensor& x, const Tensor& scales, const Handle& handle) {
  return impl_->dispatch_cached(x, scales, handle);
}
CombineOutput EPBuffer::combine(const Tensor& y, const Handle& handle) {
  return impl_->combine(y, handle);
}
Tensor EPBuffer::combine_input(const Handle& handle) { return impl_->combine_input(handle); }
Tensor EPBuffer::dispatch_input(int64_t num_tokens) { return impl_->dispatch_input(num_tokens); }
const EPConfig& EPBuffer::config() const { return impl_->c.cfg; }
int EPBuffer::world_size() const { return impl_->c.world; }
EpAlgo EPBuffer::algorithm() const { return impl_->c.algo; }
const EpCallStats& EPBuffer::last_stats() const { return impl_->c.stats; }

}  // namespace deepinfer
