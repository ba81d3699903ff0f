// Engram kernels (docs/kernels.md §Engram): the n-gram hash of every Engram layer in one call, and
// the fused gate with its residual. Plus the hash parameters (odd multipliers from NumPy's
// default_rng, distinct prime table sizes), derived once from the config.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// ---- hash parameters
// -----------------------------------------------------------------------------

struct EngramHashConfig {
  std::vector<int64_t> layer_ids;          // Engram blocks, in config order
  int64_t max_ngram_size = 3;              // orders 2..max_ngram_size are looked up
  int64_t n_head_per_ngram = 8;            // hash heads per order
  std::vector<int64_t> engram_vocab_size;  // table budget per order (max_ngram_size - 1 entries)
  int64_t seed = 0;
  int64_t vocab_size = 0;  // V': the compressed (canonical) vocabulary size
  void validate() const;
};

// What engram_hash takes, for all layers of a config (L = layer_ids.size(), G = max_ngram_size,
// H = (G - 1) * n_head_per_ngram heads per layer, head-major: order 2's heads, then order 3's...).
struct EngramHashTables {
  int64_t num_layers = 0, max_ngram = 0, heads_per_ngram = 0;
  std::vector<int64_t> multipliers;  // [L, G]: m_k = 2 r_k + 1, r = default_rng(seed + 10007 L)
  std::vector<int32_t> vocab_sizes;  // [L, H]: distinct primes, one per head
  std::vector<int32_t> offsets;      // [L, H]: exclusive prefix sum of vocab_sizes per layer
  std::vector<int64_t> rows;         // [L]: rows of each layer's table (sum of its primes)
  int64_t heads() const { return (max_ngram - 1) * heads_per_ngram; }
};

EngramHashTables engram_hash_tables(const EngramHashConfig& c);

// ---- engram_hash
// ---------------------------------------------------------------------------------

// out[l, t, h] = (XOR_{k < n(h)} ids[t, k] * mult[l, k]) mod vocab_sizes[l, h] + offsets[l, h],
// where n(h) = 2 + h / heads_per_ngram (int64 wrap-around products, non-negative modulo).
// ids[t, 0] = -1 (a masked token) gives -1 in every head of every layer.
struct EngramHashParams {
  const int32_t* ngram_ids = nullptr;    // [N, G]: column k = canonical id of token t-k (padded)
  const int64_t* multipliers = nullptr;  // [L, G]
  const int32_t* vocab_sizes = nullptr;  // [L, H]
  const int32_t* offsets = nullptr;      // [L, H]
  int32_t* out = nullptr;                // [L, N, H]
  int64_t num_tokens = 0, num_layers = 0, max_ngram = 0, heads_per_ngram = 0;
  int64_t heads() const { return (max_ngram - 1) * heads_per_ngram; }
  void validate() const;
  // ids ok: >= 0, or -1 in column 0 (a token is checked before it is hashed)
  void check_ids(int64_t t) const;
};

// ---- engram_gate
// ---------------------------------------------------------------------------------

// Per token t and branch i (fp32 math): raw = sum_d x*w*k, rstd_x = 1/sqrt(mean(x^2) + eps),
// rstd_k likewise, dot = raw * rstd_x * rstd_k / sqrt(d), g = sigmoid(sign(dot) *
// sqrt(max(|dot|, clamp))), out = bf16(x + g * v).
struct EngramGateParams {
  const bf16* x = nullptr;         // [N, hc, d] hidden branches
  const bf16* k = nullptr;         // [N, hc, d] keys
  const bf16* v = nullptr;         // [N, d] value
  const float* w_fused = nullptr;  // [hc, d] product of the two RMSNorm weights
  bf16* out = nullptr;             // [N, hc, d]
  float* raw = nullptr;            // [N, hc] or null: the unnormalised dot
  float* gate = nullptr;           // [N, hc] or null: g
  float* rstd_x = nullptr;         // [N, hc] or null
  float* rstd_k = nullptr;         // [N, hc] or null
  int64_t num_tokens = 0, hc = 4, dim = 0;
  float eps = 1e-6f;
  float clamp = 1e-6f;
  void validate() const;
};

// g from raw and the two rstd (each fp32(rms_rstd(...)) of a float64 sum of squares): float64,
// one rounding; shared by the backends.
float engram_gate_value(float raw, float rstd_x, float rstd_k, int64_t dim, float clamp);
// The short conv's SiLU: the conv sum rounded once to fp32, then SiLU in float64 from it.
double engram_silu(double conv);

// ---- engram_conv_norm
// ----------------------------------------------------------------------------

// The short conv's input (docs/kernels.md §1.4). Per token t and branch i, fp32:
// u = bf16(gate[t, i] * v[t]), out[t, i] = bf16(u * rsqrt(mean(u^2) + eps) * w[i]).
struct EngramConvNormParams {
  const bf16* v = nullptr;      // [N, d] value
  const float* gate = nullptr;  // [N, hc] g of engram_gate
  const bf16* w = nullptr;      // [hc, d] RMSNorm weight per branch
  bf16* out = nullptr;          // [N, hc, d]
  int64_t num_tokens = 0, hc = 4, dim = 0;
  float eps = 1e-5f;
  void validate() const;
};

// ---- engram_short_conv
// ---------------------------------------------------------------------------

// Depthwise causal convolution + SiLU (docs/kernels.md §1.5): per token t and channel c, fp32 in
// tap order j = 0..K-1, conv = sum_j w[c, j] * x[taps[t, j], c] (tap -1 reads zero), out[t, c] =
// bf16(conv * sigmoid(conv)). The caller points the taps at the rows a token's window holds
// (its own row, and the rows `dilation` apart before it), so the op is per token.
struct EngramShortConvParams {
  const bf16* x = nullptr;        // [R, C] rows the taps read
  const int32_t* taps = nullptr;  // [N, K] row of x for each tap, or -1
  const bf16* w = nullptr;        // [C, K] (a depthwise Conv1d weight [C, 1, K])
  bf16* out = nullptr;            // [N, C]
  int64_t num_tokens = 0, num_rows = 0, channels = 0, kernel_size = 0;
  void validate() const;  // shapes, and every tap in [-1, R)
};

void engram_hash(const EngramHashParams& p);
void engram_gate(const EngramGateParams& p);
void engram_conv_norm(const EngramConvNormParams& p);
void engram_short_conv(const EngramShortConvParams& p);

namespace host {
void engram_hash(const EngramHashParams& p);
void engram_gate(const EngramGateParams& p);
void engram_conv_norm(const EngramConvNormParams& p);
void engram_short_conv(const EngramShortConvParams& p);
}  // namespace host
namespace cpu {
void engram_hash(const EngramHashParams& p);
void engram_gate(const EngramGateParams& p);
void engram_conv_norm(const EngramConvNormParams& p);
void engram_short_conv(const EngramShortConvParams& p);
}  // namespace cpu

template <>
struct OpSpec<EngramHashParams> {
  static constexpr const char* name = "engram_hash";
  static std::string shape(const EngramHashParams& p) {
    return fmt::format("n={} layers={} ngram={} heads={}", p.num_tokens, p.num_layers, p.max_ngram,
                       p.heads());
  }
  template <class V>
  static void visit(EngramHashParams& p, V& v) {
    v.in("ngram_ids", p.ngram_ids, p.num_tokens * p.max_ngram);
    v.in("multipliers", p.multipliers, p.num_layers * p.max_ngram);
    v.in("vocab_sizes", p.vocab_sizes, p.num_layers * p.heads());
    v.in("offsets", p.offsets, p.num_layers * p.heads());
    v.out("out", p.out, p.num_layers * p.num_tokens * p.heads());
  }
};

template <>
struct OpSpec<EngramGateParams> {
  static constexpr const char* name = "engram_gate";
  static std::string shape(const EngramGateParams& p) {
    return fmt::format("n={} hc={} d={}", p.num_tokens, p.hc, p.dim);
  }
  template <class V>
  static void visit(EngramGateParams& p, V& v) {
    const int64_t rows = p.num_tokens * p.hc;
    v.in("x", p.x, rows * p.dim);
    v.in("k", p.k, rows * p.dim);
    v.in("v", p.v, p.num_tokens * p.dim);
    v.in("w_fused", p.w_fused, p.hc * p.dim);
    v.out("out", p.out, rows * p.dim);
    v.out("raw", p.raw, rows);
    v.out("gate", p.gate, rows);
    v.out("rstd_x", p.rstd_x, rows);
    v.out("rstd_k", p.rstd_k, rows);
  }
};

template <>
struct OpSpec<EngramConvNormParams> {
  static constexpr const char* name = "engram_conv_norm";
  static std::string shape(const EngramConvNormParams& p) {
    return fmt::format("n={} hc={} d={}", p.num_tokens, p.hc, p.dim);
  }
  template <class V>
  static void visit(EngramConvNormParams& p, V& v) {
    v.in("v", p.v, p.num_tokens * p.dim);
    v.in("gate", p.gate, p.num_tokens * p.hc);
    v.in("w", p.w, p.hc * p.dim);
    v.out("out", p.out, p.num_tokens * p.hc * p.dim);
  }
};

template <>
struct OpSpec<EngramShortConvParams> {
  static constexpr const char* name = "engram_short_conv";
  static std::string shape(const EngramShortConvParams& p) {
    return fmt::format("n={} rows={} c={} k={}", p.num_tokens, p.num_rows, p.channels,
                       p.kernel_size);
  }
  template <class V>
  static void visit(EngramShortConvParams& p, V& v) {
    v.in("x", p.x, p.num_rows * p.channels);
    v.in("taps", p.taps, p.num_tokens * p.kernel_size);
    v.in("w", p.w, p.channels * p.kernel_size);
    v.out("out", p.out, p.num_tokens * p.channels);
  }
};

}  // namespace deepinfer::kernels
