// BucketBuffer::reduce_scatter's data movement (docs/ep.md §13.3). Each rank packs, for every
// destination d, shard d of each tensor side by side (fp32, or bf16 rounded stochastically), moves
// the blocks with one all_to_all (a2a) or one all_gather (ag: every rank gets every block and keeps
// its own), then sums into its own shard: own values first, then rank-1, rank-2, ... (cyclic) in
// fp32, and scales once.
#include <bit>
#include <cstring>

#include "core/check.h"
#include "ep/bucket/lowerings.h"
#include "ep/bucket/stochastic.h"

namespace deepinfer {

std::string_view to_string(BucketAlgo a) {
  switch (a) {
    case BucketAlgo::a2a:
      return "a2a";
    case BucketAlgo::ag:
      return "ag";
    case BucketAlgo::automatic:
      return "auto";
  }
  return "?";
}

std::string_view to_string(BucketPrecision p) {
  return p == BucketPrecision::bf16 ? "bf16" : "fp32";
}

namespace ep::bucket {

BucketAlgo choose_path(BucketAlgo requested, const Capabilities& caps) {
  if (requested == BucketAlgo::a2a && !caps.all_to_all)
    DI_FAIL(
        "BucketBuffer: algo a2a needs a trusted all_to_all, which this backend lacks; use algo "
        "ag (or auto)");
  if (requested != BucketAlgo::automatic) return requested;
  return caps.all_to_all ? BucketAlgo::a2a : BucketAlgo::ag;
}

void reduce_scatter_shards(Group& g, BucketAlgo path, std::span<float* const> tensors,
                           std::span<const size_t> shard, const ReduceScatterOptions& opts,
                           Scratch& sc) {
  const size_t w = size_t(g.size()), rank = size_t(g.rank());
  const bool bf = opts.precision == BucketPrecision::bf16;
  const size_t item = bf ? 2 : 4;
  size_t block = 0;  // bytes of one destination's shards, side by side
  for (size_t s : shard) block += s * item;
  sc.send.resize(w * block);
  for (size_t d = 0; d < w; ++d) {
    if (d == rank) continue;  // the own shard does not travel
    std::byte* dst = sc.send.data() + d * block;
    for (size_t i = 0; i < tensors.size(); dst += shard[i] * item, ++i) {
      const float* src = tensors[i] + d * shard[i];
      if (!bf) {
        if (shard[i]) std::memcpy(dst, src, shard[i] * 4);
        continue;
      }
      const uint64_t stream = sr_stream(opts.seed, int(rank), i);
      auto* out = reinterpret_cast<bf16*>(dst);
      for (size_t k = 0; k < shard[i]; ++k)
        out[k] = round_bf16_stochastic(src[k], sr_bits(stream, d * shard[i] + k));
    }
  }
  // from(r): rank r's block for this rank.
  const std::byte* base = nullptr;
  size_t stride = 0;
  if (path == BucketAlgo::a2a) {
    sc.recv.resize(w * block);
    g.all_to_all(sc.send.data(), sc.recv.data(), block, DType::u8);
    base = sc.recv.data();
    stride = block;
  } else {
    sc.recv.resize(w * w * block);
    g.all_gather(sc.send.data(), sc.recv.data(), w * block, DType::u8);
    base = sc.recv.data() + rank * block;
    stride = w * block;
  }
  size_t off = 0;
  for (size_t i = 0; i < tensors.size(); off += shard[i] * item, ++i) {
    float* acc = tensors[i] + rank * shard[i];
    for (size_t j = 1; j < w; ++j) {
      const std::byte* b = base + ((rank + w - j) % w) * stride + off;
      if (bf) {
        const auto* v = reinterpret_cast<const bf16*>(b);
        for (size_t k = 0; k < shard[i]; ++k) acc[k] += bf16_to_f32(v[k]);
      } else {
        const auto* v = reinterpret_cast<const float*>(b);
        for (size_t k = 0; k < shard[i]; ++k) acc[k] += v[k];
      }
    }
    for (size_t k = 0; k < shard[i]; ++k) acc[k] *= opts.scale;
  }
}

}  // namespace ep::bucket
}  // namespace deepinfer
