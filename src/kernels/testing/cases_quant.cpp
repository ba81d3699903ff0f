// Harness cases for the fp8 casts. Division and max are exact in IEEE fp32, so cpu must match
// host bit for bit (tolerance 0).
#include <fmt/format.h>

#include "core/check.h"
#include "kernels/quant.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {

namespace {
constexpr Tolerance kExact{.rel_l2 = 0};

CaseResult run_token(int64_t m, int64_t k, bool ue8m0, uint64_t seed) {
  std::vector<bf16> x = random_bf16(m * k, seed, -3.0f, 3.0f);
  // Spread magnitudes over many binades and put in an all-zero block and saturating values.
  for (int64_t i = 0; i < m * k; ++i) {
    const float v =
        bf16_to_f32(x[size_t(i)]) * std::ldexp(1.0f, int(hash64(seed + 9, uint64_t(i)) % 24) - 12);
    x[size_t(i)] = f32_to_bf16(v);
  }
  if (m > 1)
    for (int64_t kk = 0; kk < std::min<int64_t>(k, kQuantBlock); ++kk) x[size_t(k + kk)] = bf16{0};
  std::vector<fp8_e4m3> q(buffer_size(m * k));
  std::vector<float> s(buffer_size(m * num_blocks(k)));
  return compare_backends(
      quant_per_token,
      QuantTokenParams{
          .x = x.data(), .q = q.data(), .scales = s.data(), .m = m, .k = k, .ue8m0 = ue8m0},
      kExact);
}

CaseResult run_block(int64_t n, int64_t k, bool ue8m0, uint64_t seed) {
  std::vector<float> w = random_f32(n * k, seed, -0.2f, 0.2f);
  for (int64_t i = 0; i < n * k; ++i)
    w[size_t(i)] *= std::ldexp(1.0f, int(hash64(seed + 3, uint64_t(i / 97)) % 16) - 8);
  if (n > 128 && k > 128)  // one all-zero block
    for (int64_t r = 128; r < std::min<int64_t>(n, 256); ++r)
      for (int64_t c = 0; c < 128; ++c) w[size_t(r * k + c)] = 0.0f;
  std::vector<fp8_e4m3> q(buffer_size(n * k));
  std::vector<float> s(buffer_size(num_blocks(n) * num_blocks(k)));
  return compare_backends(
      quant_per_block,
      QuantBlockParams{
          .w = w.data(), .q = q.data(), .scales = s.data(), .n = n, .k = k, .ue8m0 = ue8m0},
      kExact);
}

CaseResult run_dequant_token(int64_t m, int64_t k, bool both, uint64_t seed) {
  const std::vector<fp8_e4m3> q = random_e4m3(m * k, seed);
  const std::vector<float> s = random_scales(m * num_blocks(k), seed + 1);
  std::vector<bf16> out(buffer_size(m * k));
  std::vector<float> out_f32(buffer_size(m * k));
  return compare_backends(dequant_per_token,
                          DequantTokenParams{.q = q.data(),
                                             .scales = s.data(),
                                             .out = out.data(),
                                             .out_f32 = both ? out_f32.data() : nullptr,
                                             .m = m,
                                             .k = k},
                          kExact);
}

CaseResult run_dequant_block(int64_t n, int64_t k, bool f32_only, uint64_t seed) {
  const std::vector<fp8_e4m3> q = random_e4m3(n * k, seed);
  const std::vector<float> s = random_scales(num_blocks(n) * num_blocks(k), seed + 1);
  std::vector<bf16> out(buffer_size(n * k));
  std::vector<float> out_f32(buffer_size(n * k));
  return compare_backends(dequant_per_block,
                          DequantBlockParams{.q = q.data(),
                                             .scales = s.data(),
                                             .out = f32_only ? nullptr : out.data(),
                                             .out_f32 = out_f32.data(),
                                             .n = n,
                                             .k = k},
                          kExact);
}
}  // namespace

DEEPINFER_KERNEL_CASES(quant_cases) {
  struct Size {
    int64_t rows, k;
    bool quick;
  };
  const Size sizes[] = {{1, 7168, true},    {3, 200, true},     {7, 1, true},
                        {2, 128, true},     {0, 128, true},     {300, 1000, true},
                        {257, 7168, false}, {2048, 7168, false}};
  for (const auto& s : sizes) {
    for (bool ue8m0 : {false, true}) {
      const std::string tag = fmt::format("rows={} k={}{}", s.rows, s.k, ue8m0 ? " ue8m0" : "");
      cases.push_back({"quant_per_token", tag, s.quick, [s, ue8m0] {
                         return run_token(s.rows, s.k, ue8m0, uint64_t(s.rows + s.k));
                       }});
      cases.push_back({"quant_per_block", tag, s.quick, [s, ue8m0] {
                         return run_block(s.rows, s.k, ue8m0, uint64_t(s.rows * 3 + s.k));
                       }});
    }
    const std::string tag = fmt::format("rows={} k={}", s.rows, s.k);
    cases.push_back({"dequant_per_token", tag + " bf16+f32", s.quick,
                     [s] { return run_dequant_token(s.rows, s.k, true, 5); }});
    cases.push_back({"dequant_per_token", tag + " bf16", s.quick,
                     [s] { return run_dequant_token(s.rows, s.k, false, 6); }});
    cases.push_back({"dequant_per_block", tag + " f32", s.quick,
                     [s] { return run_dequant_block(s.rows, s.k, true, 7); }});
    cases.push_back({"dequant_per_block", tag + " bf16+f32", s.quick,
                     [s] { return run_dequant_block(s.rows, s.k, false, 8); }});
  }
}

}  // namespace deepinfer::kernels::testing
