// BucketBuffer::all_gather's data movement (docs/ep.md §13.2): one all_gather of bytes. One
// tensor is gathered in place (its rank-major layout is the collective's); several are packed,
// this rank's shards side by side in its block of the staging, gathered, and copied out.
#include <cstring>

#include "ep/bucket/lowerings.h"

namespace deepinfer::ep::bucket {

void gather_shards(Group& g, std::span<std::byte* const> tensors, std::span<const size_t> shard,
                   Scratch& sc) {
  const size_t w = size_t(g.size()), rank = size_t(g.rank());
  if (tensors.size() == 1) {
    g.all_gather(tensors[0] + rank * shard[0], tensors[0], shard[0], DType::u8);
    return;
  }
  size_t block = 0;  // this rank's shards side by side
  for (size_t s : shard) block += s;
  sc.recv.resize(w * block);
  std::byte* mine = sc.recv.data() + rank * block;
  for (size_t i = 0, off = 0; i < tensors.size(); off += shard[i], ++i)
    if (shard[i]) std::memcpy(mine + off, tensors[i] + rank * shard[i], shard[i]);
  g.all_gather(mine, sc.recv.data(), block, DType::u8);  // in place: block `rank` is the send
  for (size_t r = 0; r < w; ++r) {
    if (r == rank) continue;
    for (size_t i = 0, off = 0; i < tensors.size(); off += shard[i], ++i)
      if (shard[i])
        std::memcpy(tensors[i] + r * shard[i], sc.recv.data() + r * block + off, shard[i]);
  }
}

}  // namespace deepinfer::ep::bucket
