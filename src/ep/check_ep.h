// The `deepinfer check ep` matrix as a library part (the CLI and ctest both run it): every
// algorithm × bf16/fp8 × expert_alignment {1, 128} × expand × combine mode × (ag) rows max/cap ×
// reduce rs/ar × a chunk size forcing several chunks, with cached dispatch checked in every case,
// on uneven routing, against the host reference (ep/reference.h). All checks are bit-exact except
// `fast` combine through a reduce_scatter that does not add in ascending rank order (within 1 bf16
// ulp, every differing element counted and reported).
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>

#include <cstdint>
#include <vector>

namespace deepinfer::ep {

struct CheckEpOptions {
  // ag_rows, reduce, chunk_bytes and peer_memory of every case (the CLI passes
  // EPConfig::from_knobs()); the matrix sets algo, combine and the other fields per case.
  EPConfig policy;
  std::vector<EpAlgo> algos{EpAlgo::ag, EpAlgo::a2a, EpAlgo::automatic};
  std::vector<CombineMode> combines{CombineMode::exact, CombineMode::fast};
  uint64_t seed = 1;
  bool verbose = false;  // one line per case (rank 0)
  bool full = false;     // no pruning of the ag variants at large W
  int hidden = 0;        // H of every case; 0 = the world's small default. A large H makes the
                         // a2a calls large: x rows apart from their records, direct lowering
  int tokens = 0;        // M of every case; 0 = the world's small default. With a large H, enough
                         // for the rows of a call to pass 32 MiB: the sources write (direct-push)
};

struct CheckEpResult {
  int passed = 0;
  int failed = 0;
  int64_t fast_ulp_diffs = 0;  // fast-combine elements differing by 1 ulp (unordered backends)
};

// Collective: run on every rank of `group`. Rank 0 prints the summary lines; every rank returns
// the same (agreed) result.
CheckEpResult run_check_ep(Group& group, const CheckEpOptions& opts);

}  // namespace deepinfer::ep
