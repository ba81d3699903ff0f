// Which lowering an EPBuffer call takes: one pure function of what every rank agrees on, so the
// choice is unit-tested without a Group (tests/ep/test_path.cpp). docs/ep.md describes the paths.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>

#include <cstdint>
#include <string_view>

#include "ep/alltoall/a2a.h"

namespace deepinfer::ep {

// x bytes one a2a dispatch moves, over all ranks, from which the sources write them (push): a
// typical server L3 (32 MiB per CCD on EPYC) holds no more.
constexpr uint64_t kEpStreamMinBytes = uint64_t(32) << 20;

enum class DispatchPath : uint8_t {
  ag,             // all_gather of padded records, then local selection (allgather/ag_dispatch.cpp)
  exchange,       // a2a: whole records by the plan's lowering (alltoall/dispatch_exchange.cpp)
  exchange_rows,  // a2a `v`, large call: x rows by all_to_all_v_rows, records apart (same file)
  pull,           // peer memory: rows read where the sources hold x (alltoall/dispatch_pull.cpp)
  push,           // one address space, large call: sources write (alltoall/dispatch_push.cpp)
};
enum class CombinePath : uint8_t {
  ag,        // fp32 reduce_scatter / all_reduce of per-token rows (allgather/ag_combine.cpp)
  exchange,  // a2a: partials or per-slot records back by an exchange
             // (alltoall/combine_exchange.cpp)
  direct,    // peer memory: each owner reads its tokens' expert outputs in place
             // (alltoall/combine_direct.cpp)
};
std::string_view to_string(DispatchPath p);
std::string_view to_string(CombinePath p);

struct Path {
  DispatchPath dispatch = DispatchPath::ag;
  // a2a: the lowering of the split matrix (the dispatch exchange and the fast combine's).
  a2a::Lowering lowering = a2a::Lowering::even;
  CombinePath combine = CombinePath::ag;
  // CombinePath::exchange: its lowering, and the records per block where it is padded.
  a2a::Lowering combine_lowering = a2a::Lowering::even;
  int64_t combine_pad = 0;
};

// Everything the choice reads. Each field is the same on every rank: the config is agreed at
// construction, peer_memory and capabilities are the group's (the same answer on every rank), the
// plan is all-gathered, and a dispatch is cached on every rank or on none.
struct PathInputs {
  const EPConfig& cfg;
  int world = 1;
  EpAlgo algo = EpAlgo::ag;  // resolved
  PeerMemory peer_memory = PeerMemory::none;
  Capabilities caps;
  const a2a::Plan* plan = nullptr;  // a2a: the agreed split matrix (ignored for ag)
  bool cached = false;              // a cached dispatch (the plan's all_x_in_place does not apply)
};

// Pure: every rank computes the same path from the same agreed inputs, so every rank enters the
// same collectives. Throws Error (on every rank alike) where the backend trusts no a2a lowering.
Path choose_path(const PathInputs& in);

}  // namespace deepinfer::ep
