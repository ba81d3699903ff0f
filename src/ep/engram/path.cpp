#include "ep/engram/path.h"

#include "core/check.h"

namespace deepinfer {

std::string_view to_string(EngramAlgo a) {
  switch (a) {
    case EngramAlgo::ag:
      return "ag";
    case EngramAlgo::a2a:
      return "a2a";
    case EngramAlgo::direct:
      return "direct";
    case EngramAlgo::automatic:
      return "auto";
  }
  return "?";
}

namespace ep::engram {

EngramAlgo choose_path(EngramAlgo requested, PeerMemory peer_memory, const Capabilities& caps) {
  switch (requested) {
    case EngramAlgo::ag:
      return EngramAlgo::ag;
    case EngramAlgo::a2a:
      if (!caps.all_to_all_v)
        DI_FAIL(
            "EngramBuffer: algo a2a needs a trusted all_to_all_v, which this backend lacks; "
            "use algo ag (or auto)");
      return EngramAlgo::a2a;
    case EngramAlgo::direct:
      if (peer_memory == PeerMemory::none)
        DI_FAIL(
            "EngramBuffer: algo direct needs peer memory, which this group lacks; use algo "
            "ag, a2a or auto");
      return EngramAlgo::direct;
    case EngramAlgo::automatic:
      break;
  }
  if (peer_memory == PeerMemory::address_space) return EngramAlgo::direct;
  return caps.all_to_all_v ? EngramAlgo::a2a : EngramAlgo::ag;
}

}  // namespace ep::engram
}  // namespace deepinfer
