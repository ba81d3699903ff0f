// ag: no all_to_all. Every rank's indices travel by all_gather_v; the sorted distinct ids of all
// of them are owner-major, so each owner contributes the rows of its segment and one all_gather_v
// (in rank order) gives every rank every requested row once, byte-exact.
#include <algorithm>

#include "ep/engram/lowerings.h"

namespace deepinfer::ep::engram {

void fetch_ag(Context& c, const Request& r) {
  int64_t total = 0;
  for (int64_t k : r.counts) total += k;
  std::vector<int32_t>& all = c.ids;
  all.resize(size_t(total));
  std::vector<size_t> idx_counts(r.counts.begin(), r.counts.end());
  c.group.all_gather_v(r.idx.data(), r.idx.size(), all.data(), idx_counts, DType::i32);

  const std::vector<int32_t> ids = distinct_ids(all);
  std::vector<size_t> seg_bytes(size_t(c.world));
  auto seg = [&](int o) {
    auto lo = std::lower_bound(ids.begin(), ids.end(), int64_t(o) * c.n);
    auto hi = std::lower_bound(ids.begin(), ids.end(), int64_t(o + 1) * c.n);
    return std::pair{size_t(lo - ids.begin()), size_t(hi - ids.begin())};
  };
  const size_t entry = c.entry_bytes();
  for (int o = 0; o < c.world; ++o) {
    auto [lo, hi] = seg(o);
    seg_bytes[size_t(o)] = (hi - lo) * entry;
  }
  auto [lo, hi] = seg(c.rank);
  std::vector<std::byte>&mine = c.send, &rows = c.recv;
  if (mine.size() < (hi - lo) * entry) mine.resize((hi - lo) * entry);
  if (rows.size() < ids.size() * entry) rows.resize(ids.size() * entry);
  for (size_t i = lo; i < hi; ++i)
    c.pack_entry(ids[i] - int64_t(c.rank) * c.n, &mine[(i - lo) * entry]);
  c.group.all_gather_v(mine.data(), (hi - lo) * entry, rows.data(), seg_bytes, DType::u8);
  place_from(c, r, ids, rows.data());
}

}  // namespace deepinfer::ep::engram
