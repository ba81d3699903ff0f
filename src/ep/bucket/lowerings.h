// BucketBuffer's data movement (docs/ep.md §13): free functions over a Group and the buffer's
// scratch, called by the facade (bucket_buffer.cpp) once every rank has agreed on the call.
#pragma once

#include <deepinfer/bucket.h>
#include <deepinfer/comm.h>

#include <cstddef>
#include <span>
#include <vector>

namespace deepinfer::ep::bucket {

// Staging the lowerings reuse across calls (grown on demand, never shrunk).
struct Scratch {
  std::vector<std::byte> send, recv;
};

// Which reduce_scatter lowering runs: a pure function of the agreed algorithm and the group's
// capabilities (the same on every rank). Throws Error for a2a where all_to_all is not trusted.
BucketAlgo choose_path(BucketAlgo requested, const Capabilities& caps);

// tensors[i] holds W · shard[i] bytes, rank-major; this rank's shard is filled. One all_gather.
void gather_shards(Group& g, std::span<std::byte* const> tensors, std::span<const size_t> shard,
                   Scratch& sc);

// tensors[i] holds W · shard[i] floats; this rank's shard of each becomes the scaled sum in the
// order of docs/ep.md §13.1. One all_to_all (a2a) or one all_gather (ag).
void reduce_scatter_shards(Group& g, BucketAlgo path, std::span<float* const> tensors,
                           std::span<const size_t> shard, const ReduceScatterOptions& opts,
                           Scratch& sc);

}  // namespace deepinfer::ep::bucket
