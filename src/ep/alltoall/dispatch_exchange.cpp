#include <fmt/format.h>

#include "core/check.h"
#include "ep/alltoall/lowerings.h"

namespace deepinfer::ep::a2a {

Tensor dispatch_exchange(Context& c, ExchangeDispatchScratch& s, const HandleData& h,
                         const Path& path, const PackSource& src, std::vector<RowRef>& rows) {
  const bool split = path.dispatch == DispatchPath::exchange_rows;
  // The output x, allocated before the exchange so the rows land in it directly.
  Tensor x_out;
  if (split && !c.cfg.expand)
    x_out = Tensor::empty(c.x_dtype(), {a2a_recv_rows(c, h), c.cfg.hidden});
  std::byte* x_dst = x_out.defined() ? static_cast<std::byte*>(x_out.raw()) : nullptr;
  const int k = c.cfg.num_topk, p = c.cfg.scale_cols();
  const int world = c.world, rank = c.rank;
  const size_t n_send = h.send_tokens.size();
  std::vector<int64_t> sc(static_cast<size_t>(world)), rc(static_cast<size_t>(world));
  int64_t n_recv = 0;
  for (int r = 0; r < world; ++r) {
    sc[size_t(r)] = h.plan.send(rank, r);
    rc[size_t(r)] = h.plan.send(r, rank);
    n_recv += rc[size_t(r)];
  }
  c.log_once(fmt::format("a2a dispatch lowering = {}", to_string(path.lowering)));
  const RecordLayout& rl = split ? c.sizes.a2a_meta : c.sizes.a2a_record;
  if (s.send.size() < n_send * rl.bytes) s.send.resize(n_send * rl.bytes);
  for (size_t i = 0; i < n_send; ++i)
    pack_record(rl, src, p, k, h.send_tokens[i], s.send.data() + i * rl.bytes, true);
  if (s.recv.size() < size_t(n_recv) * rl.bytes) s.recv.resize(size_t(n_recv) * rl.bytes);
  exchange(c.group, path.lowering, h.plan.max_split, sc, rc, s.send.data(), s.recv.data(), rl.bytes,
           s.padded, c.stats);
  const std::byte* x_recv = nullptr;
  if (split) {
    if (!x_dst) {
      if (s.x.size() < size_t(n_recv) * rl.x_bytes) s.x.resize(size_t(n_recv) * rl.x_bytes);
      x_dst = s.x.data();
    }
    std::vector<size_t> recv_rows(rc.begin(), rc.end());
    c.group.all_to_all_v_rows(src.x, rl.x_bytes, h.send_tokens, h.send_offsets, x_dst, recv_rows);
    c.stats.collectives += 1;
    c.stats.bytes_sent += n_send * rl.x_bytes;
    c.stats.bytes_recv += size_t(n_recv) * rl.x_bytes;
    x_recv = x_dst;
  }
  list_received(c, h, rl, s.recv.data(), x_recv, rows);
  return x_out;
}

}  // namespace deepinfer::ep::a2a
