// Algorithm `ag` (all_to_all-free): dispatch is one all_gather of packed records padded to R rows
// per rank, then local selection; combine is one fp32 SUM reduce_scatter (or all_reduce) of
// per-token rows, chunked (docs/ep.md). Never calls all_to_all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ep/context.h"
#include "ep/handle.h"
#include "ep/records.h"

namespace deepinfer::ep::ag {

// Dispatch (allgather/ag_dispatch.cpp): pack [R, rec] into this rank's block of the gather
// buffer, gather in place (the block is not copied again), and list the received rows (cached:
// the handle's rows; else the rows with an expert of this rank).
struct DispatchScratch {
  std::vector<std::byte> gathered;  // [W·R, rec]
  std::vector<int64_t> selected;
};
void dispatch(Context& c, DispatchScratch& s, const HandleData& h, const PackSource& src,
              bool cached, std::vector<RowRef>& rows);

// Combine (allgather/ag_combine.cpp): every rank fills the rows of its received tokens (exact:
// K products of H; fast: one partial of H; then K weights), the reduction sums them per source
// token, and each rank turns its own tokens' sums into the output.
struct CombineScratch {
  std::vector<float> send, recv, acc;
  std::vector<uint8_t> filled;  // which rows of a chunk hold a received row
};
void combine(Context& c, CombineScratch& s, const HandleData& h, const uint16_t* y,
             CombineOutput& out);

}  // namespace deepinfer::ep::ag
