// Batch invariance of the cpu kernels (docs/numerics.md §10): a row's output bytes must not depend
// on how many rows share the call, where the row sits, or what the other rows hold; attention's
// output for a query must not depend on how the prompt was chunked or what else shares the call.
// Each case computes some rows alone (M = 1) and again inside calls of M rows of random data, and
// requires bit-identical bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/env.h"
#include "kernels/attention.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"
#include "kernels/testing/data.h"

namespace deepinfer::kernels {
namespace {

using testing::random_bf16;
using testing::random_f32;

const int64_t kMs[] = {2, 3, 8, 9, 16, 17, 33, 64, 130};
constexpr int64_t kPool = 160;  // distinct input rows to draw from

// Output bytes of each row, for the pool rows `ids` computed in one call.
using RowsFn = std::function<std::vector<std::string>(const std::vector<int64_t>& ids)>;

bool same_bytes(const std::vector<bf16>& a, const bf16* b) {
  return a.empty() || std::memcmp(a.data(), b, a.size() * sizeof(bf16)) == 0;
}

template <class T>
std::string bytes_of(const T* p, int64_t n) {
  return std::string(reinterpret_cast<const char*>(p), size_t(n) * sizeof(T));
}

// Rows `targets` alone, then at the first, middle and last position of calls of every M in kMs
// (the other rows drawn from the pool by a seeded hash): every copy must equal the M = 1 bytes.
void expect_row_invariant(const RowsFn& run, const std::string& what) {
  const int64_t targets[] = {0, 7, 101};
  for (int64_t target : targets) {
    const std::string alone = run({target})[0];
    for (int64_t m : kMs)
      for (int64_t at : {int64_t(0), m / 2, m - 1}) {
        std::vector<int64_t> ids(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i)
          ids[size_t(i)] =
              int64_t(testing::hash64(uint64_t(m * 1000 + at), uint64_t(i)) % uint64_t(kPool));
        ids[size_t(at)] = target;
        const auto out = run(ids);
        EXPECT_TRUE(out[size_t(at)] == alone) << what << ": row " << target << " at position " << at
                                              << " of M = " << m << " differs from M = 1";
      }
  }
}

// ---- GEMM -------------------------------------------------------------------------------------

// The GEMM cases run in the batch-invariant mode (DEEPINFER_BATCH_INVARIANT=on), or with the mode
// off where the CPU has BF16 dot products: there `off` takes the same kernels at every M, as no
// other is faster (docs/numerics.md §10), so it must be invariant too. Elsewhere the default
// streaming decode kernels are checked for correctness by the harness, not for invariance.
struct GemmMode {
  explicit GemmMode(bool off) : saved(knobs()) {
    if (off) {
      Knobs k = saved;
      k.batch_invariant = false;  // DecodeGemm::automatic follows the knob
      set_knobs(k);
    }
    cpu::set_decode_gemm(off ? cpu::DecodeGemm::automatic : cpu::DecodeGemm::invariant);
  }
  ~GemmMode() {
    set_knobs(saved);
    cpu::set_decode_gemm(cpu::DecodeGemm::automatic);
  }
  const Knobs saved;
};

struct Fp8GemmCase {
  int64_t n, k;
  bool decode_layout;  // give the weight's decode layout where this CPU has one
  bool f32_out;
  // Codes drawn uniformly (every exponent, NaN codes excluded): products of very different sizes
  // in one block, so a block's sum rounds and its order shows. Quantised random values mostly sum
  // exactly, in any order.
  bool wide = false;
  bool mode_off = false;  // DEEPINFER_BATCH_INVARIANT=off (GemmMode)
};

testing::Fp8Rows wide_rows(int64_t rows, int64_t k, uint64_t seed, bool weight) {
  testing::Fp8Rows r;
  r.rows = rows;
  r.k = k;
  r.q = testing::random_e4m3(rows * k, seed);
  for (auto& c : r.q)
    if ((c.bits & 0x7f) == 0x7f) c.bits ^= 1;  // NaN -> 448
  r.scales = testing::random_scales((weight ? num_blocks(rows) : rows) * num_blocks(k), seed + 1);
  return r;
}

void gemm_fp8_case(const Fp8GemmCase& c) {
  const GemmMode mode(c.mode_off);
  const auto a =
      c.wide ? wide_rows(kPool, c.k, 11, false) : testing::random_fp8_activations(kPool, c.k, 11);
  const auto w = c.wide ? wide_rows(c.n, c.k, 12, true) : testing::random_fp8_weights(c.n, c.k, 12);
  std::vector<uint8_t> wd(c.decode_layout ? decode_layout_bytes(c.n, c.k) : 0);
  if (!wd.empty()) pack_decode_layout(w.q.data(), c.n, c.k, wd.data());
  const int64_t kbs = num_blocks(c.k);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<fp8_e4m3> aq(size_t(m * c.k));
        std::vector<float> as(size_t(m * kbs));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(a.q.data() + ids[size_t(i)] * c.k, c.k, aq.data() + i * c.k);
          std::copy_n(a.scales.data() + ids[size_t(i)] * kbs, kbs, as.data() + i * kbs);
        }
        std::vector<bf16> out(c.f32_out ? 0 : size_t(m * c.n));
        std::vector<float> out_f32(c.f32_out ? size_t(m * c.n) : 0);
        cpu::gemm_fp8({.a = aq.data(),
                       .a_scales = as.data(),
                       .w = w.q.data(),
                       .w_scales = w.scales.data(),
                       .out = c.f32_out ? nullptr : out.data(),
                       .out_f32 = c.f32_out ? out_f32.data() : nullptr,
                       .m = m,
                       .n = c.n,
                       .k = c.k,
                       .w_decode = wd.empty() ? nullptr : wd.data()});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(c.f32_out ? bytes_of(out_f32.data() + i * c.n, c.n)
                                   : bytes_of(out.data() + i * c.n, c.n));
        return rows;
      },
      "gemm_fp8 n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
          (wd.empty() ? "" : " decode layout") + (c.f32_out ? " f32" : "") +
          (c.wide ? " wide" : "") + (c.mode_off ? " mode off" : ""));
}

TEST(BatchInvariance, GemmFp8DecodeLayout) {  // on VDPBF16PS, also where AMX is the default
  if (decode_layout_bytes(256, 512) == 0) GTEST_SKIP() << "no decode layout on this CPU";
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_fp8_case({.n = 288, .k = 512, .decode_layout = true, .f32_out = false});
  gemm_fp8_case({.n = 200, .k = 256, .decode_layout = true, .f32_out = true});
  gemm_fp8_case({.n = 200, .k = 384, .decode_layout = true, .f32_out = true, .wide = true});
}

TEST(BatchInvariance, GemmFp8DecodeLayoutModeOff) {  // larger M in 8-row chunks there too
  if (decode_layout_bytes(256, 512) == 0) GTEST_SKIP() << "no decode layout on this CPU";
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_fp8_case({.n = 288, .k = 512, .decode_layout = true, .f32_out = false, .mode_off = true});
  gemm_fp8_case(
      {.n = 200, .k = 384, .decode_layout = true, .f32_out = true, .wide = true, .mode_off = true});
}

TEST(BatchInvariance, GemmFp8DecodeLayoutAmx) {  // 16-row tiles: M = 17, 33, 130 span several
  if (!cpu::cpu_has_amx()) GTEST_SKIP() << "no AMX-BF16 on this CPU (or the OS refused it)";
  const cpu::ScopedAmx amx(true);
  ASSERT_TRUE(cpu::amx_active());
  gemm_fp8_case({.n = 288, .k = 512, .decode_layout = true, .f32_out = false});
  gemm_fp8_case({.n = 200, .k = 256, .decode_layout = true, .f32_out = true});
  gemm_fp8_case({.n = 200, .k = 384, .decode_layout = true, .f32_out = true, .wide = true});
}

TEST(BatchInvariance, GemmFp8RowLayout) {
  gemm_fp8_case({.n = 288, .k = 512, .decode_layout = false, .f32_out = false});
  gemm_fp8_case({.n = 200, .k = 256, .decode_layout = false, .f32_out = true});
  gemm_fp8_case({.n = 200, .k = 384, .decode_layout = false, .f32_out = true, .wide = true});
}

TEST(BatchInvariance, GemmFp8KEdge) {  // k % 128 != 0: the generic kernels' zero-padded edges
  gemm_fp8_case({.n = 130, .k = 300, .decode_layout = false, .f32_out = true, .wide = true});
}

TEST(BatchInvariance, GemmFp8GroupedContiguous) {
  // Rows of expert 1 between segments of experts 0 and 2 whose lengths vary with M.
  const GemmMode mode(false);
  const int64_t n = 160, k = 256, kbs = num_blocks(k), E = 3;
  const auto a = testing::random_fp8_activations(kPool, k, 21);
  const auto w = testing::random_fp8_expert_weights(E, n, k, 22);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<fp8_e4m3> aq(size_t(m * k));
        std::vector<float> as(size_t(m * kbs));
        std::vector<int32_t> expert(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(a.q.data() + ids[size_t(i)] * k, k, aq.data() + i * k);
          std::copy_n(a.scales.data() + ids[size_t(i)] * kbs, kbs, as.data() + i * kbs);
          // Expert 1: the middle third (a run whose length varies with M) and the rows under test
          // (pool rows 0, 7, 101), wherever they sit; experts 0 and 2 before and after.
          const int64_t r = ids[size_t(i)];
          const bool mine = (3 * i >= m && 3 * i < 2 * m) || r == 0 || r == 7 || r == 101;
          expert[size_t(i)] = mine ? 1 : 3 * i < m ? 0 : 2;
        }
        std::vector<bf16> out(size_t(m * n));
        cpu::gemm_fp8_grouped_contiguous({.a = aq.data(),
                                          .a_scales = as.data(),
                                          .w = w.q.data(),
                                          .w_scales = w.scales.data(),
                                          .m_indices = expert.data(),
                                          .out = out.data(),
                                          .m = m,
                                          .n = n,
                                          .k = k,
                                          .num_experts = E});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i) {
          // Only rows of expert 1 are compared (the M = 1 call is a run of expert 1).
          rows.push_back(expert[size_t(i)] == 1 ? bytes_of(out.data() + i * n, n) : "");
        }
        return rows;
      },
      "gemm_fp8_grouped_contiguous (expert 1)");
}

void gemm_bf16_case(int64_t n, int64_t k, bool f32_out, bool mode_off) {
  const GemmMode mode(mode_off);
  const auto a = random_bf16(kPool * k, 31, -2.0f, 2.0f);
  const auto w = random_bf16(n * k, 32, -0.1f, 0.1f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<bf16> av(size_t(m * k));
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(a.data() + ids[size_t(i)] * k, k, av.data() + i * k);
        std::vector<bf16> out(f32_out ? 0 : size_t(m * n));
        std::vector<float> out_f32(f32_out ? size_t(m * n) : 0);
        cpu::gemm_bf16({.a = av.data(),
                        .w = w.data(),
                        .out = f32_out ? nullptr : out.data(),
                        .out_f32 = f32_out ? out_f32.data() : nullptr,
                        .m = m,
                        .n = n,
                        .k = k});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(f32_out ? bytes_of(out_f32.data() + i * n, n)
                                 : bytes_of(out.data() + i * n, n));
        return rows;
      },
      "gemm_bf16 n=" + std::to_string(n) + " k=" + std::to_string(k) +
          (mode_off ? " mode off" : ""));
}

void gemm_bf16_cases(bool mode_off = false) {
  gemm_bf16_case(288, 512, false, mode_off);
  gemm_bf16_case(130, 64, true, mode_off);   // the absorbed-MLA shapes: k < 128
  gemm_bf16_case(32, 128, false, mode_off);  // n < one panel
  gemm_bf16_case(120, 96, false, mode_off);  // AMX: a partial second 16-column tile at the end
  // 8·k f32 activations beyond L1's budget: column tiles (the last one partial) and a K edge
  gemm_bf16_case(100, 1000, true, mode_off);
}

TEST(BatchInvariance, GemmBf16) {  // VDPBF16PS (else Highway), also where AMX is the default
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_bf16_cases();
}

TEST(BatchInvariance, GemmBf16ModeOff) {  // the BF16-dot kernel at every M there too
  if (!cpu::bf16_dot_gemm()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_bf16_cases(/*mode_off=*/true);
}

// The absorbed attention's per-head GEMMs with the weights in the pairs layout
// (GemmBf16Params::w_pairs, a lane per output column): every row gets its M = 1 bytes, and every
// call the bytes of the same call without the layout (the horizontal-sum kernel).
void gemm_bf16_pairs_case(int64_t n, int64_t k, bool f32_out, bool mode_off) {
  const GemmMode mode(mode_off);
  const int64_t H = 3, words = int64_t(bf16_pairs_words(n, k));
  ASSERT_GT(words, 0);
  const auto a = random_bf16(kPool * H * k, 33, -2.0f, 2.0f);  // pool rows [H, k] each
  const auto w = random_bf16(H * n * k, 34, -0.1f, 0.1f);      // [H, n, k]
  std::vector<uint32_t> pairs(size_t(H * words));
  for (int64_t h = 0; h < H; ++h)
    pack_bf16_pairs(w.data() + h * n * k, n, k, pairs.data() + h * words);
  const std::string what = "gemm_bf16 pairs heads=3 n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + (mode_off ? " mode off" : "");
  auto rows_of = [&](const std::vector<int64_t>& ids, bool with_pairs) {
    const int64_t m = int64_t(ids.size()), width = H * n;
    std::vector<bf16> av(size_t(m * H * k));
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(a.data() + ids[size_t(i)] * H * k, H * k, av.data() + i * H * k);
    std::vector<bf16> out(f32_out ? 0 : size_t(m * width));
    std::vector<float> out_f32(f32_out ? size_t(m * width) : 0);
    GemmBf16Params gp{.a = av.data(),
                      .w = w.data(),
                      .out = f32_out ? nullptr : out.data(),
                      .out_f32 = f32_out ? out_f32.data() : nullptr,
                      .m = m,
                      .n = n,
                      .k = k};
    gp.set_heads(H);
    gp.w_pairs = with_pairs ? pairs.data() : nullptr;
    cpu::gemm_bf16(gp);
    std::vector<std::string> rows;
    for (int64_t i = 0; i < m; ++i)
      rows.push_back(f32_out ? bytes_of(out_f32.data() + i * width, width)
                             : bytes_of(out.data() + i * width, width));
    return rows;
  };
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const auto got = rows_of(ids, true);
        EXPECT_TRUE(got == rows_of(ids, false))
            << what << ": M = " << ids.size() << " differs from the call without the layout";
        return got;
      },
      what);
}

void gemm_bf16_pairs_cases(bool mode_off = false) {
  gemm_bf16_pairs_case(256, 64, false, mode_off);  // q_nope · W_UK: k = qk_nope, n = kv_lora
  gemm_bf16_pairs_case(64, 256, false, mode_off);  // ō · W_UV
  gemm_bf16_pairs_case(130, 64, true, mode_off);   // a partial last 16-column tile, f32 out
  gemm_bf16_pairs_case(32, 96, false, mode_off);   // k not a multiple of 64
}

TEST(BatchInvariance, GemmBf16Pairs) {
  if (!cpu::bf16_dot_gemm()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_bf16_pairs_cases();
}

TEST(BatchInvariance, GemmBf16PairsModeOff) {
  if (!cpu::bf16_dot_gemm()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const cpu::ScopedAmx vdpbf16ps(false);
  gemm_bf16_pairs_cases(/*mode_off=*/true);
}

TEST(BatchInvariance, GemmBf16Amx) {  // 16-row B tiles: M = 17, 33, 130 span several
  if (!cpu::cpu_has_amx()) GTEST_SKIP() << "no AMX-BF16 on this CPU (or the OS refused it)";
  const cpu::ScopedAmx amx(true);
  ASSERT_TRUE(cpu::amx_bf16_gemm(512));
  gemm_bf16_cases();
}

// ---- per-row elementwise kernels ----------------------------------------------------------------

TEST(BatchInvariance, RmsNormWithCast) {
  const int64_t H = 7168 / 8 + 16;  // not a multiple of 128: a partial cast block
  const auto x = random_bf16(kPool * H, 41, -3.0f, 3.0f);
  const auto wt = random_bf16(H, 42, 0.5f, 1.5f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size()), kbs = num_blocks(H);
        std::vector<bf16> xv(size_t(m * H)), y(size_t(m * H));
        std::vector<fp8_e4m3> q(size_t(m * H));
        std::vector<float> s(size_t(m * kbs));
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(x.data() + ids[size_t(i)] * H, H, xv.data() + i * H);
        cpu::rms_norm({.x = xv.data(),
                       .w = wt.data(),
                       .y = y.data(),
                       .q = q.data(),
                       .scales = s.data(),
                       .num_tokens = m,
                       .hidden = H});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(bytes_of(y.data() + i * H, H) + bytes_of(q.data() + i * H, H) +
                         bytes_of(s.data() + i * kbs, kbs));
        return rows;
      },
      "rms_norm");
}

TEST(BatchInvariance, QuantPerToken) {
  const int64_t K = 7 * 128 + 40;
  const auto x = random_bf16(kPool * K, 51, -5.0f, 5.0f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size()), kbs = num_blocks(K);
        std::vector<bf16> xv(size_t(m * K));
        std::vector<fp8_e4m3> q(size_t(m * K));
        std::vector<float> s(size_t(m * kbs));
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(x.data() + ids[size_t(i)] * K, K, xv.data() + i * K);
        cpu::quant_per_token({.x = xv.data(), .q = q.data(), .scales = s.data(), .m = m, .k = K});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(bytes_of(q.data() + i * K, K) + bytes_of(s.data() + i * kbs, kbs));
        return rows;
      },
      "quant_per_token");
}

void swiglu_case(bool cast, int64_t I) {
  const auto gu = random_bf16(kPool * 2 * I, 61, -4.0f, 4.0f);
  const auto rw = random_f32(kPool, 62, 0.1f, 1.0f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size()), kbs = num_blocks(I);
        std::vector<bf16> xv(size_t(m * 2 * I)), y(size_t(m * I));
        std::vector<float> w(static_cast<size_t>(m)), s(size_t(m * kbs));
        std::vector<fp8_e4m3> q(size_t(m * I));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(gu.data() + ids[size_t(i)] * 2 * I, 2 * I, xv.data() + i * 2 * I);
          w[size_t(i)] = rw[size_t(ids[size_t(i)])];
        }
        cpu::swiglu({.gate = xv.data(),
                     .up = xv.data() + I,
                     .row_weight = w.data(),
                     .y = y.data(),
                     .q = cast ? q.data() : nullptr,
                     .scales = cast ? s.data() : nullptr,
                     .num_tokens = m,
                     .inter = I});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(
              bytes_of(y.data() + i * I, I) +
              (cast ? bytes_of(q.data() + i * I, I) + bytes_of(s.data() + i * kbs, kbs) : ""));
        return rows;
      },
      std::string("swiglu") + (cast ? " with cast" : ""));
}

TEST(BatchInvariance, Swiglu) {
  swiglu_case(false, 1000);  // few rows: the channel-split path; I % 16 != 0: scalar tails
  swiglu_case(true, 512);
}

TEST(BatchInvariance, Rope) {
  const int64_t H = 4, d = 64, stride = H * 96;
  RopeConfig rc;
  rc.rope_dim = d;
  const auto inv_freq = rope_inv_freq(rc);
  const auto x = random_bf16(kPool * stride, 71, -2.0f, 2.0f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<bf16> xv(size_t(m * stride));
        std::vector<int64_t> pos(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(x.data() + ids[size_t(i)] * stride, stride, xv.data() + i * stride);
          pos[size_t(i)] = ids[size_t(i)] * 37;
        }
        cpu::rope({.x = xv.data(),
                   .positions = pos.data(),
                   .inv_freq = inv_freq.data(),
                   .num_tokens = m,
                   .num_heads = H,
                   .rope_dim = d,
                   .token_stride = stride,
                   .head_stride = 96,
                   .offset = 32});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i) rows.push_back(bytes_of(xv.data() + i * stride, stride));
        return rows;
      },
      "rope");
}

TEST(BatchInvariance, Router) {
  const int64_t E = 64, K = 6;
  const auto logits = random_f32(kPool * E, 81, -4.0f, 4.0f);
  const auto bias = random_f32(E, 82, -0.1f, 0.1f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<float> lv(size_t(m * E)), wts(size_t(m * K)), mg(static_cast<size_t>(m));
        std::vector<int64_t> idx(size_t(m * K));
        for (int64_t i = 0; i < m; ++i)
          std::copy_n(logits.data() + ids[size_t(i)] * E, E, lv.data() + i * E);
        cpu::router({.logits = lv.data(),
                     .bias = bias.data(),
                     .topk_idx = idx.data(),
                     .topk_weights = wts.data(),
                     .margins = mg.data(),
                     .num_tokens = m,
                     .num_experts = E,
                     .top_k = K,
                     .n_group = 8,
                     .topk_group = 4,
                     .routed_scaling_factor = 2.5f});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i)
          rows.push_back(bytes_of(idx.data() + i * K, K) + bytes_of(wts.data() + i * K, K) +
                         bytes_of(mg.data() + i, 1));
        return rows;
      },
      "router");
}

TEST(BatchInvariance, Sampling) {
  const int64_t V = 3000;
  const auto logits = random_f32(kPool * V, 91, -8.0f, 8.0f);
  expect_row_invariant(
      [&](const std::vector<int64_t>& ids) {
        const int64_t m = int64_t(ids.size());
        std::vector<float> lv(size_t(m * V)), temp(static_cast<size_t>(m)),
            top_p(static_cast<size_t>(m));
        std::vector<int32_t> top_k(static_cast<size_t>(m)), tok(static_cast<size_t>(m));
        std::vector<int64_t> seed(static_cast<size_t>(m)), counter(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) {
          const int64_t r = ids[size_t(i)];
          std::copy_n(logits.data() + r * V, V, lv.data() + i * V);
          temp[size_t(i)] = r % 3 == 0 ? 0.0f : 0.7f;  // greedy and sampled rows
          top_k[size_t(i)] = r % 2 ? 40 : 0;
          top_p[size_t(i)] = r % 5 ? 0.9f : 1.0f;
          seed[size_t(i)] = r * 7919;
          counter[size_t(i)] = r;
        }
        cpu::sample({.logits = lv.data(),
                     .temperature = temp.data(),
                     .top_k = top_k.data(),
                     .top_p = top_p.data(),
                     .seed = seed.data(),
                     .counter = counter.data(),
                     .tokens = tok.data(),
                     .batch = m,
                     .vocab = V});
        std::vector<std::string> rows;
        for (int64_t i = 0; i < m; ++i) rows.push_back(bytes_of(tok.data() + i, 1));
        return rows;
      },
      "sample");
}

// ---- attention ----------------------------------------------------------------------------------

// One sequence's latent cache [n, D] in pages (out of order), and its queries [n, H, D].
struct MlaSeq {
  int64_t n = 0;
  std::vector<bf16> q;         // [n, H, D]
  std::vector<int32_t> pages;  // page of each block
};

constexpr int64_t kH = 4, kD = 160, kDv = 128, kPage = kMlaPageSize;

struct MlaCache {
  std::vector<bf16> kv;  // [num_pages, page, D]
  int64_t num_pages = 0;
  std::vector<MlaSeq> seqs;
};

MlaCache make_cache(const std::vector<int64_t>& lens, uint64_t seed) {
  MlaCache c;
  for (int64_t n : lens) c.num_pages += (n + kPage - 1) / kPage;
  c.kv = random_bf16(c.num_pages * kPage * kD, seed, -1.5f, 1.5f);
  std::vector<int32_t> order(size_t(c.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    MlaSeq sq;
    sq.n = lens[s];
    sq.q = random_bf16(sq.n * kH * kD, seed + 100 + s, -1.5f, 1.5f);
    for (int64_t p = 0; p < (sq.n + kPage - 1) / kPage; ++p) sq.pages.push_back(order[next++]);
    c.seqs.push_back(std::move(sq));
  }
  return c;
}

// Queries [start, start + len) of sequence s attended over its first start + len keys, in one
// mla_decode call together with the same for `others` (sequence, start, len).
struct QueryBlock {
  size_t seq;
  int64_t start, len;
};
std::vector<std::vector<bf16>> run_decode(const MlaCache& c,
                                          const std::vector<QueryBlock>& blocks) {
  // mla_decode takes one s_q for the batch: blocks of one call have equal len.
  const int64_t B = int64_t(blocks.size()), S = blocks[0].len;
  int64_t maxp = 0;
  for (const auto& b : blocks) maxp = std::max<int64_t>(maxp, int64_t(c.seqs[b.seq].pages.size()));
  std::vector<bf16> q(size_t(B * S * kH * kD)), o(size_t(B * S * kH * kDv));
  std::vector<int32_t> table(size_t(B * maxp), 0), lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto& qb = blocks[size_t(b)];
    const auto& sq = c.seqs[qb.seq];
    std::copy_n(sq.q.data() + qb.start * kH * kD, S * kH * kD, q.data() + b * S * kH * kD);
    std::copy(sq.pages.begin(), sq.pages.end(), table.begin() + b * maxp);
    lens[size_t(b)] = int32_t(qb.start + S);
  }
  cpu::mla_decode({.q = q.data(),
                   .kv_cache = c.kv.data(),
                   .block_table = table.data(),
                   .cache_seqlens = lens.data(),
                   .o = o.data(),
                   .batch = B,
                   .s_q = S,
                   .num_heads = kH,
                   .head_dim = kD,
                   .head_dim_v = kDv,
                   .page_size = kPage,
                   .num_pages = c.num_pages,
                   .max_pages_per_seq = maxp,
                   .softmax_scale = 0.08f});
  std::vector<std::vector<bf16>> out;
  for (int64_t b = 0; b < B; ++b)
    out.emplace_back(o.begin() + b * S * kH * kDv, o.begin() + (b + 1) * S * kH * kDv);
  return out;
}

// Sequence 0's outputs, query by query ([n, H, Dv]), from chunks of `chunk` queries (the model's
// chunked prefill: each chunk attends the cache filled by the earlier ones).
std::vector<bf16> chunked(const MlaCache& c, int64_t chunk) {
  const int64_t n = c.seqs[0].n;
  std::vector<bf16> out;
  for (int64_t s = 0; s < n; s += chunk) {
    const auto o = run_decode(c, {{0, s, std::min(chunk, n - s)}});
    out.insert(out.end(), o[0].begin(), o[0].end());
  }
  return out;
}

void expect_chunking_invariant(int64_t n) {
  const MlaCache c = make_cache({n}, 101);
  const auto whole = chunked(c, n);
  for (int64_t chunk : {1, 7, 32, 64, 100, 256}) {
    if (chunk >= n) continue;
    EXPECT_TRUE(same_bytes(whole, chunked(c, chunk).data()))
        << "mla_decode n=" << n << ": chunks of " << chunk << " differ from one prefill";
  }
}

TEST(BatchInvariance, MlaChunkedPrefillShort) { expect_chunking_invariant(150); }

TEST(BatchInvariance, MlaChunkedPrefillLong) {  // long enough for the kernel's key splits
  expect_chunking_invariant(1300);
}

TEST(BatchInvariance, MlaDecodeWithOtherSequences) {
  // The last token of sequence 0 (a 1-token decode) alone, then batched with other sequences of
  // short and long contexts.
  const MlaCache c = make_cache({700, 40, 2000, 300, 1200, 5, 900, 64}, 202);
  const auto alone = run_decode(c, {{0, 699, 1}})[0];
  for (size_t others = 1; others < c.seqs.size(); ++others) {
    std::vector<QueryBlock> blocks;
    for (size_t s = others; s >= 1; --s) blocks.push_back({s, c.seqs[s].n - 1, 1});
    const size_t at = blocks.size() / 2;
    blocks.insert(blocks.begin() + ptrdiff_t(at), {0, 699, 1});
    const auto out = run_decode(c, blocks);
    EXPECT_TRUE(same_bytes(alone, out[at].data()))
        << "mla_decode: sequence 0's decode differs with " << others << " other sequences";
  }
}

TEST(BatchInvariance, MlaPrefillWithOtherSequences) {
  // mla_prefill (absorbed, varlen): sequence 0's rows alone and after other sequences.
  const std::vector<int64_t> lens = {600, 30, 1100, 9};
  std::vector<std::vector<bf16>> kv, q;
  for (size_t s = 0; s < lens.size(); ++s) {
    kv.push_back(random_bf16(lens[s] * kD, 300 + s, -1.5f, 1.5f));
    q.push_back(random_bf16(lens[s] * kH * kD, 400 + s, -1.5f, 1.5f));
  }
  auto run = [&](const std::vector<size_t>& seqs) {
    std::vector<bf16> qa, kva;
    std::vector<int32_t> cu{0};
    for (size_t s : seqs) {
      qa.insert(qa.end(), q[s].begin(), q[s].end());
      kva.insert(kva.end(), kv[s].begin(), kv[s].end());
      cu.push_back(cu.back() + int32_t(lens[s]));
    }
    std::vector<bf16> o(size_t(cu.back() * kH * kDv));
    cpu::mla_prefill({.q = qa.data(),
                      .kv = kva.data(),
                      .cu_seqlens_q = cu.data(),
                      .cu_seqlens_k = cu.data(),
                      .o = o.data(),
                      .num_seqs = int64_t(seqs.size()),
                      .num_heads = kH,
                      .head_dim = kD,
                      .head_dim_v = kDv,
                      .softmax_scale = 0.08f});
    return o;
  };
  const auto alone = run({0});
  for (const auto& seqs : std::vector<std::vector<size_t>>{{1, 0}, {2, 0, 3}, {3, 1, 2, 0}}) {
    const auto o = run(seqs);
    int64_t off = 0;
    for (size_t s : seqs) {
      if (s == 0) break;
      off += lens[s];
    }
    EXPECT_TRUE(same_bytes(alone, o.data() + off * kH * kDv))
        << "mla_prefill: sequence 0 differs with " << seqs.size() - 1 << " other sequences";
  }
}

}  // namespace
}  // namespace deepinfer::kernels
