// Engram: hash parameters (NumPy-compatible multipliers, distinct primes), checks, dispatch.
#include "kernels/engram.h"

#include <deepinfer/error.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/numpy_random.h"

namespace deepinfer::kernels {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t i = 2; i * i <= n; ++i)
    if (n % i == 0) return false;
  return true;
}

}  // namespace

// A config mistake: a user-facing Error (not an internal check).
#define DI_REQUIRE(cond, ...)          \
  do {                                 \
    if (!(cond)) DI_FAIL(__VA_ARGS__); \
  } while (0)

void EngramHashConfig::validate() const {
  DI_REQUIRE(!layer_ids.empty(), "engram: layer_ids is empty (list the blocks that carry Engram)");
  for (int64_t l : layer_ids) DI_REQUIRE(l >= 0, "engram: layer id {} is negative", l);
  DI_REQUIRE(max_ngram_size >= 2, "engram: max_ngram_size must be >= 2 (orders 2..max), got {}",
             max_ngram_size);
  DI_REQUIRE(n_head_per_ngram >= 1, "engram: n_head_per_ngram must be >= 1, got {}",
             n_head_per_ngram);
  DI_REQUIRE(int64_t(engram_vocab_size.size()) == max_ngram_size - 1,
             "engram: engram_vocab_size has {} entries; max_ngram_size {} needs {} (one per order)",
             engram_vocab_size.size(), max_ngram_size, max_ngram_size - 1);
  for (int64_t b : engram_vocab_size)
    DI_REQUIRE(b >= 2 && b < (int64_t(1) << 30),
               "engram: engram_vocab_size entry {} is outside [2, 2^30)", b);
  DI_REQUIRE(vocab_size >= 1, "engram: the compressed vocabulary size must be >= 1, got {}",
             vocab_size);
  DI_REQUIRE(seed >= 0, "engram: seed must be >= 0, got {}", seed);
}

#undef DI_REQUIRE

EngramHashTables engram_hash_tables(const EngramHashConfig& c) {
  c.validate();
  EngramHashTables t;
  t.num_layers = int64_t(c.layer_ids.size());
  t.max_ngram = c.max_ngram_size;
  t.heads_per_ngram = c.n_head_per_ngram;
  const int64_t m_max = std::numeric_limits<int64_t>::max() / c.vocab_size;
  const int64_t half = std::max<int64_t>(1, m_max / 2);
  for (int64_t layer : c.layer_ids) {
    NumpyPcg64 rng(uint64_t(c.seed + 10007 * layer));
    for (int64_t r : rng.integers(0, half, size_t(c.max_ngram_size)))
      t.multipliers.push_back(2 * r + 1);
  }
  std::set<int64_t> used;
  for (size_t l = 0; l < c.layer_ids.size(); ++l) {
    int64_t rows = 0;
    for (int64_t n = 2; n <= c.max_ngram_size; ++n) {
      int64_t start = c.engram_vocab_size[size_t(n - 2)] - 1;
      for (int64_t j = 0; j < c.n_head_per_ngram; ++j) {
        int64_t p = start + 1;
        while (!is_prime(p) || used.count(p)) ++p;
        used.insert(p);
        t.offsets.push_back(int32_t(rows));
        t.vocab_sizes.push_back(int32_t(p));
        rows += p;
        DI_CHECK(rows < std::numeric_limits<int32_t>::max(),
                 "engram: layer {} needs {}+ table rows, beyond int32 offsets; lower "
                 "engram_vocab_size or n_head_per_ngram",
                 c.layer_ids[l], rows);
        start = p;
      }
    }
    t.rows.push_back(rows);
  }
  return t;
}

void EngramHashParams::validate() const {
  DI_CHECK(num_tokens >= 0 && num_layers >= 1 && max_ngram >= 2 && heads_per_ngram >= 1,
           "engram_hash: bad shape n={} layers={} max_ngram={} heads_per_ngram={}", num_tokens,
           num_layers, max_ngram, heads_per_ngram);
  DI_CHECK(num_tokens == 0 || (ngram_ids && multipliers && vocab_sizes && offsets && out),
           "engram_hash: ngram_ids, multipliers, vocab_sizes, offsets and out must be set");
  for (int64_t i = 0; i < num_layers * heads(); ++i)
    DI_CHECK(vocab_sizes[i] >= 1 && offsets[i] >= 0,
             "engram_hash: head {} of layer {} has table size {} / offset {} (need >= 1 / >= 0)",
             i % heads(), i / heads(), vocab_sizes[i], offsets[i]);
}

void EngramHashParams::check_ids(int64_t t) const {
  const int32_t* ids = ngram_ids + t * max_ngram;
  if (ids[0] == -1) return;
  for (int64_t k = 0; k < max_ngram; ++k)
    DI_CHECK(
        ids[k] >= 0,
        "engram_hash: token {} column {} has id {}; ids must be canonical (>= 0), or -1 in "
        "column 0 for a masked token (pad positions before the sequence start with the pad id)",
        t, k, ids[k]);
}

void EngramGateParams::validate() const {
  DI_CHECK(num_tokens >= 0 && hc >= 1 && dim >= 1, "engram_gate: bad shape n={} hc={} d={}",
           num_tokens, hc, dim);
  DI_CHECK(num_tokens == 0 || (x && k && v && w_fused && out),
           "engram_gate: x, k, v, w_fused and out must be set");
  DI_CHECK(eps >= 0 && clamp >= 0 && std::isfinite(eps) && std::isfinite(clamp),
           "engram_gate: eps ({}) and clamp ({}) must be finite and >= 0", eps, clamp);
}

float engram_gate_value(float raw, float rstd_x, float rstd_k, int64_t dim, float clamp) {
  const float dot = raw * rstd_x * rstd_k / std::sqrt(float(dim));
  const float s = std::sqrt(std::max(std::fabs(dot), clamp));
  const float a = dot > 0.0f ? s : (dot < 0.0f ? -s : 0.0f);  // sign(0) = 0
  return 1.0f / (1.0f + std::exp(-a));
}

void EngramConvNormParams::validate() const {
  DI_CHECK(num_tokens >= 0 && hc >= 1 && dim >= 1, "engram_conv_norm: bad shape n={} hc={} d={}",
           num_tokens, hc, dim);
  DI_CHECK(num_tokens == 0 || (v && gate && w && out),
           "engram_conv_norm: v, gate, w and out must be set");
  DI_CHECK(eps >= 0 && std::isfinite(eps), "engram_conv_norm: eps ({}) must be finite and >= 0",
           eps);
}

void EngramShortConvParams::validate() const {
  DI_CHECK(num_tokens >= 0 && num_rows >= 0 && channels >= 1 && kernel_size >= 1,
           "engram_short_conv: bad shape n={} rows={} c={} k={}", num_tokens, num_rows, channels,
           kernel_size);
  DI_CHECK(num_tokens == 0 || (taps && w && out && (x || num_rows == 0)),
           "engram_short_conv: x, taps, w and out must be set");
  for (int64_t i = 0; i < num_tokens * kernel_size; ++i)
    DI_CHECK(taps[i] >= -1 && taps[i] < num_rows,
             "engram_short_conv: token {} tap {} reads row {} of {} (need -1 or a row)",
             i / kernel_size, i % kernel_size, taps[i], num_rows);
}

void engram_hash(const EngramHashParams& p) { dispatch(p, host::engram_hash, cpu::engram_hash); }
void engram_conv_norm(const EngramConvNormParams& p) {
  dispatch(p, host::engram_conv_norm, cpu::engram_conv_norm);
}
void engram_short_conv(const EngramShortConvParams& p) {
  dispatch(p, host::engram_short_conv, cpu::engram_short_conv);
}
void engram_gate(const EngramGateParams& p) { dispatch(p, host::engram_gate, cpu::engram_gate); }

}  // namespace deepinfer::kernels
