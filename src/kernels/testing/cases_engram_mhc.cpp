// Harness cases (cpu vs host) for the Engram and mHC kernels, compared bit for bit: the hash is
// integer arithmetic, and the gate, conv and mHC sums are fp64 on both backends with one rounding
// where the reference rounds (docs/numerics.md §8.1), so summation order cannot show.
#include <fmt/format.h>

#include <vector>

#include "kernels/engram.h"
#include "kernels/mhc.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

constexpr Tolerance kExact{.rel_l2 = 0, .int_mismatch_frac = 0};

// The Engram demo's config (layers 1 and 15, orders 2-3, 8 heads each) at vocabulary `vocab`.
EngramHashTables demo_tables(int64_t vocab) {
  return engram_hash_tables({.layer_ids = {1, 15},
                             .max_ngram_size = 3,
                             .n_head_per_ngram = 8,
                             .engram_vocab_size = {646400, 646400},
                             .seed = 0,
                             .vocab_size = vocab});
}

// ids in [0, id_max); every 7th token masked (-1) when `masked`.
CaseResult run_hash(const EngramHashTables& t, int64_t n, int64_t id_max, bool masked,
                    uint64_t seed) {
  std::vector<int32_t> ids(buffer_size(n * t.max_ngram));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(hash64(seed, i) % uint64_t(id_max));
  if (masked)
    for (int64_t i = 0; i < n; i += 7) ids[size_t(i * t.max_ngram)] = -1;
  std::vector<int32_t> out(buffer_size(t.num_layers * n * t.heads()));
  return compare_backends(engram_hash,
                          EngramHashParams{.ngram_ids = ids.data(),
                                           .multipliers = t.multipliers.data(),
                                           .vocab_sizes = t.vocab_sizes.data(),
                                           .offsets = t.offsets.data(),
                                           .out = out.data(),
                                           .num_tokens = n,
                                           .num_layers = t.num_layers,
                                           .max_ngram = t.max_ngram,
                                           .heads_per_ngram = t.heads_per_ngram},
                          kExact);
}

CaseResult run_gate(int64_t n, int64_t hc, int64_t d, bool save, uint64_t seed) {
  const auto x = random_bf16(n * hc * d, seed, -2.0f, 2.0f);
  const auto k = random_bf16(n * hc * d, seed + 1, -2.0f, 2.0f);
  const auto v = random_bf16(n * d, seed + 2, -1.0f, 1.0f);
  const auto w = random_f32(hc * d, seed + 3, 0.5f, 1.5f);
  std::vector<bf16> out(buffer_size(n * hc * d));
  std::vector<float> raw(buffer_size(n * hc)), g(raw.size()), rx(raw.size()), rk(raw.size());
  return compare_backends(engram_gate,
                          EngramGateParams{.x = x.data(),
                                           .k = k.data(),
                                           .v = v.data(),
                                           .w_fused = w.data(),
                                           .out = out.data(),
                                           .raw = save ? raw.data() : nullptr,
                                           .gate = save ? g.data() : nullptr,
                                           .rstd_x = save ? rx.data() : nullptr,
                                           .rstd_k = save ? rk.data() : nullptr,
                                           .num_tokens = n,
                                           .hc = hc,
                                           .dim = d,
                                           .eps = 1e-20f,
                                           .clamp = 1e-6f},
                          kExact);
}

CaseResult run_conv_norm(int64_t n, int64_t hc, int64_t d, uint64_t seed) {
  const auto v = random_bf16(n * d, seed, -2.0f, 2.0f);
  const auto g = random_f32(n * hc, seed + 1, 0.0f, 1.0f);
  const auto w = random_bf16(hc * d, seed + 2, 0.5f, 1.5f);
  std::vector<bf16> out(buffer_size(n * hc * d));
  return compare_backends(engram_conv_norm,
                          EngramConvNormParams{.v = v.data(),
                                               .gate = g.data(),
                                               .w = w.data(),
                                               .out = out.data(),
                                               .num_tokens = n,
                                               .hc = hc,
                                               .dim = d},
                          kExact);
}

// n tokens of `seqs` sequences side by side over rows [history | tokens]: tap j of a token reads
// the row dilation·(K-1-j) positions back, -1 before its sequence start.
CaseResult run_short_conv(int64_t n, int64_t c, int64_t k, int64_t dil, uint64_t seed) {
  const int64_t rows = n + (k - 1) * dil;
  const auto x = random_bf16(rows * c, seed, -3.0f, 3.0f);
  const auto w = random_bf16(c * k, seed + 1, -1.0f, 1.0f);
  std::vector<int32_t> taps(buffer_size(n * k));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = (k - 1) * dil + t - (k - 1 - j) * dil;
      taps[size_t(t * k + j)] = (t % 5 == 4 && j == 0) ? -1 : int32_t(r);
    }
  std::vector<bf16> out(buffer_size(n * c));
  return compare_backends(engram_short_conv,
                          EngramShortConvParams{.x = x.data(),
                                                .taps = taps.data(),
                                                .w = w.data(),
                                                .out = out.data(),
                                                .num_tokens = n,
                                                .num_rows = rows,
                                                .channels = c,
                                                .kernel_size = k},
                          kExact);
}

struct MhcInputs {
  std::vector<bf16> residual;
  std::vector<float> fn, scale, base;
  MhcInputs(int64_t n, int64_t hc, int64_t d, int64_t mixes, uint64_t seed)
      : residual(random_bf16(n * hc * d, seed, -2.0f, 2.0f)),
        fn(random_f32(mixes * hc * d, seed + 1, -1.0f, 1.0f)),
        scale(random_f32(3, seed + 2, 0.05f, 0.2f)),
        base(random_f32(mixes, seed + 3, -1.0f, 1.0f)) {}
};

CaseResult run_mhc_pre(int64_t n, int64_t hc, int64_t d, uint64_t seed) {
  const MhcInputs in(n, hc, d, hc * (hc + 2), seed);
  std::vector<bf16> x(buffer_size(n * d));
  std::vector<float> post(buffer_size(n * hc)), comb(buffer_size(n * hc * hc)), pre(post.size());
  return compare_backends(mhc_pre,
                          MhcPreParams{.residual = in.residual.data(),
                                       .fn = in.fn.data(),
                                       .scale = in.scale.data(),
                                       .base = in.base.data(),
                                       .x = x.data(),
                                       .post = post.data(),
                                       .comb = comb.data(),
                                       .pre = pre.data(),
                                       .num_tokens = n,
                                       .hc = hc,
                                       .dim = d},
                          kExact);
}

CaseResult run_mhc_head(int64_t n, int64_t hc, int64_t d, uint64_t seed) {
  const MhcInputs in(n, hc, d, hc, seed);
  std::vector<bf16> out(buffer_size(n * d));
  return compare_backends(mhc_head,
                          MhcHeadParams{.residual = in.residual.data(),
                                        .fn = in.fn.data(),
                                        .scale = in.scale.data(),
                                        .base = in.base.data(),
                                        .out = out.data(),
                                        .num_tokens = n,
                                        .hc = hc,
                                        .dim = d},
                          kExact);
}

CaseResult run_mhc_post(int64_t n, int64_t hc, int64_t d, uint64_t seed) {
  const auto y = random_bf16(n * d, seed, -2.0f, 2.0f);
  const auto r = random_bf16(n * hc * d, seed + 1, -2.0f, 2.0f);
  const auto post = random_f32(n * hc, seed + 2, 0.0f, 2.0f);
  const auto comb = random_f32(n * hc * hc, seed + 3, 0.0f, 0.5f);
  std::vector<bf16> out(buffer_size(n * hc * d));
  return compare_backends(mhc_post,
                          MhcPostParams{.y = y.data(),
                                        .residual = r.data(),
                                        .post = post.data(),
                                        .comb = comb.data(),
                                        .out = out.data(),
                                        .num_tokens = n,
                                        .hc = hc,
                                        .dim = d},
                          kExact);
}

}  // namespace

DEEPINFER_KERNEL_CASES(engram_cases) {
  cases.push_back({"engram_hash", "demo n=300 masked", true,
                   [] { return run_hash(demo_tables(99000), 300, 99000, true, 1); }});
  cases.push_back({"engram_hash", "demo n=0", true,
                   [] { return run_hash(demo_tables(99000), 0, 99000, false, 2); }});
  // ids far above V': the int64 products wrap and the mix goes negative (Python-style modulo).
  cases.push_back({"engram_hash", "wrapping products n=257", true,
                   [] { return run_hash(demo_tables(99000), 257, 2147483647, false, 3); }});
  cases.push_back({"engram_hash", "g=4 h=3 n=1000", true, [] {
                     return run_hash(engram_hash_tables({.layer_ids = {0, 2, 5},
                                                         .max_ngram_size = 4,
                                                         .n_head_per_ngram = 3,
                                                         .engram_vocab_size = {101, 211, 307},
                                                         .seed = 42,
                                                         .vocab_size = 300}),
                                     1000, 300, true, 4);
                   }});
  cases.push_back({"engram_hash", "demo n=8192", false,
                   [] { return run_hash(demo_tables(99000), 8192, 99000, true, 5); }});
  cases.push_back(
      {"engram_gate", "n=7 hc=4 d=1024 save", true, [] { return run_gate(7, 4, 1024, true, 11); }});
  cases.push_back(
      {"engram_gate", "n=3 hc=4 d=77 (tail)", true, [] { return run_gate(3, 4, 77, true, 12); }});
  cases.push_back({"engram_gate", "n=5 hc=1 d=256 no save", true,
                   [] { return run_gate(5, 1, 256, false, 13); }});
  cases.push_back({"engram_gate", "n=0", true, [] { return run_gate(0, 4, 64, true, 14); }});
  cases.push_back(
      {"engram_gate", "n=256 hc=4 d=7168", false, [] { return run_gate(256, 4, 7168, true, 15); }});
  cases.push_back(
      {"engram_conv_norm", "n=7 hc=4 d=1024", true, [] { return run_conv_norm(7, 4, 1024, 51); }});
  cases.push_back({"engram_conv_norm", "n=3 hc=4 d=77 (tail)", true,
                   [] { return run_conv_norm(3, 4, 77, 52); }});
  cases.push_back({"engram_conv_norm", "n=0", true, [] { return run_conv_norm(0, 4, 64, 53); }});
  cases.push_back({"engram_short_conv", "n=9 c=4096 k=4 dil=3", true,
                   [] { return run_short_conv(9, 4096, 4, 3, 61); }});
  cases.push_back({"engram_short_conv", "n=13 c=37 k=3 dil=2 (tail)", true,
                   [] { return run_short_conv(13, 37, 3, 2, 62); }});
  cases.push_back(
      {"engram_short_conv", "n=5 c=64 k=1", true, [] { return run_short_conv(5, 64, 1, 3, 63); }});
  cases.push_back(
      {"engram_short_conv", "n=0", true, [] { return run_short_conv(0, 64, 4, 3, 64); }});
  cases.push_back({"engram_short_conv", "n=512 c=4096 k=4 dil=3", false,
                   [] { return run_short_conv(512, 4096, 4, 3, 65); }});
}

DEEPINFER_KERNEL_CASES(mhc_cases) {
  cases.push_back({"mhc_pre", "n=9 hc=4 d=1024", true, [] { return run_mhc_pre(9, 4, 1024, 21); }});
  cases.push_back(
      {"mhc_pre", "n=4 hc=4 d=37 (tail)", true, [] { return run_mhc_pre(4, 4, 37, 22); }});
  cases.push_back({"mhc_pre", "n=3 hc=2 d=64", true, [] { return run_mhc_pre(3, 2, 64, 23); }});
  cases.push_back({"mhc_pre", "n=0", true, [] { return run_mhc_pre(0, 4, 64, 24); }});
  cases.push_back(
      {"mhc_pre", "n=128 hc=4 d=7168", false, [] { return run_mhc_pre(128, 4, 7168, 25); }});
  cases.push_back(
      {"mhc_post", "n=9 hc=4 d=1024", true, [] { return run_mhc_post(9, 4, 1024, 31); }});
  cases.push_back(
      {"mhc_post", "n=4 hc=4 d=37 (tail)", true, [] { return run_mhc_post(4, 4, 37, 32); }});
  cases.push_back(
      {"mhc_post", "n=128 hc=4 d=7168", false, [] { return run_mhc_post(128, 4, 7168, 33); }});
  cases.push_back(
      {"mhc_head", "n=9 hc=4 d=1024", true, [] { return run_mhc_head(9, 4, 1024, 41); }});
  cases.push_back(
      {"mhc_head", "n=4 hc=4 d=37 (tail)", true, [] { return run_mhc_head(4, 4, 37, 42); }});
}

}  // namespace deepinfer::kernels::testing
