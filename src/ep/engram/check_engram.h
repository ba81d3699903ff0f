// The `deepinfer check engram` matrix as a library part (the CLI and ctest both run it): every
// lowering the group supports × bf16/fp8 (+ scale factors) × index patterns (duplicates, -1,
// every index on one owner, T = 0 on some ranks, J up to 32, n prime), bit-exact against a host
// reference that sees every shard (the tables are generated from (seed, global row)), plus the
// agreed errors: a bad index on one rank, differing n.
#pragma once

#include <deepinfer/comm.h>

#include <cstdint>

namespace deepinfer::ep::engram {

struct CheckEngramOptions {
  uint64_t seed = 1;
  bool verbose = false;  // one line per case (rank 0)
};

struct CheckEngramResult {
  int passed = 0;
  int failed = 0;
};

// Collective: run on every rank of `group`. Every rank returns the same (agreed) result; rank 0
// logs the failures it sees.
CheckEngramResult run_check_engram(Group& group, const CheckEngramOptions& opts);

}  // namespace deepinfer::ep::engram
