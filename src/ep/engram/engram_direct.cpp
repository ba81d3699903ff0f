// direct: each slot's row is read from its owner's shard where the group exposes it (peer
// memory): no ids or rows move through collectives.
#include <cstring>

#include "ep/engram/lowerings.h"

namespace deepinfer::ep::engram {

void fetch_direct(Context& c, const Request& r) {
  const size_t regions = c.sf_bytes ? 2 : 1;
  for (size_t p = 0; p < r.idx.size(); ++p) {
    const int32_t g = r.idx[p];
    if (g < 0) continue;
    const size_t o = size_t(g / c.n), row = size_t(g % c.n);
    std::memcpy(r.data_out + p * c.data_bytes, c.peers[o * regions] + row * c.data_bytes,
                c.data_bytes);
    if (c.sf_bytes)
      std::memcpy(r.sf_out + p * c.sf_bytes, c.peers[o * regions + 1] + row * c.sf_bytes,
                  c.sf_bytes);
  }
}

}  // namespace deepinfer::ep::engram
