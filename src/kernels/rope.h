// Rotary position embedding with YaRN scaling (docs/numerics.md §5), interleaved pairs as in
// the official DeepSeek code: channel pairs (x[2i], x[2i+1]) are
// rotated by phi_i = pos * inv_freq[i], with pos the absolute position. Angles are fp32
// (pos * inv_freq in fp32, then cos/sin of that fp32 angle, correctly rounded to fp32); the
// rotation is fp32 and the result is rounded to bf16 once.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// HF config.json `rope_scaling` of type "yarn" (DeepSeek-V3: factor 40, original 4096,
// beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1). factor <= 1 means plain RoPE.
struct YarnScaling {
  float factor = 1.0f;
  int64_t original_max_position_embeddings = 4096;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;  // 0 = absent in the config
};

struct RopeConfig {
  int64_t rope_dim = 64;  // d: channels rotated (qk_rope_head_dim), even
  double theta = 10000.0;
  bool yarn = false;  // rope_scaling.type == "yarn"
  YarnScaling scaling;
  void validate() const;
};

// 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1 (HF/official yarn_get_mscale).
double yarn_get_mscale(double factor, double mscale);
// The YaRN correction range [lo, hi] (clamped to [0, d-1]): lo = floor(c(beta_fast)),
// hi = ceil(c(beta_slow)), c(n) = d ln(L0 / (2 pi n)) / (2 ln theta). V3: lo = 10, hi = 23.
struct YarnRange {
  int64_t lo = 0;
  int64_t hi = 0;
};
YarnRange yarn_correction_range(const RopeConfig& cfg);
// inv_freq [d/2] f32: f_i = theta^(-2i/d), and with YaRN f_i*(1-ramp_i) + (f_i/factor)*ramp_i,
// ramp_i = clamp((i - lo)/(hi - lo), 0, 1) (hi += 0.001 when hi == lo).
std::vector<float> rope_inv_freq(const RopeConfig& cfg);
// Multiplier on cos/sin (HF yarn attention_factor): mscale(f, mscale)/mscale(f, mscale_all_dim)
// when both are given, else mscale(f, 1); 1 without YaRN. 1.0 for every published DeepSeek config.
float rope_attention_factor(const RopeConfig& cfg);
// Softmax scale for MLA: qk_head_dim^-0.5 * m^2 with m = mscale(factor, mscale_all_dim) under
// YaRN (m = 1 otherwise). V3: 192^-0.5 * 1.368888^2 = 0.1352338. Never 576^-0.5.
float mla_softmax_scale(int64_t qk_head_dim, const RopeConfig& cfg);

struct RopeParams {
  bf16* x = nullptr;                   // rotated in place; see the strides below
  const int64_t* positions = nullptr;  // [T] i64 absolute positions (start_pos + offset)
  const float* inv_freq = nullptr;     // [d/2] f32, from rope_inv_freq
  int64_t num_tokens = 0;              // T
  int64_t num_heads = 1;               // heads per token sharing the token's position
  int64_t rope_dim = 64;               // d
  int64_t token_stride = 0;            // elements between tokens
  int64_t head_stride = 0;             // elements between heads
  int64_t offset = 0;                  // first rotated channel within a head
  float attention_factor = 1.0f;       // from rope_attention_factor
  void validate() const;
  // Elements spanned by x (first token's first head to the last rotated channel).
  int64_t span() const {
    return num_tokens && num_heads
               ? (num_tokens - 1) * token_stride + (num_heads - 1) * head_stride + offset + rope_dim
               : 0;
  }
};
// Example (V3): q [T, H, 192] bf16: num_heads H, token_stride H*192, head_stride 192, offset 128;
// kv [T, 576] bf16 (k_pe at 512): num_heads 1, token_stride 576, offset 512.

// cos/sin of pos * inv_freq[i] for i < half (fp32, times attention_factor). Shared by backends.
void rope_cos_sin(int64_t pos, const float* inv_freq, int64_t half, float attention_factor,
                  float* cos_out, float* sin_out);

void rope(const RopeParams& p);

namespace host {
void rope(const RopeParams& p);
}
namespace cpu {
void rope(const RopeParams& p);
}

template <>
struct OpSpec<RopeParams> {
  static constexpr const char* name = "rope";
  static std::string shape(const RopeParams& p) {
    return fmt::format("t={} heads={} d={} offset={}", p.num_tokens, p.num_heads, p.rope_dim,
                       p.offset);
  }
  template <class V>
  static void visit(RopeParams& p, V& v) {
    v.inout("x", p.x, p.span());
    v.in("positions", p.positions, p.num_tokens);
    v.in("inv_freq", p.inv_freq, p.rope_dim / 2);
  }
};

}  // namespace deepinfer::kernels
