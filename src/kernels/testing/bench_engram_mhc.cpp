// `bench kernels` lines for engram_hash, engram_gate and mhc_pre (docs/performance.md §1): time of
// the cpu kernel against memcpy bandwidth measured in the same run on the bytes the op must move
// (inputs read once, outputs written once), and against read bandwidth on the input bytes alone.
// mhc_pre also does 2·hc(hc+2)·hc·d flops per token, so its line carries the fp32 FMA roofline too.
// Every line's output is checked against host.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "kernels/engram.h"
#include "kernels/mhc.h"
#include "kernels/testing/bench.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

// Compares every output of a cpu run with the host run's (same inputs, other output buffers).
template <class P>
CaseResult check_outputs(const P& cpu_p, const P& host_p) {
  const auto a = collect_buffers(cpu_p), b = collect_buffers(host_p);
  CaseResult total;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].role == BufferRole::in) continue;
    const CaseResult r =
        compare_buffers(a[i].name, a[i].dtype, a[i].ptr, b[i].ptr, a[i].numel, {.rel_l2 = 1e-3});
    total.max_rel_err = std::max(total.max_rel_err, r.max_rel_err);
    total.pass = total.pass && r.pass;
  }
  return total;
}

// `bytes` in and out in all, `read_bytes` of them inputs: the line's ratio is against memcpy
// bandwidth on all of them, and read_ratio against a read-only pass over the inputs alone (the
// time no implementation can beat, since every input byte must be read once).
BenchRecord memory_record(BenchContext& ctx, const char* bench, std::string case_name, double s,
                          double bytes, double read_bytes, const CaseResult& c) {
  const double limit = ctx.memcpy_gbps(size_t(bytes / 2));
  const double read = ctx.read_gbps(size_t(read_bytes));
  return {.bench = bench,
          .case_name = std::move(case_name),
          .seconds = s,
          .bytes = bytes,
          .limit = "memcpy_gbps",
          .limit_value = limit,
          .ratio = bytes / s / 1e9 / limit,
          .correct = c.pass,
          .rel_err = c.max_rel_err,
          .extra = {{"read_bytes", read_bytes},
                    {"read_gbps", read},
                    {"read_ratio", read_bytes / (read * 1e9) / s}}};
}

}  // namespace

DEEPINFER_KERNEL_BENCH(engram) {
  int failures = 0;
  // engram_hash: the demo config (2 layers, orders 2-3, 8 heads), canonical vocabulary 99000.
  {
    const int64_t n = ctx.quick ? 4096 : 65536;
    const EngramHashTables t = engram_hash_tables({.layer_ids = {1, 15},
                                                   .max_ngram_size = 3,
                                                   .n_head_per_ngram = 8,
                                                   .engram_vocab_size = {646400, 646400},
                                                   .vocab_size = 99000});
    std::vector<int32_t> ids(size_t(n * 3));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(hash64(7, i) % 99000);
    std::vector<int32_t> out(size_t(2 * n * 16)), ref(out.size());
    EngramHashParams p{.ngram_ids = ids.data(),
                       .multipliers = t.multipliers.data(),
                       .vocab_sizes = t.vocab_sizes.data(),
                       .offsets = t.offsets.data(),
                       .out = out.data(),
                       .num_tokens = n,
                       .num_layers = 2,
                       .max_ngram = 3,
                       .heads_per_ngram = 8};
    ScopedBackend use(KernelBackend::cpu);
    const double s = ctx.time([&] { engram_hash(p); }, 9, 0.3);
    EngramHashParams hp = p;
    hp.out = ref.data();
    // The host twin divides where cpu multiplies by a reciprocal: its time in the same run.
    const double s_host = ctx.time([&] { host::engram_hash(hp); }, 3, 0.1);
    const CaseResult c = check_outputs(p, hp);
    failures += c.pass ? 0 : 1;
    const double bytes = double(ids.size() * 4 + out.size() * 4);
    BenchRecord rec = memory_record(ctx, "engram_hash", fmt::format("n={} layers=2 heads=16", n), s,
                                    bytes, double(ids.size() * 4), c);
    rec.extra["ns_per_row_id"] = s / double(out.size()) * 1e9;
    rec.extra["speedup_vs_host"] = s_host / s;
    ctx.emit(rec);
  }
  // engram_gate: hc = 4 branches, the demo's hidden 1024 and V3's 7168.
  for (int64_t d : {int64_t(1024), int64_t(7168)}) {
    const int64_t n = ctx.quick ? 64 : 512, hc = 4;
    const auto x = random_bf16(n * hc * d, 1), k = random_bf16(n * hc * d, 2),
               v = random_bf16(n * d, 3);
    const auto w = random_f32(hc * d, 4, 0.5f, 1.5f);
    std::vector<bf16> out(size_t(n * hc * d)), ref(out.size());
    EngramGateParams p{.x = x.data(),
                       .k = k.data(),
                       .v = v.data(),
                       .w_fused = w.data(),
                       .out = out.data(),
                       .num_tokens = n,
                       .hc = hc,
                       .dim = d};
    ScopedBackend use(KernelBackend::cpu);
    const double s = ctx.time([&] { engram_gate(p); }, 9, 0.3);
    EngramGateParams hp = p;
    hp.out = ref.data();
    host::engram_gate(hp);
    const CaseResult c = check_outputs(p, hp);
    failures += c.pass ? 0 : 1;
    const double read_bytes = double(2 * n * hc * d * 2 + n * d * 2 + hc * d * 4);
    const double bytes = read_bytes + double(n * hc * d * 2);
    ctx.emit(memory_record(ctx, "engram_gate", fmt::format("n={} hc={} d={}", n, hc, d), s, bytes,
                           read_bytes, c));
  }
  return failures;
}

DEEPINFER_KERNEL_BENCH(mhc) {
  int failures = 0;
  for (int64_t d : {int64_t(1024), int64_t(7168)}) {
    const int64_t n = ctx.quick ? 32 : 256, hc = 4, mixes = hc * (hc + 2);
    const auto r = random_bf16(n * hc * d, 1);
    const auto fn = random_f32(mixes * hc * d, 2), base = random_f32(mixes, 3),
               scale = random_f32(3, 4, 0.05f, 0.2f);
    std::vector<bf16> x(size_t(n * d)), xr(x.size());
    std::vector<float> post(size_t(n * hc)), postr(post.size()), comb(size_t(n * hc * hc)),
        combr(comb.size());
    MhcPreParams p{.residual = r.data(),
                   .fn = fn.data(),
                   .scale = scale.data(),
                   .base = base.data(),
                   .x = x.data(),
                   .post = post.data(),
                   .comb = comb.data(),
                   .num_tokens = n,
                   .hc = hc,
                   .dim = d};
    ScopedBackend use(KernelBackend::cpu);
    const double s = ctx.time([&] { mhc_pre(p); }, 9, 0.3);
    MhcPreParams hp = p;
    hp.x = xr.data();
    hp.post = postr.data();
    hp.comb = combr.data();
    host::mhc_pre(hp);
    const CaseResult c = check_outputs(p, hp);
    failures += c.pass ? 0 : 1;
    // Read the residual and fn (fn once: it stays cached across tokens), write x, post, comb.
    const double read_bytes = double(n * hc * d * 2 + mixes * hc * d * 4);
    const double bytes = read_bytes + double(n * d * 2 + n * (hc + hc * hc) * 4);
    BenchRecord rec = memory_record(ctx, "mhc_pre", fmt::format("n={} hc={} d={}", n, hc, d), s,
                                    bytes, read_bytes, c);
    rec.flops = 2.0 * double(n * (mixes + 1) * hc * d);
    // The dots run as fp64 FMAs (docs/numerics.md §8.1): half the lanes of the measured fp32 peak.
    const double peak = ctx.fma_peak_gflops() / 2;
    const double roof_s = std::max(bytes / (rec.limit_value * 1e9), rec.flops / (peak * 1e9));
    rec.extra["fma64_peak_gflops"] = peak;
    rec.extra["roofline_ratio"] = roof_s / s;
    ctx.emit(rec);
  }
  return failures;
}

}  // namespace deepinfer::kernels::testing
