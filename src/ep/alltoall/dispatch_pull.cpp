#include <array>
#include <cstring>
#include <span>

#include "ep/alltoall/lowerings.h"

namespace deepinfer::ep::a2a {

// Nothing is packed or exchanged: the exposed arrays are read where they are (one address space)
// or where every rank built x in the window (mpi; the rest is copied in by the expose).
void dispatch_pull(Context& c, PullScratch& s, const HandleData& h, const PackSource& src,
                   std::vector<RowRef>& rows) {
  const size_t k = size_t(c.cfg.num_topk), t_count = size_t(h.num_tokens);
  const size_t x_bytes = c.sizes.ag_record.x_bytes, scale_bytes = c.sizes.ag_record.scale_bytes;
  const std::array<std::span<const std::byte>, 5> regions{
      std::span(src.x, t_count * x_bytes),
      std::as_bytes(std::span(src.scales, src.scales ? t_count * scale_bytes / 4 : 0)),
      std::as_bytes(std::span(src.weights, t_count * k)),
      std::as_bytes(std::span(src.idx, t_count * k)),
      std::as_bytes(std::span(h.send_tokens)),
  };
  c.group.expose(regions, s.exposed);
  c.log_once("a2a dispatch lowering = direct (peer memory)");
  rows.clear();
  uint64_t bytes = 0;
  for (int r = 0; r < c.world; ++r) {
    const std::byte* const* at = s.exposed.data() + size_t(r) * regions.size();
    int64_t q = h.plan.send_offset(r, c.rank);
    for (const int64_t end = q + h.plan.send(r, c.rank); q < end; ++q) {
      int64_t t;
      std::memcpy(&t, at[4] + size_t(q) * 8, 8);
      const size_t tt = size_t(t);
      rows.push_back({int32_t(r), int32_t(t), at[0] + tt * x_bytes, at[1] + tt * scale_bytes,
                      at[2] + tt * k * 4, at[3] + tt * k * 8});
      bytes += x_bytes + scale_bytes + k * 12 + 8;
    }
  }
  c.stats.collectives += 2;  // the expose and the closing barrier
  c.stats.lowering = "direct";
  c.stats.bytes_recv += bytes;
}

}  // namespace deepinfer::ep::a2a
