// Every quick harness case (cpu vs host, outputs poisoned) as its own test, plus checks that the
// harness itself can fail: an unwritten element, a NaN, a wrong value, an injected fault.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <set>

#include "core/check.h"
#include "kernels/gemm.h"
#include "kernels/testing/bench.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

std::vector<OpCase> quick_cases() {
  std::vector<OpCase> out;
  for (auto& c : all_op_cases())
    if (c.quick) out.push_back(std::move(c));
  return out;
}

}  // namespace

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " [" << c.name << "]"; }

namespace {

class HarnessCase : public ::testing::TestWithParam<OpCase> {};

TEST_P(HarnessCase, CpuMatchesHost) {
  reset_call_counters();
  const CaseResult r = GetParam().run();
  EXPECT_TRUE(r.pass) << GetParam().op << " [" << GetParam().name << "]: " << r.detail;
}

std::string case_test_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string s = info.param.op + "_" + info.param.name + "_" + std::to_string(info.index);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Quick, HarnessCase, ::testing::ValuesIn(quick_cases()), case_test_name);

TEST(Harness, EveryOwnedOpHasQuickCases) {
  std::set<std::string> ops;
  for (const auto& c : quick_cases()) ops.insert(c.op);
  for (const char* op :
       {"quant_per_token", "quant_per_block", "dequant_per_token", "dequant_per_block", "gemm_fp8",
        "gemm_fp8_grouped_contiguous", "gemm_fp8_grouped_masked", "gemm_bf16"})
    EXPECT_TRUE(ops.count(op)) << op << " has no quick harness case";
}

TEST(Harness, CompareBuffersCatchesNanInfAndError) {
  const float ref[4] = {1, 2, 3, 4};
  const float same[4] = {1, 2, 3, 4};
  const float nan[4] = {1, 2, NAN, 4};
  const float off[4] = {1, 2, 3, 4.5f};
  const float inf_a[2] = {INFINITY, 1}, inf_b[2] = {INFINITY, 1}, inf_c[2] = {-INFINITY, 1};
  EXPECT_TRUE(compare_buffers("x", DType::f32, same, ref, 4, {}).pass);
  EXPECT_FALSE(compare_buffers("x", DType::f32, nan, ref, 4, {.rel_l2 = 1e9}).pass);
  EXPECT_FALSE(compare_buffers("x", DType::f32, ref, nan, 4, {.rel_l2 = 1e9})
                   .pass);  // NaN in the reference too
  EXPECT_FALSE(compare_buffers("x", DType::f32, off, ref, 4, {.rel_l2 = 1e-3}).pass);
  EXPECT_TRUE(compare_buffers("x", DType::f32, off, ref, 4, {.rel_l2 = 0.1}).pass);
  EXPECT_TRUE(compare_buffers("x", DType::f32, inf_a, inf_b, 2, {}).pass);
  EXPECT_FALSE(compare_buffers("x", DType::f32, inf_c, inf_b, 2, {}).pass);
  const int32_t ia[3] = {1, 2, 3}, ib[3] = {1, 2, 4};
  EXPECT_FALSE(compare_buffers("ids", DType::i32, ia, ib, 3, {}).pass);
  EXPECT_TRUE(compare_buffers("ids", DType::i32, ia, ib, 3, {.int_mismatch_frac = 0.5}).pass);
  const float zero[2] = {0, 0}, tiny[2] = {0, 1e-30f};
  EXPECT_FALSE(compare_buffers("z", DType::f32, tiny, zero, 2, {.rel_l2 = 1}).pass);
}

}  // namespace
}  // namespace deepinfer::kernels::testing

namespace deepinfer::kernels {
// A fake op whose cpu backend forgets the last element: the poisoned output must fail the case.
struct LazyParams {
  const float* x = nullptr;
  float* out = nullptr;
  int64_t n = 0;
};

template <>
struct OpSpec<LazyParams> {
  static constexpr const char* name = "test_lazy";
  static std::string shape(const LazyParams& p) { return fmt::format("n={}", p.n); }
  template <class V>
  static void visit(LazyParams& p, V& v) {
    v.in("x", p.x, p.n);
    v.out("out", p.out, p.n);
  }
};
}  // namespace deepinfer::kernels

namespace deepinfer::kernels::testing {
namespace {
void lazy_host(const LazyParams& p) {
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = 2 * p.x[i];
}
void lazy_cpu(const LazyParams& p) {
  for (int64_t i = 0; i + 1 < p.n; ++i) p.out[i] = 2 * p.x[i];
}
void lazy_op(const LazyParams& p) { dispatch(p, lazy_host, lazy_cpu); }
void good_op(const LazyParams& p) { dispatch(p, lazy_host, lazy_host); }

TEST(Harness, PoisonCatchesUnwrittenElement) {
  std::vector<float> x = random_f32(10, 1), out(10, 0.0f);
  // Pre-filling `out` with the right answer must not hide the bug: the harness poisons it.
  lazy_host({x.data(), out.data(), 10});
  const CaseResult bad = compare_backends(lazy_op, LazyParams{x.data(), out.data(), 10}, {});
  EXPECT_FALSE(bad.pass);
  EXPECT_NE(bad.detail.find("NaN"), std::string::npos) << bad.detail;
  EXPECT_TRUE(compare_backends(good_op, LazyParams{x.data(), out.data(), 10}, {}).pass);
}

TEST(Harness, InjectedFaultFailsTheGemmCase) {
  const Knobs saved = knobs();
  Knobs k = saved;
  k.fault = "kernel:gemm_fp8:1";  // call 0 is the host run, call 1 the cpu run
  set_knobs(k);
  reset_call_counters();
  const Fp8Rows a = random_fp8_activations(2, 256, 1), w = random_fp8_weights(130, 256, 2);
  std::vector<bf16> out(2 * 130);
  const GemmFp8Params p{.a = a.q.data(),
                        .a_scales = a.scales.data(),
                        .w = w.q.data(),
                        .w_scales = w.scales.data(),
                        .out = out.data(),
                        .m = 2,
                        .n = 130,
                        .k = 256};
  const CaseResult r = compare_backends(gemm_fp8, p, {.rel_l2 = 1e-3});
  set_knobs(saved);
  EXPECT_FALSE(r.pass);
  reset_call_counters();
  EXPECT_TRUE(compare_backends(gemm_fp8, p, {.rel_l2 = 1e-3}).pass);
}

// The read pass behind every weight-streaming limit reads each word once whatever the split into
// streams: its sum equals the closed form, sizes with and without a remainder past the parts.
TEST(Harness, ReadPassReadsEveryWordOnce) {
  for (const size_t n : {size_t(256), size_t(64) << 10, (size_t(64) << 10) + 768})
    for (const size_t streams : {size_t(1), size_t(2), size_t(4)})
      for (const size_t grain : {size_t(64), size_t(256)})
        for (const bool to_l2 : {false, true}) {
          std::vector<uint64_t> words(n / 8);
          uint64_t want = 0;
          for (size_t i = 0; i < words.size(); ++i) want += words[i] = i * 2654435761u + 7;
          EXPECT_EQ(read_pass_sum(reinterpret_cast<const uint8_t*>(words.data()), n, 2048, streams,
                                  grain, to_l2),
                    want)
              << "n=" << n << " streams=" << streams << " grain=" << grain << " to_l2=" << to_l2;
        }
}

}  // namespace
}  // namespace deepinfer::kernels::testing
