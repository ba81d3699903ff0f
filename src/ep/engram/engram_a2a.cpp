// a2a: each rank sends its distinct ids to their owners (all_to_all_v), the owners answer with
// the rows in the same order (all_to_all_v); the counts come from the agreement's matrix.
#include "ep/engram/lowerings.h"

namespace deepinfer::ep::engram {

void fetch_a2a(Context& c, const Request& r) {
  const std::span<const int32_t> ids = r.ids;
  const size_t w = size_t(c.world), entry = c.entry_bytes();
  std::vector<size_t> send(w), recv(w), send_b(w), recv_b(w);
  size_t recv_total = 0;
  for (size_t o = 0; o < w; ++o) {
    send[o] = size_t(r.owner_cnt[size_t(c.rank) * w + o]);
    recv[o] = size_t(r.owner_cnt[o * w + size_t(c.rank)]);
    send_b[o] = send[o] * entry;
    recv_b[o] = recv[o] * entry;
    recv_total += recv[o];
  }
  std::vector<int32_t>& asked = c.ids;
  asked.resize(recv_total);
  c.group.all_to_all_v(ids.data(), send, asked.data(), recv, DType::i32);
  std::vector<std::byte>&answer = c.send, &rows = c.recv;
  if (answer.size() < recv_total * entry) answer.resize(recv_total * entry);
  if (rows.size() < ids.size() * entry) rows.resize(ids.size() * entry);
  for (size_t i = 0; i < recv_total; ++i)
    c.pack_entry(asked[i] - int64_t(c.rank) * c.n, &answer[i * entry]);
  c.group.all_to_all_v(answer.data(), recv_b, rows.data(), send_b, DType::u8);
  place_from(c, r, ids, rows.data());
}

}  // namespace deepinfer::ep::engram
