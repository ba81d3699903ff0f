// Engram hash parameters (docs/kernels.md §1.1): the config's checks, NumPy-compatible multipliers
// and distinct prime table sizes. No kernel dispatch here, so the config parser (and its fuzz
// target) can check an Engram config without the kernel library.
#include <deepinfer/error.h>

#include <limits>
#include <set>

#include "core/numpy_random.h"
#include "kernels/engram.h"

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

}  // namespace deepinfer::kernels
