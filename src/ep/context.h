// What every lowering of EPBuffer sees: the group, the agreed config, this rank's place in the
// world, and the statistics of the call in progress. Each lowering keeps its own scratch apart.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/ep.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ep/sizing.h"

namespace deepinfer::ep {

struct Context {
  Group& group;
  EPConfig cfg;
  int world = 1, rank = 0;
  int local_experts = 1;       // L
  std::vector<int32_t> owner;  // [E] the rank holding expert e (e / L without a division per slot)
  EpAlgo algo = EpAlgo::ag;    // resolved
  EpSizes sizes;
  EpCallStats stats;  // of the last call

  Context(Group& g, const EPConfig& c) : group(g), cfg(c) {}

  // Whether a slot's expert id e (-1: masked) lives on rank r.
  bool on_rank(int64_t e, int r) const { return e >= 0 && owner[size_t(e)] == r; }
  DType x_dtype() const {
    return cfg.dispatch_dtype == DispatchDType::fp8 ? DType::e4m3 : DType::bf16;
  }
  // Once per process and message (rank 0): the lowering a backend gets is news once, not per call.
  void log_once(const std::string& what) const;
};

}  // namespace deepinfer::ep
