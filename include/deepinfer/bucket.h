// bucket: BucketBuffer, many tensors in one collective over any Group (docs/ep.md §13). Mirrors
// DeepEP's bucket collectives: tensors live in storage the buffer owns (registered storage);
// all_gather fills each tensor, rank-major, from every rank's shard in one collective;
// reduce_scatter sums every rank's copy of each tensor into this rank's shard in a fixed order
// (own shard, then rank-1, rank-2, ... cyclic; fp32 accumulation, scaled once), with fp32 or
// stochastically rounded bf16 transport. Bad input on any rank is an Error on every rank, agreed
// before any data moves.
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace deepinfer {

// How reduce_scatter moves the shards: one all_to_all (each rank receives only its shards), one
// all_gather (no all_to_all: each rank receives every rank's whole bucket, W× the bytes), or
// chosen from the group (a2a where all_to_all is trusted, else ag). all_gather always takes the
// one all_gather. Every path gives the same bytes.
enum class BucketAlgo : uint8_t { a2a, ag, automatic };
std::string_view to_string(BucketAlgo);  // "a2a", "ag", "auto"

// What a reduce_scatter moves: the fp32 values, or bf16 rounded stochastically from the seed.
enum class BucketPrecision : uint8_t { fp32, bf16 };
std::string_view to_string(BucketPrecision);  // "fp32", "bf16"

struct BucketConfig {
  size_t storage_bytes = 0;  // this rank's registered storage (may differ between ranks)
  BucketAlgo algo = BucketAlgo::automatic;
};

struct ReduceScatterOptions {
  BucketPrecision precision = BucketPrecision::fp32;
  float scale = 1.0f;  // applied once, to the fp32 sum
  uint64_t seed = 0;   // bf16: the stochastic rounding's stream (the same seed, the same bytes)
};

class BucketBuffer {
 public:
  // Collective: one small all_reduce checks that the algorithm agrees on all ranks and that it can
  // run on this group (Error on every rank otherwise). The group must outlive the buffer.
  BucketBuffer(Group& group, const BucketConfig& config);
  ~BucketBuffer();
  BucketBuffer(const BucketBuffer&) = delete;
  BucketBuffer& operator=(const BucketBuffer&) = delete;

  // Local: a contiguous tensor in the registered storage (64-byte aligned, contents as they were);
  // an Error when the storage is full. The tensor keeps the storage alive, so it may outlive the
  // buffer (the engine's loader keeps the weights it gathered this way).
  Tensor alloc(DType dtype, std::vector<int64_t> shape);
  // Local: forgets every allocation (the next alloc starts at the beginning of the storage).
  void reset();
  size_t storage_bytes() const;
  size_t used_bytes() const;

  // Collective, in place. Each tensor lies in the registered storage, numel divisible by W (any
  // dtype, sizes and dtypes mixed); this rank's shard, elements [rank·s, (rank+1)·s), holds its
  // input. Afterwards each tensor holds every rank's shard in rank order. One all_gather moves
  // every tensor. The list (count, dtypes, sizes) must be the same on every rank.
  void all_gather(std::span<const Tensor> tensors);

  // Collective, in place. Each tensor is f32 in the registered storage, numel divisible by W.
  // Afterwards this rank's shard of each tensor, elements [rank·s, (rank+1)·s), holds
  //   scale · (x_rank + x_{rank-1} + x_{rank-2} + ... )   (cyclic, summed left to right in fp32)
  // where x_r is rank r's shard `rank` of that tensor; the rest of the tensor is left as it was.
  // With bf16 transport every x_r that travels (r ≠ rank) is rounded stochastically to bf16; this
  // rank's own x_rank is used as it is. The list and the options must be the same on every rank.
  void reduce_scatter(std::span<const Tensor> tensors, const ReduceScatterOptions& opts = {});

  const BucketConfig& config() const;
  BucketAlgo path() const;  // the resolved reduce_scatter lowering (never automatic)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
