// GEMMs, all "NT" (out = A·Wᵀ, W stored [N, K] as in the checkpoint), docs/numerics.md §3:
//  - fp8 block-scaled (DeepGEMM semantics): for each 128-wide K block kb, the integer-exact e4m3
//    products are summed in fp32 (partial), then acc += partial · s_a[m, kb] · s_w[n/128, kb] in
//    fp32; the output is rounded once (bf16) or kept (f32, for logits). Edge blocks in N and K are
//    partial. Backends may sum a block's products in a different order (fp32 rounding only).
//  - grouped-contiguous: rows sorted by expert (any segment lengths; DeepGEMM's per-expert
//    alignment is only a performance hint here), per-row expert id, −1 = padding row: its output
//    row is written as zeros.
//  - grouped-masked: A [E, max_m, K], masked_m[e] valid rows; rows >= masked_m[e] are written as
//    zeros (DeepGEMM leaves them undefined; zeros keep every output element defined).
//  - bf16: bf16 × bf16 products summed in fp32, output rounded once (or f32).
// Every GEMM writes exactly one of `out` (bf16) or `out_f32` (f32): set one, leave the other null.
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <span>
#include <string>

#include "core/check.h"
#include "kernels/quant.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

struct GemmFp8Params {
  const fp8_e4m3* a = nullptr;      // [m, k]
  const float* a_scales = nullptr;  // [m, num_blocks(k)]
  const fp8_e4m3* w = nullptr;      // [n, k]
  const float* w_scales = nullptr;  // [num_blocks(n), num_blocks(k)]
  bf16* out = nullptr;              // [m, n] or null
  float* out_f32 = nullptr;         // [m, n] or null
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* w_decode = nullptr;  // optional: w in the decode layout (below); only cpu reads it
};

// The decode layout: the codes of an fp8 weight [n, k] re-ordered so the cpu backend's decode GEMM
// (m <= 8, CPUs with AVX512-BF16 and -VBMI) reads 32 output columns per panel with BF16 dot
// products; the prefill kernel decodes its weight panels from it too. It is a copy made once per
// weight (the runtime keeps one next to each fp8 linear, DEEPINFER_DECODE_LAYOUT); host, the
// recorder and replays use `w`, which must hold the same codes.
// decode_layout_bytes: its size, or 0 where this CPU or shape (k % 128 != 0) has no decode layout.
size_t decode_layout_bytes(int64_t n, int64_t k);
// Writes w [n, k] into out (decode_layout_bytes(n, k) bytes) on the kernel pool.
void pack_decode_layout(const fp8_e4m3* w, int64_t n, int64_t k, uint8_t* out);

// The pairs layout of a bf16 weight [n, k]: (w[j][2p], w[j][2p + 1]) as one uint32 at [p][j],
// the columns padded with zeros to a multiple of 16, so a 64-byte load holds one K pair of 16
// output columns. The cpu backend's bf16 GEMM reads it where GemmBf16Params::w_pairs is set, with
// the bytes it gives without (the absorbed attention's per-head GEMMs, K = 64..256).
// bf16_pairs_words: its size in uint32, or 0 where this CPU or k (k % 32 != 0) has no use for it.
size_t bf16_pairs_words(int64_t n, int64_t k);
void pack_bf16_pairs(const bf16* w, int64_t n, int64_t k, uint32_t* out);
struct GemmFp8GroupedContiguousParams {
  const fp8_e4m3* a = nullptr;      // [m, k] rows sorted by expert
  const float* a_scales = nullptr;  // [m, num_blocks(k)]
  const fp8_e4m3* w = nullptr;      // [num_experts, n, k]
  const float* w_scales = nullptr;  // [num_experts, num_blocks(n), num_blocks(k)]
  const int32_t* m_indices =
      nullptr;          // [m] expert of each row in [0, num_experts), or −1 (padding)
  bf16* out = nullptr;  // [m, n]; padding rows zeroed
  int64_t m = 0, n = 0, k = 0, num_experts = 0;
};

struct GemmFp8GroupedMaskedParams {
  const fp8_e4m3* a = nullptr;        // [num_experts, max_m, k]
  const float* a_scales = nullptr;    // [num_experts, max_m, num_blocks(k)]
  const fp8_e4m3* w = nullptr;        // [num_experts, n, k]
  const float* w_scales = nullptr;    // [num_experts, num_blocks(n), num_blocks(k)]
  const int32_t* masked_m = nullptr;  // [num_experts] valid rows, each in [0, max_m]
  bf16* out = nullptr;                // [num_experts, max_m, n]; rows >= masked_m[e] zeroed
  int64_t num_experts = 0, max_m = 0, n = 0, k = 0;
};

// out = a·wᵀ, or `batch` independent such problems in one call (e.g. one per attention head, so
// a decode step dispatches once per layer instead of once per head). Problem b reads
// a + b·a_batch (rows lda apart), w + b·w_batch ([n, k] contiguous) and writes out + b·out_batch
// (rows ldo apart); 0 strides mean contiguous (lda = k, ldo = n). Problems must not write the
// same element. Every problem sums in the order a single call of its shape would.
struct GemmBf16Params {
  const bf16* a = nullptr;   // [m, k]
  const bf16* w = nullptr;   // [n, k]
  bf16* out = nullptr;       // [m, n] or null
  float* out_f32 = nullptr;  // [m, n] or null
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  int64_t lda = 0, ldo = 0;                         // row strides (elements); 0: k, n
  int64_t a_batch = 0, w_batch = 0, out_batch = 0;  // problem strides (elements)
  // Every output is the exact dot rounded once to fp32 (float64 sums on every backend, as the host
  // always does): for projections whose bf16 output feeds a rounding-sensitive stream (Engram's
  // value and keys, docs/numerics.md §8.1). Off: the backend's fast fp32 order.
  bool exact = false;
  // Optional: every problem's w in the pairs layout, problem b at w_pairs + b·bf16_pairs_words(n,
  // k); only cpu reads it (host, the recorder and replays use w, which must hold the same values).
  const uint32_t* w_pairs = nullptr;
  int64_t row_a() const { return lda ? lda : k; }
  int64_t row_out() const { return ldo ? ldo : n; }
  // `heads` problems in the packed attention-head layout: a [m, heads, k], w [heads, n, k],
  // out [m, heads, n].
  void set_heads(int64_t heads) {
    batch = heads;
    lda = heads * k;
    ldo = heads * n;
    a_batch = k;
    w_batch = n * k;
    out_batch = n;
  }
  // Elements spanned from the base pointer (what a recording must copy).
  int64_t extent_a() const { return span(a_batch, m, row_a(), k); }
  int64_t extent_w() const { return span(w_batch, n, k, k); }
  int64_t extent_out() const { return span(out_batch, m, row_out(), n); }

 private:
  int64_t span(int64_t bstride, int64_t rows, int64_t ld, int64_t width) const {
    if (batch == 0 || rows == 0 || width == 0) return 0;
    return (batch - 1) * bstride + (rows - 1) * ld + width;
  }
};

void gemm_fp8(const GemmFp8Params& p);
void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p);
void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p);
void gemm_bf16(const GemmBf16Params& p);

// Several independent fp8 GEMMs in one call: a layer's expert projections, each on its own weight
// (the checkpoint keeps one tensor per expert, so there is no [E, n, k] stack for
// gemm_fp8_grouped_contiguous without copying every expert). Each problem gets exactly the bytes
// gemm_fp8 gives it alone. The cpu backend runs the problems its decode layout kernel takes in one
// pool dispatch (a decode step then waits once per projection group, not once per expert); the
// others, the host backend, recording and faults go one gemm_fp8 call per problem. Problems must
// not write the same element. The profile shows it as op gemm_fp8_multi.
void gemm_fp8_multi(std::span<const GemmFp8Params> problems);

namespace host {
void gemm_fp8(const GemmFp8Params& p);
void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p);
void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p);
void gemm_bf16(const GemmBf16Params& p);
}  // namespace host

namespace cpu {
void gemm_fp8(const GemmFp8Params& p);
void gemm_fp8_multi(std::span<const GemmFp8Params> problems);
void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p);
void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p);
void gemm_bf16(const GemmBf16Params& p);
}  // namespace cpu

// Checks sizes and pointers; throws Error naming the op and the bad field.
void validate(const GemmFp8Params& p);
void validate(const GemmFp8GroupedContiguousParams& p);
void validate(const GemmFp8GroupedMaskedParams& p);
void validate(const GemmBf16Params& p);

template <>
struct OpSpec<GemmFp8Params> {
  static constexpr const char* name = "gemm_fp8";
  static std::string shape(const GemmFp8Params& p) {
    return fmt::format("m={} n={} k={}{}", p.m, p.n, p.k, p.out_f32 ? " f32" : "");
  }
  // The codes and scales of w (the decode layout holds the same bytes), once, and 2·m·n·k.
  static KernelWork work(const GemmFp8Params& p) {
    if (p.m == 0) return {.fp8 = true};
    return {.weight_bytes = double(p.n * p.k) + double(num_blocks(p.n) * num_blocks(p.k)) * 4,
            .flops = 2.0 * double(p.m) * double(p.n) * double(p.k),
            .fp8 = true};
  }
  template <class V>
  static void visit(GemmFp8Params& p, V& v) {
    v.in("a", p.a, p.m * p.k);
    v.in("a_scales", p.a_scales, p.m * num_blocks(p.k));
    v.in("w", p.w, p.n * p.k);
    v.in("w_scales", p.w_scales, num_blocks(p.n) * num_blocks(p.k));
    v.out("out", p.out, p.m * p.n);
    v.out("out_f32", p.out_f32, p.m * p.n);
  }
};

template <>
struct OpSpec<GemmFp8GroupedContiguousParams> {
  static constexpr const char* name = "gemm_fp8_grouped_contiguous";
  static std::string shape(const GemmFp8GroupedContiguousParams& p) {
    return fmt::format("m={} n={} k={} experts={}", p.m, p.n, p.k, p.num_experts);
  }
  template <class V>
  static void visit(GemmFp8GroupedContiguousParams& p, V& v) {
    v.in("a", p.a, p.m * p.k);
    v.in("a_scales", p.a_scales, p.m * num_blocks(p.k));
    v.in("w", p.w, p.num_experts * p.n * p.k);
    v.in("w_scales", p.w_scales, p.num_experts * num_blocks(p.n) * num_blocks(p.k));
    v.in("m_indices", p.m_indices, p.m);
    v.out("out", p.out, p.m * p.n);
  }
};

template <>
struct OpSpec<GemmFp8GroupedMaskedParams> {
  static constexpr const char* name = "gemm_fp8_grouped_masked";
  static std::string shape(const GemmFp8GroupedMaskedParams& p) {
    return fmt::format("experts={} max_m={} n={} k={}", p.num_experts, p.max_m, p.n, p.k);
  }
  template <class V>
  static void visit(GemmFp8GroupedMaskedParams& p, V& v) {
    const int64_t rows = p.num_experts * p.max_m;
    v.in("a", p.a, rows * p.k);
    v.in("a_scales", p.a_scales, rows * num_blocks(p.k));
    v.in("w", p.w, p.num_experts * p.n * p.k);
    v.in("w_scales", p.w_scales, p.num_experts * num_blocks(p.n) * num_blocks(p.k));
    v.in("masked_m", p.masked_m, p.num_experts);
    v.out("out", p.out, rows * p.n);
  }
};

template <>
struct OpSpec<GemmBf16Params> {
  static constexpr const char* name = "gemm_bf16";
  static std::string shape(const GemmBf16Params& p) {
    return fmt::format("m={} n={} k={}{}{}", p.m, p.n, p.k,
                       p.batch != 1 ? fmt::format(" batch={}", p.batch) : "",
                       p.out_f32 ? " f32" : "");
  }
  // Every problem's w, once, and 2·m·n·k per problem.
  static KernelWork work(const GemmBf16Params& p) {
    if (p.m == 0) return {};
    const double problems = double(p.batch), nk = double(p.n) * double(p.k);
    return {.weight_bytes = problems * nk * 2, .flops = problems * 2.0 * double(p.m) * nk};
  }
  template <class V>
  static void visit(GemmBf16Params& p, V& v) {
    v.in("a", p.a, p.extent_a());
    v.in("w", p.w, p.extent_w());
    v.out("out", p.out, p.extent_out());
    v.out("out_f32", p.out_f32, p.extent_out());
  }
};

}  // namespace deepinfer::kernels
