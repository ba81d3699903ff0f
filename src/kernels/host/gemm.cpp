// Reference GEMMs: scalar loops that spell out docs/numerics.md §3 as tools/reference/NUMERICS.md
// pins it. For each output element and each 128-wide K block, the exact e4m3 products are summed
// exactly (float64 holds the sum of 128 of them without error) and rounded once to fp32; then
// acc = acc + P·(s_a·s_w) in fp32, the scale product first; the output is rounded once.
#include "kernels/gemm.h"

#include <algorithm>
#include <vector>

namespace deepinfer::kernels::host {

namespace {

void store(bf16* out, float* out_f32, int64_t i, float v) {
  if (out) out[i] = f32_to_bf16(v);
  if (out_f32) out_f32[i] = v;
}

// rows × n block of out = A·Wᵀ for one weight matrix. a: [rows, k], a_scales: [rows, kb],
// w: [n, k], w_scales: [nb, kb], out/out_f32: [rows, n].
void fp8_rows(const fp8_e4m3* a, const float* a_scales, const fp8_e4m3* w, const float* w_scales,
              bf16* out, float* out_f32, int64_t rows, int64_t n, int64_t k) {
  const int64_t kb_count = num_blocks(k);
  std::vector<float> wf(static_cast<size_t>(k)),
      af(static_cast<size_t>(rows * k));  // decoded once: the values are exact
  for (int64_t i = 0; i < rows * k; ++i) af[size_t(i)] = e4m3_to_f32(a[i]);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) wf[size_t(kk)] = e4m3_to_f32(w[j * k + kk]);
    const float* sw = w_scales + (j / kQuantBlock) * kb_count;
    for (int64_t r = 0; r < rows; ++r) {
      const float* ar = af.data() + r * k;
      float acc = 0.0f;
      for (int64_t kb = 0; kb < kb_count; ++kb) {
        const int64_t k0 = kb * kQuantBlock, k1 = std::min(k, k0 + kQuantBlock);
        double exact = 0.0;
        for (int64_t kk = k0; kk < k1; ++kk) exact += double(ar[kk]) * double(wf[size_t(kk)]);
        const float partial = float(exact);
        const float scale = a_scales[r * kb_count + kb] * sw[kb];
        acc += partial * scale;
      }
      store(out, out_f32, r * n + j, acc);
    }
  }
}

void zero_rows(bf16* out, int64_t rows, int64_t n) { std::fill(out, out + rows * n, bf16{0}); }

}  // namespace

void gemm_fp8(const GemmFp8Params& p) {
  fp8_rows(p.a, p.a_scales, p.w, p.w_scales, p.out, p.out_f32, p.m, p.n, p.k);
}

void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p) {
  const int64_t kb_count = num_blocks(p.k), w_scale_count = num_blocks(p.n) * kb_count;
  for (int64_t r = 0; r < p.m; ++r) {
    const int32_t e = p.m_indices[r];
    if (e < 0) {
      zero_rows(p.out + r * p.n, 1, p.n);
      continue;
    }
    fp8_rows(p.a + r * p.k, p.a_scales + r * kb_count, p.w + e * p.n * p.k,
             p.w_scales + e * w_scale_count, p.out + r * p.n, nullptr, 1, p.n, p.k);
  }
}

void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p) {
  const int64_t kb_count = num_blocks(p.k), w_scale_count = num_blocks(p.n) * kb_count;
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const int64_t rows = p.masked_m[e], base = e * p.max_m;
    fp8_rows(p.a + base * p.k, p.a_scales + base * kb_count, p.w + e * p.n * p.k,
             p.w_scales + e * w_scale_count, p.out + base * p.n, nullptr, rows, p.n, p.k);
    zero_rows(p.out + (base + rows) * p.n, p.max_m - rows, p.n);
  }
}

void gemm_bf16(const GemmBf16Params& p) {
  std::vector<float> wf(size_t(p.k));
  const int64_t lda = p.row_a(), ldo = p.row_out();
  for (int64_t b = 0; b < p.batch; ++b) {
    const bf16* a = p.a + b * p.a_batch;
    const bf16* w = p.w + b * p.w_batch;
    bf16* out = p.out ? p.out + b * p.out_batch : nullptr;
    float* out_f32 = p.out_f32 ? p.out_f32 + b * p.out_batch : nullptr;
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t kk = 0; kk < p.k; ++kk) wf[size_t(kk)] = bf16_to_f32(w[j * p.k + kk]);
      for (int64_t r = 0; r < p.m; ++r) {
        // bf16×bf16 products are exact in double; the dot product is summed in double and
        // rounded once to fp32, as the PyTorch reference does (tools/reference/NUMERICS.md).
        double acc = 0.0;
        for (int64_t kk = 0; kk < p.k; ++kk)
          acc += double(bf16_to_f32(a[r * lda + kk])) * double(wf[size_t(kk)]);
        store(out, out_f32, r * ldo + j, float(acc));
      }
    }
  }
}

}  // namespace deepinfer::kernels::host
