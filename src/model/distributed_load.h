// Distributed loading (docs/ep.md §13.4): every rank needs the replicated tensors (everything but
// the routed experts); instead of each rank reading all of them from the checkpoint, each reads
// 1/W of their bytes and a bucketed all_gather (BucketBuffer) assembles the rest, so a cluster
// reading from shared storage moves W× fewer replicated bytes per rank. The result is byte for byte
// the checkpoint's, so the model computes exactly what plain (mmap) loading gives.
#pragma once

#include <deepinfer/comm.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "model/safetensors.h"

namespace deepinfer::model {

// How a rank reads the replicated tensors: in place from the mmap'd checkpoint (each rank reads
// all of them on first touch; ranks on one host share the page cache), or 1/W each and a bucketed
// all_gather (a private copy per rank). DEEPINFER_LOAD = mmap|bucket|auto.
enum class LoadMode : uint8_t { mmap, bucket };
std::string_view to_string(LoadMode);

// What one rank reads from the checkpoint's files.
struct LoadStats {
  LoadMode mode = LoadMode::mmap;
  int rank = 0, world = 1;
  size_t replicated_bytes = 0;       // every non-expert tensor of the checkpoint
  size_t replicated_read_bytes = 0;  // of them, read by this rank (all, or its 1/W slice)
  size_t expert_bytes = 0;           // this rank's routed experts (read by it in both modes)
  size_t gathered_bytes = 0;  // bucket: the all_gather's bytes (slices of every rank, padding)
  size_t read_bytes() const { return replicated_read_bytes + expert_bytes; }
  std::string describe() const;  // the load log line
};

// The routed expert a tensor belongs to ("model.layers.L.mlp.experts.E...." -> E), or -1.
int64_t routed_expert_of(const std::string& name);

// True for an Engram block's hash table ("model.layers.L.engram.embedding.weight"): sharded over
// the ranks by rows (each reads its own rows), never replicated.
bool is_engram_table(const std::string& name);

// Plain loading's reads: every replicated tensor, and the routed experts in
// [first_expert, first_expert + num_experts).
LoadStats mmap_load_stats(const Checkpoint& ckpt, int rank, int world, int64_t first_expert,
                          int64_t num_experts);

// Collective: the replicated tensors laid out in one flat region (64-byte aligned, sorted by name),
// gathered in chunks of at most `chunk_bytes` (one all_gather each, in place); each rank copies
// only its slice of each chunk out of `base`. Returns `base` with the replicated tensors reading
// from the gathered region; stats gets the replicated figures (the caller adds expert_bytes).
// Ranks whose checkpoints differ (names, dtypes, shapes) get an Error on every rank.
std::shared_ptr<const Checkpoint> gather_replicated(Group& group,
                                                    std::shared_ptr<const Checkpoint> base,
                                                    size_t chunk_bytes, LoadStats& stats);

}  // namespace deepinfer::model
