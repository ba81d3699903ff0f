// Harness cases for the GEMMs: cpu vs host over decode (M=1..8), odd sizes, partial edge blocks in
// N and K, f32 outputs, empty experts and padding rows. Large shapes are not quick.
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/gemm.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {

namespace {

// bf16 output: a summation-order difference can flip a bf16 rounding (2^-9 relative on that
// element); a wrong block, scale or edge gives errors of 1e-2 and more.
constexpr Tolerance kBf16Out{.rel_l2 = 1e-3};
constexpr Tolerance kF32Out{.rel_l2 = 2e-6};

CaseResult run_dense(int64_t m, int64_t n, int64_t k, bool f32_out, bool ue8m0, uint64_t seed) {
  const Fp8Rows a = random_fp8_activations(m, k, seed, ue8m0);
  const Fp8Rows w = random_fp8_weights(n, k, seed + 7, ue8m0);
  std::vector<bf16> out(buffer_size(m * n));
  std::vector<float> out_f32(buffer_size(m * n));
  GemmFp8Params p{.a = a.q.data(),
                  .a_scales = a.scales.data(),
                  .w = w.q.data(),
                  .w_scales = w.scales.data(),
                  .out = f32_out ? nullptr : out.data(),
                  .out_f32 = f32_out ? out_f32.data() : nullptr,
                  .m = m,
                  .n = n,
                  .k = k};
  const Tolerance tol = f32_out ? kF32Out : kBf16Out;
  // Every cpu path this CPU has: the row layout (decode shapes: AVX512-VBMI where present), the
  // decode layout (AVX512-BF16: decode shapes, and the prefill kernel's weight panels), for
  // decode shapes the generic Highway kernel, and the batch-invariant mode with and without the
  // decode layout, and with it on both tile products (AMX, VDPBF16PS) where the CPU has AMX.
  std::vector<uint8_t> w_decode(decode_layout_bytes(n, k));
  if (!w_decode.empty()) pack_decode_layout(w.q.data(), n, k, w_decode.data());
  const auto run_mode = [&](cpu::DecodeGemm mode, bool packed) {
    cpu::set_decode_gemm(mode);
    p.w_decode = packed ? w_decode.data() : nullptr;
    const CaseResult r = compare_backends(gemm_fp8, p, tol);
    cpu::set_decode_gemm(cpu::DecodeGemm::automatic);
    return r;
  };
  using cpu::DecodeGemm;
  CaseResult r = run_mode(DecodeGemm::automatic, false);
  if (r.pass && !w_decode.empty()) r = run_mode(DecodeGemm::automatic, true);
  if (r.pass && m <= cpu::kSmallM) r = run_mode(DecodeGemm::generic, false);
  if (r.pass) r = run_mode(DecodeGemm::invariant, false);
  if (r.pass && !w_decode.empty()) r = run_mode(DecodeGemm::invariant, true);
  if (r.pass && !w_decode.empty() && cpu::cpu_has_amx()) {  // the other tile product: VDPBF16PS
    const cpu::ScopedAmx other(!cpu::amx_active());         // where AMX is the default, and back
    r = run_mode(DecodeGemm::invariant, true);
  }
  return r;
}

// Rows sorted by expert; each expert's segment padded with -1 rows to `align`.
CaseResult run_contiguous(int64_t experts, std::vector<int64_t> counts, int64_t align, int64_t n,
                          int64_t k, uint64_t seed) {
  std::vector<int32_t> m_indices;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t c = counts[size_t(e)], padded = (c + align - 1) / align * align;
    for (int64_t r = 0; r < padded; ++r) m_indices.push_back(r < c ? int32_t(e) : -1);
  }
  const int64_t m = int64_t(m_indices.size());
  const Fp8Rows a = random_fp8_activations(m, k, seed);
  const Fp8Rows w = random_fp8_expert_weights(experts, n, k, seed + 3);
  std::vector<bf16> out(buffer_size(m * n));
  GemmFp8GroupedContiguousParams p{.a = a.q.data(),
                                   .a_scales = a.scales.data(),
                                   .w = w.q.data(),
                                   .w_scales = w.scales.data(),
                                   .m_indices = m_indices.data(),
                                   .out = out.data(),
                                   .m = m,
                                   .n = n,
                                   .k = k,
                                   .num_experts = experts};
  return compare_backends(gemm_fp8_grouped_contiguous, p, kBf16Out);
}

CaseResult run_masked(std::vector<int32_t> masked_m, int64_t max_m, int64_t n, int64_t k,
                      uint64_t seed) {
  const int64_t experts = int64_t(masked_m.size());
  const Fp8Rows a = random_fp8_activations(experts * max_m, k, seed);
  const Fp8Rows w = random_fp8_expert_weights(experts, n, k, seed + 5);
  std::vector<bf16> out(buffer_size(experts * max_m * n));
  GemmFp8GroupedMaskedParams p{.a = a.q.data(),
                               .a_scales = a.scales.data(),
                               .w = w.q.data(),
                               .w_scales = w.scales.data(),
                               .masked_m = masked_m.data(),
                               .out = out.data(),
                               .num_experts = experts,
                               .max_m = max_m,
                               .n = n,
                               .k = k};
  return compare_backends(gemm_fp8_grouped_masked, p, kBf16Out);
}

// batch > 1: the attention-head layout, a [m, batch, k], w [batch, n, k], out [m, batch, n].
// exact: GemmBf16Params::exact, fp64 sums on both backends, compared bit for bit.
CaseResult run_bf16(int64_t m, int64_t n, int64_t k, bool f32_out, uint64_t seed, int64_t batch = 1,
                    bool exact = false) {
  const std::vector<bf16> a = random_bf16(m * batch * k, seed, -2.0f, 2.0f);
  const std::vector<bf16> w = random_bf16(batch * n * k, seed + 1, -0.1f, 0.1f);
  std::vector<bf16> out(buffer_size(m * batch * n));
  std::vector<float> out_f32(buffer_size(m * batch * n));
  GemmBf16Params p{.a = a.data(),
                   .w = w.data(),
                   .out = f32_out ? nullptr : out.data(),
                   .out_f32 = f32_out ? out_f32.data() : nullptr,
                   .m = m,
                   .n = n,
                   .k = k,
                   .exact = exact};
  if (batch != 1) p.set_heads(batch);
  if (exact) return compare_backends(gemm_bf16, p, Tolerance{.rel_l2 = 0});
  const CaseResult r = compare_backends(gemm_bf16, p, f32_out ? kF32Out : kBf16Out);
  if (!r.pass) return r;
  cpu::set_decode_gemm(cpu::DecodeGemm::invariant);  // the batch-invariant order
  CaseResult inv = compare_backends(gemm_bf16, p, f32_out ? kF32Out : kBf16Out);
  if (inv.pass && cpu::cpu_has_amx()) {              // the other tile product: VDPBF16PS
    const cpu::ScopedAmx other(!cpu::amx_active());  // where AMX is the default, and back
    inv = compare_backends(gemm_bf16, p, f32_out ? kF32Out : kBf16Out);
  }
  cpu::set_decode_gemm(cpu::DecodeGemm::automatic);
  return inv;
}

}  // namespace

DEEPINFER_KERNEL_CASES(gemm_cases) {
  struct Dense {
    int64_t m, n, k;
    bool f32, ue8m0, quick;
  };
  const Dense dense[] = {
      {1, 128, 128, false, false, true},
      {1, 2048, 7168, false, false, true},
      {2, 7168, 256, false, false, true},
      {4, 256, 7168, false, false, true},
      {8, 384, 1024, false, false, true},
      {3, 200, 300, false, false, true},  // edges in N and K
      {6, 200, 256, false, false, true},
      {7, 17, 384, true, false, true},  // partial decode panels
      {17, 129, 129, false, false, true},
      {1, 1, 1, false, false, true},
      {5, 256, 512, false, true, true},
      {4, 300, 256, true, false, true},  // ue8m0; f32 logits
      {0, 128, 256, false, false, true},
      {33, 77, 640, false, false, true},
      {64, 512, 7168, false, false, false},
      {512, 256, 2048, false, false, false},
      {128, 2048, 7168, false, false, false},
      {1, 7168, 2048, false, false, false},
      {300, 1000, 1000, true, false, false},
  };
  for (const auto& d : dense)
    cases.push_back({"gemm_fp8",
                     fmt::format("m={} n={} k={}{}{}", d.m, d.n, d.k, d.f32 ? " f32" : "",
                                 d.ue8m0 ? " ue8m0" : ""),
                     d.quick, [d] {
                       return run_dense(d.m, d.n, d.k, d.f32, d.ue8m0,
                                        uint64_t(d.m * 131 + d.n * 7 + d.k));
                     }});

  cases.push_back(
      {"gemm_fp8_grouped_contiguous", "experts=4 counts=3,0,5,2 align=4 n=256 k=384", true, [] {
         return run_contiguous(4, {3, 0, 5, 2}, 4, 256, 384, 11);
       }});
  cases.push_back(
      {"gemm_fp8_grouped_contiguous", "experts=3 counts=1,1,1 align=1 n=130 k=200", true, [] {
         return run_contiguous(3, {1, 1, 1}, 1, 130, 200, 12);
       }});
  cases.push_back({"gemm_fp8_grouped_contiguous", "experts=2 counts=0,0 (no rows)", true, [] {
                     return run_contiguous(2, {0, 0}, 4, 128, 128, 13);
                   }});
  cases.push_back(
      {"gemm_fp8_grouped_contiguous", "experts=3 counts=0,7,0 align=8 n=128 k=7168", true, [] {
         return run_contiguous(3, {0, 7, 0}, 8, 128, 7168, 14);
       }});
  cases.push_back(
      {"gemm_fp8_grouped_contiguous", "experts=8 counts=40..0 align=32 n=512 k=2048", false, [] {
         return run_contiguous(8, {40, 0, 33, 1, 64, 5, 0, 17}, 32, 512, 2048, 15);
       }});

  cases.push_back({"gemm_fp8_grouped_masked", "masked=0,6,2 max_m=6 n=200 k=300", true, [] {
                     return run_masked({0, 6, 2}, 6, 200, 300, 21);
                   }});
  cases.push_back({"gemm_fp8_grouped_masked", "masked=1,0,3,8 max_m=8 n=256 k=1024", true, [] {
                     return run_masked({1, 0, 3, 8}, 8, 256, 1024, 22);
                   }});
  cases.push_back({"gemm_fp8_grouped_masked", "masked=0,0 max_m=4 (all masked)", true, [] {
                     return run_masked({0, 0}, 4, 128, 128, 23);
                   }});
  cases.push_back({"gemm_fp8_grouped_masked", "masked=16,3,0,9 max_m=16 n=2048 k=7168", false, [] {
                     return run_masked({16, 3, 0, 9}, 16, 2048, 7168, 24);
                   }});

  struct Bf16 {
    int64_t m, n, k;
    bool f32, quick;
  };
  const Bf16 bf[] = {{1, 129, 7168, false, true},
                     {3, 257, 200, false, true},
                     {2, 1000, 512, true, true},
                     {33, 64, 64, false, true},
                     {1, 1, 1, true, true},
                     {0, 16, 16, false, true},
                     {20, 72, 96, false, true},
                     {8, 4096, 1024, true, false},
                     {256, 512, 1536, false, false},
                     // the VDPBF16PS kernel's K slices, K tail, partial column tile, two row
                     // chunks; two row blocks
                     {16, 45, 1100, true, true},
                     {5, 19, 2080, false, true},
                     {300, 40, 96, true, true}};
  for (const auto& d : bf)
    cases.push_back(
        {"gemm_bf16", fmt::format("m={} n={} k={}{}", d.m, d.n, d.k, d.f32 ? " f32" : ""), d.quick,
         [d] { return run_bf16(d.m, d.n, d.k, d.f32, uint64_t(d.m * 17 + d.n + d.k)); }});
  // Batched over heads (absorbed MLA: one call per layer), including M > kSmallM (one problem at
  // a time outside the invariant mode) and an empty batch.
  struct Bf16Batch {
    int64_t batch, m, n, k;
    bool f32;
  };
  const Bf16Batch bb[] = {{4, 1, 128, 64, false},
                          {16, 3, 32, 128, false},
                          {3, 9, 40, 64, true},
                          {2, 17, 40, 64, false},
                          {0, 2, 16, 16, false}};
  for (const auto& d : bb)
    cases.push_back(
        {"gemm_bf16",
         fmt::format("batch={} m={} n={} k={}{}", d.batch, d.m, d.n, d.k, d.f32 ? " f32" : ""),
         true,
         [d] { return run_bf16(d.m, d.n, d.k, d.f32, uint64_t(d.batch * 31 + d.n), d.batch); }});
  // exact mode (the Engram projections' shapes, a K tail, batched heads): bit for bit.
  const Bf16Batch ex[] = {{1, 7, 1280, 256, false}, {1, 3, 37, 77, true}, {2, 5, 48, 64, false}};
  for (const auto& d : ex)
    cases.push_back({"gemm_bf16",
                     fmt::format("exact batch={} m={} n={} k={}{}", d.batch, d.m, d.n, d.k,
                                 d.f32 ? " f32" : ""),
                     true, [d] {
                       return run_bf16(d.m, d.n, d.k, d.f32, uint64_t(d.batch * 37 + d.n), d.batch,
                                       true);
                     }});
}

}  // namespace deepinfer::kernels::testing
