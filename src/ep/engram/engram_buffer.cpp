// EngramBuffer: the config and shard agreements, the per-fetch agreement on the indices, and the
// facade over the lowerings (ep/engram/path.h chooses one; each lives in a file of its own).
// docs/ep.md §12.
#include <deepinfer/engram.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "core/check.h"
#include "ep/engram/lowerings.h"
#include "ep/engram/path.h"

namespace deepinfer {

namespace ep::engram {

void Context::pack_entry(int64_t row, std::byte* dst) const {
  std::memcpy(dst, shard + size_t(row) * data_bytes, data_bytes);
  if (sf_bytes) std::memcpy(dst + data_bytes, sf + size_t(row) * sf_bytes, sf_bytes);
}

std::vector<int32_t> distinct_ids(std::span<const int32_t> idx) {
  std::vector<int32_t> ids;
  ids.reserve(idx.size());
  for (int32_t g : idx)
    if (g >= 0) ids.push_back(g);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void place_entry(const Context& c, const Request& r, const std::byte* e, size_t p) {
  std::memcpy(r.data_out + p * c.data_bytes, e, c.data_bytes);
  if (c.sf_bytes) std::memcpy(r.sf_out + p * c.sf_bytes, e + c.data_bytes, c.sf_bytes);
}

void place_from(const Context& c, const Request& r, std::span<const int32_t> ids,
                const std::byte* entries) {
  for (size_t p = 0; p < r.idx.size(); ++p) {
    if (r.idx[p] < 0) continue;
    const size_t i = size_t(std::lower_bound(ids.begin(), ids.end(), r.idx[p]) - ids.begin());
    place_entry(c, r, entries + i * c.entry_bytes(), p);
  }
}

}  // namespace ep::engram

EngramResult EngramFetch::wait() {
  if (!valid_) DI_FAIL("EngramFetch::wait: this handle holds no fetch (never started, or waited)");
  valid_ = false;
  return std::move(result_);
}

struct EngramBuffer::Impl {
  EngramConfig cfg;
  EngramAlgo path = EngramAlgo::ag;
  ep::engram::Context c;
  Tensor shard, sf;  // this rank's copy of its rows

  Impl(Group& g, const EngramConfig& config) : cfg(config), c(g) {}

  DType dtype() const { return cfg.dtype == EngramDType::fp8 ? DType::e4m3 : DType::bf16; }
  // Collective: where every rank's shard (and sf) is readable from here.
  void expose_shard() {
    std::vector<std::span<const std::byte>> regions{{c.shard, size_t(c.n) * c.data_bytes}};
    if (c.sf_bytes) regions.emplace_back(c.sf, size_t(c.n) * c.sf_bytes);
    c.group.expose(regions, c.peers);
  }
};

EngramBuffer::EngramBuffer(Group& group, const EngramConfig& config)
    : impl_(std::make_unique<Impl>(group, config)) {
  Impl& s = *impl_;
  s.c.world = group.size();
  s.c.rank = group.rank();
  std::string err;
  if (config.hidden < 1) err = fmt::format("hidden = {} must be >= 1", config.hidden);
  const bool fp8 = config.dtype == EngramDType::fp8;
  if (fp8 && config.scale_cols < 1)
    err = fmt::format("scale_cols = {} must be >= 1 for fp8", config.scale_cols);
  if (!fp8 && config.scale_cols != 0)
    err = fmt::format("scale_cols = {} must be 0 for bf16", config.scale_cols);
  // The enums come from the caller as any byte: one outside its values is no table format or path.
  if (config.dtype != EngramDType::bf16 && !fp8)
    err = fmt::format("dtype must be bf16 or fp8, got the value {}", int(config.dtype));
  if (config.algo != EngramAlgo::ag && config.algo != EngramAlgo::a2a &&
      config.algo != EngramAlgo::direct && config.algo != EngramAlgo::automatic)
    err = fmt::format("algo must be ag, a2a, direct or automatic, got the value {}",
                      int(config.algo));
  // One MAX all_reduce of (v, -v) pairs: every rank learns whether any rank is invalid and
  // whether the fields agree.
  const std::array<int64_t, 4> f{config.hidden, int64_t(config.dtype), config.scale_cols,
                                 int64_t(config.algo)};
  std::array<int64_t, 9> v{};
  v[0] = err.empty() ? 0 : 1;
  for (size_t i = 0; i < f.size(); ++i) {
    v[1 + 2 * i] = f[i];
    v[2 + 2 * i] = -f[i];
  }
  group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (!err.empty()) DI_FAIL("EngramBuffer: {}", err);
  if (v[0]) DI_FAIL("EngramBuffer: another rank's config is invalid (see its error)");
  static constexpr std::array<const char*, 4> names{"hidden", "dtype", "scale_cols", "algo"};
  for (size_t i = 0; i < f.size(); ++i)
    if (v[1 + 2 * i] != -v[2 + 2 * i])
      DI_FAIL("EngramBuffer: {} differs between ranks ({} .. {}); every rank needs the same config",
              names[i], -v[2 + 2 * i], v[1 + 2 * i]);
  s.path = ep::engram::choose_path(config.algo, group.peer_memory(), group.capabilities());
  s.c.data_bytes = size_t(config.hidden) * dtype_size(s.dtype());
  s.c.sf_bytes = size_t(config.scale_cols) * 4;
}

EngramBuffer::~EngramBuffer() = default;

const EngramConfig& EngramBuffer::config() const { return impl_->cfg; }
int64_t EngramBuffer::rows_per_rank() const { return impl_->c.n; }
EngramAlgo EngramBuffer::path() const { return impl_->path; }

void EngramBuffer::write(const Tensor& storage, const Tensor& sf) {
  Impl& s = *impl_;
  const EngramConfig& cfg = s.cfg;
  const bool fp8 = cfg.dtype == EngramDType::fp8;
  std::string err;
  const int64_t n = storage.defined() && storage.ndim() == 2 ? storage.dim(0) : 0;
  if (!storage.defined() || storage.ndim() != 2 || storage.dtype() != s.dtype() ||
      storage.dim(1) != cfg.hidden || !storage.is_contiguous() || n < 1)
    err = fmt::format("storage must be a contiguous [n >= 1, {}] {} tensor, got {}", cfg.hidden,
                      dtype_name(s.dtype()), storage.defined() ? storage.describe() : "none");
  else if (fp8 && (!sf.defined() || sf.dtype() != DType::f32 || sf.ndim() != 2 || sf.dim(0) != n ||
                   sf.dim(1) != cfg.scale_cols || !sf.is_contiguous()))
    err = fmt::format("sf must be a contiguous [{}, {}] f32 tensor, got {}", n, cfg.scale_cols,
                      sf.defined() ? sf.describe() : "none");
  else if (!fp8 && sf.defined())
    err = "sf is for fp8 tables only; pass none for bf16";
  std::array<int64_t, 3> v{err.empty() ? 0 : 1, n, -n};
  s.c.group.all_reduce(v.data(), v.size(), DType::i64, ReduceOp::max);
  if (!err.empty()) DI_FAIL("EngramBuffer::write: {}", err);
  if (v[0]) DI_FAIL("EngramBuffer::write: another rank's shard is invalid (see its error)");
  if (v[1] != -v[2])
    DI_FAIL(
        "EngramBuffer::write: rows per rank differ between ranks ({} .. {}); every rank "
        "holds the same n",
        -v[2], v[1]);
  if (int64_t(s.c.world) * n > int64_t(INT32_MAX))
    DI_FAIL("EngramBuffer::write: W·n = {} rows do not fit int32 indices", int64_t(s.c.world) * n);
  // Past the agreement every rank has finished its previous fetch, so no peer still reads the
  // old shard.
  s.shard = storage.clone();
  s.sf = fp8 ? sf.clone() : Tensor();
  s.c.n = n;
  s.c.shard = static_cast<const std::byte*>(s.shard.raw());
  s.c.sf = fp8 ? static_cast<const std::byte*>(s.sf.raw()) : nullptr;
  s.c.peers.clear();
  // Direct in one address space: exposed once per write, read in place (the shard changes only
  // at the next write, whose agreement no rank passes while a peer still reads). On a window
  // each fetch exposes again: another user of the group's window may overwrite it between.
  if (s.path == EngramAlgo::direct && s.c.group.peer_memory() == PeerMemory::address_space)
    s.expose_shard();
}

EngramFetch EngramBuffer::start_fetch(const Tensor& indices) {
  Impl& s = *impl_;
  ep::engram::Context& c = s.c;
  if (c.n == 0) DI_FAIL("EngramBuffer::fetch: no table yet; call write() on every rank first");
  const int64_t limit = int64_t(c.world) * c.n;
  std::string err;
  int64_t bad = 0;
  // An empty [0, J] view may have no storage (T = 0 borrowed from an empty vector).
  const int nd = indices.ndim();
  if ((nd != 2 && nd != 3) || (!indices.defined() && indices.numel() != 0) ||
      indices.dtype() != DType::i32 || !indices.is_contiguous())
    err = fmt::format("indices must be a contiguous [T, J] or [L, T, J] i32 tensor, got {}",
                      indices.ndim() ? indices.describe() : "none");
  // [L, T, J] is L·T rows of J ids: one exchange for every layer.
  const int64_t layers = err.empty() && nd == 3 ? indices.dim(0) : 1;
  const int64_t t = err.empty() ? indices.dim(-2) : 0, j = err.empty() ? indices.dim(-1) : 0;
  const std::span<const int32_t> idx(err.empty() ? indices.data<int32_t>() : nullptr,
                                     size_t(layers * t * j));
  for (size_t p = 0; p < idx.size() && err.empty(); ++p)
    if (idx[p] < -1 || idx[p] >= limit) {
      bad = idx[p];
      err = fmt::format("index {} at flat position {} of {} is outside [-1, {}) (W·n = {}·{})", bad,
                        p, indices.describe(), limit, c.world, c.n);
    }
  const std::vector<int32_t> ids =
      err.empty() ? ep::engram::distinct_ids(idx) : std::vector<int32_t>{};
  // One all_gather agrees on validity before any row moves and gives every rank every rank's
  // count and its distinct ids per owner: [invalid, bad index, T·J, per owner W].
  const size_t w = size_t(c.world), row = 3 + w;
  std::vector<int64_t> mine(row, 0), all(row * w);
  mine[0] = err.empty() ? 0 : 1;
  mine[1] = bad;
  mine[2] = layers * t * j;
  for (int32_t g : ids) mine[3 + size_t(g / c.n)] += 1;
  c.group.all_gather(mine.data(), all.data(), row, DType::i64);
  if (!err.empty()) DI_FAIL("EngramBuffer::fetch: {}", err);
  for (size_t r = 0; r < w; ++r)
    if (all[r * row])
      DI_FAIL("EngramBuffer::fetch: rank {} passed an invalid index ({}); indices lie in [-1, {})",
              r, all[r * row + 1], limit);
  std::vector<int64_t> counts(w), owner_cnt(w * w);
  for (size_t r = 0; r < w; ++r) {
    counts[r] = all[r * row + 2];
    std::copy_n(&all[r * row + 3], w, &owner_cnt[r * w]);
  }

  EngramResult out;
  auto shape = [&](int64_t cols) {
    return nd == 3 ? std::vector<int64_t>{layers, t, j * cols} : std::vector<int64_t>{t, j * cols};
  };
  out.data = Tensor::zeros(s.dtype(), shape(s.cfg.hidden));
  if (c.sf_bytes) out.sf = Tensor::zeros(DType::f32, shape(s.cfg.scale_cols));
  ep::engram::Request req{idx,
                          ids,
                          counts,
                          owner_cnt,
                          static_cast<std::byte*>(out.data.raw()),
                          c.sf_bytes ? static_cast<std::byte*>(out.sf.raw()) : nullptr};
  switch (s.path) {
    case EngramAlgo::ag:
      ep::engram::fetch_ag(c, req);
      break;
    case EngramAlgo::a2a:
      ep::engram::fetch_a2a(c, req);
      break;
    case EngramAlgo::direct:
    case EngramAlgo::automatic:
      if (c.group.peer_memory() != PeerMemory::address_space) s.expose_shard();
      ep::engram::fetch_direct(c, req);
      // No rank leaves (to write a new shard, or to destroy its buffer) while a peer still reads
      // its rows.
      c.group.barrier();
      break;
  }
  return EngramFetch(std::move(out));
}

}  // namespace deepinfer
