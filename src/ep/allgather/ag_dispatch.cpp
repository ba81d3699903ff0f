#include <cstring>

#include "ep/allgather/ag.h"

namespace deepinfer::ep::ag {
namespace {

// Collective: send [R, rec] -> recv [W·R, rec] in rank order; send may be this rank's block of
// recv.
void gather(Group& group, const std::byte* send, int64_t rows, size_t rec_bytes, std::byte* recv,
            EpCallStats& stats) {
  const size_t block = size_t(rows) * rec_bytes;
  group.all_gather(send, recv, block, DType::u8);
  stats.bytes_sent += block;
  stats.bytes_recv += block * size_t(group.size());
  stats.collectives += 1;
  stats.lowering = "ag";
}

// Local: indices src·R + t of gathered records with an expert in [lo, hi), in (src, t) order.
void select(const std::byte* gathered, int world, int64_t rows, const RecordLayout& rec, int k,
            int64_t lo, int64_t hi, std::vector<int64_t>& out) {
  out.clear();
  const int64_t total = int64_t(world) * rows;
  for (int64_t i = 0; i < total; ++i) {
    const std::byte* idx = gathered + size_t(i) * rec.bytes + rec.off_idx;
    for (int j = 0; j < k; ++j) {
      int64_t e;
      std::memcpy(&e, idx + size_t(j) * 8, 8);
      if (e >= lo && e < hi) {
        out.push_back(i);
        break;
      }
    }
  }
}

}  // namespace

void dispatch(Context& c, DispatchScratch& s, const HandleData& h, const PackSource& src,
              bool cached, std::vector<RowRef>& rows) {
  const RecordLayout& rl = c.sizes.ag_record;
  const int64_t r_rows = h.ag_rows;
  const int k = c.cfg.num_topk, p = c.cfg.scale_cols();
  std::vector<std::byte>& recv_buf = s.gathered;
  if (recv_buf.size() < size_t(c.world) * size_t(r_rows) * rl.bytes)
    recv_buf.resize(size_t(c.world) * size_t(r_rows) * rl.bytes);
  std::byte* own = recv_buf.data() + size_t(c.rank) * size_t(r_rows) * rl.bytes;
  for (int64_t t = 0; t < r_rows; ++t) {
    std::byte* dst = own + size_t(t) * rl.bytes;
    if (t < h.num_tokens)
      pack_record(rl, src, p, k, t, dst, false);
    else
      pack_padding(rl, k, dst);
  }
  gather(c.group, own, r_rows, rl.bytes, recv_buf.data(), c.stats);
  rows.clear();
  if (cached) {
    for (size_t i = 0; i < h.recv_src_rank.size(); ++i) {
      const int64_t g = int64_t(h.recv_src_rank[i]) * r_rows + h.recv_src_token[i];
      const std::byte* rec = recv_buf.data() + size_t(g) * rl.bytes;
      rows.push_back(record_row(rl, h.recv_src_rank[i], h.recv_src_token[i], rec, rec));
    }
    return;
  }
  const int64_t lo = int64_t(c.rank) * c.local_experts;
  select(recv_buf.data(), c.world, r_rows, rl, k, lo, lo + c.local_experts, s.selected);
  for (int64_t g : s.selected) {
    const std::byte* rec = recv_buf.data() + size_t(g) * rl.bytes;
    rows.push_back(record_row(rl, int32_t(g / r_rows), int32_t(g % r_rows), rec, rec));
  }
}

}  // namespace deepinfer::ep::ag
