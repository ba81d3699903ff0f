// Distributed loading (docs/ep.md §13.4): at 1..4 ranks every replicated tensor of models/tiny
// is byte for byte the checkpoint's, read from the gathered copy; each rank reads about 1/W of the
// replicated bytes and together they read each byte once; the routed experts stay in the mmap;
// the weights load from the result; ranks that opened different checkpoints get an Error on every
// rank.
#include <deepinfer/comm.h>
#include <deepinfer/error.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/distributed_load.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace deepinfer::model {
namespace {

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny";

class DistributedLoad : public ::testing::TestWithParam<int> {};

TEST_P(DistributedLoad, GathersTheCheckpointsBytes) {
  const int world = GetParam();
  auto base = std::make_shared<const Checkpoint>(kTiny);
  const ModelConfig cfg = load_config(kTiny);
  LaunchOptions o;
  o.world = world;
  o.timeout_s = 60;
  std::mutex mu;
  std::vector<LoadStats> stats;
  std::atomic<int> bad{0};
  run_ranks(o, [&](Group& g) {
    LoadStats s;
    // A small chunk: several all_gathers, tensors split across chunks and slices.
    auto ck = gather_replicated(g, base, 64 << 10, s);
    for (const std::string& name : base->names()) {
      const TensorView &a = base->get(name), &b = ck->get(name);
      const bool expert = routed_expert_of(name) >= 0;
      if (a.nbytes != b.nbytes || a.dtype != b.dtype || a.shape != b.shape ||
          std::memcmp(a.data, b.data, a.nbytes) != 0 || (expert != (a.data == b.data)))
        ++bad;
    }
    if (cfg.n_routed_experts % g.size() == 0) {  // W = 3 checks the gather only
      LoadOptions lo;
      lo.ep_rank = g.rank();
      lo.ep_size = g.size();
      auto w = load_weights(ck, cfg, lo);
      // The weights read from the gathered copy, not the mmap.
      if (w->embed != reinterpret_cast<const bf16*>(ck->get("model.embed_tokens.weight").data))
        ++bad;
    }
    std::lock_guard lk(mu);
    stats.push_back(s);
  });
  EXPECT_EQ(bad.load(), 0);
  ASSERT_EQ(stats.size(), size_t(world));
  const LoadStats plain = mmap_load_stats(*base, 0, 1, 0, cfg.n_routed_experts);
  size_t sum = 0;
  for (const LoadStats& s : stats) {
    EXPECT_EQ(s.mode, LoadMode::bucket);
    EXPECT_EQ(s.replicated_bytes, plain.replicated_bytes);
    // About 1/W each (slices are equal up to the padding of the region and its chunks).
    EXPECT_LE(s.replicated_read_bytes, plain.replicated_bytes / size_t(world) + (64u << 10));
    sum += s.replicated_read_bytes;
    // Padding: 64-byte alignment per tensor, and below W·64 bytes per chunk.
    EXPECT_GE(s.gathered_bytes, plain.replicated_bytes);
    EXPECT_LE(s.gathered_bytes, plain.replicated_bytes + plain.replicated_bytes / 50 + (64u << 10));
  }
  EXPECT_EQ(sum, plain.replicated_bytes);  // every byte read once, by one rank
}

INSTANTIATE_TEST_SUITE_P(World, DistributedLoad, ::testing::Values(1, 2, 3, 4));

TEST(DistributedLoad, PlainStatsSplitTheExperts) {
  const Checkpoint ck(kTiny);
  const ModelConfig cfg = load_config(kTiny);
  const LoadStats all = mmap_load_stats(ck, 0, 1, 0, cfg.n_routed_experts);
  size_t experts = 0;
  for (int r = 0; r < 4; ++r) {
    const int64_t n = cfg.n_routed_experts / 4;
    const LoadStats s = mmap_load_stats(ck, r, 4, r * n, n);
    EXPECT_EQ(s.replicated_read_bytes, all.replicated_bytes);
    experts += s.expert_bytes;
  }
  EXPECT_EQ(experts, all.expert_bytes);
  EXPECT_GT(all.expert_bytes, 0u);
  EXPECT_EQ(all.read_bytes(), ck.total_bytes());
}

// Rank 0 opens a checkpoint whose one tensor has another shape: an Error on every rank.
TEST(DistributedLoad, DifferentCheckpointsAreAnErrorOnEveryRank) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("deepinfer_dist_load_test_" + std::to_string(getpid()));
  std::vector<float> data(8, 1.0f);
  for (int v : {0, 1}) {
    std::filesystem::create_directories(dir / std::to_string(v));
    write_safetensors((dir / std::to_string(v) / "model.safetensors").string(),
                      {{"model.norm.weight", DType::f32, {v ? 8 : 4}, data.data()}});
  }
  LaunchOptions o;
  o.world = 2;
  o.timeout_s = 30;
  std::atomic<int> threw{0};
  run_ranks(o, [&](Group& g) {
    auto ck = std::make_shared<const Checkpoint>((dir / (g.rank() == 0 ? "0" : "1")).string());
    LoadStats s;
    try {
      gather_replicated(g, ck, 1 << 20, s);
    } catch (const Error&) {
      ++threw;
    }
  });
  EXPECT_EQ(threw.load(), 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::model
