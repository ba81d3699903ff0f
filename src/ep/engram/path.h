// Which lowering an EngramBuffer fetch takes: one pure function of the agreed config and the
// group's peer memory and capabilities (the same on every rank), so every rank enters the same
// collectives; unit-tested without a Group (tests/ep/test_engram.cpp). docs/ep.md §12.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/engram.h>

namespace deepinfer::ep::engram {

// Never returns automatic. `automatic`: direct where the ranks share one address space (reading
// in place copies nothing), else a2a where all_to_all_v is trusted, else ag. Throws Error (on
// every rank alike) for direct without peer memory and for a2a where all_to_all_v is not trusted.
EngramAlgo choose_path(EngramAlgo requested, PeerMemory peer_memory, const Capabilities& caps);

}  // namespace deepinfer::ep::engram
