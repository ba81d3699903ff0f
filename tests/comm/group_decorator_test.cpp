// GroupDecorator forwards every virtual of Group to the inner group's own implementation (not to
// Group's defaults), and the wrappers built on it override only what they change: the
// capabilities override its capabilities, `faulty` its collectives and its peer memory (none).
#include "comm/group_decorator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/capabilities.h"
#include "comm/faulty/faulty_group.h"

namespace deepinfer {
namespace {

// Records which of its virtuals was called; moves no data. Overrides every virtual of Group,
// the defaulted ones included, so a call that reaches Group's default instead shows up.
class RecordingGroup final : public Group {
 public:
  std::vector<std::string> calls;
  std::byte staging[8]{};

  int rank() const override { return note("rank"), 1; }
  int size() const override { return note("size"), 2; }
  std::string backend() const override { return note("backend"), "recording"; }
  Capabilities capabilities() const override {
    note("capabilities");
    Capabilities c;
    c.ordered_reduce = false;
    return c;
  }
  void all_gather(const void*, void*, size_t, DType) override { note("all_gather"); }
  void all_gather_v(const void*, size_t, void*, std::span<const size_t>, DType) override {
    note("all_gather_v");
  }
  void all_reduce(void*, size_t, DType, ReduceOp) override { note("all_reduce"); }
  void reduce_scatter(const float*, float*, size_t) override { note("reduce_scatter"); }
  void all_to_all(const void*, void*, size_t, DType) override { note("all_to_all"); }
  void all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>,
                    DType) override {
    note("all_to_all_v");
  }
  void all_to_all_v_rows(const void*, size_t, std::span<const int64_t>, std::span<const int64_t>,
                         void*, std::span<const size_t>) override {
    note("all_to_all_v_rows");
  }
  void broadcast(void*, size_t, DType, int) override { note("broadcast"); }
  void barrier() override { note("barrier"); }
  PeerMemory peer_memory() const override { return note("peer_memory"), PeerMemory::address_space; }
  void expose(std::span<const std::span<const std::byte>>,
              std::vector<const std::byte*>& peers) override {
    note("expose");
    peers.assign(2, staging);
  }
  void expose_writable(std::span<const std::span<std::byte>>,
                       std::vector<std::byte*>& peers) override {
    note("expose_writable");
    peers.assign(2, staging);
  }
  std::byte* expose_staging(size_t) override { return note("expose_staging"), staging; }

 private:
  void note(const char* name) const { calls_mut().push_back(name); }
  std::vector<std::string>& calls_mut() const { return const_cast<RecordingGroup*>(this)->calls; }
};

struct Call {
  const char* name;
  std::function<void(Group&, RecordingGroup&)> invoke;  // calls `name` on the first, checks results
};

// One entry per virtual of Group (a virtual added to Group belongs here too).
std::vector<Call> every_virtual() {
  static std::byte buf[64];
  static const size_t counts[2] = {1, 1};
  static const int64_t rows[2] = {0, 1}, offsets[3] = {0, 1, 2};
  return {
      {"rank", [](Group& g, RecordingGroup&) { EXPECT_EQ(g.rank(), 1); }},
      {"size", [](Group& g, RecordingGroup&) { EXPECT_EQ(g.size(), 2); }},
      {"backend", [](Group& g, RecordingGroup&) { (void)g.backend(); }},
      {"capabilities",
       [](Group& g, RecordingGroup&) { EXPECT_FALSE(g.capabilities().ordered_reduce); }},
      {"all_gather", [](Group& g, RecordingGroup&) { g.all_gather(buf, buf, 1, DType::u8); }},
      {"all_gather_v",
       [](Group& g, RecordingGroup&) { g.all_gather_v(buf, 1, buf, counts, DType::u8); }},
      {"all_reduce",
       [](Group& g, RecordingGroup&) { g.all_reduce(buf, 1, DType::f32, ReduceOp::sum); }},
      {"reduce_scatter",
       [](Group& g, RecordingGroup&) {
         g.reduce_scatter(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf), 1);
       }},
      {"all_to_all", [](Group& g, RecordingGroup&) { g.all_to_all(buf, buf, 1, DType::u8); }},
      {"all_to_all_v",
       [](Group& g, RecordingGroup&) { g.all_to_all_v(buf, counts, buf, counts, DType::u8); }},
      {"all_to_all_v_rows",
       [](Group& g, RecordingGroup&) { g.all_to_all_v_rows(buf, 4, rows, offsets, buf, counts); }},
      {"broadcast", [](Group& g, RecordingGroup&) { g.broadcast(buf, 1, DType::u8, 0); }},
      {"barrier", [](Group& g, RecordingGroup&) { g.barrier(); }},
      {"peer_memory",
       [](Group& g, RecordingGroup&) { EXPECT_EQ(g.peer_memory(), PeerMemory::address_space); }},
      {"expose",
       [](Group& g, RecordingGroup& r) {
         std::vector<const std::byte*> peers;
         const std::span<const std::byte> region(buf, 8);
         g.expose(std::span(&region, 1), peers);
         EXPECT_EQ(peers, std::vector<const std::byte*>(2, r.staging));
       }},
      {"expose_writable",
       [](Group& g, RecordingGroup& r) {
         std::vector<std::byte*> peers;
         const std::span<std::byte> region(buf, 8);
         g.expose_writable(std::span(&region, 1), peers);
         EXPECT_EQ(peers, std::vector<std::byte*>(2, r.staging));
       }},
      {"expose_staging",
       [](Group& g, RecordingGroup& r) { EXPECT_EQ(g.expose_staging(8), r.staging); }},
  };
}

TEST(GroupDecorator, ForwardsEveryVirtualToTheInnerGroupsOwn) {
  RecordingGroup inner;
  GroupDecorator d(inner);
  for (const Call& c : every_virtual()) {
    SCOPED_TRACE(c.name);
    inner.calls.clear();
    c.invoke(d, inner);
    // Exactly the same virtual on the inner group: Group's default of all_to_all_v_rows would
    // show up as all_to_all_v, expose_staging's default would not reach the inner group at all.
    EXPECT_EQ(inner.calls, std::vector<std::string>{c.name});
  }
}

TEST(GroupDecorator, OwningFormForwardsToo) {
  auto owned = std::make_unique<RecordingGroup>();
  RecordingGroup& inner = *owned;
  GroupDecorator d(std::move(owned));
  for (const Call& c : every_virtual()) {
    SCOPED_TRACE(c.name);
    inner.calls.clear();
    c.invoke(d, inner);
    EXPECT_EQ(inner.calls, std::vector<std::string>{c.name});
  }
}

TEST(GroupDecorator, CapabilitiesOverrideChangesOnlyCapabilities) {
  auto owned = std::make_unique<RecordingGroup>();
  RecordingGroup& inner = *owned;
  CapabilitiesFile file;
  file.caps.all_to_all_v = false;
  file.caps.ordered_reduce = true;
  file.backend = "recording";
  std::unique_ptr<Group> g = with_capabilities_override(std::move(owned), file);
  inner.calls.clear();
  EXPECT_FALSE(g->capabilities().all_to_all_v);
  EXPECT_TRUE(g->capabilities().ordered_reduce);
  EXPECT_TRUE(inner.calls.empty());
  for (const Call& c : every_virtual()) {
    if (std::string(c.name) == "capabilities") continue;
    SCOPED_TRACE(c.name);
    inner.calls.clear();
    c.invoke(*g, inner);
    EXPECT_EQ(inner.calls, std::vector<std::string>{c.name});
  }
}

// `faulty` offers no peer memory whatever the inner group has, so nothing goes around the
// collectives it breaks; expose throws and there is no staging place, without asking the inner.
TEST(FaultyGroup, OffersNoPeerMemory) {
  for (const char* fault : {"int32-ag-corrupt", "a2av-hang", "a2a-diverge", "rank-exit"}) {
    SCOPED_TRACE(fault);
    auto owned = std::make_unique<RecordingGroup>();
    RecordingGroup& inner = *owned;
    std::unique_ptr<Group> g = comm::make_faulty_group(std::move(owned), fault, 1.0);
    inner.calls.clear();
    EXPECT_EQ(g->peer_memory(), PeerMemory::none);
    EXPECT_EQ(g->expose_staging(8), nullptr);
    std::vector<const std::byte*> peers;
    std::byte b[8]{};
    const std::span<const std::byte> region(b, 8);
    EXPECT_THROW(g->expose(std::span(&region, 1), peers), Error);
    std::vector<std::byte*> writable;
    const std::span<std::byte> wregion(b, 8);
    EXPECT_THROW(g->expose_writable(std::span(&wregion, 1), writable), Error);
    for (const std::string& c : inner.calls)
      EXPECT_TRUE(c == "backend" || c == "rank" || c == "size") << c;
  }
}

// all_to_all_v_rows is the same exchange as all_to_all_v: a fault that breaks all_to_all_v takes
// it through all_to_all_v (so it breaks it too); any other reaches the inner group's own.
TEST(FaultyGroup, RowsExchangeGoesThroughTheFaultWhereAllToAllVIsBroken) {
  for (const char* fault : {"int32-ag-corrupt", "a2av-hang", "a2a-diverge", "rank-exit"}) {
    SCOPED_TRACE(fault);
    auto owned = std::make_unique<RecordingGroup>();
    RecordingGroup& inner = *owned;
    std::unique_ptr<Group> g = comm::make_faulty_group(std::move(owned), fault, 1.0);
    const bool breaks_v = !g->capabilities().all_to_all_v;
    EXPECT_EQ(breaks_v, std::string(fault) == "a2av-hang" || std::string(fault) == "a2a-diverge");
    std::byte buf[16]{};
    const int64_t rows[2] = {0, 1}, offsets[3] = {0, 1, 2};
    const size_t recv_rows[2] = {1, 1};
    inner.calls.clear();
    g->all_to_all_v_rows(buf, 4, rows, offsets, buf + 8, recv_rows);
    std::erase_if(inner.calls, [](const std::string& c) {
      return c == "rank" || c == "size" || c == "backend";
    });
    EXPECT_EQ(inner.calls,
              std::vector<std::string>{breaks_v ? "all_to_all_v" : "all_to_all_v_rows"});
  }
}

// The other wrappers' collectives still reach the inner group (faulty counts and may break them,
// but a healthy call goes through once).
TEST(FaultyGroup, ForwardsCollectives) {
  auto owned = std::make_unique<RecordingGroup>();
  RecordingGroup& inner = *owned;
  std::unique_ptr<Group> g = comm::make_faulty_group(std::move(owned), "int32-ag-corrupt", 1.0);
  for (const Call& c : every_virtual()) {
    const std::string name = c.name;
    if (name == "peer_memory" || name == "expose" || name == "expose_writable" ||
        name == "expose_staging" || name == "backend")
      continue;
    SCOPED_TRACE(name);
    inner.calls.clear();
    c.invoke(*g, inner);
    std::erase_if(inner.calls,
                  [&](const std::string& s) { return s != name && (s == "rank" || s == "size"); });
    EXPECT_EQ(inner.calls, std::vector<std::string>{name});
  }
}

}  // namespace
}  // namespace deepinfer
