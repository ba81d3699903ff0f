// `deepinfer bench kernels` sub-benches for the fp8 casts and GEMMs. Each record carries the
// ratio to a limit measured in the same run and a correctness check against host:
//  - gemm_fp8_decode (M = 1..8, K = 7168, N = 2048 / 7168): weight GB/s vs the read bandwidth of a
//    1 GiB read-only pass, both streamed from DRAM as in a forward pass (goal >= 0.6), and
//    roofline_ratio: the time the slower of that bandwidth and the compute peak (BF16 dot products
//    for the decode layout, else fp32 FMA) allows over the time taken, and speedups over the
//    row-layout and Highway kernels, all in this run.
//  - gemm_fp8_moe (batch 1, 4, 16): one MoE layer's routed experts in one gemm_fp8_multi, weight
//    GB/s of the experts the batch touches vs the read pass, and the roofline with the compute
//    peak.
//  - gemm_bf16_head (M = 1, 2, 4, 16): the BF16 LM head from DRAM vs the read pass and the peak of
//    the tile product it runs; where the CPU has BF16 dots, also with the weight in the pairs
//    layout (the per-head GEMMs' kernel), which the runtime does not use for the head.
//  - gemm_bf16_heads (M = 1, 16): the absorbed attention's per-head GEMMs, 16 heads in one call
//    (K = 64 to the latent, K = 256 back), cache-resident, vs the peak of the instruction they run,
//    with the weights in the pairs layout as the runtime runs them, and the speedup over without.
//  - gemm_fp8_prefill (M = 512): GFLOP/s vs the measured fp32 FMA peak (goal >= 0.5), and time vs
//    OpenBLAS sgemm on the dequantised f32 weights (ratio = blas_seconds / seconds; goal > 1).
//  - quant_per_token: bytes moved vs memcpy.
//  - gemm_batch_invariant: the GEMMs the batch-invariant mode (DecodeGemm::invariant) runs on
//    another kernel than the mode off: bf16 at prefill M (DeepSeek-V3's absorbed-attention and
//    router shapes), fp8 decode M without the decode layout, and fp8 with the decode layout at
//    M = 16..512 (the decode-layout kernel in 8-row chunks when on); ratio = seconds
//    with the mode off / seconds with it on (< 1: its cost, > 1: its gain).
#include <deepinfer/tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "core/check.h"
#include "core/env.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "kernels/testing/bench.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

#ifdef DEEPINFER_HAVE_BLAS
// Declared here rather than through <cblas.h>, whose Debian alternative may be netlib's.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
extern "C" __attribute__((weak)) void openblas_set_num_threads(int num_threads);
#endif

namespace deepinfer::kernels::testing {

namespace {

// Random fp8 weights straight from codes (a host cast of 51M values would dominate the run).
struct Weights {
  std::vector<fp8_e4m3> q;
  std::vector<float> scales;
};
Weights random_weights(int64_t n, int64_t k, uint64_t seed) {
  return {random_e4m3(n * k, seed),
          random_scales(num_blocks(n) * num_blocks(k), seed + 1, 1e-4f, 1e-3f)};
}

// cpu output rows [0, m) × columns [0, n_check) against host on the same slice.
CaseResult check_against_host(const Fp8Rows& a, const Weights& w, int64_t m, int64_t n, int64_t k,
                              const std::vector<bf16>& cpu_out, int64_t m_check, int64_t n_check) {
  m_check = std::min(m_check, m);
  n_check = std::min(n_check, n);
  std::vector<bf16> ref(size_t(m_check * n_check));
  host::gemm_fp8({.a = a.q.data(),
                  .a_scales = a.scales.data(),
                  .w = w.q.data(),
                  .w_scales = w.scales.data(),
                  .out = ref.data(),
                  .m = m_check,
                  .n = n_check,
                  .k = k});
  std::vector<bf16> got(size_t(m_check * n_check));
  for (int64_t r = 0; r < m_check; ++r)
    for (int64_t j = 0; j < n_check; ++j) got[size_t(r * n_check + j)] = cpu_out[size_t(r * n + j)];
  return compare_buffers("out", DType::bf16, got.data(), ref.data(), m_check * n_check,
                         {.rel_l2 = 1e-3});
}

// A weight-streaming GEMM's record (M = m rows against an n × k weight of wbytes): GB/s of the
// weight against the read pass `limit`, and roofline_ratio: the time the slower of that pass and
// the compute peak on 2·M·N·K allows over the time taken.
BenchRecord streaming_record(const char* bench, int64_t m, int64_t n, int64_t k, double s,
                             double wbytes, double limit, double compute_peak,
                             const CaseResult& c) {
  const double flops = 2.0 * double(m * n * k);
  const double memory_s = wbytes / (limit * 1e9), compute_s = flops / (compute_peak * 1e9);
  return {.bench = bench,
          .case_name = fmt::format("m={} n={} k={}", m, n, k),
          .seconds = s,
          .bytes = wbytes,
          .flops = flops,
          .limit = "read_gbps",
          .limit_value = limit,
          .ratio = wbytes / s / 1e9 / limit,
          .correct = c.pass,
          .rel_err = c.max_rel_err,
          .extra = {{"compute_peak_gflops", compute_peak},
                    {"compute_ratio", compute_s / s},
                    {"compute_bound", compute_s > memory_s ? 1.0 : 0.0},
                    {"roofline_ratio", std::max(memory_s, compute_s) / s}}};
}

}  // namespace

DEEPINFER_KERNEL_BENCH(gemm_fp8_decode) {
  int failures = 0;
  const int64_t k = 7168;
  const std::vector<int64_t> ns =
      ctx.quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 7168};
  const std::vector<int64_t> ms =
      ctx.quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 2, 4, 8};
  for (int64_t n : ns) {
    // In a forward pass a layer's weights come from DRAM, never from a cache the previous call
    // warmed: the timed calls rotate over enough copies to exceed the last-level cache
    // (beyond_cache_bytes); the limit is the 1 GiB read pass. The one-copy, cache-warm figure is
    // printed too (ratio_cache_warm, against a read pass over one copy's bytes).
    const int64_t copies =
        std::max<int64_t>(1, (int64_t(beyond_cache_bytes()) + n * k - 1) / (n * k));
    std::vector<Weights> ws;
    // The decode layouts on the runtime's weight storage (huge pages where the OS gives them).
    const size_t layout_bytes = decode_layout_bytes(n, k);  // 0 where the CPU has no BF16 dot
    const bool decode_layout = layout_bytes != 0;
    std::vector<std::shared_ptr<std::byte>> w_decodes;
    for (int64_t c = 0; c < copies; ++c) {
      ws.push_back(random_weights(n, k, uint64_t(n + 1000 * c)));
      if (!decode_layout) continue;
      w_decodes.push_back(deepinfer::detail::weight_alloc(layout_bytes));
      pack_decode_layout(ws.back().q.data(), n, k,
                         reinterpret_cast<uint8_t*>(w_decodes.back().get()));
    }
    const Weights& w = ws[0];
    const double wbytes = double(n * k) + double(w.scales.size() * 4);
    const double limit = ctx.read_gbps(kReadPassBytes), limit_warm = ctx.read_gbps(size_t(n * k));
    for (int64_t m : ms) {
      const Fp8Rows a = random_fp8_activations(m, k, uint64_t(m));
      std::vector<bf16> out(size_t(m * n));
      std::vector<GemmFp8Params> ps;
      for (int64_t c = 0; c < copies; ++c)
        ps.push_back({.a = a.q.data(),
                      .a_scales = a.scales.data(),
                      .w = ws[size_t(c)].q.data(),
                      .w_scales = ws[size_t(c)].scales.data(),
                      .out = out.data(),
                      .m = m,
                      .n = n,
                      .k = k,
                      .w_decode = decode_layout
                                      ? reinterpret_cast<const uint8_t*>(w_decodes[size_t(c)].get())
                                      : nullptr});
      size_t next = 0;
      auto call = [&] { gemm_fp8(ps[next++ % ps.size()]); };
      ScopedBackend use(KernelBackend::cpu);
      // Peers in the same run: the Highway kernel and the VBMI row kernel; then the default path
      // (the decode layout where the CPU has AVX512-BF16, as the runtime runs it), whose output is
      // checked.
      using cpu::DecodeGemm;
      for (DecodeGemm kind : {DecodeGemm::generic, DecodeGemm::rows, DecodeGemm::automatic}) {
        cpu::set_decode_gemm(kind);  // untimed warm-up of each (page mapping, caches, clocks)
        for (int i = 0; i < 20; ++i) call();
      }
      cpu::set_decode_gemm(DecodeGemm::generic);
      const double s_generic = ctx.time(call, 9, 0.3);
      cpu::set_decode_gemm(DecodeGemm::rows);
      const double s_rows = ctx.time(call, 9, 0.3);
      cpu::set_decode_gemm(DecodeGemm::automatic);
      // The decode layout on the other tile product: AMX where the default is VDPBF16PS, and the
      // reverse under DEEPINFER_AMX=on (0 where the CPU has no AMX).
      double s_other = 0;
      if (decode_layout && cpu::cpu_has_amx()) {
        const cpu::ScopedAmx other(!cpu::amx_active());
        for (int i = 0; i < 20; ++i) call();
        s_other = ctx.time(call, 9, 0.3);
      }
      const double s_warm = ctx.time([&] { gemm_fp8(ps[0]); }, 9, 0.3);
      const double s = ctx.time(call, 9, 0.3);
      gemm_fp8(ps[0]);
      const CaseResult c = check_against_host(a, w, m, n, k, out, m, 512);
      failures += c.pass ? 0 : 1;
      // At M = 4..8 on few cores the multiply-adds, not the weight stream, bound the time; the
      // compute peak is that of the instruction the kernel runs (BF16 dot products for the
      // decode layout, else fp32 FMA).
      const double compute_peak =
          decode_layout ? ctx.bf16_dot_peak_gflops() : ctx.fma_peak_gflops();
      BenchRecord r =
          streaming_record("gemm_fp8_decode", m, n, k, s, wbytes, limit, compute_peak, c);
      r.extra.insert({{"decode_layout", decode_layout ? 1.0 : 0.0},
                      {"weight_copies", double(copies)},
                      {"ratio_cache_warm", wbytes / s_warm / 1e9 / limit_warm},
                      {"speedup_vs_rows", s_rows / s},
                      {"amx", cpu::amx_active() ? 1.0 : 0.0},
                      {"speedup_vs_other_tile_product", s_other > 0 ? s_other / s : 0.0},
                      {"speedup_vs_generic", s_generic / s}});
      ctx.emit(r);
    }
  }
  return failures;
}

DEEPINFER_KERNEL_BENCH(gemm_fp8_moe) {
  // One MoE layer's routed experts at decode, as the runtime runs them: the gate and up GEMMs of
  // every expert a batch of B tokens touches (top-4 of 32, random routing) in one gemm_fp8_multi,
  // each with its own row count, then their down GEMMs in another; the synthetic model's shapes
  // (gate, up [512, 2048], down [2048, 512]). Each expert's three layouts lie one after the other
  // as the loader leaves them, and layers rotate beyond the last-level cache. The bytes are the
  // touched experts' weights, held against the read pass, with the roofline on the slower of that
  // pass and the BF16-dot (or FMA) peak.
  int failures = 0;
  const int64_t experts = 32, top_k = 4, hidden = 2048, inter = 512;
  const bool dot = cpu::bf16_dot_gemm();
  const double compute_peak = dot ? ctx.bf16_dot_peak_gflops() : ctx.fma_peak_gflops();
  const double limit = ctx.read_gbps(kReadPassBytes);
  const Weights w_in = random_weights(inter, hidden, 11),
                w_down = random_weights(hidden, inter, 12);
  const size_t in_bytes = decode_layout_bytes(inter, hidden);
  const size_t down_bytes = decode_layout_bytes(hidden, inter);
  const int64_t expert_bytes = 3 * inter * hidden;
  // Calls rotate over the layers and, within a layer, over 8 shifts of the routing (expert e reads
  // expert (e + 4·shift) mod 32's weights), so that even batch 1's 4 experts read layers · 8 · 4
  // experts' bytes before any repeats.
  const int64_t layers = std::max<int64_t>(
      3, (int64_t(beyond_cache_bytes()) + experts * expert_bytes - 1) / (experts * expert_bytes));
  // [layer][expert]: gate, up, down layouts (every expert's values the same: the kernel reads
  // only the layout). Without a decode layout (no AVX512-BF16) every expert reads the one
  // row-layout weight, from cache: the line says decode_layout 0, and its ratio is no DRAM figure.
  std::vector<std::array<std::shared_ptr<std::byte>, 3>> layouts;
  if (in_bytes)
    for (int64_t i = 0; i < layers * experts; ++i) {
      auto& l = layouts.emplace_back();
      for (int j = 0; j < 3; ++j) {
        const Weights& w = j < 2 ? w_in : w_down;
        l[size_t(j)] = deepinfer::detail::weight_alloc(j < 2 ? in_bytes : down_bytes);
        pack_decode_layout(w.q.data(), j < 2 ? inter : hidden, j < 2 ? hidden : inter,
                           reinterpret_cast<uint8_t*>(l[size_t(j)].get()));
      }
    }
  ScopedBackend use(KernelBackend::cpu);
  for (int64_t batch : ctx.quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 4, 16}) {
    // Rows per expert: top_k distinct experts for each token.
    std::vector<int64_t> rows(size_t(experts), 0);
    for (int64_t t = 0; t < batch; ++t) {
      std::vector<bool> taken(size_t(experts), false);
      for (uint64_t draw = 0, j = 0; j < uint64_t(top_k); ++draw) {
        const auto e = size_t(hash64(uint64_t(batch), uint64_t(t) * 1000 + draw) % experts);
        if (!taken[e]) {
          taken[e] = true;
          ++rows[e];
          ++j;
        }
      }
    }
    std::vector<int64_t> touched;
    int64_t total_rows = 0;
    for (int64_t e = 0; e < experts; ++e)
      if (rows[size_t(e)] > 0) {
        touched.push_back(e);
        total_rows += rows[size_t(e)];
      }
    for (const bool down : {false, true}) {
      const int64_t n = down ? hidden : inter, k = down ? inter : hidden;
      const Weights& w = down ? w_down : w_in;
      std::vector<Fp8Rows> acts;
      std::vector<std::vector<bf16>> outs;
      for (int64_t e : touched) {
        acts.push_back(random_fp8_activations(rows[size_t(e)], k, uint64_t(e + 100 * batch)));
        outs.emplace_back(size_t(rows[size_t(e)] * n));
        if (!down) outs.emplace_back(size_t(rows[size_t(e)] * n));
      }
      int64_t calls = 0;
      std::vector<GemmFp8Params> ps;
      auto call = [&] {
        ps.clear();
        const int64_t layer = calls % layers, shift = 4 * (calls / layers % 8);
        for (size_t i = 0; i < touched.size(); ++i) {
          const int64_t e = touched[i], we = (e + shift) % experts;
          for (int j = down ? 2 : 0; j < (down ? 3 : 2); ++j)
            ps.push_back(
                {.a = acts[i].q.data(),
                 .a_scales = acts[i].scales.data(),
                 .w = w.q.data(),
                 .w_scales = w.scales.data(),
                 .out = outs[ps.size()].data(),
                 .m = rows[size_t(e)],
                 .n = n,
                 .k = k,
                 .w_decode = in_bytes ? reinterpret_cast<const uint8_t*>(
                                            layouts[size_t(layer * experts + we)][size_t(j)].get())
                                      : nullptr});
        }
        gemm_fp8_multi(ps);
        ++calls;
      };
      for (int i = 0; i < 8 * int(layers); ++i) call();
      const double s = ctx.time(call, 9, 0.3);
      CaseResult c;  // every output against host
      for (size_t i = 0; i < ps.size() && c.pass; ++i) {
        const int64_t m = ps[i].m;
        c = check_against_host(acts[down ? i : i / 2], w, m, n, k, outs[i], m, 256);
      }
      failures += c.pass ? 0 : 1;
      const double wbytes = double(ps.size()) * (double(n * k) + double(w.scales.size() * 4));
      BenchRecord r = streaming_record("gemm_fp8_moe", total_rows, n * int64_t(down ? 1 : 2), k, s,
                                       wbytes, limit, compute_peak, c);
      r.case_name =
          fmt::format("{} batch={} experts={} rows={} n={} k={}", down ? "down" : "gate+up", batch,
                      touched.size(), total_rows, down ? n : 2 * n, k);
      r.extra.insert({{"decode_layout", in_bytes ? 1.0 : 0.0},
                      {"layers", double(layers)},
                      {"experts_touched", double(touched.size())}});
      ctx.emit(r);
    }
  }
  return failures;
}

DEEPINFER_KERNEL_BENCH(gemm_bf16_head) {
  // The BF16 LM head at decode (DeepSeek-V3's official checkpoints keep it in bf16): the
  // synthetic model's vocabulary × hidden, M = the batch. Weights rotate over copies beyond the
  // last-level cache (from DRAM, as in a decode step); the roofline is the slower of the 1 GiB read
  // pass on the weight bytes and the peak of the instruction the kernel runs on 2·M·N·K.
  int failures = 0;
  const int64_t n = 32000, k = 2048;
  const int64_t copies =
      std::max<int64_t>(1, (int64_t(beyond_cache_bytes()) + 2 * n * k - 1) / (2 * n * k));
  std::vector<std::shared_ptr<std::byte>> ws;
  for (int64_t c = 0; c < copies; ++c) {
    ws.push_back(deepinfer::detail::weight_alloc(size_t(n * k) * 2));
    const auto w = random_bf16(n * k, uint64_t(300 + c), -0.1f, 0.1f);
    std::memcpy(ws.back().get(), w.data(), size_t(n * k) * 2);
  }
  const double wbytes = double(n * k) * 2;
  const double limit = ctx.read_gbps(kReadPassBytes);
  const bool amx = cpu::amx_active(), dot = cpu::bf16_dot_gemm();
  const double compute_peak = amx   ? ctx.amx_peak_gflops()
                              : dot ? ctx.bf16_dot_peak_gflops()
                                    : ctx.fma_peak_gflops();
  // Each copy in the pairs layout too (a lane per output column), where the CPU has BF16 dots.
  const size_t words = dot ? bf16_pairs_words(n, k) : 0;
  std::vector<std::shared_ptr<std::byte>> pairs;
  for (int64_t c = 0; c < (words ? copies : 0); ++c) {
    pairs.push_back(deepinfer::detail::weight_alloc(words * 4));
    pack_bf16_pairs(reinterpret_cast<const bf16*>(ws[size_t(c)].get()), n, k,
                    reinterpret_cast<uint32_t*>(pairs.back().get()));
  }
  ScopedBackend use(KernelBackend::cpu);
  for (int64_t m : ctx.quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 2, 4, 16})
    for (const bool with_pairs : {false, true}) {
      if (with_pairs && pairs.empty()) continue;
      const auto a = random_bf16(m * k, uint64_t(m), -2.0f, 2.0f);
      std::vector<float> out(size_t(m * n));
      size_t next = 0;
      auto call = [&] {
        const size_t i = next++ % ws.size();
        gemm_bf16(
            {.a = a.data(),
             .w = reinterpret_cast<const bf16*>(ws[i].get()),
             .out_f32 = out.data(),
             .m = m,
             .n = n,
             .k = k,
             .w_pairs = with_pairs ? reinterpret_cast<const uint32_t*>(pairs[i].get()) : nullptr});
      };
      for (int i = 0; i < 3; ++i) call();
      const double s = ctx.time(call, 7, 0.3);
      next = 0;
      call();
      const int64_t nc = 512;
      std::vector<float> ref(size_t(m * nc)), got(size_t(m * nc));
      host::gemm_bf16({.a = a.data(),
                       .w = reinterpret_cast<const bf16*>(ws[0].get()),
                       .out_f32 = ref.data(),
                       .m = m,
                       .n = nc,
                       .k = k});
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(got.data() + r * nc, out.data() + r * n, size_t(nc) * 4);
      const CaseResult c =
          compare_buffers("out", DType::f32, got.data(), ref.data(), m * nc, {.rel_l2 = 1e-5});
      failures += c.pass ? 0 : 1;
      BenchRecord r =
          streaming_record("gemm_bf16_head", m, n, k, s, wbytes, limit, compute_peak, c);
      if (with_pairs) r.case_name += " pairs";
      r.extra.insert({{"amx", amx ? 1.0 : 0.0}, {"weight_copies", double(copies)}});
      ctx.emit(r);
    }
  return failures;
}

DEEPINFER_KERNEL_BENCH(gemm_bf16_heads) {
  // The synthetic model's absorbed MLA at decode: q_nope [M, 16 heads, 64] times each head's W_UK
  // [256, 64] into the latent, and the attention output [M, 16, 256] times W_UV [64, 256] back.
  // Their weights (1 MiB a layer) stay in cache; the small K makes the end of each output's sum a
  // large share of the work. M = 128 is a prefill's. Each shape runs as the runtime does (`pairs`:
  // the weights in the pairs layout where the CPU has BF16 dot products) and without the layout
  // (`speedup_vs_rows`).
  int failures = 0;
  const int64_t heads = 16;
  struct Shape {
    int64_t n, k;
  };
  const bool amx = cpu::amx_active(), dot = cpu::bf16_dot_gemm();
  const double compute_peak = amx   ? ctx.amx_peak_gflops()
                              : dot ? ctx.bf16_dot_peak_gflops()
                                    : ctx.fma_peak_gflops();
  ScopedBackend use(KernelBackend::cpu);
  for (const Shape sh : {Shape{256, 64}, Shape{64, 256}})
    for (int64_t m : {int64_t(1), int64_t(16), int64_t(128)}) {
      const int64_t n = sh.n, k = sh.k;
      const auto a = random_bf16(m * heads * k, uint64_t(m + k), -2.0f, 2.0f);
      const auto w = random_bf16(heads * n * k, uint64_t(n + 5), -0.1f, 0.1f);
      const size_t words = bf16_pairs_words(n, k);
      std::vector<uint32_t> pairs(size_t(heads) * words);
      for (int64_t h = 0; h < heads && words > 0; ++h)
        pack_bf16_pairs(w.data() + h * n * k, n, k, pairs.data() + size_t(h) * words);
      std::vector<float> out(size_t(m * heads * n)), ref(out.size());
      GemmBf16Params p{.a = a.data(), .w = w.data(), .out_f32 = out.data(), .m = m, .n = n, .k = k};
      p.set_heads(heads);
      GemmBf16Params rows = p;
      if (words > 0) p.w_pairs = pairs.data();
      // In turn, best of three rounds each: the first one timed ran slower (gemm_batch_invariant).
      double s = 1e30, s_rows = 1e30;
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 20; ++i) gemm_bf16(p);
        s = std::min(s, ctx.time([&] { gemm_bf16(p); }, 9, 0.2));
        for (int i = 0; i < 20; ++i) gemm_bf16(rows);
        s_rows = std::min(s_rows, ctx.time([&] { gemm_bf16(rows); }, 9, 0.2));
      }
      gemm_bf16(p);
      GemmBf16Params h = p;
      h.out_f32 = ref.data();
      host::gemm_bf16(h);
      const CaseResult c = compare_buffers("out", DType::f32, out.data(), ref.data(),
                                           int64_t(out.size()), {.rel_l2 = 1e-5});
      failures += c.pass ? 0 : 1;
      const double flops = 2.0 * double(m * heads * n * k);
      BenchRecord r;
      r.bench = "gemm_bf16_heads";
      r.case_name = fmt::format("heads={} m={} n={} k={}", heads, m, n, k);
      r.seconds = s;
      r.flops = flops;
      r.limit = amx ? "amx_peak_gflops" : dot ? "bf16_dot_peak_gflops" : "fma_peak_gflops";
      r.limit_value = compute_peak;
      r.ratio = flops / s / 1e9 / compute_peak;
      r.correct = c.pass;
      r.rel_err = c.max_rel_err;
      r.extra = {{"gflops", flops / s / 1e9},
                 {"pairs", words > 0 ? 1.0 : 0.0},
                 {"speedup_vs_rows", s_rows / s}};
      ctx.emit(r);
    }
  return failures;
}

DEEPINFER_KERNEL_BENCH(gemm_fp8_prefill) {
  const int64_t m = ctx.quick ? 128 : 512, n = 2048, k = 7168;
  const Weights w = random_weights(n, k, 77);
  const Fp8Rows a = random_fp8_activations(m, k, 78);
  std::vector<bf16> out(size_t(m * n));
  // As the runtime runs it: with the decode layout where the CPU has one (its weight panels).
  std::vector<uint8_t> w_decode(decode_layout_bytes(n, k));
  if (!w_decode.empty()) pack_decode_layout(w.q.data(), n, k, w_decode.data());
  GemmFp8Params p{.a = a.q.data(),
                  .a_scales = a.scales.data(),
                  .w = w.q.data(),
                  .w_scales = w.scales.data(),
                  .out = out.data(),
                  .m = m,
                  .n = n,
                  .k = k};
  ScopedBackend use(KernelBackend::cpu);
  const double s_rows = ctx.time([&] { gemm_fp8(p); }, 3, 0.5);
  p.w_decode = w_decode.empty() ? nullptr : w_decode.data();
  const double s = ctx.time([&] { gemm_fp8(p); }, 3, 0.5);
  const CaseResult c = check_against_host(a, w, m, n, k, out, 8, n);
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const double peak = ctx.fma_peak_gflops();
  const std::string shape = fmt::format("m={} n={} k={}", m, n, k);
  ctx.emit({.bench = "gemm_fp8_prefill",
            .case_name = shape,
            .seconds = s,
            .flops = flops,
            .limit = "fma_peak_gflops",
            .limit_value = peak,
            .ratio = flops / s / 1e9 / peak,
            .correct = c.pass,
            .rel_err = c.max_rel_err,
            .extra = {{"decode_layout", w_decode.empty() ? 0.0 : 1.0},
                      {"speedup_vs_row_layout", s_rows / s}}});
#ifdef DEEPINFER_HAVE_BLAS
  // OpenBLAS sgemm on the same shape with the weights dequantised to f32 (what a
  // dequantise-then-BLAS implementation would run). Its result is checked against ours too.
  std::vector<float> wf(size_t(n * k)), af(size_t(m * k)), cf(size_t(m * n));
  dequant_per_block(
      {.q = w.q.data(), .scales = w.scales.data(), .out_f32 = wf.data(), .n = n, .k = k});
  dequant_per_token(
      {.q = a.q.data(), .scales = a.scales.data(), .out_f32 = af.data(), .m = m, .k = k});
  if (openblas_set_num_threads) openblas_set_num_threads(ctx.threads);
  const double sb = ctx.time(
      [&] {
        cblas_sgemm(101 /*RowMajor*/, 111 /*NoTrans*/, 112 /*Trans*/, int(m), int(n), int(k), 1.0f,
                    af.data(), int(k), wf.data(), int(k), 0.0f, cf.data(), int(n));
      },
      3, 0.5);
  std::vector<float> ours(size_t(m * n));
  for (size_t i = 0; i < ours.size(); ++i) ours[i] = bf16_to_f32(out[i]);
  const CaseResult cb =
      compare_buffers("out", DType::f32, ours.data(), cf.data(), m * n, {.rel_l2 = 1e-2});
  ctx.emit({.bench = "gemm_fp8_prefill",
            .case_name = shape + " vs_openblas",
            .seconds = s,
            .flops = flops,
            .limit = "openblas_sgemm_s",
            .limit_value = sb,
            .ratio = sb / s,
            .correct = c.pass && cb.pass,
            .rel_err = cb.max_rel_err,
            .extra = {{"openblas_gflops", flops / sb / 1e9}}});
  return (c.pass ? 0 : 1) + (cb.pass ? 0 : 1);
#else
  return c.pass ? 0 : 1;
#endif
}

DEEPINFER_KERNEL_BENCH(gemm_batch_invariant) {
  using cpu::DecodeGemm;
  ScopedBackend use(KernelBackend::cpu);
  int failures = 0;
  // Times `call` in the default and the invariant mode, checks the invariant output's first rows
  // against host (`check`), and emits the pair.
  auto compare = [&](const std::string& name, const std::function<void()>& call,
                     const std::function<CaseResult()>& check) {
    const Knobs saved = knobs();
    Knobs off = saved;
    off.batch_invariant = false;  // automatic follows the knob, on by default
    // The modes in turn, three times each, best of each: the mode timed first ran up to 2x slower
    // (the router shape) when each was timed once.
    double s_default = 1e30, s = 1e30;
    for (int round = 0; round < 3; ++round) {
      cpu::set_decode_gemm(DecodeGemm::automatic);
      set_knobs(off);
      call();
      s_default = std::min(s_default, ctx.time(call, 7, 0.1));
      set_knobs(saved);
      cpu::set_decode_gemm(DecodeGemm::invariant);
      call();
      s = std::min(s, ctx.time(call, 7, 0.1));
    }
    const CaseResult c = check();
    cpu::set_decode_gemm(DecodeGemm::automatic);
    failures += c.pass ? 0 : 1;
    ctx.emit({.bench = "gemm_batch_invariant",
              .case_name = name,
              .seconds = s,
              .limit = "default_seconds",
              .limit_value = s_default,
              .ratio = s_default / s,
              .correct = c.pass,
              .rel_err = c.max_rel_err});
  };
  struct Shape {
    int64_t n, k;
    bool f32_out;
  };
  const std::vector<int64_t> ms =
      ctx.quick ? std::vector<int64_t>{64} : std::vector<int64_t>{16, 64, 256};
  for (const Shape sh : {Shape{512, 128, false}, Shape{128, 512, false}, Shape{256, 7168, true}})
    for (int64_t m : ms) {
      const auto a = random_bf16(m * sh.k, uint64_t(m), -2.0f, 2.0f);
      const auto w = random_bf16(sh.n * sh.k, 5, -0.1f, 0.1f);
      std::vector<bf16> out(sh.f32_out ? 0 : size_t(m * sh.n));
      std::vector<float> out_f32(sh.f32_out ? size_t(m * sh.n) : 0);
      const GemmBf16Params p{.a = a.data(),
                             .w = w.data(),
                             .out = sh.f32_out ? nullptr : out.data(),
                             .out_f32 = sh.f32_out ? out_f32.data() : nullptr,
                             .m = m,
                             .n = sh.n,
                             .k = sh.k};
      compare(
          fmt::format("bf16 m={} n={} k={}", m, sh.n, sh.k), [&] { gemm_bf16(p); },
          [&] {
            const int64_t mc = std::min<int64_t>(m, 4);
            std::vector<float> ref(size_t(mc * sh.n)), got(size_t(mc * sh.n));
            host::gemm_bf16({.a = a.data(),
                             .w = w.data(),
                             .out_f32 = ref.data(),
                             .m = mc,
                             .n = sh.n,
                             .k = sh.k});
            for (size_t i = 0; i < got.size(); ++i)
              got[i] = sh.f32_out ? out_f32[i] : bf16_to_f32(out[i]);
            return compare_buffers("out", DType::f32, got.data(), ref.data(), mc * sh.n,
                                   {.rel_l2 = 1e-2});
          });
    }
  const int64_t n = 2048, k = 7168;
  const Weights w = random_weights(n, k, 91);
  // fp8 at decode M without the decode layout, then (where the CPU runs it) at M > 8 with it.
  auto fp8_case = [&](int64_t m, const uint8_t* w_decode) {
    const Fp8Rows a = random_fp8_activations(m, k, uint64_t(m) + (w_decode ? 93 : 92));
    std::vector<bf16> out(size_t(m * n));
    const GemmFp8Params p{.a = a.q.data(),
                          .a_scales = a.scales.data(),
                          .w = w.q.data(),
                          .w_scales = w.scales.data(),
                          .out = out.data(),
                          .m = m,
                          .n = n,
                          .k = k,
                          .w_decode = w_decode};
    compare(
        fmt::format("fp8 {} m={} n={} k={}", w_decode ? "decode layout" : "no decode layout", m, n,
                    k),
        [&] { gemm_fp8(p); }, [&] { return check_against_host(a, w, m, n, k, out, m, 512); });
  };
  for (int64_t m : ctx.quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 4, 8})
    fp8_case(m, nullptr);
  std::vector<uint8_t> w_decode(decode_layout_bytes(n, k));
  if (!w_decode.empty()) {  // the CPU runs the decode layout
    pack_decode_layout(w.q.data(), n, k, w_decode.data());
    for (int64_t m :
         ctx.quick ? std::vector<int64_t>{16} : std::vector<int64_t>{16, 32, 64, 128, 512})
      fp8_case(m, w_decode.data());
  }
  return failures;
}

DEEPINFER_KERNEL_BENCH(quant_per_token) {
  const int64_t m = ctx.quick ? 64 : 512, k = 7168;
  const std::vector<bf16> x = random_bf16(m * k, 5, -3.0f, 3.0f);
  std::vector<fp8_e4m3> q(size_t(m * k)), qh(size_t(m * k));
  std::vector<float> s(size_t(m * num_blocks(k))), sh(s.size());
  const QuantTokenParams p{.x = x.data(), .q = q.data(), .scales = s.data(), .m = m, .k = k};
  ScopedBackend use(KernelBackend::cpu);
  const double t = ctx.time([&] { quant_per_token(p); }, 9, 0.3);
  host::quant_per_token({.x = x.data(), .q = qh.data(), .scales = sh.data(), .m = m, .k = k});
  CaseResult c = compare_buffers("q", DType::e4m3, q.data(), qh.data(), m * k, {.rel_l2 = 0});
  const CaseResult cs =
      compare_buffers("scales", DType::f32, s.data(), sh.data(), int64_t(s.size()), {.rel_l2 = 0});
  c.pass = c.pass && cs.pass;
  const double bytes = double(m * k) * 3.0;  // read bf16, write e4m3
  const double limit = ctx.memcpy_gbps(size_t(m * k) * 2);
  ctx.emit({.bench = "quant_per_token",
            .case_name = fmt::format("m={} k={}", m, k),
            .seconds = t,
            .bytes = bytes,
            .limit = "memcpy_gbps",
            .limit_value = limit,
            .ratio = bytes / t / 1e9 / limit,
            .correct = c.pass,
            .rel_err = c.max_rel_err,
            .extra = {}});
  return c.pass ? 0 : 1;
}

}  // namespace deepinfer::kernels::testing
