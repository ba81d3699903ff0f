#include "kernels/testing/data.h"

#include "kernels/quant.h"

namespace deepinfer::kernels::testing {

uint64_t hash64(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  const double u = double(hash64(seed, i) >> 11) * 0x1.0p-53;  // [0, 1)
  return float(lo + (hi - lo) * u);
}

std::vector<float> random_f32(int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = uniform(seed, uint64_t(i), lo, hi);
  return v;
}

std::vector<bf16> random_bf16(int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<bf16> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f32_to_bf16(uniform(seed, uint64_t(i), lo, hi));
  return v;
}

std::vector<fp8_e4m3> random_e4m3(int64_t n, uint64_t seed) {
  std::vector<fp8_e4m3> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t b = uint8_t(hash64(seed, uint64_t(i)));
    if ((b & 0x7f) == 0x7f) b ^= 1;  // NaN -> ±448
    v[size_t(i)] = fp8_e4m3{b};
  }
  return v;
}

std::vector<float> random_scales(int64_t n, uint64_t seed, float lo, float hi) {
  return random_f32(n, seed, lo, hi);
}

std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

Fp8Rows random_fp8_activations(int64_t m, int64_t k, uint64_t seed, bool ue8m0) {
  std::vector<bf16> x = random_bf16(m * k, seed, -2.0f, 2.0f);
  if (m > 1)
    for (int64_t kk = 0; kk < k; ++kk)
      if ((kk / kQuantBlock) % 7 == 3) x[size_t(k + kk)] = bf16{0};
  Fp8Rows r;
  r.rows = m, r.k = k;
  r.q.resize(size_t(m * k));
  r.scales.resize(size_t(m * num_blocks(k)));
  host::quant_per_token(
      {.x = x.data(), .q = r.q.data(), .scales = r.scales.data(), .m = m, .k = k, .ue8m0 = ue8m0});
  return r;
}

Fp8Rows random_fp8_weights(int64_t n, int64_t k, uint64_t seed, bool ue8m0) {
  std::vector<float> w = random_f32(n * k, seed, -0.1f, 0.1f);
  for (int64_t j = 0; j < n; ++j) {
    const float row_gain = 0.25f + uniform(seed + 1, uint64_t(j), 0.0f, 2.0f);
    for (int64_t kk = 0; kk < k; ++kk) w[size_t(j * k + kk)] *= row_gain;
  }
  Fp8Rows r;
  r.rows = n, r.k = k;
  r.q.resize(size_t(n * k));
  r.scales.resize(size_t(num_blocks(n) * num_blocks(k)));
  host::quant_per_block(
      {.w = w.data(), .q = r.q.data(), .scales = r.scales.data(), .n = n, .k = k, .ue8m0 = ue8m0});
  return r;
}

Fp8Rows random_fp8_expert_weights(int64_t experts, int64_t n, int64_t k, uint64_t seed) {
  Fp8Rows all;
  all.rows = experts * n, all.k = k;
  for (int64_t e = 0; e < experts; ++e) {
    Fp8Rows one = random_fp8_weights(n, k, seed * 1000 + uint64_t(e));
    all.q.insert(all.q.end(), one.q.begin(), one.q.end());
    all.scales.insert(all.scales.end(), one.scales.begin(), one.scales.end());
  }
  return all;
}

}  // namespace deepinfer::kernels::testing
