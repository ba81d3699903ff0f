// What the cpu GEMM kernels take: one GEMM on one weight matrix.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>

namespace deepinfer::kernels::cpu {

struct GemmArgs {
  const void* a;          // [m, k] e4m3 or bf16
  const float* a_scales;  // [m, kb] or null (bf16: unit scales)
  const void* w;          // [n, k]
  const float* w_scales;  // [nb, kb] or null
  bf16* out;              // [m, n] or null
  float* out_f32;         // [m, n] or null
  int64_t m, n, k;
  bool bf16_inputs;
  const uint8_t* w_decode = nullptr;  // w in the decode layout, or null
};
constexpr int64_t kSmallM = 8;  // up to this many rows: the streaming (decode) kernel

// fp8 decode GEMM (m <= kSmallM) on CPUs with AVX512-VBMI (Ice Lake+, Zen 4+), from the decode
// layout where g.w_decode is set and the CPU has AVX512-BF16: returns false, doing nothing, where
// the CPU or the shape (k % 128) does not fit.
bool gemm_fp8_small_m_vbmi(const GemmArgs& g);
// AVX512-VBMI and AVX512-BF16 (VDPBF16PS): what the decode layout needs.
bool cpu_has_bf16_dot();
// The prefill kernel's weight panel from the decode layout: W[n0 + j, 128·kb + kk] as f32 at
// out[kk·32 + j] for j < 32 (64-byte aligned; columns past n are zero). Returns false, doing
// nothing, where g has no decode layout, n0 % 32 != 0, or the CPU or the DecodeGemm setting
// says no.
bool decode_layout_f32_panel(const GemmArgs& g, int64_t n0, int64_t kb, float* out);
// Which decode kernel serves m <= kSmallM (the harness and the bench check each of them):
// automatic = the decode layout where given, else VBMI rows, else Highway; rows = VBMI rows even
// where a decode layout is given; generic = the Highway kernel. The prefill kernel reads its
// weight panels from the decode layout only under automatic.
enum class DecodeGemm { automatic, rows, generic };
void set_decode_gemm(DecodeGemm k);

}  // namespace deepinfer::kernels::cpu
