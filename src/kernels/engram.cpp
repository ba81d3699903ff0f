// Engram: the ops' parameter checks and dispatch (the hash parameters: engram_params.cpp).
#include "kernels/engram.h"

#include <deepinfer/error.h>

#include <cmath>

namespace deepinfer::kernels {

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

// float64 from the fp32 raw and rstd, one rounding (docs/numerics.md §8.1): the gate scales a whole
// row of the stream, so its last bit must not depend on an exp implementation.
float engram_gate_value(float raw, float rstd_x, float rstd_k, int64_t dim, float clamp) {
  const double dot = double(raw) * rstd_x * rstd_k / std::sqrt(double(dim));
  const double s = std::sqrt(std::max(std::fabs(dot), double(clamp)));
  const double a = dot > 0 ? s : (dot < 0 ? -s : 0.0);  // sign(0) = 0
  return float(1.0 / (1.0 + std::exp(-a)));
}

double engram_silu(double conv) {
  const double c = double(float(conv));
  return c / (1.0 + std::exp(-c));
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
