#include <array>
#include <span>

#include "core/stream_copy.h"
#include "ep/alltoall/lowerings.h"

namespace deepinfer::ep::a2a {

// Every rank exposes, writable, where its received rows go (x straight into its output, the rest
// as meta records) and each source writes its own rows there, at their place in (source rank,
// source token) order. A source reads each x row once, in order, for all its destinations, where
// under the pull every destination reads it again from scattered places; x goes by streaming
// stores, so no destination line is read in first or pulled back from this core's cache by its
// reader. The closing barrier comes before the unpack, which finds the rows in place and reads
// only this rank's memory. Faster than the pull once the moved rows exceed a cache (path.h).
Tensor dispatch_push(Context& c, PushScratch& s, const HandleData& h, const PackSource& src,
                     std::vector<RowRef>& rows) {
  const RecordLayout& rl = c.sizes.a2a_meta;
  const int k = c.cfg.num_topk, p = c.cfg.scale_cols();
  const int world = c.world, rank = c.rank;
  const size_t x_bytes = rl.x_bytes;
  const int64_t n_recv = a2a_recv_rows(c, h);
  Tensor x_out = Tensor::empty(c.x_dtype(), {n_recv, c.cfg.hidden});
  auto* x_dst = static_cast<std::byte*>(x_out.raw());
  if (s.meta.size() < size_t(n_recv) * rl.bytes) s.meta.resize(size_t(n_recv) * rl.bytes);
  const std::array<std::span<std::byte>, 2> regions{
      std::span<std::byte>(x_dst, size_t(n_recv) * x_bytes),
      std::span<std::byte>(s.meta.data(), size_t(n_recv) * rl.bytes)};
  c.group.expose_writable(regions, s.exposed);
  c.log_once("a2a dispatch lowering = direct-push (peer memory, the sources write)");
  // Per destination: the next of its send list, and where that row goes in its outputs.
  std::vector<int64_t> next(h.send_offsets.begin(), h.send_offsets.end() - 1),
      at(static_cast<size_t>(world));
  for (int d = 0; d < world; ++d) at[size_t(d)] = h.plan.recv_offset(rank, d);
  uint64_t sent = 0;
  for (int64_t t = 0; t < h.num_tokens; ++t)
    for (int i = 0; i < world; ++i) {
      const int d = (rank + i) % world;  // staggered, as the other lowerings read their peers
      const size_t di = size_t(d);
      if (next[di] == h.send_offsets[di + 1] || h.send_tokens[size_t(next[di])] != t) continue;
      ++next[di];
      const size_t row = size_t(at[di]++);
      std::byte* peer_x = s.exposed[di * 2];
      std::byte* peer_meta = s.exposed[di * 2 + 1];
      copy_streaming(peer_x + row * x_bytes, src.x + size_t(t) * x_bytes, x_bytes);
      pack_record(rl, src, p, k, t, peer_meta + row * rl.bytes, true);
      sent += x_bytes + rl.bytes;
    }
  streaming_fence();
  c.group.barrier();  // every row has landed; no peer writes here, or reads this rank's x, after it
  list_received(c, h, rl, s.meta.data(), x_dst, rows);
  c.stats.collectives += 2;  // the expose and the closing barrier
  c.stats.lowering = "direct-push";
  c.stats.bytes_sent += sent;
  c.stats.bytes_recv += uint64_t(n_recv) * (x_bytes + rl.bytes);
  return x_out;
}

}  // namespace deepinfer::ep::a2a
