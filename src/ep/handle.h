// What a dispatch leaves behind for cached dispatch and combine (internal).
#pragma once

#include <deepinfer/ep.h>

#include <cstdint>
#include <vector>

#include "ep/alltoall/a2a.h"
#include "ep/path.h"

namespace deepinfer::ep {

struct HandleData {
  EpAlgo algo = EpAlgo::ag;  // resolved
  int world = 1, rank = 0;
  const void* owner = nullptr;  // the EPBuffer that made it (its sizes are that buffer's)
  int64_t num_tokens = 0;       // T of this rank
  Tensor topk_idx;              // [T, K] i64, this rank's routing (copy)
  Tensor topk_weights;          // [T, K] f32 (copy)

  // Receive side, rows in (source rank, source token) order.
  int64_t num_recv = 0;                                      // N
  std::vector<int32_t> recv_src_rank;                        // [N]
  std::vector<int32_t> recv_src_token;                       // [N]
  std::vector<int64_t> num_recv_per_rank;                    // [W]
  std::vector<int32_t> recv_local_idx;                       // [N, K] local expert or -1
  std::vector<float> recv_weights;                           // [N, K] source weights
  std::vector<int64_t> count_raw, count_aligned, seg_start;  // [L]
  int64_t num_expanded = 0;                                  // S
  std::vector<int64_t> expand_slot;  // [N, K] expanded row of (row, k), -1 (expand only)

  // Send side: this rank's tokens grouped by destination rank, ascending within each.
  std::vector<int64_t> send_offsets;  // [W + 1]
  std::vector<int64_t> send_tokens;   // [send_offsets[W]]

  int64_t ag_rows = 0;  // ag: R rows per rank in the all_gather
  a2a::Plan plan;       // a2a: the agreed split matrix
  Path path;            // the uncached dispatch's path (combine takes path.combine)
};

}  // namespace deepinfer::ep
