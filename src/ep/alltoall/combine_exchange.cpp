#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "core/check.h"
#include "ep/alltoall/lowerings.h"
#include "ep/combine_rows.h"

namespace deepinfer::ep::a2a {
namespace {

using rows::canon;

// exact: one record per (received row, local slot): [w f32 | pad | y bf16 H]; the owner forms
// the product, the same fp32 value the expert rank would have sent, and sums its token's slots.
struct Exact {
  static size_t record_bytes(const EPConfig& cfg) {
    return align_up(8 + size_t(cfg.hidden) * 2, kRecordAlign);
  }
  static void counts(const Context& c, const HandleData& h, std::vector<int64_t>& sc,
                     std::vector<int64_t>& rc) {
    const int k = c.cfg.num_topk;
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    for (int64_t i = 0; i < h.num_recv; ++i)
      for (int j = 0; j < k; ++j)
        sc[size_t(h.recv_src_rank[size_t(i)])] += h.recv_local_idx[size_t(i * k + j)] >= 0;
    for (int r = 0; r < c.world; ++r)
      for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q) {
        const int64_t t = h.send_tokens[size_t(q)];
        for (int j = 0; j < k; ++j) rc[size_t(r)] += c.on_rank(own_idx[t * k + j], r);
      }
  }
  static std::byte* pack(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                         size_t rec, std::byte* sp) {
    const int k = cfg.num_topk, hd = cfg.hidden;
    for (int j = 0; j < k; ++j) {
      if (h.recv_local_idx[size_t(i * k + j)] < 0) continue;
      const float w = canon(h.recv_weights[size_t(i * k + j)]);
      std::memcpy(sp, &w, 4);
      std::memset(sp + 4, 0, 4);
      std::memcpy(sp + 8, y_row(cfg, h, y, i, j), size_t(hd) * 2);
      if (rec > 8 + size_t(hd) * 2)
        std::memset(sp + 8 + size_t(hd) * 2, 0, rec - 8 - size_t(hd) * 2);
      sp += rec;
    }
    return sp;
  }
  static void sum(const Context& c, ExchangeCombineScratch& s, const HandleData& h,
                  const std::byte* rp, size_t rec, CombineOutput& out) {
    const int k = c.cfg.num_topk, hd = c.cfg.hidden;
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    uint16_t* ox = out.x.data<uint16_t>();
    float* ow = out.topk_weights.data<float>();
    s.slot_ptr.assign(size_t(h.num_tokens) * size_t(k), nullptr);
    for (int r = 0; r < c.world; ++r)
      for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1]; ++q) {
        const int64_t t = h.send_tokens[size_t(q)];
        for (int j = 0; j < k; ++j)
          if (c.on_rank(own_idx[t * k + j], r)) {
            s.slot_ptr[size_t(t * k + j)] = rp;
            rp += rec;
          }
      }
    std::array<float, 64> w;
    std::array<const uint16_t*, 64> ys;
    for (int64_t t = 0; t < h.num_tokens; ++t) {
      int m = 0;
      for (int j = 0; j < k; ++j) {
        const std::byte* r = s.slot_ptr[size_t(t * k + j)];
        if (!r) continue;
        std::memcpy(&w[size_t(m)], r, 4);
        ys[size_t(m++)] = reinterpret_cast<const uint16_t*>(r + 8);
        ow[t * k + j] = w[size_t(m - 1)];
      }
      // Σ canon(w·y) from +0: canon of an addend changes nothing (x + -0 == x, and a
      // round-to-nearest sum is -0 only when both addends are), so the plain sum is exact.
      rows::weighted_sum(w.data(), ys.data(), m, size_t(hd), false, ox + t * hd, nullptr);
    }
  }
};

// fast: one record per received row: [K weights f32 | partial bf16 H] (the dispatch's counts
// reversed); the owner adds its token's partials in ascending rank order.
struct Fast {
  static size_t record_bytes(const EPConfig& cfg) {
    return align_up(size_t(cfg.num_topk) * 4 + size_t(cfg.hidden) * 2, kRecordAlign);
  }
  static void counts(const Context& c, const HandleData& h, std::vector<int64_t>& sc,
                     std::vector<int64_t>& rc) {
    for (int r = 0; r < c.world; ++r) {
      sc[size_t(r)] = h.plan.send(r, c.rank);
      rc[size_t(r)] = h.plan.send(c.rank, r);
    }
  }
  static std::byte* pack(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                         size_t rec, std::byte* sp) {
    const int k = cfg.num_topk, hd = cfg.hidden;
    for (int j = 0; j < k; ++j) {
      const float w = h.recv_local_idx[size_t(i * k + j)] >= 0
                          ? canon(h.recv_weights[size_t(i * k + j)])
                          : 0.0f;
      std::memcpy(sp + size_t(j) * 4, &w, 4);
    }
    local_partial(cfg, h, y, i, reinterpret_cast<uint16_t*>(sp + size_t(k) * 4), nullptr);
    const size_t used = size_t(k) * 4 + size_t(hd) * 2;
    if (rec > used) std::memset(sp + used, 0, rec - used);
    return sp + rec;
  }
  static void sum(const Context& c, ExchangeCombineScratch& s, const HandleData& h,
                  const std::byte* rp, size_t rec, CombineOutput& out) {
    const int k = c.cfg.num_topk, hd = c.cfg.hidden;
    const int64_t* own_idx = h.topk_idx.data<int64_t>();
    uint16_t* ox = out.x.data<uint16_t>();
    float* ow = out.topk_weights.data<float>();
    // Rank r's records come before rank r+1's, so listing them per token while walking the ranks
    // in order keeps ascending rank order.
    const size_t per = size_t(std::min(c.world, k));  // a token's partials: one per rank it went to
    s.part_ptr.assign(size_t(h.num_tokens) * per, nullptr);
    s.part_count.assign(size_t(h.num_tokens), 0);
    for (int r = 0; r < c.world; ++r)
      for (int64_t q = h.send_offsets[size_t(r)]; q < h.send_offsets[size_t(r) + 1];
           ++q, rp += rec) {
        const int64_t t = h.send_tokens[size_t(q)];
        s.part_ptr[size_t(t) * per + size_t(s.part_count[size_t(t)]++)] =
            reinterpret_cast<const uint16_t*>(rp + size_t(k) * 4);
        for (int j = 0; j < k; ++j)
          if (c.on_rank(own_idx[t * k + j], r)) std::memcpy(&ow[t * k + j], rp + size_t(j) * 4, 4);
      }
    for (int64_t t = 0; t < h.num_tokens; ++t)
      rows::weighted_sum(nullptr, s.part_ptr.data() + size_t(t) * per, s.part_count[size_t(t)],
                         size_t(hd), false, ox + t * hd, nullptr);
  }
};

template <class Mode>
void combine_as(Context& c, ExchangeCombineScratch& s, const HandleData& h, const uint16_t* y,
                CombineOutput& out) {
  const EPConfig& cfg = c.cfg;
  std::vector<int64_t> sc(size_t(c.world), 0), rc(size_t(c.world), 0);
  const size_t rec = Mode::record_bytes(cfg);
  Mode::counts(c, h, sc, rc);
  int64_t n_send = 0, n_recv = 0;
  for (int r = 0; r < c.world; ++r) n_send += sc[size_t(r)], n_recv += rc[size_t(r)];
  if (s.send.size() < size_t(n_send) * rec) s.send.resize(size_t(n_send) * rec);
  if (s.recv.size() < size_t(n_recv) * rec) s.recv.resize(size_t(n_recv) * rec);
  std::byte* sp = s.send.data();
  for (int64_t i = 0; i < h.num_recv; ++i)
    sp = Mode::pack(cfg, h, y, i, rec, sp);  // grouped by source rank
  const Path& path = h.path;
  c.log_once(fmt::format("a2a combine ({}) lowering = {}", to_string(cfg.combine),
                         to_string(path.combine_lowering)));
  exchange(c.group, path.combine_lowering, path.combine_pad, sc, rc, s.send.data(), s.recv.data(),
           rec, s.padded, c.stats);
  Mode::sum(c, s, h, s.recv.data(), rec, out);
}

}  // namespace

void combine_exchange(Context& c, ExchangeCombineScratch& s, const HandleData& h, const uint16_t* y,
                      CombineOutput& out) {
  if (c.cfg.combine == CombineMode::exact)
    combine_as<Exact>(c, s, h, y, out);
  else
    combine_as<Fast>(c, s, h, y, out);
}

}  // namespace deepinfer::ep::a2a
