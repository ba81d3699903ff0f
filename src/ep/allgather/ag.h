// Algorithm `ag` (all_to_all-free): dispatch is one all_gather of packed records padded to R rows
// per rank, then local selection; combine is one fp32 SUM reduce_scatter (or all_reduce) of
// per-token rows, chunked (DESIGN §4). Sees only Group; never calls all_to_all.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ep/sizing.h"

namespace deepinfer::ep::ag {

// Collective: send [R, rec] -> recv [W·R, rec] in rank order; send may be this rank's block of recv.
void gather(Group& group, const std::byte* send, int64_t rows, size_t rec_bytes, std::byte* recv,
            EpCallStats& stats);

// Local: indices src·R + t of gathered records with an expert in [lo, hi), in (src, t) order.
void select(const std::byte* gathered, int world, int64_t rows, const RecordLayout& rec, int k,
            int64_t lo, int64_t hi, std::vector<int64_t>& out);

struct ReduceParams {
  EpReduce reduce = EpReduce::rs;
  int64_t rows = 0;        // R rows per rank
  size_t cols = 0;         // floats per row
  size_t chunk_rows = 1;   // rows per rank per collective
};
// fill(begin, end, send): write rows [begin, end) of every rank's block into send [W, end-begin, cols],
// every float of it (zeros where the rank has nothing: send holds the previous chunk's bytes).
// consume(begin, end, own): this rank's summed rows [end-begin, cols].
using FillFn = std::function<void(int64_t, int64_t, float*)>;
using ConsumeFn = std::function<void(int64_t, int64_t, const float*)>;
void reduce(Group& group, const ReduceParams& p, const FillFn& fill, const ConsumeFn& consume,
            std::vector<float>& send_buf, std::vector<float>& recv_buf, EpCallStats& stats);

}  // namespace deepinfer::ep::ag
