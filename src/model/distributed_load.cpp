// Distributed loading of the replicated tensors through BucketBuffer (docs/ep.md §13.4).
#include "model/distributed_load.h"

#include <deepinfer/bucket.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ep/bucket/stochastic.h"

namespace deepinfer::model {
namespace {

constexpr size_t kAlign = 64;  // each tensor of the gathered region starts on a cache line
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
double mib(size_t b) { return double(b) / double(1 << 20); }

}  // namespace

std::string_view to_string(LoadMode m) { return m == LoadMode::bucket ? "bucket" : "mmap"; }

std::string LoadStats::describe() const {
  return fmt::format(
      "load ({}): rank {}/{} read {:.2f} MiB from the checkpoint: {:.2f} of the {:.2f} MiB of "
      "replicated tensors{} and {:.2f} MiB of its routed experts",
      to_string(mode), rank, world, mib(read_bytes()), mib(replicated_read_bytes),
      mib(replicated_bytes),
      mode == LoadMode::bucket
          ? fmt::format(" (all_gather assembled {:.2f} MiB)", mib(gathered_bytes))
          : std::string(),
      mib(expert_bytes));
}

int64_t routed_expert_of(const std::string& name) {
  static constexpr std::string_view kKey = ".mlp.experts.";
  const size_t pos = name.find(kKey);
  return pos == std::string::npos ? -1 : std::atoll(name.c_str() + pos + kKey.size());
}

bool is_engram_table(const std::string& name) {
  static constexpr std::string_view kKey = ".engram.embedding.weight";
  return name.size() > kKey.size() &&
         name.compare(name.size() - kKey.size(), kKey.size(), kKey) == 0;
}

LoadStats mmap_load_stats(const Checkpoint& ckpt, int rank, int world, int64_t first_expert,
                          int64_t num_experts) {
  LoadStats s;
  s.rank = rank;
  s.world = world;
  for (const std::string& name : ckpt.names()) {
    const int64_t e = routed_expert_of(name);
    const size_t b = ckpt.get(name).nbytes;
    if (is_engram_table(name))
      continue;  // each rank reads its rows (the model's EngramBuffer shard)
    else if (e < 0)
      s.replicated_bytes += b;
    else if (e >= first_expert && e < first_expert + num_experts)
      s.expert_bytes += b;
  }
  s.replicated_read_bytes = s.replicated_bytes;
  return s;
}

std::shared_ptr<const Checkpoint> gather_replicated(Group& group,
                                                    std::shared_ptr<const Checkpoint> base,
                                                    size_t chunk_bytes, LoadStats& stats) {
  const size_t w = size_t(group.size()), rank = size_t(group.rank());
  stats.replicated_bytes = stats.replicated_read_bytes = 0;
  // The region: every replicated tensor, sorted by name, 64-byte aligned.
  std::vector<const TensorView*> views;
  std::vector<size_t> offset;
  size_t region = 0;
  uint64_t sig = 0x243f6a8885a308d3ull;
  for (const std::string& name : base->names()) {
    if (routed_expert_of(name) >= 0 || is_engram_table(name)) continue;
    const TensorView& t = base->get(name);
    region = align_up(region);
    views.push_back(&t);
    offset.push_back(region);
    region += t.nbytes;
    for (char ch : name) sig = ep::bucket::splitmix64(sig ^ uint64_t(uint8_t(ch)));
    sig = ep::bucket::splitmix64(sig ^ (uint64_t(t.dtype) << 56) ^ t.nbytes);
  }
  // Every rank must lay out the same tensors (mpi ranks each open the checkpoint themselves).
  std::array<int64_t, 4> v{int64_t(sig >> 2), -int64_t(sig >> 2), int64_t(region),
                           -int64_t(region)};
  group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (v[0] != -v[1] || v[2] != -v[3])
    DI_FAIL(
        "distributed loading: the ranks opened different checkpoints (their non-expert tensors' "
        "names, dtypes or sizes differ; {} on rank {}); point every rank at the same folder, or "
        "set DEEPINFER_LOAD=mmap",
        base->dir(), rank);
  // Chunks of W equal slices, each chunk one in-place all_gather of at most chunk_bytes; the last
  // chunk's slices shrink to what is left, so the padding stays below W·64 bytes a chunk.
  const size_t full = align_up((std::max(std::min(chunk_bytes, region), kAlign * w) + w - 1) / w);
  std::vector<size_t> slices;  // per chunk
  size_t total = 0;
  while (total < region) {
    slices.push_back(std::min(full, align_up((region - total + w - 1) / w)));
    total += w * slices.back();
  }
  BucketBuffer buf(group, BucketConfig{total, BucketAlgo::automatic});
  auto chunks = std::make_shared<std::vector<Tensor>>();
  for (size_t slice : slices) chunks->push_back(buf.alloc(DType::u8, {int64_t(w * slice)}));
  auto* data = slices.empty() ? nullptr : static_cast<std::byte*>(chunks->front().raw());
  for (size_t c = 0, start = 0; c < slices.size(); start += w * slices[c], ++c) {
    DI_CHECK(chunks->at(c).raw() == data + start, "chunk {} is not contiguous", c);
    // This rank's slice of the region: [lo, hi). Padding stays zero.
    const size_t lo = start + rank * slices[c], hi = lo + slices[c];
    std::memset(data + lo, 0, slices[c]);
    for (size_t i = 0; i < views.size(); ++i) {
      const size_t a = std::max(lo, offset[i]), b = std::min(hi, offset[i] + views[i]->nbytes);
      if (a >= b) continue;
      std::memcpy(data + a, views[i]->data + (a - offset[i]), b - a);
      stats.replicated_read_bytes += b - a;
    }
    buf.all_gather(std::span(&chunks->at(c), 1));
  }
  stats.mode = LoadMode::bucket;
  stats.rank = int(rank);
  stats.world = int(w);
  stats.gathered_bytes = total;
  std::map<std::string, const std::byte*> moved;
  for (size_t i = 0; i < views.size(); ++i) {
    stats.replicated_bytes += views[i]->nbytes;
    moved.emplace(views[i]->name, data + offset[i]);
  }
  return std::make_shared<const Checkpoint>(std::move(base), moved, std::move(chunks));
}

}  // namespace deepinfer::model
