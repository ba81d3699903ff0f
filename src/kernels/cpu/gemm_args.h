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
  int64_t ldo = 0;                    // output row stride (0: n); the small-M kernels only
};
constexpr int64_t kSmallM = 8;  // up to this many rows: the streaming (decode) kernel

// fp8 decode GEMM (m <= kSmallM) on CPUs with AVX512-VBMI (Ice Lake+, Zen 4+), from the decode
// layout where g.w_decode is set and the CPU has AVX512-BF16: returns false, doing nothing, where
// the CPU or the shape (k % 128) does not fit.
bool gemm_fp8_small_m_vbmi(const GemmArgs& g);
// AVX512-VBMI and AVX512-BF16 (VDPBF16PS): what the decode layout needs.
bool cpu_has_bf16_dot();
// The prefill kernel's weight panel from the decode layout: W[n0 + j, 128·kb + kk] as f32 at
// out[p·32 + j] for j < 32, p = kk (swap_pairs: kk ^ 1) (64-byte aligned; columns past n are
// zero). Returns false, doing nothing, where g has no decode layout, n0 % 32 != 0, or the CPU or
// the DecodeGemm setting says no.
bool decode_layout_f32_panel(const GemmArgs& g, int64_t n0, int64_t kb, float* out,
                             bool swap_pairs);
// Batch-invariant mode on a CPU whose BF16 dot products add a K pair odd K first: the prefill
// kernel then sums each pair (2i, 2i + 1) in that order too (k % 128 == 0 fp8 only), so the decode
// layout kernel and it agree bit for bit.
bool invariant_pairs_swapped(const GemmArgs& g);
// Which decode kernel serves m <= kSmallM (the harness and the bench check each of them):
//  - invariant: batch invariant (docs/numerics.md §10): a row's bytes do not depend on M. fp8
//    rows of every M sum in the prefill kernel's order: M <= kSmallM from the decode layout where
//    given and the CPU's BF16 dot products add a pair one product at a time (checked once; the
//    prefill kernel then takes the pair in the same order), else in the prefill kernel itself. bf16
//    rows of every M sum in the Highway decode kernel's order (8 rows a pass).
//  - automatic: invariant under DEEPINFER_BATCH_INVARIANT=on; otherwise the decode layout where
//    given, else VBMI rows, else Highway (faster where there is no decode layout, and bf16, but a
//    row of M <= 8 then sums in another order than the same row in a larger call).
//  - rows = VBMI rows even where a decode layout is given; generic = the Highway kernel.
// The prefill kernel reads its weight panels from the decode layout under automatic and invariant.
enum class DecodeGemm { automatic, invariant, rows, generic };
void set_decode_gemm(DecodeGemm k);
// Whether m <= kSmallM GEMMs run in the batch-invariant order now (see DecodeGemm).
bool small_m_invariant();

}  // namespace deepinfer::kernels::cpu
