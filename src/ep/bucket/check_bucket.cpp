#include "ep/bucket/check_bucket.h"

#include <deepinfer/bucket.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/log.h"
#include "ep/bucket/stochastic.h"

namespace deepinfer::ep::bucket {
namespace {

constexpr size_t kStorageBytes = size_t(4) << 20;

uint64_t key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(seed ^ a) ^ b) ^ c);
}

// Byte k of rank r's shard of tensor i in all_gather case c is ag_byte(ag_key(...), k): the closed
// form every rank knows.
uint64_t ag_key(uint64_t seed, int c, int r, size_t i) {
  return key(seed, uint64_t(c), uint64_t(r), i);
}
std::byte ag_byte(uint64_t k0, size_t k) { return std::byte(splitmix64(k0 + k) & 0xff); }

// Rank r's value at element e of tensor i in reduce_scatter case c is rs_value(rs_key(...), e): a
// sign, 24 random mantissa bits and an exponent in [-8, 8], so that the order of the sum shows in
// its rounding.
uint64_t rs_key(uint64_t seed, int c, int r, size_t i) {
  return key(seed ^ 0x5151, uint64_t(c), uint64_t(r), i);
}
float rs_value(uint64_t k0, size_t e) {
  const uint64_t h = splitmix64(k0 + e);
  const float m = float(h & 0xffffff) / float(1 << 24) + 0.5f;  // [0.5, 1.5)
  const int ex = int((h >> 24) % 17) - 8;
  return std::ldexp((h >> 40) & 1 ? -m : m, ex);
}

// The reference's stochastic rounding, written apart from the buffer's (which adds the random bits
// to the float's bit pattern): x lies between the bf16 values `below` and `below + ulp` (in
// magnitude) at the fraction p of the way, and goes up iff the draw r >= 2^16·(1 - p). Normal
// finite x only (the generated values are).
float ref_round_stochastic(float x, uint16_t r) {
  const double a = std::fabs(double(x));
  int e = 0;
  std::frexp(a, &e);                          // a = f·2^e, f in [0.5, 1)
  const double ulp = std::ldexp(1.0, e - 8);  // bf16 keeps 8 significant bits
  const double below = std::floor(a / ulp) * ulp;
  const double frac = (a - below) / ulp;  // a multiple of 2^-16 in [0, 1)
  const double up = frac * 65536.0 + double(r) >= 65536.0 ? ulp : 0.0;
  return float(std::copysign(below + up, double(x)));
}

struct AgItem {
  DType dtype;
  int64_t shard;  // elements per rank
};

struct Runner {
  Group& g;
  const CheckBucketOptions& o;
  BucketBuffer buf;
  CheckBucketResult res;
  int w() const { return g.size(); }

  Runner(Group& group, const CheckBucketOptions& opts, BucketAlgo algo)
      : g(group), o(opts), buf(group, BucketConfig{kStorageBytes, algo}) {}

  // Agrees on one case's outcome (failed on any rank = failed) and counts it.
  void count(const std::string& name, bool ok) {
    int64_t bad = ok ? 0 : 1;
    g.all_reduce(&bad, 1, DType::i64, ReduceOp::max);
    (bad ? res.failed : res.passed) += 1;
    if (g.rank() == 0 && (bad || o.verbose))
      log_info("check bucket {} [{}]", bad ? "FAIL" : "ok", name);
  }

  // The list of all_gather case c: the same on every rank (it depends on (seed, c) only).
  std::vector<AgItem> ag_list(int c) const {
    const int64_t big = ((int64_t(1) << 20) + w() - 1) / w();  // >= 1 MiB gathered
    if (c == 0) return {};
    if (c == 1) return {{DType::u8, big}};  // one tensor: gathered in place
    if (c == 2) return {{DType::f32, 5}};
    if (c == 3)
      return {{DType::bf16, big / 2}, {DType::i32, 3}, {DType::e4m3, 0}, {DType::f64, 17}};
    static constexpr DType kTypes[] = {DType::f32,  DType::f64, DType::bf16, DType::e4m3,
                                       DType::e5m2, DType::i32, DType::i64,  DType::u8};
    static constexpr int64_t kShards[] = {0, 1, 3, 17, 64, 100, 1000, 4097};
    std::vector<AgItem> v(2 + key(o.seed, 77, uint64_t(c), 0) % 5);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint64_t h = key(o.seed, 78, uint64_t(c), i);
      v[i] = {kTypes[h % 8], kShards[(h >> 8) % 8]};
    }
    return v;
  }

  bool ag_case(int c, std::string& why) {
    buf.reset();
    const std::vector<AgItem> list = ag_list(c);
    const size_t W = size_t(w()), rank = size_t(g.rank());
    std::vector<Tensor> ts;
    std::vector<std::vector<std::byte>> plain;
    for (size_t i = 0; i < list.size(); ++i) {
      ts.push_back(buf.alloc(list[i].dtype, {int64_t(W) * list[i].shard}));
      const size_t sb = ts[i].nbytes() / W;
      auto* p = static_cast<std::byte*>(ts[i].raw());
      if (ts[i].nbytes()) std::memset(p, 0xa5, ts[i].nbytes());  // every byte must be overwritten
      const uint64_t k0 = ag_key(o.seed, c, int(rank), i);
      for (size_t k = 0; k < sb; ++k) p[rank * sb + k] = ag_byte(k0, k);
      // The plain reference: one Group::all_gather per tensor, from a copy of the shard.
      std::vector<std::byte> mine(p + rank * sb, p + (rank + 1) * sb);
      plain.emplace_back(W * sb);
      if (sb) g.all_gather(mine.data(), plain.back().data(), sb, DType::u8);
    }
    buf.all_gather(ts);
    for (size_t i = 0; i < ts.size(); ++i) {
      const size_t sb = ts[i].nbytes() / W;
      const auto* p = static_cast<const std::byte*>(ts[i].raw());
      if (sb && std::memcmp(p, plain[i].data(), W * sb) != 0) {
        why = fmt::format("tensor {} ({}) differs from the plain all_gather", i, ts[i].describe());
        return false;
      }
      for (size_t r = 0; r < W; ++r) {
        const uint64_t k0 = ag_key(o.seed, c, int(r), i);
        for (size_t k = 0; k < sb; ++k)
          if (p[r * sb + k] != ag_byte(k0, k)) {
            why = fmt::format("tensor {} ({}): byte {} of rank {}'s shard is wrong", i,
                              ts[i].describe(), k, r);
            return false;
          }
      }
    }
    return true;
  }

  // The host reduce_scatter: this rank's element k of tensor i (shard s), from every rank's
  // generated inputs (keys[r]: rank r's values of the tensor; streams[r]: its stochastic rounding),
  // own first, then rank-1, rank-2, ... (cyclic), in fp32, scaled once.
  float rs_reference(const std::vector<uint64_t>& keys, const std::vector<uint64_t>& streams,
                     size_t s, size_t k, const ReduceScatterOptions& ro) const {
    const int W = w(), d = g.rank();
    const size_t e = size_t(d) * s + k;
    float acc = rs_value(keys[size_t(d)], e);
    for (int j = 1; j < W; ++j) {
      const int r = (d - j + W) % W;
      float v = rs_value(keys[size_t(r)], e);
      if (ro.precision == BucketPrecision::bf16)
        v = ref_round_stochastic(v, sr_bits(streams[size_t(r)], e));
      acc += v;
    }
    return acc * ro.scale;
  }

  // Runs reduce_scatter case c (shards per tensor) and checks it; `out` gets this rank's shards.
  bool rs_case(int c, const std::vector<int64_t>& shards, const ReduceScatterOptions& ro,
               std::string& why, std::vector<float>* out = nullptr) {
    buf.reset();
    const size_t W = size_t(w()), rank = size_t(g.rank());
    std::vector<Tensor> ts;
    for (size_t i = 0; i < shards.size(); ++i) {
      ts.push_back(buf.alloc(DType::f32, {int64_t(W) * shards[i]}));
      const uint64_t k0 = rs_key(o.seed, c, int(rank), i);
      for (size_t e = 0; e < size_t(ts[i].numel()); ++e) ts[i].data<float>()[e] = rs_value(k0, e);
    }
    buf.reduce_scatter(ts, ro);
    for (size_t i = 0; i < ts.size(); ++i) {
      const size_t s = size_t(shards[i]);
      const float* p = ts[i].data<float>();
      std::vector<uint64_t> keys(W), streams(W);
      for (size_t r = 0; r < W; ++r) {
        keys[r] = rs_key(o.seed, c, int(r), i);
        streams[r] = sr_stream(ro.seed, int(r), i);
      }
      for (size_t e = 0; e < W * s; ++e) {
        const bool own = e / s == rank;
        const float want =
            own ? rs_reference(keys, streams, s, e - rank * s, ro) : rs_value(keys[rank], e);
        if (std::memcmp(&p[e], &want, 4) != 0) {
          why = fmt::format("tensor {} element {} ({}): got {:a}, want {:a}", i, e,
                            own ? "own shard" : "outside the own shard, must be unchanged", p[e],
                            want);
          return false;
        }
      }
      if (out) out->insert(out->end(), p + rank * s, p + (rank + 1) * s);
    }
    return true;
  }

  void run(const std::string& name, const std::function<bool(std::string&)>& fn) {
    std::string why;
    bool ok = false;
    try {
      ok = fn(why);
    } catch (const Error& e) {
      why = e.what();
    }
    if (!ok) log_error("check bucket [{}] rank {}: {}", name, g.rank(), why);
    count(name, ok);
  }

  // An Error on every rank where `expected` (else no Error), and nothing hangs.
  void expect_error(const std::string& name, bool expected, const std::function<void()>& fn) {
    bool threw = false;
    std::string msg;
    try {
      fn();
    } catch (const Error& e) {
      threw = true;
      msg = e.what();
    }
    if (threw != expected)
      log_error("check bucket [{}] rank {}: {}", name, g.rank(),
                threw ? "unexpected Error: " + msg : std::string("no Error"));
    count(name, threw == expected);
  }

  void run_all_gather() {
    for (int c = 0; c < 14; ++c) {
      std::string desc;
      for (const AgItem& it : ag_list(c))
        desc += fmt::format("{}{}[{}·{}]", desc.empty() ? "" : " ", dtype_name(it.dtype), w(),
                            it.shard);
      run(fmt::format("all_gather case {}: [{}]", c, desc),
          [&](std::string& why) { return ag_case(c, why); });
    }
  }

  void run_reduce_scatter() {
    static const std::vector<std::vector<int64_t>> kLists = {
        {4096}, {3080, 1, 0, 37}, {0}, {1000, 4096}};
    static constexpr float kScales[] = {1.0f, 0.25f, 1.0f / 3.0f, -2.0f};
    for (BucketPrecision p : {BucketPrecision::fp32, BucketPrecision::bf16})
      for (size_t c = 0; c < kLists.size(); ++c) {
        const ReduceScatterOptions ro{p, kScales[c], o.seed * 1000 + c};
        run(fmt::format("reduce_scatter path={} {} scale={} shards={}", to_string(buf.path()),
                        to_string(p), ro.scale, fmt::join(kLists[c], ",")),
            [&](std::string& why) { return rs_case(int(c), kLists[c], ro, why); });
      }
    // bf16: the same seed gives the same bytes; another seed gives other bytes (W > 1).
    run(fmt::format("reduce_scatter path={} bf16 reproducible from its seed",
                    to_string(buf.path())),
        [&](std::string& why) {
          std::vector<float> a, b, other;
          const ReduceScatterOptions ro{BucketPrecision::bf16, 1.0f, o.seed + 99};
          ReduceScatterOptions ro2 = ro;
          ro2.seed += 1;
          if (!rs_case(9, {4096}, ro, why, &a) || !rs_case(9, {4096}, ro, why, &b) ||
              !rs_case(9, {4096}, ro2, why, &other))
            return false;
          if (a != b) why = "the same seed gave other bytes";
          if (w() > 1 && a == other) why = "another seed gave the same bytes";
          return why.empty();
        });
  }

  void run_errors() {
    const bool multi = w() > 1;
    const bool last = g.rank() == w() - 1;
    const int64_t W = w();
    auto ag = [&](std::vector<Tensor> ts) { buf.all_gather(ts); };
    buf.reset();
    expect_error("all_gather: one tensor fewer on the last rank", multi, [&] {
      buf.reset();
      std::vector<Tensor> ts{buf.alloc(DType::u8, {W * 4}), buf.alloc(DType::u8, {W * 4})};
      if (last) ts.pop_back();
      ag(ts);
    });
    expect_error("all_gather: another dtype (same bytes) on the last rank", multi, [&] {
      buf.reset();
      ag({buf.alloc(last ? DType::i32 : DType::f32, {W * 4})});
    });
    expect_error("all_gather: another size on the last rank", multi, [&] {
      buf.reset();
      ag({buf.alloc(DType::bf16, {W * (last ? 5 : 4)})});
    });
    expect_error("all_gather: unregistered storage on the last rank", true, [&] {
      buf.reset();
      Tensor t = buf.alloc(DType::u8, {W * 4});
      if (last) t = Tensor::zeros(DType::u8, {W * 4});
      ag({t});
    });
    expect_error("all_gather: numel not a multiple of W", multi, [&] {
      buf.reset();
      ag({buf.alloc(DType::u8, {W + 1})});
    });
    expect_error("all_gather: two tensors overlap on rank 0", true, [&] {
      buf.reset();
      Tensor a = buf.alloc(DType::u8, {W * 8}), b = buf.alloc(DType::u8, {W * 8});
      ag({a, g.rank() == 0 ? a : b});
    });
    auto rs = [&](std::vector<Tensor> ts, const ReduceScatterOptions& ro) {
      buf.reduce_scatter(ts, ro);
    };
    expect_error("reduce_scatter: bf16 input on the last rank", true, [&] {
      buf.reset();
      rs({buf.alloc(last ? DType::bf16 : DType::f32, {W * 4})}, {});
    });
    expect_error("reduce_scatter: another scale on the last rank", multi, [&] {
      buf.reset();
      rs({buf.alloc(DType::f32, {W * 4})}, {BucketPrecision::fp32, last ? 0.5f : 1.0f, 0});
    });
    expect_error("reduce_scatter: another seed on the last rank", multi, [&] {
      buf.reset();
      rs({buf.alloc(DType::f32, {W * 4})}, {BucketPrecision::bf16, 1.0f, last ? 8ull << 40 : 7});
    });
    expect_error("reduce_scatter: unregistered storage on rank 0", true, [&] {
      buf.reset();
      Tensor t = buf.alloc(DType::f32, {W * 4});
      if (g.rank() == 0) t = Tensor::zeros(DType::f32, {W * 4});
      rs({t}, {});
    });
    expect_error("reduce_scatter: a NaN scale", true, [&] {
      buf.reset();
      rs({buf.alloc(DType::f32, {W * 4})}, {BucketPrecision::fp32, NAN, 0});
    });
    run("all_gather after the errors", [&](std::string& why) { return ag_case(4, why); });
  }
};

}  // namespace

CheckBucketResult run_check_bucket(Group& group, const CheckBucketOptions& opts) {
  CheckBucketResult total;
  std::vector<BucketAlgo> algos{BucketAlgo::ag};
  if (group.capabilities().all_to_all) algos.push_back(BucketAlgo::a2a);
  algos.push_back(BucketAlgo::automatic);
  for (size_t a = 0; a < algos.size(); ++a) {
    Runner r(group, opts, algos[a]);
    if (a == 0) {  // all_gather and the errors do not depend on the reduce_scatter lowering
      r.run_all_gather();
      r.run_errors();
    }
    r.run_reduce_scatter();
    total.passed += r.res.passed;
    total.failed += r.res.failed;
  }
  return total;
}

}  // namespace deepinfer::ep::bucket
