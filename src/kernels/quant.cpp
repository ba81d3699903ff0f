// Dispatchers and argument checks for the fp8 casts.
#include "kernels/quant.h"

#include "core/check.h"

namespace deepinfer::kernels {

namespace {
void check_token(const char* op, const void* x, const void* q, const float* s, int64_t m,
                 int64_t k) {
  DI_CHECK(m >= 0 && k >= 0, "{}: negative size m={} k={}", op, m, k);
  if (m * k == 0) return;
  DI_CHECK(x && q && s, "{}: a buffer pointer is null (x/q/scales)", op);
}
}  // namespace

void quant_per_token(const QuantTokenParams& p) {
  check_token("quant_per_token", p.x, p.q, p.scales, p.m, p.k);
  dispatch(p, host::quant_per_token, cpu::quant_per_token);
}

void quant_per_block(const QuantBlockParams& p) {
  check_token("quant_per_block", p.w, p.q, p.scales, p.n, p.k);
  dispatch(p, host::quant_per_block, cpu::quant_per_block);
}

void dequant_per_token(const DequantTokenParams& p) {
  DI_CHECK(p.out || p.out_f32, "dequant_per_token: set `out` (bf16) and/or `out_f32`");
  check_token("dequant_per_token", p.q, p.q, p.scales, p.m, p.k);
  dispatch(p, host::dequant_per_token, cpu::dequant_per_token);
}

void dequant_per_block(const DequantBlockParams& p) {
  DI_CHECK(p.out || p.out_f32, "dequant_per_block: set `out` (bf16) and/or `out_f32`");
  check_token("dequant_per_block", p.q, p.q, p.scales, p.n, p.k);
  dispatch(p, host::dequant_per_block, cpu::dequant_per_block);
}

}  // namespace deepinfer::kernels
