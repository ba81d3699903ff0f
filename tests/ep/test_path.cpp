// ep::choose_path without a Group: every branch of the lowering choice, from the inputs every rank
// agrees on (config, the group's peer memory and capabilities, the all-gathered split matrix).
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "ep/path.h"

namespace deepinfer::ep {
namespace {

using a2a::Lowering;

EPConfig config(int hidden, DispatchDType dtype = DispatchDType::fp8) {
  EPConfig c;
  c.num_experts = 16;
  c.hidden = hidden;
  c.num_topk = 4;
  c.num_max_tokens_per_rank = 4096;
  c.dispatch_dtype = dtype;
  c.algo = EpAlgo::a2a;
  c.combine = CombineMode::fast;
  c.expand = false;
  c.peer_memory = EpPeerMemory::automatic;
  return c;
}

// W = 2: the split matrix [[a, b], [c, d]].
a2a::Plan plan2(int64_t a, int64_t b, int64_t c, int64_t d, bool all_x_in_place = false) {
  return a2a::agreed_plan(2, {a, b, c, d}, all_x_in_place);
}

struct Case {
  Case(EPConfig c, a2a::Plan p, PeerMemory m = PeerMemory::none)
      : cfg(c), plan(std::move(p)), pm(m) {}
  EPConfig cfg;
  a2a::Plan plan;
  PeerMemory pm;
  Capabilities caps;
  bool cached = false;
  EpAlgo algo = EpAlgo::a2a;
  Path path() const { return choose_path({cfg, plan.world, algo, pm, caps, &plan, cached}); }
};

TEST(EpPath, AgIsAgWhateverTheGroup) {
  for (PeerMemory pm : {PeerMemory::none, PeerMemory::window, PeerMemory::address_space}) {
    Case c{config(7168), plan2(9000, 9000, 9000, 9000, true), pm};
    c.algo = EpAlgo::ag;
    c.cfg.peer_memory = EpPeerMemory::on;
    const Path p = c.path();
    EXPECT_EQ(p.dispatch, DispatchPath::ag);
    EXPECT_EQ(p.combine, CombinePath::ag);
  }
}

TEST(EpPath, ExchangeLoweringFollowsTheSplitMatrixAndCapabilities) {
  // Even splits: all_to_all; uneven: all_to_all_v where trusted, else padded to the max split.
  Path p = Case{config(256), plan2(3, 3, 3, 3)}.path();
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.lowering, Lowering::even);
  EXPECT_EQ(p.combine, CombinePath::exchange);
  EXPECT_EQ(p.combine_lowering, Lowering::even);

  p = Case{config(256), plan2(3, 1, 0, 5)}.path();
  EXPECT_EQ(p.lowering, Lowering::v);
  EXPECT_EQ(p.combine_lowering, Lowering::v);

  Case padded{config(256), plan2(3, 1, 0, 5)};
  padded.caps.all_to_all_v = false;
  p = padded.path();
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.lowering, Lowering::padded);
  EXPECT_EQ(p.combine_lowering,
            Lowering::padded);  // fast: one record per row, the dispatch's bound
  EXPECT_EQ(p.combine_pad, 5);

  // Even splits without a trusted all_to_all go by all_to_all_v.
  Case even_v{config(256), plan2(2, 2, 2, 2)};
  even_v.caps.all_to_all = false;
  EXPECT_EQ(even_v.path().lowering, Lowering::v);

  // Nothing trusted: an Error (the same on every rank), never a lowering the backend breaks.
  Case none{config(256), plan2(3, 1, 0, 5)};
  none.caps.all_to_all = none.caps.all_to_all_v = false;
  EXPECT_THROW(none.path(), Error);
}

TEST(EpPath, ExactCombineCountsSlotsSoItNeedsVOrAPaddedBound) {
  Case c{config(256), plan2(2, 2, 2, 2)};
  c.cfg.combine = CombineMode::exact;
  Path p = c.path();
  EXPECT_EQ(p.lowering, Lowering::even);       // the dispatch's even split ...
  EXPECT_EQ(p.combine_lowering, Lowering::v);  // ... but per-slot counts are uneven
  c.caps.all_to_all_v = false;
  p = c.path();
  EXPECT_EQ(p.combine_lowering, Lowering::padded);
  EXPECT_EQ(p.combine_pad, 2 * 4);  // max split · min(K, L) = 2 · min(4, 16 / 2)
}

TEST(EpPath, LargeVCallSendsRowsApart) {
  // fp8 rows of H bytes; large once total · H >= W · kEpDirectMinBytes (2 · 256 KiB here).
  const int64_t rows = int64_t(2 * kEpDirectMinBytes / 1024);  // 512 rows of 1 KiB
  Case c{config(1024), plan2(rows / 2 - 1, 1, 0, rows / 2)};
  EXPECT_EQ(c.path().dispatch, DispatchPath::exchange_rows);
  c.plan = plan2(rows / 2 - 1, 1, 0, rows / 2 - 1);  // one row short
  EXPECT_EQ(c.path().dispatch, DispatchPath::exchange);
  c.plan = plan2(rows / 2, rows / 2, rows / 2, rows / 2);  // large but even: all_to_all
  EXPECT_EQ(c.path().dispatch, DispatchPath::exchange);
}

TEST(EpPath, PeerMemoryOnOffAndAutomaticThresholds) {
  // x rows: 1 KiB (fp8, H = 1024); y rows 2 KiB: combine turns direct at half the rows dispatch
  // does.
  const int64_t x_rows = int64_t(2 * kEpDirectMinBytes / 1024), y_rows = x_rows / 2;
  Case c{config(1024), plan2(0, 0, 0, 0), PeerMemory::address_space};
  auto with_total = [&](int64_t total) {
    c.plan = plan2(total - total / 2, 0, 0, total / 2);
    return c.path();
  };
  Path p = with_total(y_rows - 1);
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.combine, CombinePath::exchange);
  p = with_total(y_rows);
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.combine, CombinePath::direct);
  p = with_total(x_rows - 1);
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  p = with_total(x_rows);
  EXPECT_EQ(p.dispatch, DispatchPath::pull);
  EXPECT_EQ(p.combine, CombinePath::direct);

  c.cfg.peer_memory = EpPeerMemory::on;  // any size
  p = with_total(2);
  EXPECT_EQ(p.dispatch, DispatchPath::pull);
  EXPECT_EQ(p.combine, CombinePath::direct);
  c.cfg.peer_memory = EpPeerMemory::off;
  p = with_total(x_rows * 100);
  EXPECT_EQ(p.dispatch, DispatchPath::exchange_rows);
  EXPECT_EQ(p.combine, CombinePath::exchange);

  // No peer memory: `on` changes nothing.
  c.cfg.peer_memory = EpPeerMemory::on;
  c.pm = PeerMemory::none;
  p = with_total(2);
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.combine, CombinePath::exchange);
}

TEST(EpPath, PushOnlyInOneAddressSpaceForALargeNonExpandCall) {
  // 32 MiB of x over all ranks: fp8 rows of 7168 bytes.
  const int64_t rows = int64_t((kEpStreamMinBytes + 7167) / 7168);
  Case c{config(7168), plan2(rows / 2, 0, 0, rows - rows / 2), PeerMemory::address_space};
  EXPECT_EQ(c.path().dispatch, DispatchPath::push);
  c.cfg.expand = true;  // the receiver alone knows where an expanded row goes
  EXPECT_EQ(c.path().dispatch, DispatchPath::pull);
  c.cfg.expand = false;
  c.plan = plan2(rows / 2, 0, 0, rows - rows / 2 - 1);
  EXPECT_EQ(c.path().dispatch, DispatchPath::pull);  // fits a cache: reading is faster
  c.plan = plan2(rows / 2, 0, 0, rows - rows / 2, true);
  c.pm = PeerMemory::window;  // the window is read, never written by peers
  EXPECT_EQ(c.path().dispatch, DispatchPath::pull);
}

TEST(EpPath, WindowPullsOnlyWhereEveryXIsInPlaceAndTheDispatchIsNotCached) {
  Case c{config(1024), plan2(4, 3, 2, 1, true), PeerMemory::window};
  c.cfg.peer_memory = EpPeerMemory::on;
  Path p = c.path();
  EXPECT_EQ(p.dispatch, DispatchPath::pull);
  EXPECT_EQ(p.combine, CombinePath::direct);
  c.cached = true;  // the plan's "x in place" was about the uncached call's x
  EXPECT_EQ(c.path().dispatch, DispatchPath::exchange);
  EXPECT_EQ(c.path().combine, CombinePath::direct);
  c.cached = false;
  c.plan = plan2(4, 3, 2, 1, false);  // some rank's x is elsewhere: exposing it would copy it
  p = c.path();
  EXPECT_EQ(p.dispatch, DispatchPath::exchange);
  EXPECT_EQ(p.combine, CombinePath::direct);
}

TEST(EpPath, AddressSpaceReadsXInPlaceEvenWhenCached) {
  Case c{config(1024), plan2(4, 3, 2, 1), PeerMemory::address_space};
  c.cfg.peer_memory = EpPeerMemory::on;
  c.cached = true;
  EXPECT_EQ(c.path().dispatch, DispatchPath::pull);
}

}  // namespace
}  // namespace deepinfer::ep
