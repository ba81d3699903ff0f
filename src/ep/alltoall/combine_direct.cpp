#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ep/alltoall/lowerings.h"
#include "ep/combine_rows.h"

namespace deepinfer::ep::a2a {
namespace {

using rows::canon;

// Per token, the addends (y row and weight) as the owner lists them while walking the ranks in
// ascending order, then the token's sum.
// exact: addend a = slot j, weight canon(w); the sum is Σ canon(w)·y in slot order.
struct Exact {
  static size_t addend(DirectCombineScratch&, int64_t t, int k, int j) { return size_t(t * k + j); }
  static float weight(float w) { return canon(w); }
  static void close_rank(DirectCombineScratch&, int64_t, int) {}
  static void sum(const DirectCombineScratch& s, int64_t t, int k, size_t hd, uint16_t* out) {
    const uint16_t* const* rows = s.part_ptr.data() + t * k;
    std::array<float, 64> w;
    std::array<const uint16_t*, 64> ys;
    int m = 0;  // masked slots and slots of a token that reached no expert drop out
    for (int j = 0; j < k; ++j)
      if (rows[j]) w[size_t(m)] = s.slot_w[size_t(t * k + j)], ys[size_t(m++)] = rows[j];
    rows::weighted_sum(w.data(), ys.data(), m, hd, false, out, nullptr);
  }
};
// fast: addends by rank ascending, then slot ascending; group_end[t·K + g] closes the token's
// g-th rank group (the partial that rank would have sent); the sum adds the partials in order.
struct Fast {
  static size_t addend(DirectCombineScratch& s, int64_t t, int k, int) {
    return size_t(t * k + s.part_count[size_t(t)]++);
  }
  static float weight(float w) { return w; }
  static void close_rank(DirectCombineScratch& s, int64_t t, int k) {
    s.group_end[size_t(t * k + s.group_count[size_t(t)]++)] = s.part_count[size_t(t)];
  }
  static void sum(const DirectCombineScratch& s, int64_t t, int k, size_t hd, uint16_t* out) {
    rows::sum_of_partials(s.slot_w.data() + t * k, s.part_ptr.data() + t * k,
                          s.group_end.data() + t * k, s.group_count[size_t(t)], hd, out);
  }
};

// Forms what the exchange would have sent and summed, in one pass that writes nothing but the
// output. Collectives: the expose (every rank's y is complete once it has exposed it; mpi copies
// it into the shared window) and a closing barrier (no rank returns, and frees its y, while a
// peer still reads it).
template <class Mode>
void combine_as(Context& c, DirectCombineScratch& s, const HandleData& h, const uint16_t* y,
                CombineOutput& out) {
  const EPConfig& cfg = c.cfg;
  const int k = cfg.num_topk;
  const size_t hd = size_t(cfg.hidden);
  const int64_t y_rows = cfg.expand ? h.num_expanded : h.num_recv;
  // Expand layout: the y row of (received row i, slot j) is expand_slot[i·K + j].
  const std::array<std::span<const std::byte>, 2> regions{
      std::as_bytes(std::span(y, size_t(y_rows) * hd)),
      std::as_bytes(std::span(cfg.expand ? h.expand_slot.data() : nullptr,
                              cfg.expand ? h.expand_slot.size() : 0))};
  c.group.expose(regions, s.exposed);
  c.log_once(
      fmt::format("a2a combine ({}) lowering = direct (peer memory)", to_string(cfg.combine)));
  auto peer_y = [&](int r) { return reinterpret_cast<const uint16_t*>(s.exposed[size_t(r) * 2]); };
  auto peer_slot = [&](int r) {
    return reinterpret_cast<const int64_t*>(s.exposed[size_t(r) * 2 + 1]);
  };

  const int64_t* own_idx = h.topk_idx.data<int64_t>();
  const float* own_w = h.topk_weights.data<float>();
  float* ow = out.topk_weights.data<float>();
  s.part_ptr.assign(size_t(h.num_tokens) * size_t(k), nullptr);
  s.slot_w.assign(size_t(h.num_tokens) * size_t(k), 0.0f);
  s.group_end.assign(size_t(h.num_tokens) * size_t(k), 0);
  s.part_count.assign(size_t(h.num_tokens), 0);  // addends so far
  s.group_count.assign(size_t(h.num_tokens), 0);
  uint64_t bytes_read = 0;
  for (int r = 0; r < c.world; ++r) {
    // Rank r received its rows in (source rank, source token) order: this rank's start there.
    int64_t row = h.plan.recv_offset(c.rank, r);
    for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q, ++row) {
      const int64_t t = h.send_tokens[size_t(q)];
      if (!cfg.expand) bytes_read += hd * 2;  // one y row per received row, else one per slot
      for (int j = 0; j < k; ++j) {
        const int64_t e = own_idx[t * k + j];
        if (!c.on_rank(e, r)) continue;
        if (cfg.expand) bytes_read += hd * 2;
        const int64_t y_row = cfg.expand ? peer_slot(r)[row * k + j] : row;
        const size_t a = Mode::addend(s, t, k, j);
        s.part_ptr[a] = peer_y(r) + size_t(y_row) * hd;
        s.slot_w[a] = Mode::weight(own_w[t * k + j]);
        ow[t * k + j] = canon(own_w[t * k + j]);
      }
      Mode::close_rank(s, t, k);
    }
  }
  uint16_t* ox = out.x.data<uint16_t>();
  auto sum_tokens = [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) Mode::sum(s, t, k, hd, ox + size_t(t) * hd);
  };
  // Tokens are independent: a rank with a pool of its own (several CPUs) splits them, in
  // pieces of at least 256K columns so a small call stays on this thread.
  if (ThreadPool* pool = scoped_pool())
    pool->parallel_for(h.num_tokens, std::max<int64_t>(1, (int64_t(1) << 18) / int64_t(hd)),
                       sum_tokens);
  else
    sum_tokens(0, h.num_tokens);
  c.group.barrier();
  c.stats.collectives += 2;
  c.stats.lowering = "direct";
  c.stats.bytes_recv += bytes_read;
}

}  // namespace

void combine_direct(Context& c, DirectCombineScratch& s, const HandleData& h, const uint16_t* y,
                    CombineOutput& out) {
  if (c.cfg.combine == CombineMode::exact)
    combine_as<Exact>(c, s, h, y, out);
  else
    combine_as<Fast>(c, s, h, y, out);
}

}  // namespace deepinfer::ep::a2a
