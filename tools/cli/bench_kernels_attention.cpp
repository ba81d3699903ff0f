// `deepinfer bench kernels --bench mla_decode`: MLA decode over the paged latent cache at 4k
// context (FlashMLA shapes: D = 576, Dv = 512, page 64), as a fraction of memcpy bandwidth on the
// cache bytes it reads, measured in the same run. Also reports GFLOP/s against the fp32 FMA peak:
// with 128 heads every cached byte feeds 128 q.k and P.V rows, so a CPU is compute-bound there.
// Correctness in the same run: the timed cpu output of the first heads against host.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/testing/bench.h"
#include "kernels/testing/data.h"
#include "kernels/testing/harness.h"

namespace deepinfer::kernels::testing {
namespace {

struct DecodeCase {
  int64_t batch, heads, seqlen, s_q;
};

int bench_decode_case(BenchContext& ctx, const DecodeCase& c) {
  constexpr int64_t D = 576, Dv = 512, page = kMlaPageSize;
  const int64_t pages_per_seq = (c.seqlen + page - 1) / page, num_pages = c.batch * pages_per_seq;
  // Scrambled page order, as a long-running cache would have.
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  for (int64_t i = num_pages - 1; i > 0; --i)
    std::swap(table[size_t(i)], table[hash64(5, uint64_t(i)) % uint64_t(i + 1)]);
  const std::vector<int32_t> seqlens(size_t(c.batch), int32_t(c.seqlen));
  const auto cache = random_bf16(num_pages * page * D, 1, -1.0f, 1.0f);
  const auto q = random_bf16(c.batch * c.s_q * c.heads * D, 2, -1.0f, 1.0f);
  std::vector<bf16> o(size_t(c.batch * c.s_q * c.heads * Dv));
  std::vector<float> lse(size_t(c.batch * c.heads * c.s_q));
  const float scale = 0.1352338f;  // V3: 192^-0.5 * mscale^2
  MlaDecodeParams p{.q = q.data(),
                    .kv_cache = cache.data(),
                    .block_table = table.data(),
                    .cache_seqlens = seqlens.data(),
                    .o = o.data(),
                    .lse = lse.data(),
                    .batch = c.batch,
                    .s_q = c.s_q,
                    .num_heads = c.heads,
                    .page_size = page,
                    .num_pages = num_pages,
                    .max_pages_per_seq = pages_per_seq,
                    .softmax_scale = scale};
  const double seconds = ctx.time([&] { cpu::mla_decode(p); });

  // Check: rerun the first min(H, 4) heads of every row on host (heads are independent).
  const int64_t hc = std::min<int64_t>(c.heads, 4);
  std::vector<bf16> q_sub(size_t(c.batch * c.s_q * hc * D)),
      o_ref(size_t(c.batch * c.s_q * hc * Dv)), o_got(o_ref.size());
  for (int64_t r = 0; r < c.batch * c.s_q; ++r) {
    std::copy_n(q.begin() + r * c.heads * D, hc * D, q_sub.begin() + r * hc * D);
    std::copy_n(o.begin() + r * c.heads * Dv, hc * Dv, o_got.begin() + r * hc * Dv);
  }
  MlaDecodeParams ph = p;
  ph.q = q_sub.data();
  ph.o = o_ref.data();
  ph.lse = nullptr;
  ph.num_heads = hc;
  host::mla_decode(ph);
  const CaseResult check = compare_buffers("o", DType::bf16, o_got.data(), o_ref.data(),
                                           int64_t(o_ref.size()), Tolerance{.rel_l2 = 2e-3});

  const double bytes = double(c.batch) * double(c.seqlen) * D * sizeof(bf16);
  const double flops = double(c.batch * c.s_q * c.heads) * double(c.seqlen) * 2.0 * (D + Dv);
  const double read = ctx.read_gbps(kReadPassBytes);
  const double peak = ctx.fma_peak_gflops();
  BenchRecord r;
  r.bench = "mla_decode";
  r.case_name =
      fmt::format("b={} s_q={} h={} len={} d=576 dv=512", c.batch, c.s_q, c.heads, c.seqlen);
  r.seconds = seconds;
  r.bytes = bytes;
  r.flops = flops;
  r.limit = "read_gbps";
  r.limit_value = read;
  r.ratio = bytes / seconds / 1e9 / read;
  r.correct = check.pass;
  r.rel_err = check.max_rel_err;
  r.extra["fma_peak_gflops"] = peak;
  r.extra["ratio_fma_peak"] = flops / seconds / 1e9 / peak;
  ctx.emit(r);
  if (!check.pass)
    std::fprintf(stderr, "mla_decode %s: %s\n", r.case_name.c_str(), check.detail.c_str());
  return check.pass ? 0 : 1;
}

}  // namespace

DEEPINFER_KERNEL_BENCH(mla_decode) {
  std::vector<DecodeCase> cases = {{1, 16, 4096, 1}, {1, 128, 4096, 1}};
  if (!ctx.quick) {
    cases.push_back({8, 16, 4096, 1});
    cases.push_back({4, 128, 4096, 2});
  }
  int failures = 0;
  for (const auto& c : cases) failures += bench_decode_case(ctx, c);
  return failures;
}

}  // namespace deepinfer::kernels::testing
