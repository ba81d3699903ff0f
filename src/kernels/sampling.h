// Token sampling (docs/numerics.md §9): greedy, temperature, top-k, top-p; seeded, reproducible,
// batched.
//
// Each row draws one uniform u in [0, 1) from Philox4x32-10 keyed by (seed, counter) of that row,
// so a row's token depends only on its logits and its own settings -- never on the batch, the
// thread count or the backend. The runtime bumps `counter` once per generated token.
//
// Per row (V = vocab; SamplingParams holds the per-row settings):
//   temperature <= 0 or top_k == 1: argmax of the logits (ties -> lower id).
//   else x_i = l_i / temperature (fp32); candidates = the top_k largest x (ties -> lower id;
//   top_k <= 0 or >= V: all); e_i = exp(x_i - max x) in fp64; total = sum of e over the candidates
//   in id order. top_p < 1: keep the shortest prefix of the candidates sorted by x descending
//   (ties -> lower id) whose running fp64 sum reaches top_p * total (at least one token).
//   Draw: r = u * (sum of kept e in id order); the token is the first kept id, in id order,
//   whose running sum exceeds r (the last kept id if rounding leaves none).
// NaN logits are an error naming the row.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// Per-row settings are arrays of B; a null array means the default for every row.
struct SamplingParams {
  const float* logits = nullptr;       // [B, stride] f32
  const float* temperature = nullptr;  // [B] f32, <= 0: greedy (default 0: greedy)
  const int32_t* top_k = nullptr;      // [B] i32, <= 0: no top-k filter (default)
  const float* top_p = nullptr;        // [B] f32 in (0, 1], 1: no top-p filter (default)
  const int64_t* seed = nullptr;       // [B] i64 (bits of a u64), per request (default 0)
  const int64_t* counter = nullptr;    // [B] i64, per generated token of the request (default 0)
  int32_t* tokens = nullptr;           // [B] i32
  int64_t batch = 0;                   // B
  int64_t vocab = 0;                   // V
  int64_t logits_stride = 0;           // elements between rows of logits (0 = V)
  int64_t stride() const { return logits_stride ? logits_stride : vocab; }
  void validate() const;
};

// Philox4x32-10 (Salmon et al. 2011, Random123): 4 x u32 from a 128-bit counter and 64-bit key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
// The row's uniform in [0, 1) with 53 random bits: key = seed, counter = (counter, 0).
double sampling_uniform(uint64_t seed, uint64_t counter);

void sample(const SamplingParams& p);

namespace host {
void sample(const SamplingParams& p);
}
namespace cpu {
void sample(const SamplingParams& p);
}

template <>
struct OpSpec<SamplingParams> {
  static constexpr const char* name = "sample";
  static std::string shape(const SamplingParams& p) {
    return fmt::format("b={} v={}", p.batch, p.vocab);
  }
  template <class V>
  static void visit(SamplingParams& p, V& v) {
    v.in("logits", p.logits, p.batch ? (p.batch - 1) * p.stride() + p.vocab : 0);
    v.in("temperature", p.temperature, p.batch);
    v.in("top_k", p.top_k, p.batch);
    v.in("top_p", p.top_p, p.batch);
    v.in("seed", p.seed, p.batch);
    v.in("counter", p.counter, p.batch);
    v.out("tokens", p.tokens, p.batch);
  }
};

}  // namespace deepinfer::kernels
