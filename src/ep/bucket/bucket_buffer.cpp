// BucketBuffer: the registered storage, the per-call agreement (every rank checks its tensors, and
// one all_reduce agrees on validity, count, dtypes and sizes, and the options, before any data
// moves), and the facade over the data movement (gather.cpp, reduce_scatter.cpp). docs/ep.md §13.
#include <deepinfer/bucket.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <string>
#include <utility>

#include "core/check.h"
#include "ep/bucket/lowerings.h"
#include "ep/bucket/stochastic.h"

namespace deepinfer {
namespace {

constexpr size_t kAlign = 64;  // bytes; every alloc starts on a cache line

struct Field {
  const char* name;
  int64_t value;  // |value| < 2^62, so -value never overflows
};

// Collective: one MAX all_reduce of [invalid rank + 1, then (v, -v) per field]. Every rank learns
// whether any rank's input is invalid and whether every field agrees; each throws alike.
void agree(Group& g, std::string_view op, const std::string& err, std::span<const Field> fields) {
  std::vector<int64_t> v(1 + 2 * fields.size());
  v[0] = err.empty() ? 0 : g.rank() + 1;
  for (size_t i = 0; i < fields.size(); ++i) {
    v[1 + 2 * i] = fields[i].value;
    v[2 + 2 * i] = -fields[i].value;
  }
  g.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (!err.empty()) DI_FAIL("BucketBuffer::{} on rank {}: {}", op, g.rank(), err);
  if (v[0])
    DI_FAIL("BucketBuffer::{}: rank {} passed invalid input (see its error); nothing moved", op,
            v[0] - 1);
  for (size_t i = 0; i < fields.size(); ++i)
    if (v[1 + 2 * i] != -v[2 + 2 * i])
      DI_FAIL(
          "BucketBuffer::{}: the {} differ between ranks (this rank: {}, range {} .. {}); every "
          "rank must pass the same list of tensors and options; nothing moved",
          op, fields[i].name, fields[i].value, -v[2 + 2 * i], v[1 + 2 * i]);
}

int64_t fold62(uint64_t h) { return int64_t(h >> 2); }

}  // namespace

struct BucketBuffer::Impl {
  Group& g;
  BucketConfig cfg;
  BucketAlgo path = BucketAlgo::ag;
  std::shared_ptr<std::byte> storage;
  size_t used = 0;
  ep::bucket::Scratch scratch;

  Impl(Group& group, const BucketConfig& c) : g(group), cfg(c) {}

  // This rank's problem with one call's tensors ("" if none); shard[i] = bytes of one shard.
  std::string check(std::span<const Tensor> ts, bool f32_only, std::vector<size_t>& shard) const {
    const size_t w = size_t(g.size());
    const auto* lo = storage.get();
    const auto* hi = lo + cfg.storage_bytes;
    std::vector<std::pair<const std::byte*, const std::byte*>> spans;
    for (size_t i = 0; i < ts.size(); ++i) {
      const Tensor& t = ts[i];
      const std::string what =
          fmt::format("tensor {} ({})", i, t.defined() ? t.describe() : "none");
      if (!t.defined() && t.numel() != 0) return what + " is undefined; pass tensors from alloc()";
      if (!t.is_contiguous()) return what + " is not contiguous";
      if (f32_only && t.dtype() != DType::f32)
        return what + " must be f32 (reduce_scatter sums fp32 values)";
      if (size_t(t.numel()) % w != 0)
        return fmt::format("{} has {} elements, not a multiple of the world size {}", what,
                           t.numel(), w);
      shard[i] = t.nbytes() / w;
      if (t.nbytes() == 0) continue;
      const auto* b = static_cast<const std::byte*>(t.raw());
      if (b < lo || b + t.nbytes() > hi)
        return what + " is not in this buffer's registered storage; allocate it with alloc()";
      spans.emplace_back(b, b + t.nbytes());
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        return "two tensors of the list overlap in the storage; pass each tensor once";
    return {};
  }

  // Agrees on one call; afterwards shard holds every tensor's shard bytes (the same everywhere).
  void agree_call(std::string_view op, std::span<const Tensor> ts, bool f32_only,
                  std::vector<size_t>& shard, std::span<const Field> extra, std::string err = {}) {
    shard.assign(ts.size(), 0);
    if (err.empty()) err = check(ts, f32_only, shard);
    uint64_t sig = 0x6a09e667f3bcc909ull;
    int64_t bytes = 0;
    for (const Tensor& t : ts) {
      sig = ep::bucket::splitmix64(sig ^ (uint64_t(t.dtype()) << 56) ^ uint64_t(t.numel()));
      bytes += int64_t(t.nbytes());
    }
    std::vector<Field> f{{"tensor counts", int64_t(ts.size())},
                         {"dtypes or sizes of the tensors", fold62(sig)},
                         {"total bytes", bytes}};
    f.insert(f.end(), extra.begin(), extra.end());
    agree(g, op, err, f);
  }
};

BucketBuffer::BucketBuffer(Group& group, const BucketConfig& config)
    : impl_(std::make_unique<Impl>(group, config)) {
  Impl& s = *impl_;
  std::string err;
  try {
    s.path = ep::bucket::choose_path(config.algo, group.capabilities());
  } catch (const Error& e) {
    err = e.what();
  }
  const Field algo{"algorithms", int64_t(config.algo)};
  agree(group, "BucketBuffer", err, std::span(&algo, 1));
  s.storage = detail::host_alloc(std::max<size_t>(config.storage_bytes, 1));
}

BucketBuffer::~BucketBuffer() = default;

Tensor BucketBuffer::alloc(DType dtype, std::vector<int64_t> shape) {
  Impl& s = *impl_;
  const Tensor probe = Tensor::borrow(s.storage.get(), dtype, shape);
  const size_t at = (s.used + kAlign - 1) / kAlign * kAlign;
  if (at + probe.nbytes() > s.cfg.storage_bytes)
    DI_FAIL(
        "BucketBuffer::alloc: {} ({} bytes) does not fit: {} of {} storage bytes are in use; "
        "construct the buffer with a larger storage_bytes",
        probe.describe(), probe.nbytes(), s.used, s.cfg.storage_bytes);
  s.used = at + probe.nbytes();
  // Shares the storage's use count: the tensor keeps the storage alive.
  return Tensor::borrow(std::shared_ptr<std::byte>(s.storage, s.storage.get() + at), dtype,
                        std::move(shape));
}

void BucketBuffer::reset() { impl_->used = 0; }
size_t BucketBuffer::storage_bytes() const { return impl_->cfg.storage_bytes; }
size_t BucketBuffer::used_bytes() const { return impl_->used; }
const BucketConfig& BucketBuffer::config() const { return impl_->cfg; }
BucketAlgo BucketBuffer::path() const { return impl_->path; }

void BucketBuffer::all_gather(std::span<const Tensor> tensors) {
  Impl& s = *impl_;
  std::vector<size_t> shard;
  s.agree_call("all_gather", tensors, false, shard, {});
  std::vector<std::byte*> ptrs;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (shard[i]) {
      ptrs.push_back(static_cast<std::byte*>(tensors[i].raw()));
      sizes.push_back(shard[i]);
    }
  if (!ptrs.empty()) ep::bucket::gather_shards(s.g, ptrs, sizes, s.scratch);
}

void BucketBuffer::reduce_scatter(std::span<const Tensor> tensors,
                                  const ReduceScatterOptions& opts) {
  Impl& s = *impl_;
  std::vector<size_t> shard;
  const bool bad_opts = !std::isfinite(opts.scale) || (opts.precision != BucketPrecision::fp32 &&
                                                       opts.precision != BucketPrecision::bf16);
  const std::array<Field, 4> extra{{
      {"precisions", int64_t(opts.precision)},
      {"scales", int64_t(std::bit_cast<uint32_t>(opts.scale))},
      {"seeds (high half)", int64_t(opts.seed >> 32)},
      {"seeds (low half)", int64_t(opts.seed & 0xffffffffu)},
  }};
  s.agree_call("reduce_scatter", tensors, true, shard, extra,
               bad_opts
                   ? fmt::format("scale {} must be finite and precision fp32 or bf16", opts.scale)
                   : std::string());
  std::vector<float*> ptrs;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ptrs.push_back(tensors[i].data<float>());
    sizes.push_back(shard[i] / 4);
  }
  size_t total = 0;
  for (size_t b : shard) total += b;
  if (total)  // agreed: the same on every rank
    ep::bucket::reduce_scatter_shards(s.g, s.path, ptrs, sizes, opts, s.scratch);
}

}  // namespace deepinfer
