#include "ep/path.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::ep {

std::string_view to_string(DispatchPath p) {
  switch (p) {
    case DispatchPath::ag:
      return "ag";
    case DispatchPath::exchange:
      return "exchange";
    case DispatchPath::exchange_rows:
      return "exchange-rows";
    case DispatchPath::pull:
      return "direct";
    case DispatchPath::push:
      return "direct-push";
  }
  return "?";
}

std::string_view to_string(CombinePath p) {
  switch (p) {
    case CombinePath::ag:
      return "ag";
    case CombinePath::exchange:
      return "exchange";
    case CombinePath::direct:
      return "direct";
  }
  return "?";
}

Path choose_path(const PathInputs& in) {
  Path p;
  if (in.algo != EpAlgo::a2a) return p;
  DI_CHECK(in.plan != nullptr, "choose_path: a2a needs the agreed plan");
  const a2a::Plan& plan = *in.plan;
  const EPConfig& cfg = in.cfg;
  p.lowering = a2a::choose_lowering(plan.split, in.caps);
  const size_t x_row = size_t(cfg.hidden) * (cfg.dispatch_dtype == DispatchDType::fp8 ? 1 : 2);
  const size_t y_row = size_t(cfg.hidden) * 2;
  // The call moves kEpDirectMinBytes per rank on average (rows of row_bytes): bandwidth, not
  // collective rounds, sets its time.
  auto large_call = [&](size_t row_bytes) {
    return uint64_t(plan.total) * row_bytes >= uint64_t(in.world) * kEpDirectMinBytes;
  };
  // Peer memory per EPConfig::peer_memory; under `automatic` once the call is large.
  auto use_direct = [&](size_t row_bytes) {
    if (cfg.peer_memory != EpPeerMemory::automatic) return cfg.peer_memory == EpPeerMemory::on;
    return large_call(row_bytes);
  };

  // Dispatch reads x in place only where exposing it copies nothing: in one address space, or
  // where every rank's x sits in its window staging place (agreed in the plan: uncached dispatch
  // only). Else the exposed x would be one copy more than the exchange.
  const bool x_readable =
      in.peer_memory == PeerMemory::address_space ||
      (in.peer_memory == PeerMemory::window && !in.cached && plan.all_x_in_place);
  if (x_readable && use_direct(x_row)) {
    // The sources write: in one address space, without the expand layout (whose rows go to
    // per-expert places only the receiver knows), and where the x rows all ranks move exceed
    // what a cache keeps.
    const bool push = in.peer_memory == PeerMemory::address_space && !cfg.expand &&
                      uint64_t(plan.total) * x_row >= kEpStreamMinBytes;
    p.dispatch = push ? DispatchPath::push : DispatchPath::pull;
  } else {
    // Under `v`, a large call sends the x rows apart from their records (no pack copy).
    p.dispatch = p.lowering == a2a::Lowering::v && large_call(x_row) ? DispatchPath::exchange_rows
                                                                     : DispatchPath::exchange;
  }

  if (in.peer_memory != PeerMemory::none && use_direct(y_row)) {
    p.combine = CombinePath::direct;
    return p;
  }
  p.combine = CombinePath::exchange;
  if (cfg.combine == CombineMode::fast) {
    // One record per received row: the dispatch's counts reversed.
    p.combine_lowering = p.lowering;
    p.combine_pad = plan.max_split;
    return p;
  }
  // exact: one record per (row, local slot). Slot counts are not globally known: v where
  // trusted, else pad to a bound every rank derives from the split matrix.
  p.combine_lowering = in.caps.all_to_all_v ? a2a::Lowering::v : a2a::Lowering::padded;
  p.combine_pad = plan.max_split * std::min(cfg.num_topk, cfg.num_experts / std::max(1, in.world));
  if (p.combine_lowering == a2a::Lowering::padded && !in.caps.all_to_all)
    p.combine_lowering = a2a::choose_lowering({}, in.caps);  // throws: nothing trusted
  return p;
}

}  // namespace deepinfer::ep
