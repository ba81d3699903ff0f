#include "ep/records.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "core/log.h"

namespace deepinfer::ep {

void Context::log_once(const std::string& what) const {
  static std::mutex mu;
  static std::set<std::string> logged;
  if (rank != 0) return;
  std::lock_guard<std::mutex> lock(mu);
  if (logged.insert(what + " on " + group.backend()).second)
    log_debug("ep: {} on {}", what, group.backend());
}

void list_received(const Context& c, const HandleData& h, const RecordLayout& rl,
                   const std::byte* recv, const std::byte* x_apart, std::vector<RowRef>& rows) {
  rows.clear();
  size_t pos = 0;
  for (int r = 0; r < c.world; ++r)
    for (int64_t i = 0; i < h.plan.send(r, c.rank); ++i, ++pos) {
      const std::byte* rec = recv + pos * rl.bytes;
      int64_t t;
      std::memcpy(&t, rec + rl.off_token, 8);
      rows.push_back(
          record_row(rl, int32_t(r), int32_t(t), x_apart ? x_apart + pos * rl.x_bytes : rec, rec));
    }
}

// last[r]: the last token counted for (or placed at) rank r, so a token reaches each rank once.
void build_send_lists(const Context& c, HandleData& h) {
  const int k = c.cfg.num_topk, world = c.world;
  const int64_t* idx = h.num_tokens ? h.topk_idx.data<int64_t>() : nullptr;
  std::vector<int64_t> last(static_cast<size_t>(world));
  auto for_each_destination = [&](auto&& fn) {
    std::fill(last.begin(), last.end(), -1);
    for (int64_t t = 0; t < h.num_tokens; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t e = idx[t * k + j];
        if (e < 0) continue;
        const size_t r = size_t(c.owner[size_t(e)]);
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

int64_t a2a_recv_rows(const Context& c, const HandleData& h) {
  int64_t n = 0;
  for (int r = 0; r < c.world; ++r) n += h.plan.send(r, c.rank);
  return n;
}

}  // namespace deepinfer::ep
