// The lowerings of algorithm `a2a`, one file each; ep/path.h chooses among them. Each is a free
// function over the shared Context and a scratch struct of its own, which the EPBuffer keeps
// (grown on demand, reused call after call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ep/alltoall/a2a.h"
#include "ep/context.h"
#include "ep/handle.h"
#include "ep/path.h"
#include "ep/records.h"

namespace deepinfer::ep::a2a {

// Dispatch by exchange (dispatch_exchange.cpp): records packed per destination, moved by the
// plan's lowering. DispatchPath::exchange_rows sends the x rows apart by all_to_all_v_rows,
// straight from the caller's x (no pack copy) into the returned output x (non-expand; no unpack
// copy either) and the small [scales|weights|idx|token] records by a second all_to_all_v.
// Returns that output x, else an undefined tensor.
struct ExchangeDispatchScratch {
  std::vector<std::byte> send, recv, x;
  Scratch padded;
};
Tensor dispatch_exchange(Context& c, ExchangeDispatchScratch& s, const HandleData& h,
                         const Path& path, const PackSource& src, std::vector<RowRef>& rows);

// Direct pull (dispatch_pull.cpp): every rank exposes its x, scales, weights, ids and send list,
// and lists its rows where the sources hold them; the unpack copies them straight into the
// outputs. The caller closes with a barrier once the rows are read.
struct PullScratch {
  std::vector<const std::byte*> exposed;
};
void dispatch_pull(Context& c, PullScratch& s, const HandleData& h, const PackSource& src,
                   std::vector<RowRef>& rows);

// Direct push (dispatch_push.cpp): every rank exposes, writable, where its received rows go, and
// the sources write them there. Returns the output x (closed by a barrier: the rows are in place).
struct PushScratch {
  std::vector<std::byte> meta;
  std::vector<std::byte*> exposed;
};
Tensor dispatch_push(Context& c, PushScratch& s, const HandleData& h, const PackSource& src,
                     std::vector<RowRef>& rows);

// Combine by exchange (combine_exchange.cpp): fast sends one [weights | partial] record per
// received row, exact one [w | y] record per (received row, local slot); the owner sums them.
struct ExchangeCombineScratch {
  std::vector<std::byte> send, recv;
  Scratch padded;
  std::vector<const std::byte*> slot_ptr;
  std::vector<const uint16_t*> part_ptr;
  std::vector<int> part_count;
};
void combine_exchange(Context& c, ExchangeCombineScratch& s, const HandleData& h, const uint16_t* y,
                      CombineOutput& out);

// Combine direct (combine_direct.cpp): each owner reads its tokens' expert outputs in the peers'
// exposed y and sums them as the exchange would have. Closed by a barrier.
struct DirectCombineScratch {
  std::vector<const std::byte*> exposed;
  std::vector<const uint16_t*> part_ptr;
  std::vector<float> slot_w;
  std::vector<int> group_end, part_count, group_count;
};
void combine_direct(Context& c, DirectCombineScratch& s, const HandleData& h, const uint16_t* y,
                    CombineOutput& out);

}  // namespace deepinfer::ep::a2a
