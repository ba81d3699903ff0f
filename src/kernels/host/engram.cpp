// Host reference: Engram hash (plain % per head) and gate (fp64 sums, one element at a time).
#include "kernels/engram.h"

#include <cmath>
#include <vector>

#include "kernels/norm.h"

namespace deepinfer::kernels::host {

void engram_hash(const EngramHashParams& p) {
  p.validate();
  const int64_t G = p.max_ngram, H = p.heads(), N = p.num_tokens;
  for (int64_t t = 0; t < N; ++t) {
    p.check_ids(t);
    const int32_t* ids = p.ngram_ids + t * G;
    for (int64_t l = 0; l < p.num_layers; ++l)
      for (int64_t h = 0; h < H; ++h) {
        int32_t& o = p.out[(l * N + t) * H + h];
        if (ids[0] == -1) {
          o = -1;
          continue;
        }
        const int64_t n = 2 + h / p.heads_per_ngram;
        uint64_t mix = 0;
        for (int64_t k = 0; k < n; ++k)
          mix ^= uint64_t(int64_t(ids[k])) * uint64_t(p.multipliers[l * G + k]);
        const int64_t mod = p.vocab_sizes[l * H + h];
        const int64_t r = ((int64_t(mix) % mod) + mod) % mod;
        o = int32_t(r + p.offsets[l * H + h]);
      }
  }
}

void engram_gate(const EngramGateParams& p) {
  p.validate();
  const int64_t D = p.dim;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int64_t i = 0; i < p.hc; ++i) {
      const int64_t row = t * p.hc + i;
      const bf16 *x = p.x + row * D, *k = p.k + row * D, *v = p.v + t * D;
      const float* w = p.w_fused + i * D;
      double raw = 0, sx = 0, sk = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double xd = bf16_to_f32(x[d]), kd = bf16_to_f32(k[d]);
        raw += xd * double(w[d]) * kd;
        sx += xd * xd;
        sk += kd * kd;
      }
      const float rx = float(rms_rstd(sx, D, p.eps)), rk = float(rms_rstd(sk, D, p.eps));
      const float g = engram_gate_value(float(raw), rx, rk, D, p.clamp);
      for (int64_t d = 0; d < D; ++d)
        p.out[row * D + d] = f32_to_bf16(bf16_to_f32(x[d]) + g * bf16_to_f32(v[d]));
      if (p.raw) p.raw[row] = float(raw);
      if (p.gate) p.gate[row] = g;
      if (p.rstd_x) p.rstd_x[row] = rx;
      if (p.rstd_k) p.rstd_k[row] = rk;
    }
}

void engram_conv_norm(const EngramConvNormParams& p) {
  p.validate();
  const int64_t D = p.dim;
  std::vector<float> u(static_cast<size_t>(D));
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int64_t i = 0; i < p.hc; ++i) {
      const float g = p.gate[t * p.hc + i];
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) {
        u[size_t(d)] = round_bf16(g * bf16_to_f32(p.v[t * D + d]));
        ss += double(u[size_t(d)]) * u[size_t(d)];
      }
      const double r = rms_rstd(ss, D, p.eps);
      bf16* o = p.out + (t * p.hc + i) * D;
      for (int64_t d = 0; d < D; ++d)
        o[d] = f32_to_bf16(float(double(u[size_t(d)]) * r * double(bf16_to_f32(p.w[i * D + d]))));
    }
}

void engram_short_conv(const EngramShortConvParams& p) {
  p.validate();
  const int64_t C = p.channels, K = p.kernel_size;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = p.taps[t * K + j];
        if (r >= 0) acc += double(bf16_to_f32(p.w[c * K + j])) * bf16_to_f32(p.x[r * C + c]);
      }
      p.out[t * C + c] = f32_to_bf16(float(engram_silu(acc)));
    }
}

}  // namespace deepinfer::kernels::host
