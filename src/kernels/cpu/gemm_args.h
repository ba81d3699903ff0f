// What the cpu GEMM kernels take: one GEMM on one weight matrix.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>

namespace deepinfer::kernels::cpu {

struct GemmArgs {
  const void* a;            // [m, k] e4m3 or bf16
  const float* a_scales;    // [m, kb] or null (bf16: unit scales)
  const void* w;            // [n, k]
  const float* w_scales;    // [nb, kb] or null
  bf16* out;                // [m, n] or null
  float* out_f32;           // [m, n] or null
  int64_t m, n, k;
  bool bf16_inputs;
};
constexpr int64_t kSmallM = 8;  // up to this many rows: the streaming (decode) kernel

// fp8 decode GEMM (m <= kSmallM) on CPUs with AVX512-VBMI (Ice Lake+, Zen 4+): returns false,
// doing nothing, where the CPU or the shape (k % 128) does not fit.
bool gemm_fp8_small_m_vbmi(const GemmArgs& g);
// Off: the generic Highway kernel serves decode shapes too (the harness checks both paths).
void set_gemm_vbmi_enabled(bool on);

}  // namespace deepinfer::kernels::cpu
