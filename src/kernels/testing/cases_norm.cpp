// Harness cases (cpu vs host) for RMSNorm, residual add, SwiGLU and RoPE. The cpu kernels run in
// fp32 where host runs in fp64, so bf16 outputs may differ by one rounding on a few elements;
// fp8 outputs inherit that (one fp8 step on the element, or a scale when the amax element moves).
// Zero-size calls have nothing to compare; tests/kernels/test_elementwise_host.cpp covers them.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

constexpr Tolerance kBf16Tol{.rel_l2 = 2e-3};
constexpr Tolerance kFp8Tol{.rel_l2 = 2e-2};

CaseResult run_rms_norm(int64_t T, int64_t H, int64_t in_stride, int mode, uint64_t seed) {
  const int64_t xs = in_stride ? in_stride : H;
  const auto x = random_bf16(T * xs, seed, -4.0f, 4.0f);
  const auto w = random_bf16(H, seed + 1, -1.5f, 1.5f);
  std::vector<bf16> y(size_t(T * H));
  std::vector<fp8_e4m3> q(size_t(T * H));
  std::vector<float> s(size_t(T * num_blocks(H)));
  RmsNormParams p{.x = x.data(),
                  .w = w.data(),
                  .y = y.data(),
                  .num_tokens = T,
                  .hidden = H,
                  .in_stride = in_stride};
  if (mode > 0) {
    p.q = q.data();
    p.scales = s.data();
    p.ue8m0 = mode == 2;
  }
  // fp64 with one rounding on both backends (docs/numerics.md §4): the rows and their casts are
  // bit-identical.
  return compare_backends(rms_norm, p, Tolerance{.rel_l2 = 0});
}

CaseResult run_swiglu(int64_t T, int64_t I, bool weighted, int mode, uint64_t seed) {
  const auto gu = random_bf16(T * 2 * I, seed, -8.0f, 8.0f);
  const auto rw = random_f32(T, seed + 1, 0.0f, 1.0f);
  std::vector<bf16> y(size_t(T * I));
  std::vector<fp8_e4m3> q(size_t(T * I));
  std::vector<float> s(size_t(T * num_blocks(I)));
  SwigluParams p{.gate = gu.data(),
                 .up = gu.data() + I,
                 .row_weight = weighted ? rw.data() : nullptr,
                 .y = mode == 1 ? nullptr : y.data(),
                 .num_tokens = T,
                 .inter = I};
  if (mode > 0) {
    p.q = q.data();
    p.scales = s.data();
    p.ue8m0 = mode == 2;
  }
  return compare_backends(swiglu, p, mode ? kFp8Tol : kBf16Tol);
}

CaseResult run_rope(int64_t T, int64_t H, int64_t head, int64_t offset, int64_t d, bool yarn,
                    uint64_t seed) {
  RopeConfig cfg;
  cfg.rope_dim = d;
  cfg.yarn = yarn;
  cfg.scaling = {.factor = 40.0f, .mscale = 1.0f, .mscale_all_dim = 1.0f};
  const auto inv = rope_inv_freq(cfg);
  auto x = random_bf16(T * H * head, seed, -2.0f, 2.0f);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int64_t(hash64(seed, uint64_t(t)) % 163840);
  if (T > 0) pos[0] = 0;
  return compare_backends(rope,
                          RopeParams{.x = x.data(),
                                     .positions = pos.data(),
                                     .inv_freq = inv.data(),
                                     .num_tokens = T,
                                     .num_heads = H,
                                     .rope_dim = d,
                                     .token_stride = H * head,
                                     .head_stride = head,
                                     .offset = offset,
                                     .attention_factor = rope_attention_factor(cfg)},
                          Tolerance{.rel_l2 = 0});  // exact products, one rounding: bit for bit
}

}  // namespace

DEEPINFER_KERNEL_CASES(rms_norm_cases) {
  struct S {
    int64_t t, h, stride;
    bool quick;
  };
  for (const S s : {S{1, 7168, 0, true}, S{3, 1536, 0, true}, S{5, 512, 576, true},
                    S{2, 300, 0, true}, S{17, 33, 0, true}, S{64, 7168, 0, false}})
    for (int mode : {0, 1, 2})
      cases.push_back({"rms_norm",
                       fmt::format("t={} h={} stride={} {}", s.t, s.h, s.stride,
                                   mode == 0   ? "bf16"
                                   : mode == 1 ? "fp8"
                                               : "fp8-ue8m0"),
                       s.quick, [=] {
                         return run_rms_norm(s.t, s.h, s.stride, mode, uint64_t(s.t * 131 + s.h));
                       }});
}

DEEPINFER_KERNEL_CASES(residual_add_cases) {
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(3 * 7168), int64_t(512 * 7168)})
    cases.push_back(
        {"residual_add", fmt::format("n={}", n), n < 100000, [=] {
           const auto a = random_bf16(n, 5, -100.0f, 100.0f), b = random_bf16(n, 6, -1.0f, 1.0f);
           std::vector<bf16> out(static_cast<size_t>(n));
           // One fp32 add of two bf16 values rounded once: exact on both backends.
           return compare_backends(
               residual_add,
               ResidualAddParams{.a = a.data(), .b = b.data(), .out = out.data(), .n = n},
               Tolerance{.rel_l2 = 0});
         }});
}

DEEPINFER_KERNEL_CASES(bias_add_cases) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 256}, {7, 1280}, {3, 37}, {0, 64}, {512, 5120}})
    cases.push_back(
        {"bias_add", fmt::format("rows={} cols={}", rows, cols), rows * cols < 100000, [=] {
           const auto x = random_f32(rows * cols, 7, -50.0f, 50.0f);
           const auto b = random_bf16(cols, 8, -1.0f, 1.0f);
           std::vector<bf16> out(static_cast<size_t>(std::max<int64_t>(rows * cols, 1)));
           // f32 + bf16: host sums in fp64, cpu in fp32 (one double rounding apart).
           return compare_backends(
               bias_add,
               BiasAddParams{
                   .x = x.data(), .bias = b.data(), .out = out.data(), .rows = rows, .cols = cols},
               kBf16Tol);
         }});
}

DEEPINFER_KERNEL_CASES(swiglu_cases) {
  struct S {
    int64_t t, i;
    bool quick;
  };
  for (const S s : {S{1, 2048, true}, S{4, 300, true}, S{33, 18, true}, S{256, 2048, false}})
    for (bool weighted : {false, true})
      for (int mode : {0, 1, 2})
        cases.push_back({"swiglu",
                         fmt::format("t={} i={}{} {}", s.t, s.i, weighted ? " weighted" : "",
                                     mode == 0   ? "bf16"
                                     : mode == 1 ? "fp8"
                                                 : "fp8-ue8m0"),
                         s.quick, [=] {
                           return run_swiglu(s.t, s.i, weighted, mode, uint64_t(s.t * 7 + s.i));
                         }});
}

DEEPINFER_KERNEL_CASES(rope_cases) {
  // q_pe inside q [T, H, 192] at 128; k_pe inside the kv row [T, 576] at 512; odd shapes.
  cases.push_back({"rope", "q t=5 h=16 d=64 yarn", true,
                   [] { return run_rope(5, 16, 192, 128, 64, true, 1); }});
  cases.push_back(
      {"rope", "k t=9 h=1 d=64 yarn", true, [] { return run_rope(9, 1, 576, 512, 64, true, 2); }});
  cases.push_back(
      {"rope", "t=3 h=3 d=6 plain", true, [] { return run_rope(3, 3, 10, 2, 6, false, 3); }});
  cases.push_back({"rope", "q t=512 h=128 d=64 yarn", false,
                   [] { return run_rope(512, 128, 192, 128, 64, true, 5); }});
}

}  // namespace deepinfer::kernels::testing
