// EPConfig's defaults are constants (constructing one reads no environment), equal to the
// DEEPINFER_EP_* knobs' defaults; EPConfig::from_knobs() maps every allowed word of each knob.
#include <deepinfer/ep.h>
#include <gtest/gtest.h>

#include <string>

#include "core/env.h"

namespace deepinfer {
namespace {

struct KnobGuard {
  Knobs saved = knobs();
  ~KnobGuard() { set_knobs(saved); }
};

void expect_same_policy(const EPConfig& a, const EPConfig& b) {
  EXPECT_EQ(a.algo, b.algo);
  EXPECT_EQ(a.combine, b.combine);
  EXPECT_EQ(a.ag_rows, b.ag_rows);
  EXPECT_EQ(a.reduce, b.reduce);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.peer_memory, b.peer_memory);
}

TEST(EpConfigKnobs, DefaultsAreTheKnobsDefaults) {
  KnobGuard g;
  set_knobs(Knobs{});
  expect_same_policy(EPConfig{}, EPConfig::from_knobs());
  EXPECT_EQ(EPConfig{}.describe(), EPConfig::from_knobs().describe());
}

// A knob set to something else changes from_knobs() and not a default-constructed EPConfig.
TEST(EpConfigKnobs, ConstructionReadsNoKnob) {
  KnobGuard g;
  Knobs k;
  k.ep_algo = "ag";
  k.ep_combine = "fast";
  k.ep_ag_rows = "cap";
  k.ep_reduce = "ar";
  k.ep_chunk_bytes = 8192;
  k.ep_peer_memory = "off";
  set_knobs(k);
  const EPConfig c;
  EXPECT_EQ(c.algo, EpAlgo::automatic);
  EXPECT_EQ(c.combine, CombineMode::exact);
  EXPECT_EQ(c.ag_rows, AgRows::max);
  EXPECT_EQ(c.reduce, EpReduce::rs);
  EXPECT_EQ(c.chunk_bytes, size_t(64) << 20);
  EXPECT_EQ(c.peer_memory, EpPeerMemory::automatic);
  const EPConfig f = EPConfig::from_knobs();
  EXPECT_EQ(f.algo, EpAlgo::ag);
  EXPECT_EQ(f.combine, CombineMode::fast);
  EXPECT_EQ(f.ag_rows, AgRows::cap);
  EXPECT_EQ(f.reduce, EpReduce::ar);
  EXPECT_EQ(f.chunk_bytes, 8192u);
  EXPECT_EQ(f.peer_memory, EpPeerMemory::off);
}

// Every word core accepts for a DEEPINFER_EP_* knob maps to the enum value whose to_string it is.
TEST(EpConfigKnobs, EveryAllowedWordMaps) {
  KnobGuard g;
  int mapped = 0;
  for (std::string_view w : knob_choices("DEEPINFER_EP_ALGO")) {
    Knobs k;
    k.ep_algo = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(EPConfig::from_knobs().algo), w);
    ++mapped;
  }
  for (std::string_view w : knob_choices("DEEPINFER_EP_COMBINE")) {
    Knobs k;
    k.ep_combine = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(EPConfig::from_knobs().combine), w);
    ++mapped;
  }
  for (std::string_view w : knob_choices("DEEPINFER_EP_AG_ROWS")) {
    Knobs k;
    k.ep_ag_rows = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(EPConfig::from_knobs().ag_rows), w);
    ++mapped;
  }
  for (std::string_view w : knob_choices("DEEPINFER_EP_REDUCE")) {
    Knobs k;
    k.ep_reduce = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(EPConfig::from_knobs().reduce), w);
    ++mapped;
  }
  for (std::string_view w : knob_choices("DEEPINFER_EP_PEER_MEMORY")) {
    Knobs k;
    k.ep_peer_memory = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(EPConfig::from_knobs().peer_memory), w);
    ++mapped;
  }
  EXPECT_EQ(mapped, 3 + 2 + 2 + 2 + 3);
}

TEST(CommKnobs, EveryAllowedWordMaps) {
  KnobGuard g;
  int mapped = 0;
  for (std::string_view w : knob_choices("DEEPINFER_COMM")) {
    Knobs k;
    k.comm = std::string(w);
    set_knobs(k);
    EXPECT_EQ(to_string(comm_kind_from_knobs()), w);
    ++mapped;
  }
  EXPECT_EQ(mapped, 2);
  set_knobs(Knobs{});
  EXPECT_EQ(comm_kind_from_knobs(), LaunchOptions{}.comm);
}

}  // namespace
}  // namespace deepinfer
