// Deterministic test data: the same (seed, index) gives the same value on every machine.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>
#include <vector>

namespace deepinfer::kernels::testing {

// splitmix64 of (seed, i): a reproducible stream without library distributions.
uint64_t hash64(uint64_t seed, uint64_t i);
// Uniform in [lo, hi).
float uniform(uint64_t seed, uint64_t i, float lo, float hi);

std::vector<float> random_f32(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<bf16> random_bf16(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// Random e4m3 codes, never NaN (0x7f / 0xff).
std::vector<fp8_e4m3> random_e4m3(int64_t n, uint64_t seed);
// Random positive scales in [lo, hi).
std::vector<float> random_scales(int64_t n, uint64_t seed, float lo = 1e-3f, float hi = 1e-2f);

std::vector<float> to_f32(const std::vector<bf16>& v);

// fp8 rows with their scales, made the realistic way: random values quantised by the host casts.
struct Fp8Rows {
  std::vector<fp8_e4m3> q;  // [rows, k]
  std::vector<float>
      scales;  // activations: [rows, num_blocks(k)]; weights: [num_blocks(rows), num_blocks(k)]
  int64_t rows = 0, k = 0;
};
// bf16 activations U[-2, 2) (every 7th 128-block of row 1 zero, to hit the amax floor), cast 1×128.
Fp8Rows random_fp8_activations(int64_t m, int64_t k, uint64_t seed, bool ue8m0 = false);
// f32 weights U[-0.1, 0.1) with a per-row magnitude spread, cast 128×128.
Fp8Rows random_fp8_weights(int64_t n, int64_t k, uint64_t seed, bool ue8m0 = false);
// `experts` weight matrices [experts, n, k] with their scales [experts, nb, kb], concatenated.
Fp8Rows random_fp8_expert_weights(int64_t experts, int64_t n, int64_t k, uint64_t seed);

}  // namespace deepinfer::kernels::testing
