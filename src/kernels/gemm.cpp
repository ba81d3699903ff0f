// Dispatchers and argument checks for the GEMMs.
#include "kernels/gemm.h"

#include "core/check.h"
#include "kernels/profiler.h"

namespace deepinfer::kernels {

namespace {
void check_sizes(const char* op, int64_t m, int64_t n, int64_t k) {
  DI_CHECK(m >= 0 && n >= 0 && k >= 0, "{}: negative size m={} n={} k={}", op, m, n, k);
}
void check_one_out(const char* op, const void* out, const void* out_f32) {
  DI_CHECK((out == nullptr) != (out_f32 == nullptr),
           "{}: set exactly one of `out` (bf16) and `out_f32` (f32 logits)", op);
}
}  // namespace

void validate(const GemmFp8Params& p) {
  check_sizes("gemm_fp8", p.m, p.n, p.k);
  check_one_out("gemm_fp8", p.out, p.out_f32);
  if (p.m * p.k != 0) DI_CHECK(p.a && p.a_scales, "gemm_fp8: `a` or `a_scales` is null");
  if (p.n * p.k != 0) DI_CHECK(p.w && p.w_scales, "gemm_fp8: `w` or `w_scales` is null");
}

void validate(const GemmFp8GroupedContiguousParams& p) {
  check_sizes("gemm_fp8_grouped_contiguous", p.m, p.n, p.k);
  DI_CHECK(p.num_experts >= 0, "gemm_fp8_grouped_contiguous: num_experts = {}", p.num_experts);
  DI_CHECK(p.out != nullptr || p.m * p.n == 0, "gemm_fp8_grouped_contiguous: `out` is null");
  if (p.m == 0) return;
  DI_CHECK(p.a && p.a_scales && p.m_indices,
           "gemm_fp8_grouped_contiguous: a/a_scales/m_indices null");
  DI_CHECK(p.w && p.w_scales, "gemm_fp8_grouped_contiguous: `w` or `w_scales` is null");
  for (int64_t r = 0; r < p.m; ++r) {
    const int32_t e = p.m_indices[r];
    DI_CHECK(e >= -1 && e < p.num_experts,
             "gemm_fp8_grouped_contiguous: m_indices[{}] = {} is outside [-1, {}) (use -1 for "
             "padding rows)",
             r, e, p.num_experts);
  }
}

void validate(const GemmFp8GroupedMaskedParams& p) {
  check_sizes("gemm_fp8_grouped_masked", p.max_m, p.n, p.k);
  DI_CHECK(p.num_experts >= 0, "gemm_fp8_grouped_masked: num_experts = {}", p.num_experts);
  const int64_t rows = p.num_experts * p.max_m;
  DI_CHECK(p.out != nullptr || rows * p.n == 0, "gemm_fp8_grouped_masked: `out` is null");
  if (p.num_experts == 0) return;
  DI_CHECK(p.masked_m, "gemm_fp8_grouped_masked: `masked_m` is null");
  for (int64_t e = 0; e < p.num_experts; ++e)
    DI_CHECK(p.masked_m[e] >= 0 && p.masked_m[e] <= p.max_m,
             "gemm_fp8_grouped_masked: masked_m[{}] = {} is outside [0, max_m = {}]", e,
             p.masked_m[e], p.max_m);
  if (rows * p.k != 0)
    DI_CHECK(p.a && p.a_scales, "gemm_fp8_grouped_masked: `a` or `a_scales` is null");
  if (p.n * p.k != 0)
    DI_CHECK(p.w && p.w_scales, "gemm_fp8_grouped_masked: `w` or `w_scales` is null");
}

void validate(const GemmBf16Params& p) {
  check_sizes("gemm_bf16", p.m, p.n, p.k);
  DI_CHECK(p.batch >= 0, "gemm_bf16: batch = {} is negative", p.batch);
  check_one_out("gemm_bf16", p.out, p.out_f32);
  if (p.extent_a() != 0) DI_CHECK(p.a, "gemm_bf16: `a` is null");
  if (p.extent_w() != 0) DI_CHECK(p.w, "gemm_bf16: `w` is null");
  DI_CHECK(p.lda == 0 || p.lda >= p.k, "gemm_bf16: lda = {} is below k = {}", p.lda, p.k);
  DI_CHECK(p.ldo == 0 || p.ldo >= p.n, "gemm_bf16: ldo = {} is below n = {}", p.ldo, p.n);
  DI_CHECK(p.a_batch >= 0 && p.w_batch >= 0 && p.out_batch >= 0,
           "gemm_bf16: negative problem stride (a {}, w {}, out {})", p.a_batch, p.w_batch,
           p.out_batch);
  DI_CHECK(p.batch <= 1 || p.out_batch > 0,
           "gemm_bf16: {} problems with out_batch = 0 would write the same elements", p.batch);
}

void gemm_fp8(const GemmFp8Params& p) {
  validate(p);
  dispatch(p, host::gemm_fp8, cpu::gemm_fp8);
}

void gemm_fp8_multi(std::span<const GemmFp8Params> problems) {
  for (const auto& p : problems) validate(p);
  if (current_backend() != KernelBackend::cpu || active_recorder() != nullptr) {
    for (const auto& p : problems) gemm_fp8(p);
    return;
  }
  // The calls count as gemm_fp8 calls (DEEPINFER_FAULT=kernel:gemm_fp8:<i> still finds its call).
  std::vector<size_t> faulty;
  for (size_t i = 0; i < problems.size(); ++i)
    if (fault_matches(OpSpec<GemmFp8Params>::name, next_call_index(OpSpec<GemmFp8Params>::name)))
      faulty.push_back(i);
  if (Profiler* prof = active_profiler(); prof != nullptr) [[unlikely]] {
    KernelWork work{.fp8 = true};  // one dispatch: its roofline is that of all its problems
    for (const auto& p : problems) work += OpSpec<GemmFp8Params>::work(p);
    detail::profile_call(
        *prof, "gemm_fp8_multi", [&] { cpu::gemm_fp8_multi(problems); }, work);
  } else
    cpu::gemm_fp8_multi(problems);
  for (size_t i : faulty) detail::apply_fault(collect_buffers(problems[i]));
}

void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p) {
  validate(p);
  dispatch(p, host::gemm_fp8_grouped_contiguous, cpu::gemm_fp8_grouped_contiguous);
}

void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p) {
  validate(p);
  dispatch(p, host::gemm_fp8_grouped_masked, cpu::gemm_fp8_grouped_masked);
}

void gemm_bf16(const GemmBf16Params& p) {
  validate(p);
  dispatch(p, host::gemm_bf16, cpu::gemm_bf16);
}

}  // namespace deepinfer::kernels
