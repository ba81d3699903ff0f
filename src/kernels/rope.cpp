// RoPE/YaRN: frequency tables and scales (shared by all backends), checks and dispatch.
#include "kernels/rope.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/check.h"

namespace deepinfer::kernels {

void RopeConfig::validate() const {
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope: rope_dim must be positive and even, got {}",
           rope_dim);
  DI_CHECK(theta > 1.0, "rope: rope_theta must be > 1, got {}", theta);
  if (yarn) {
    DI_CHECK(scaling.factor > 0.0f, "rope_scaling.factor must be > 0, got {}", scaling.factor);
    DI_CHECK(scaling.original_max_position_embeddings > 0,
             "rope_scaling.original_max_position_embeddings must be > 0, got {}",
             scaling.original_max_position_embeddings);
    DI_CHECK(scaling.beta_fast > 0.0f && scaling.beta_slow > 0.0f,
             "rope_scaling.beta_fast/beta_slow must be > 0, got {}/{}", scaling.beta_fast,
             scaling.beta_slow);
  }
}

void RopeParams::validate() const {
  DI_CHECK(num_tokens >= 0 && num_heads >= 0, "rope: num_tokens {} / num_heads {} must be >= 0",
           num_tokens, num_heads);
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope: rope_dim must be positive and even, got {}",
           rope_dim);
  DI_CHECK(inv_freq != nullptr, "rope: inv_freq is null; build it with rope_inv_freq(config)");
  DI_CHECK(num_tokens == 0 || num_heads == 0 || (x && positions),
           "rope: x and positions must be set");
  DI_CHECK(offset >= 0 && head_stride >= 0 && token_stride >= 0, "rope: negative offset/stride");
  DI_CHECK(num_heads <= 1 || head_stride >= offset + rope_dim,
           "rope: head_stride {} < offset {} + rope_dim {}", head_stride, offset, rope_dim);
  DI_CHECK(num_tokens <= 1 || token_stride >= (num_heads - 1) * head_stride + offset + rope_dim,
           "rope: token_stride {} too small for {} heads of stride {} (offset {}, rope_dim {})",
           token_stride, num_heads, head_stride, offset, rope_dim);
}

double yarn_get_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

namespace {
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}
}  // namespace

YarnRange yarn_correction_range(const RopeConfig& cfg) {
  cfg.validate();
  const double d = double(cfg.rope_dim), L0 = double(cfg.scaling.original_max_position_embeddings);
  auto lo = int64_t(std::floor(correction_dim(cfg.scaling.beta_fast, d, cfg.theta, L0)));
  auto hi = int64_t(std::ceil(correction_dim(cfg.scaling.beta_slow, d, cfg.theta, L0)));
  return {std::max<int64_t>(lo, 0), std::min<int64_t>(hi, cfg.rope_dim - 1)};
}

std::vector<float> rope_inv_freq(const RopeConfig& cfg) {
  cfg.validate();
  const int64_t half = cfg.rope_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // θ^(−2i/d) in float64, rounded once (docs/numerics.md §5; the official fp32
    // 1 / base^(2i/d) rounds twice and lands an ulp away on a quarter of the frequencies).
    f[size_t(i)] = float(std::pow(double(cfg.theta), -double(2 * i) / double(cfg.rope_dim)));
  }
  if (cfg.yarn && cfg.scaling.factor > 1.0f) {
    const YarnRange r = yarn_correction_range(cfg);
    const float lo = float(r.lo);
    const float hi = r.hi == r.lo ? float(r.hi) + 0.001f : float(r.hi);
    for (int64_t i = 0; i < half; ++i) {
      const float ramp = std::clamp((float(i) - lo) / (hi - lo), 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      // official order: freqs / factor * (1 - smooth) + freqs * smooth, fp32
      const float fi = f[size_t(i)];
      f[size_t(i)] = fi / cfg.scaling.factor * (1.0f - smooth) + fi * smooth;
    }
  }
  return f;
}

float rope_attention_factor(const RopeConfig& cfg) {
  cfg.validate();
  if (!cfg.yarn) return 1.0f;
  const YarnScaling& s = cfg.scaling;
  if (s.mscale != 0.0f && s.mscale_all_dim != 0.0f)
    return float(yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim));
  return float(yarn_get_mscale(s.factor, 1.0));
}

float mla_softmax_scale(int64_t qk_head_dim, const RopeConfig& cfg) {
  DI_CHECK(qk_head_dim > 0, "mla_softmax_scale: qk_head_dim must be > 0, got {}", qk_head_dim);
  double s = 1.0 / std::sqrt(double(qk_head_dim));
  if (cfg.yarn && cfg.scaling.mscale_all_dim != 0.0f) {
    const double m = yarn_get_mscale(cfg.scaling.factor, cfg.scaling.mscale_all_dim);
    s *= m * m;
  }
  return float(s);
}

void rope_cos_sin(int64_t pos, const float* inv_freq, int64_t half, float attention_factor,
                  float* cos_out, float* sin_out) {
  for (int64_t i = 0; i < half; ++i) {
    const float phi = float(pos) * inv_freq[i];  // fp32 angle, as torch.outer(t, freqs)
    cos_out[i] = float(std::cos(double(phi))) * attention_factor;
    sin_out[i] = float(std::sin(double(phi))) * attention_factor;
  }
}

void rope(const RopeParams& p) { dispatch(p, host::rope, cpu::rope); }

}  // namespace deepinfer::kernels
