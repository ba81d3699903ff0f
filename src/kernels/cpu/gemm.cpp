// Fast GEMMs: Highway SIMD (runtime dispatch) + kernel_pool(). Same formula as host
// (docs/numerics.md §3); only the fp32 summation order differs.
//  - small M (decode, M <= 8): memory-bound. Each weight row is streamed once; 128-wide K blocks
//    are decoded to f32 in registers and FMA'd with the M activation rows (decoded once); the
//    per-block partial vector is scaled by s_a·s_w into a vector accumulator, reduced at the end.
//  - larger M (prefill): compute-bound. Work items of (128 output columns, MC rows); per K
//    block the item decodes its 128×128 weight tile into a packed f32 panel and runs an MR×NR FMA
//    microkernel over pre-packed f32 activations; the block's partial tile is scaled into an f32
//    accumulator tile. Weights stay fp8 in memory; decoding is exact, so results are unchanged.
//    Where the weight has a decode layout (gemm_vbmi.cpp), the panels come from it instead: its
//    32-column panels decode straight into the panel order.
// bf16 GEMM uses the same kernels with a bf16 decoder and unit scales.
// Batch invariance (DecodeGemm::invariant, docs/numerics.md §10): fp8 decode shapes take the
// prefill kernel's per-row order (the decode layout kernel, or tiles of fewer rows), bf16 GEMMs
// of every M the small-M order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
// clang-format on

#include "kernels/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/fp8_simd-inl.h"
#include "kernels/cpu/gemm_args.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Decodes one vector of inputs (Lanes(DF) elements) of either type.
template <bool kBf16>
HWY_INLINE VF DecodeVec(DF df, const void* base, int64_t i) {
  if constexpr (kBf16)
    return DecodeBf16(df, static_cast<const uint16_t*>(base) + i);
  else
    return DecodeE4m3(df, static_cast<const uint8_t*>(base) + i);
}

// Decodes n elements to f32 (exact), vector body + scalar tail.
template <bool kBf16>
void DecodeRow(const void* src, float* HWY_RESTRICT dst, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(DecodeVec<kBf16>(df, src, i), df, dst + i);
  for (; i < n; ++i)
    dst[i] = kBf16 ? bf16_to_f32(static_cast<const bf16*>(src)[i])
                   : e4m3_to_f32(static_cast<const fp8_e4m3*>(src)[i]);
}

void Store(const GemmArgs& g, int64_t r, int64_t j, float v) {
  const int64_t i = r * (g.ldo ? g.ldo : g.n) + j;
  if (g.out)
    g.out[i] = f32_to_bf16(v);
  else
    g.out_f32[i] = v;
}

// ---- small M: stream the weights once ---------------------------------------------------------

// Columns per tile of the small-M kernel: the tile's K blocks run outermost, so one block's
// activations (MM·128 f32, ≤ 4 KiB) stay in L1 while the tile's weight rows stream past them. (Per
// column the K loop would sweep all MM·K activations once per column: 64 KiB at M = 8, K = 2048,
// more than L1, so every FMA waited on L2.) Each column's operations and their order are unchanged.
constexpr int64_t kSmallMTile = 8;

// Columns [j0, j1), at most kSmallMTile of them, for MM rows.
template <int MM, bool kBf16>
void SmallMTile(const GemmArgs& g, const float* HWY_RESTRICT af, int64_t j0, int64_t j1) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), K = g.k, kbs = num_blocks(K);
  const size_t esize = kBf16 ? 2 : 1;
  HWY_ALIGN uint8_t tail_bytes[2 * HWY_MAX_BYTES / 4 * 2] = {};  // one zero-padded vector of W
  const int64_t nt = j1 - j0;
  VF acc[kSmallMTile][MM];
  for (int64_t t = 0; t < nt; ++t)
    for (int r = 0; r < MM; ++r) acc[t][r] = hn::Zero(df);
  for (int64_t kb = 0; kb < kbs; ++kb) {
    const int64_t k0 = kb * kQuantBlock, klen = std::min(kQuantBlock, K - k0);
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t j = j0 + t;
      const uint8_t* wrow = static_cast<const uint8_t*>(g.w) + size_t(j * K) * esize;
      VF p0[MM], p1[MM];  // two chains per row: FMA latency
      for (int r = 0; r < MM; ++r) p0[r] = p1[r] = hn::Zero(df);
      int64_t kk = 0;
      for (; kk + 2 * L <= klen; kk += 2 * L) {
        const VF w0 = DecodeVec<kBf16>(df, wrow, k0 + kk);
        const VF w1 = DecodeVec<kBf16>(df, wrow, k0 + kk + L);
        for (int r = 0; r < MM; ++r) {
          p0[r] = hn::MulAdd(hn::LoadU(df, af + r * K + k0 + kk), w0, p0[r]);
          p1[r] = hn::MulAdd(hn::LoadU(df, af + r * K + k0 + kk + L), w1, p1[r]);
        }
      }
      for (; kk < klen; kk += L) {
        const int64_t cnt = std::min(L, klen - kk);
        VF w0;
        if (cnt == L) {
          w0 = DecodeVec<kBf16>(df, wrow, k0 + kk);
        } else {  // K edge: zero-padded copy (the activations past the edge are finite, times 0)
          std::memset(tail_bytes, 0, sizeof(tail_bytes));
          std::memcpy(tail_bytes, wrow + size_t(k0 + kk) * esize, size_t(cnt) * esize);
          w0 = DecodeVec<kBf16>(df, tail_bytes, 0);
        }
        for (int r = 0; r < MM; ++r)
          p0[r] = hn::MulAdd(hn::LoadU(df, af + r * K + k0 + kk), w0, p0[r]);
      }
      const float sw = g.w_scales ? g.w_scales[(j / kQuantBlock) * kbs + kb] : 1.0f;
      for (int r = 0; r < MM; ++r) {
        const float s = g.a_scales ? g.a_scales[r * kbs + kb] * sw : 1.0f;
        acc[t][r] = hn::MulAdd(hn::Add(p0[r], p1[r]), hn::Set(df, s), acc[t][r]);
      }
    }
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int r = 0; r < MM; ++r) Store(g, r, j0 + t, hn::GetLane(hn::SumOfLanes(df, acc[t][r])));
}

// Where all MM·K activations fit in L1 anyway (batch 1), one column at a time: one weight stream
// per thread prefetches better than kSmallMTile of them (measured: batch-1 decode slower tiled).
template <int MM, bool kBf16>
void SmallMRange(const GemmArgs& g, const float* HWY_RESTRICT af, int64_t j0, int64_t j1) {
  const int64_t tile = int64_t(MM) * g.k * 4 <= 16384 ? 1 : kSmallMTile;
  for (int64_t j = j0; j < j1; j += tile) SmallMTile<MM, kBf16>(g, af, j, std::min(j1, j + tile));
}

// SmallMRange for g.m (1..kSmallM) rows.
template <bool kBf16>
void SmallMRows(const GemmArgs& g, const float* HWY_RESTRICT af, int64_t j0, int64_t j1) {
  switch (g.m) {
    case 1:
      return SmallMRange<1, kBf16>(g, af, j0, j1);
    case 2:
      return SmallMRange<2, kBf16>(g, af, j0, j1);
    case 3:
      return SmallMRange<3, kBf16>(g, af, j0, j1);
    case 4:
      return SmallMRange<4, kBf16>(g, af, j0, j1);
    case 5:
      return SmallMRange<5, kBf16>(g, af, j0, j1);
    case 6:
      return SmallMRange<6, kBf16>(g, af, j0, j1);
    case 7:
      return SmallMRange<7, kBf16>(g, af, j0, j1);
    default:
      return SmallMRange<8, kBf16>(g, af, j0, j1);
  }
}

// Columns per task for `rows` rows: enough to amortise the dispatch, ~4 tasks per thread.
int64_t SmallMGrain(int64_t n, int64_t rows) {
  const int64_t threads = kernel_pool().num_threads();
  return std::max<int64_t>(rows > kSmallM ? kSmallMTile : 16, n / (4 * threads));
}

// bf16 activation rows for bf16_dot_rows, copied 64-byte aligned with a row stride (returned) of
// 64 bytes more than a multiple of 64: rows K·2 = 4 KiB apart (hidden 2048) would all fall in the
// same L1 sets, and 8 of them plus the weight rows overflow a set's ways (measured: the M = 8 LM
// head ran 1.5× slower in place).
// row(i) is the address of row i (of m), k bf16 each.
template <class RowAt>
int64_t PadBf16Rows(int64_t m, int64_t k, const RowAt& row,
                    hwy::AlignedFreeUniquePtr<uint16_t[]>& buf) {
  const int64_t ld = (k + 31) / 32 * 32 + 32;
  buf = hwy::AllocateAligned<uint16_t>(size_t(std::max<int64_t>(m * ld, 1)));
  for (int64_t r = 0; r < m; ++r) std::memcpy(buf.get() + r * ld, row(r), size_t(k) * 2);
  return ld;
}

template <bool kBf16>
void SmallMAll(const GemmArgs& g);

// The AMX bf16 kernel's work units: kAmxCols output columns each (two column tiles).
constexpr int64_t kAmxCols = 32;
int64_t AmxGroups(int64_t n) { return (n + kAmxCols - 1) / kAmxCols; }
// Units per task: ~4 tasks per thread.
int64_t AmxGrain(int64_t n) {
  return std::max<int64_t>(1, AmxGroups(n) / (4 * kernel_pool().num_threads()));
}

template <bool kBf16>
void SmallM(const GemmArgs& g) {
  if (kBf16 && bf16_dot_gemm()) return SmallMAll<kBf16>(g);  // one BF16-dot path for every M
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  // Activations decoded once, padded by one vector so K-edge loads stay in bounds.
  std::vector<float> af(size_t(g.m * g.k + L), 0.0f);
  DecodeRow<kBf16>(g.a, af.data(), g.m * g.k);
  kernel_pool().parallel_for(g.n, SmallMGrain(g.n, g.m), [&](int64_t j0, int64_t j1) {
    SmallMRows<kBf16>(g, af.data(), j0, j1);
  });
}

// Rows [0, g.m) in chunks of kSmallM, columns [j0, j1): the column tiles outermost, so a tile's
// weight rows come from memory once for every chunk (later chunks find them in cache).
// rows(s, r0, jt, je) computes the chunk s (rows r0.. of g) for columns [jt, je).
template <class Rows>
void SmallMChunks(const GemmArgs& g, int64_t j0, int64_t j1, const Rows& rows) {
  const int64_t kbs = num_blocks(g.k), ldo = g.ldo ? g.ldo : g.n;
  for (int64_t jt = j0; jt < j1; jt += kSmallMTile) {
    const int64_t je = std::min(j1, jt + kSmallMTile);
    for (int64_t r0 = 0; r0 < g.m; r0 += kSmallM) {
      GemmArgs s = g;
      s.m = std::min(kSmallM, g.m - r0);
      if (g.out) s.out = g.out + r0 * ldo;
      if (g.out_f32) s.out_f32 = g.out_f32 + r0 * ldo;
      if (g.a_scales) s.a_scales = g.a_scales + r0 * kbs;
      rows(s, r0, jt, je);
    }
  }
}

// SmallMChunks over f32 activations af [m, k] (decoded once).
template <bool kBf16>
void SmallMChunksF32(const GemmArgs& g, const float* HWY_RESTRICT af, int64_t j0, int64_t j1) {
  SmallMChunks(g, j0, j1, [&](const GemmArgs& s, int64_t r0, int64_t jt, int64_t je) {
    SmallMRows<kBf16>(s, af + r0 * g.k, jt, je);
  });
}

// Any M in the small-M order (the batch-invariant bf16 GEMM): rows in chunks of kSmallM, one task
// per column range, activations decoded once (or copied as padded bf16 rows for the BF16-dot
// kernel).
template <bool kBf16>
void SmallMAll(const GemmArgs& g) {
  if (kBf16 && amx_bf16_gemm(g.k)) {
    std::vector<uint32_t> pairs(amx_bf16_pairs_size(g.m, g.k));
    amx_bf16_pack(g.m, g.k, static_cast<const uint16_t*>(g.a), g.k, pairs.data());
    kernel_pool().parallel_for(AmxGroups(g.n), AmxGrain(g.n), [&](int64_t u0, int64_t u1) {
      amx_bf16_columns(g, pairs.data(), u0 * kAmxCols, std::min(g.n, u1 * kAmxCols));
      release_amx_tiles();
    });
    return;
  }
  if (kBf16 && bf16_dot_gemm()) {
    hwy::AlignedFreeUniquePtr<uint16_t[]> a;
    const int64_t ld = PadBf16Rows(
        g.m, g.k, [&](int64_t r) { return static_cast<const uint16_t*>(g.a) + r * g.k; }, a);
    parallel_for_streaming(
        (g.n + kDotTaskCols - 1) / kDotTaskCols,
        streaming_work(g.n * g.k * int64_t(sizeof(bf16)), g.m), [&](int64_t t0, int64_t t1) {
          bf16_dot_rows(g, a.get(), ld, t0 * kDotTaskCols, std::min(g.n, t1 * kDotTaskCols));
        });
    return;
  }
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  std::vector<float> af(size_t(g.m * g.k + L), 0.0f);
  DecodeRow<kBf16>(g.a, af.data(), g.m * g.k);
  kernel_pool().parallel_for(g.n, SmallMGrain(g.n, g.m), [&](int64_t j0, int64_t j1) {
    SmallMChunksF32<kBf16>(g, af.data(), j0, j1);
  });
}

// Whether bf16 GEMMs of every M take the small-M kernels (SmallMAll): in the invariant mode for
// its one order, and with BF16 dot products (or AMX) in either mode, as no kernel is faster there.
bool Bf16SmallMAtEveryM() { return small_m_invariant() || bf16_dot_gemm(); }

// Several bf16 problems (GemmBf16Params::batch, strided) in the small-M order, every problem's
// column-range tasks in one pool dispatch: the per-head GEMMs of a decode step wake the pool once.
// False, doing nothing, where a single call of the shape would take another kernel (M > kSmallM
// where !Bf16SmallMAtEveryM(), or k = 0): the caller runs the problems one by one.
bool GemmBf16Batched(const GemmBf16Params& p) {
  if ((p.m > kSmallM && !Bf16SmallMAtEveryM()) || p.k == 0) return false;
  if (p.m == 0 || p.n == 0 || p.batch == 0) return true;
  const int64_t K = p.k, lda = p.row_a(), ldo = p.row_out();
  // Problem b's GEMM (columns set by the caller).
  const auto problem = [&](int64_t b) {
    GemmArgs s{};
    s.w = p.w + b * p.w_batch;
    s.out = p.out ? p.out + b * p.out_batch : nullptr;
    s.out_f32 = p.out_f32 ? p.out_f32 + b * p.out_batch : nullptr;
    s.m = p.m;
    s.n = p.n;
    s.k = K;
    s.bf16_inputs = true;
    s.ldo = ldo;
    return s;
  };
  if (amx_bf16_gemm(K)) {
    const size_t each = amx_bf16_pairs_size(p.m, K);
    std::vector<uint32_t> pairs(size_t(p.batch) * each);
    for (int64_t b = 0; b < p.batch; ++b)
      amx_bf16_pack(p.m, K, reinterpret_cast<const uint16_t*>(p.a + b * p.a_batch), lda,
                    pairs.data() + size_t(b) * each);
    const int64_t col_tasks = AmxGroups(p.n);
    kernel_pool().parallel_for(p.batch * col_tasks, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / col_tasks, u = i % col_tasks;
        amx_bf16_columns(problem(b), pairs.data() + size_t(b) * each, u * kAmxCols,
                         std::min(p.n, (u + 1) * kAmxCols));
      }
      release_amx_tiles();
    });
    return true;
  }
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const bool dot = bf16_dot_gemm();
  std::vector<float> af(dot ? 0 : size_t(p.batch * p.m * K + L), 0.0f);
  hwy::AlignedFreeUniquePtr<uint16_t[]> ab;  // dot: every problem's rows, padded (PadBf16Rows)
  int64_t ld = 0;
  if (dot) {  // row i of the padded copy: problem i / m, its row i % m
    ld = PadBf16Rows(
        p.batch * p.m, K, [&](int64_t i) { return p.a + (i / p.m) * p.a_batch + (i % p.m) * lda; },
        ab);
  } else {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t r = 0; r < p.m; ++r)
        DecodeRow<true>(p.a + b * p.a_batch + r * lda, af.data() + (b * p.m + r) * K, K);
  }
  // A lane per column, no horizontal sums: the same bytes as the rows kernel, faster at every
  // shape `bench kernels --bench gemm_bf16_heads` measures.
  if (dot && p.w_pairs != nullptr && K % 32 == 0) {
    const size_t words = bf16_pairs_words(p.n, K);
    const int64_t tiles = (p.n + kPairCols - 1) / kPairCols;
    // Tiles [i0, i1) of the call (every head's, one stream in order), a head's share in one kernel
    // call: per tile the call setup cost as much as the tile's products at M = 1.
    parallel_for_streaming(
        p.batch * tiles, streaming_work(p.batch * p.n * K * int64_t(sizeof(bf16)), p.m),
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1;) {
            const int64_t b = i / tiles, e = std::min(i1, (b + 1) * tiles);
            bf16_pair_columns(problem(b), ab.get() + b * p.m * ld, ld,
                              p.w_pairs + size_t(b) * words, (i % tiles) * kPairCols,
                              std::min(p.n, (e - b * tiles) * kPairCols));
            i = e;
          }
        });
    return true;
  }
  const int64_t grain = SmallMGrain(p.n, p.m), col_tasks = (p.n + grain - 1) / grain;
  kernel_pool().parallel_for(p.batch * col_tasks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / col_tasks, j0 = (i % col_tasks) * grain;
      const GemmArgs s = problem(b);
      const int64_t j1 = std::min(p.n, j0 + grain);
      if (dot)
        bf16_dot_rows(s, ab.get() + b * p.m * ld, ld, j0, j1);
      else
        SmallMChunksF32<true>(s, af.data() + b * p.m * K, j0, j1);
    }
  });
  return true;
}

// ---- large M: packed panels and an MR×NR microkernel -------------------------------------------

#if HWY_TARGET <= HWY_AVX3
constexpr int kMR = 8;  // 32 vector registers: 16 accumulators
#else
constexpr int kMR = 4;  // 16 vector registers: 8 accumulators
#endif
constexpr int kNV = 2;                // NR = kNV vectors
constexpr int64_t kNC = kQuantBlock;  // columns per work item: one weight-scale block

// partial[MR][NR] = Σ_kk a[kk][r] · w[kk][c] over klen; a: [klen][MR], w: [klen][NR]. Each
// (row, column) sums its products in panel order whatever MR is (K order, or K pairs swapped to
// match the decode layout kernel: invariant_pairs_swapped; docs/numerics.md §10).
template <int MR>
HWY_INLINE void MicroKernel(const float* HWY_RESTRICT a, const float* HWY_RESTRICT w, int64_t klen,
                            VF (&c)[MR][kNV]) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v) c[r][v] = hn::Zero(df);
  for (int64_t kk = 0; kk < klen; ++kk) {
    const VF w0 = hn::Load(df, w + kk * kNV * L);
    const VF w1 = hn::Load(df, w + kk * kNV * L + L);
    for (int r = 0; r < MR; ++r) {
      const VF ar = hn::Set(df, a[kk * MR + r]);
      c[r][0] = hn::MulAdd(ar, w0, c[r][0]);
      c[r][1] = hn::MulAdd(ar, w1, c[r][1]);
    }
  }
}

// Rows in tiles of MR (kMR for prefill; M rounded up to 1, 2 or 4, else kMR, for the decode shapes
// in the batch-invariant mode: the same per-row order with less work on padding rows).
template <bool kBf16, int MR = kMR>
void LargeM(const GemmArgs& g) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), NR = kNV * L, K = g.k, kbs = num_blocks(K);
  const int64_t m_tiles = (g.m + MR - 1) / MR;
  ThreadPool& pool = kernel_pool();
  // K order within a block: kk, or kk ^ 1 (pairs swapped) to match the decode layout kernel.
  const int64_t sx = invariant_pairs_swapped(g) ? 1 : 0;

  // Activations decoded and packed once: [m_tile][kb][kk < 128][MR] f32, rows past M zero.
  const int64_t panel = kQuantBlock * MR;
  hwy::AlignedFreeUniquePtr<float[]> ap =
      hwy::AllocateAligned<float>(size_t(m_tiles * kbs * panel));
  pool.parallel_for(m_tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> row(size_t(K) + size_t(L));
    for (int64_t t = t0; t < t1; ++t) {
      float* dst = ap.get() + t * kbs * panel;
      std::fill(dst, dst + kbs * panel, 0.0f);
      for (int r = 0; r < MR; ++r) {
        const int64_t m = t * MR + r;
        if (m >= g.m) break;
        const size_t esize = kBf16 ? 2 : 1;
        DecodeRow<kBf16>(static_cast<const uint8_t*>(g.a) + size_t(m * K) * esize, row.data(), K);
        for (int64_t kk = 0; kk < K; ++kk)
          dst[(kk / kQuantBlock) * panel + ((kk % kQuantBlock) ^ sx) * MR + r] = row[size_t(kk)];
      }
    }
  });

  // Work items: (column block of kNC, row chunk of mc rows); split rows when columns are few.
  const int64_t n_blocks = (g.n + kNC - 1) / kNC;
  const int64_t want = 3 * int64_t(pool.num_threads());
  const int64_t m_chunks = std::clamp<int64_t>((want + n_blocks - 1) / n_blocks, 1, m_tiles);
  const int64_t tiles_per_chunk = (m_tiles + m_chunks - 1) / m_chunks;
  const int64_t items = n_blocks * m_chunks;

  pool.parallel_for(items, 1, [&](int64_t i0, int64_t i1) {
    const int64_t n_panels = (kNC + NR - 1) / NR;
    hwy::AlignedFreeUniquePtr<float[]> wp =
        hwy::AllocateAligned<float>(size_t(n_panels * kQuantBlock * NR));
    hwy::AlignedFreeUniquePtr<float[]> acc =
        hwy::AllocateAligned<float>(size_t(tiles_per_chunk * MR * kNC));
    std::vector<float> row(size_t(kQuantBlock) + size_t(L));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t nb = item % n_blocks, mc = item / n_blocks;
      const int64_t n0 = nb * kNC, nc = std::min(kNC, g.n - n0);
      const int64_t t0 = mc * tiles_per_chunk, t1 = std::min(m_tiles, t0 + tiles_per_chunk);
      if (t0 >= t1) continue;
      std::fill(acc.get(), acc.get() + (t1 - t0) * MR * kNC, 0.0f);
      for (int64_t kb = 0; kb < kbs; ++kb) {
        const int64_t k0 = kb * kQuantBlock, klen = std::min(kQuantBlock, K - k0);
        // Pack W[n0:n0+nc, k0:k0+klen] as [panel][kk][NR] f32; columns past nc are zero. From the
        // decode layout where there is one (its 32-column panels are this layout, NR = 32).
        bool from_decode_layout = NR == 32;
        for (int64_t pnl = 0; pnl < n_panels && from_decode_layout; ++pnl)
          from_decode_layout =
              decode_layout_f32_panel(g, n0 + pnl * NR, kb, wp.get() + pnl * kQuantBlock * NR, sx);
        if (!from_decode_layout) {
          std::fill(wp.get(), wp.get() + n_panels * kQuantBlock * NR, 0.0f);
          const size_t esize = kBf16 ? 2 : 1;
          for (int64_t j = 0; j < nc; ++j) {
            DecodeRow<kBf16>(static_cast<const uint8_t*>(g.w) + size_t((n0 + j) * K + k0) * esize,
                             row.data(), klen);
            float* dst = wp.get() + (j / NR) * kQuantBlock * NR + (j % NR);
            for (int64_t kk = 0; kk < klen; ++kk) dst[(kk ^ sx) * NR] = row[size_t(kk)];
          }
        }
        const float sw = g.w_scales ? g.w_scales[nb * kbs + kb] : 1.0f;
        for (int64_t t = t0; t < t1; ++t) {
          const float* a = ap.get() + (t * kbs + kb) * panel;
          float sa[MR];
          for (int r = 0; r < MR; ++r) {
            const int64_t m = t * MR + r;
            sa[r] = m >= g.m ? 0.0f : (g.a_scales ? g.a_scales[m * kbs + kb] * sw : 1.0f);
          }
          for (int64_t pnl = 0; pnl < n_panels; ++pnl) {
            VF c[MR][kNV];
            MicroKernel(a, wp.get() + pnl * kQuantBlock * NR, klen, c);
            float* at = acc.get() + (t - t0) * MR * kNC + pnl * NR;
            for (int r = 0; r < MR; ++r)
              for (int v = 0; v < kNV; ++v) {
                float* p = at + r * kNC + v * L;
                hn::StoreU(hn::MulAdd(c[r][v], hn::Set(df, sa[r]), hn::LoadU(df, p)), df, p);
              }
          }
        }
      }
      for (int64_t t = t0; t < t1; ++t)
        for (int r = 0; r < MR; ++r) {
          const int64_t m = t * MR + r;
          if (m >= g.m) break;
          const float* at = acc.get() + ((t - t0) * MR + r) * kNC;
          for (int64_t j = 0; j < nc; ++j) Store(g, m, n0 + j, at[j]);
        }
    }
  });
}

// M > kSmallM: the decode layout kernel over chunks of kSmallM rows, panel by panel (the chunks
// share each panel's weights in L2). In the batch-invariant mode each row gets the bytes the
// prefill kernel would give it (invariant_pairs_swapped: the two agree bit for bit). The weights
// go through BF16 dot products, about twice the fp32 FMA rate here, instead of being unpacked into
// f32 panels for FMA: faster at every M measured (docs/performance.md §8), so the mode off takes
// it too. False, doing nothing, where the decode layout kernel does not take the shape.
bool ChunkedDecodeLayout(const GemmArgs& g) {
  if (g.m <= kSmallM || !takes_decode_layout_chunked(g)) return false;  // (bf16: not taken)
  run_decode_layout_multi(std::span<const GemmArgs>(&g, 1));
  return true;
}

void Gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.m <= kSmallM && gemm_fp8_small_m_vbmi(g)) return;
  if (ChunkedDecodeLayout(g)) return;
  if (g.k == 0) {
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t j = 0; j < g.n; ++j) Store(g, r, j, 0.0f);
    return;
  }
  if (g.bf16_inputs && Bf16SmallMAtEveryM()) {
    SmallMAll<true>(g);
    return;
  }
  if (g.m <= kSmallM && small_m_invariant()) {  // fp8 without a usable decode layout
    if (g.m == 1)
      LargeM<false, 1>(g);
    else if (g.m == 2)
      LargeM<false, 2>(g);
    else if (g.m <= 4)
      LargeM<false, 4>(g);
    else
      LargeM<false, kMR>(g);
  } else if (g.m <= kSmallM) {
    if (g.bf16_inputs)
      SmallM<true>(g);
    else
      SmallM<false>(g);
  } else {
    if (g.bf16_inputs)
      LargeM<true>(g);
    else
      LargeM<false>(g);
  }
}

// Columns [c0, c1) of problem b with exact sums (GemmBf16Params::exact): bf16 × bf16 products are
// exact in float64, and a float64 sum of them stays far below one fp32 ulp from the exact dot, so
// the output is the exact dot rounded once, as on the host. Rows one by one: batch-invariant.
void GemmBf16Exact(const GemmBf16Params& p, int64_t b, int64_t c0, int64_t c1) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t N = int64_t(hn::Lanes(dd)), K = p.k;
  const auto load = [&](const bf16* q) {
    return hn::PromoteTo(dd, DecodeBf16(df, reinterpret_cast<const uint16_t*>(q)));
  };
  for (int64_t r = 0; r < p.m; ++r) {
    const bf16* a = p.a + b * p.a_batch + r * p.row_a();
    for (int64_t c = c0; c < c1; ++c) {
      const bf16* w = p.w + b * p.w_batch + c * K;
      auto acc = hn::Zero(dd);
      int64_t k = 0;
      for (; k + N <= K; k += N) acc = hn::MulAdd(load(a + k), load(w + k), acc);
      double s = hn::GetLane(hn::SumOfLanes(dd, acc));
      for (; k < K; ++k) s += double(bf16_to_f32(a[k])) * double(bf16_to_f32(w[k]));
      const int64_t o = b * p.out_batch + r * p.row_out() + c;
      if (p.out_f32) p.out_f32[o] = float(s);
      if (p.out) p.out[o] = f32_to_bf16(float(s));
    }
  }
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(Gemm);
HWY_EXPORT(GemmBf16Batched);
HWY_EXPORT(GemmBf16Exact);

namespace {
void run(const GemmArgs& g) { HWY_DYNAMIC_DISPATCH(Gemm)(g); }

void zero_rows(bf16* out, int64_t rows, int64_t n) {
  if (rows > 0) std::fill(out, out + rows * n, bf16{0});
}
}  // namespace

void gemm_fp8(const GemmFp8Params& p) {
  run({p.a, p.a_scales, p.w, p.w_scales, p.out, p.out_f32, p.m, p.n, p.k, false, p.w_decode});
}

void gemm_fp8_multi(std::span<const GemmFp8Params> problems) {
  // What Gemm would give each problem: the decode layout kernel for M <= kSmallM (and a larger M
  // in kSmallM-row chunks, as ChunkedDecodeLayout), all of those in one dispatch; anything else
  // one call at a time.
  std::vector<GemmArgs> layout;
  for (const GemmFp8Params& p : problems) {
    const GemmArgs g{p.a, p.a_scales, p.w, p.w_scales, p.out,     p.out_f32,
                     p.m, p.n,        p.k, false,      p.w_decode};
    if (g.m == 0 || g.n == 0) continue;
    if (takes_decode_layout_chunked(g))
      layout.push_back(g);
    else
      run(g);
  }
  run_decode_layout_multi(layout);
}

void gemm_fp8_grouped_contiguous(const GemmFp8GroupedContiguousParams& p) {
  const int64_t kbs = num_blocks(p.k), w_scale_count = num_blocks(p.n) * kbs;
  // One dense GEMM per run of rows with the same expert; padding rows are zeroed.
  int64_t r = 0;
  while (r < p.m) {
    const int32_t e = p.m_indices[r];
    int64_t end = r + 1;
    while (end < p.m && p.m_indices[end] == e) ++end;
    if (e < 0) {
      zero_rows(p.out + r * p.n, end - r, p.n);
    } else {
      run({p.a + r * p.k, p.a_scales + r * kbs, p.w + e * p.n * p.k, p.w_scales + e * w_scale_count,
           p.out + r * p.n, nullptr, end - r, p.n, p.k, false});
    }
    r = end;
  }
}

void gemm_fp8_grouped_masked(const GemmFp8GroupedMaskedParams& p) {
  const int64_t kbs = num_blocks(p.k), w_scale_count = num_blocks(p.n) * kbs;
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const int64_t rows = p.masked_m[e], base = e * p.max_m;
    run({p.a + base * p.k, p.a_scales + base * kbs, p.w + e * p.n * p.k,
         p.w_scales + e * w_scale_count, p.out + base * p.n, nullptr, rows, p.n, p.k, false});
    zero_rows(p.out + (base + rows) * p.n, p.max_m - rows, p.n);
  }
}

void gemm_bf16(const GemmBf16Params& p) {
  if (p.exact) {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, p.m * p.k));
    kernel_pool().parallel_for(p.n, grain, [&](int64_t c0, int64_t c1) {
      for (int64_t b = 0; b < p.batch; ++b) HWY_DYNAMIC_DISPATCH(GemmBf16Exact)(p, b, c0, c1);
    });
    return;
  }
  if (p.batch == 1 && p.row_a() == p.k && p.row_out() == p.n && p.w_pairs == nullptr) {
    run({p.a, nullptr, p.w, nullptr, p.out, p.out_f32, p.m, p.n, p.k, true});
    return;
  }
  if (HWY_DYNAMIC_DISPATCH(GemmBf16Batched)(p)) return;
  // One problem at a time through contiguous copies (prefill shapes: the copies are cheap there).
  std::vector<bf16> a(size_t(p.m * p.k)), out(p.out ? size_t(p.m * p.n) : 0);
  std::vector<float> out_f32(p.out_f32 ? size_t(p.m * p.n) : 0);
  const int64_t lda = p.row_a(), ldo = p.row_out();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t r = 0; r < p.m; ++r)
      std::copy_n(p.a + b * p.a_batch + r * lda, p.k, a.begin() + r * p.k);
    run({a.data(), nullptr, p.w + b * p.w_batch, nullptr, p.out ? out.data() : nullptr,
         p.out_f32 ? out_f32.data() : nullptr, p.m, p.n, p.k, true});
    for (int64_t r = 0; r < p.m; ++r) {
      if (p.out) std::copy_n(out.begin() + r * p.n, p.n, p.out + b * p.out_batch + r * ldo);
      if (p.out_f32)
        std::copy_n(out_f32.begin() + r * p.n, p.n, p.out_f32 + b * p.out_batch + r * ldo);
    }
  }
}

}  // namespace deepinfer::kernels::cpu
#endif  // HWY_ONCE
