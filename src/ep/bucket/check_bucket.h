// The `deepinfer check bucket` matrix as a library part (the CLI and ctest both run it):
// BucketBuffer::all_gather of random lists (mixed sizes and dtypes, empty shards, one >= 1 MiB)
// bit-exact against a plain Group::all_gather per tensor and against the generated closed form;
// reduce_scatter (every lowering the group offers × fp32 and bf16 transport × scales) bit-exact
// against a host reduce_scatter written here, in the same order, that sees every rank's inputs
// (they are generated from (seed, rank, tensor, element)); the same seed gives the same bytes; and
// the errors every rank must raise together (differing count, dtype, size, scale or seed on one
// rank, unregistered storage, a size not divisible by W, overlapping tensors, a non-f32 sum).
#pragma once

#include <deepinfer/comm.h>

#include <cstdint>

namespace deepinfer::ep::bucket {

struct CheckBucketOptions {
  uint64_t seed = 1;
  bool verbose = false;  // one line per case (rank 0)
};

struct CheckBucketResult {
  int passed = 0;
  int failed = 0;
};

// Collective: run on every rank of `group`. Every rank returns the same (agreed) result; rank 0
// logs the failures it sees.
CheckBucketResult run_check_bucket(Group& group, const CheckBucketOptions& opts);

}  // namespace deepinfer::ep::bucket
