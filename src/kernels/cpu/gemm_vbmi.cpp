// fp8 decode GEMMs (M <= 8) on AVX512-VBMI, two of them:
//  - the decode layout (AVX512-BF16 too): the weight re-ordered at load so 64 bytes hold 16 output
//    columns × 4 K (`pack_decode_layout`). A vector lane is an output column, so BF16 dot products
//    (VDPBF16PS, 32 products per instruction) against one broadcast activation pair accumulate
//    straight into the outputs: no horizontal sums, and each broadcast feeds two 16-column groups.
//    Where the CPU has AMX-BF16 (DEEPINFER_AMX, on by default) the same layout and decode feed
//    TDPBF16PS tile products instead, at every M (PanelRangeAmx, below).
//  - the checkpoint's row layout, f32 FMAs over 128-wide K blocks, described next.
// Decode streams the weights once, so the per-byte decode cost decides the speed: an e4m3 code
// becomes bf16 (exact: 4 exponent and 3 mantissa bits fit) through two 128-entry byte lookups
// (VPERMI2B, the low and high byte of the code), 64 codes at a time, and f32 by moving the bf16
// bits up (an interleave with zeros). The interleaves permute positions within each 64-code group;
// activations go through the same decode, so products pair up. Products are exact in f32; each
// 128-block's partial sum is scaled by s_a·s_w into the accumulator as docs/numerics.md §3 says, so
// only the f32 summation order differs from the host. (Scaling the decoded values instead saves
// that epilogue but moves the rounding points enough to fail the tiny model's golden: 1.5e-2
// against 6e-4 on one prompt.)
#include <deepinfer/error.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/env.h"
#include "core/thread_pool.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/gemm.h"
#include "kernels/registry.h"

namespace deepinfer::kernels::cpu {
namespace {
bool batch_invariant_knob() { return knobs().batch_invariant; }
}  // namespace

void parallel_for_streaming(int64_t units, int64_t work,
                            const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool& pool = kernel_pool();
  if (work < kPerThreadBelow) {
    pool.parallel_for(units, 1, fn, ThreadPool::Schedule::per_thread);
    return;
  }
  const int64_t threads = pool.num_threads();
  pool.parallel_for(units, std::max<int64_t>(1, units / (32 * threads)), fn,
                    ThreadPool::Schedule::tapering);
}
}  // namespace deepinfer::kernels::cpu

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace deepinfer::kernels::cpu {
namespace {

#define DI_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi")))
#define DI_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16")))
#define DI_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,amx-tile,amx-bf16")))

// bf16 code of each e4m3 magnitude (0..127); 0x7f, NaN, decodes as 480 like the generic decoder.
struct Tables {
  alignas(64) std::array<uint8_t, 128> lo, hi;
  Tables() {
    for (int m = 0; m < 128; ++m) {
      const float v = m == 0x7f ? 480.0f : e4m3_to_f32(fp8_e4m3{uint8_t(m)});
      const uint16_t b = f32_to_bf16(v).bits;
      lo[size_t(m)] = uint8_t(b & 0xff);
      hi[size_t(m)] = uint8_t(b >> 8);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// f.template operator()<MM>() with MM = m, for m in 1..kSmallM (kernels are unrolled over rows).
template <class F>
void with_rows(int64_t m, F&& f) {
  switch (m) {
    case 1:
      f.template operator()<1>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    case 3:
      f.template operator()<3>();
      break;
    case 4:
      f.template operator()<4>();
      break;
    case 5:
      f.template operator()<5>();
      break;
    case 6:
      f.template operator()<6>();
      break;
    case 7:
      f.template operator()<7>();
      break;
    default:
      f.template operator()<8>();
      break;
  }
}

// Sum of the 16 lanes (not _mm512_reduce_add_ps: GCC 12 warns inside it under -Werror).
DI_VBMI_TARGET inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// hsum of 16 accumulators at once, the same adds in the same order: a 16 × 16 transpose (lane l
// of every accumulator in t[l]), then 0 + t[0] + t[1] + ... + t[15]. (The maskz forms: GCC 12 warns
// inside the plain unpack and shuffle intrinsics, and CI builds with -Werror.)
DI_VBMI_TARGET inline __m512 Hsum16(const __m512* acc) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(0xffff, acc[2 * i], acc[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xffff, acc[2 * i], acc[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, a0, a2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, a0, a2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, a1, a3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, a1, a3));
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_maskz_shuffle_f32x4(0xffff, u[8 * h + i], u[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_maskz_shuffle_f32x4(0xffff, u[8 * h + i], u[8 * h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    u[i] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[8 + i], 0x88);
    u[8 + i] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[8 + i], 0xdd);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int l = 0; l < 16; ++l) sum = _mm512_add_ps(sum, u[l]);
  return sum;
}

struct Decoder {
  __m512i lo0, lo1, hi0, hi1, sign;
  DI_VBMI_TARGET Decoder() {
    const Tables& t = tables();
    lo0 = _mm512_load_si512(t.lo.data());
    lo1 = _mm512_load_si512(t.lo.data() + 64);
    hi0 = _mm512_load_si512(t.hi.data());
    hi1 = _mm512_load_si512(t.hi.data() + 64);
    sign = _mm512_set1_epi8(char(0x80));
  }
  // 64 e4m3 codes -> bf16 of codes [16q, 16q+8) in b0 and [16q+8, 16q+16) in b1, q = 0..3 (the
  // in-lane interleave; the decode layout puts its codes where these land).
  DI_VBMI_TARGET inline void decode_bf16(const uint8_t* p, __m512i& b0, __m512i& b1) const {
    const __m512i codes = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
    const __m512i hi =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, codes, hi1), codes, sign, 0xF8);
    b0 = _mm512_unpacklo_epi8(lo, hi);
    b1 = _mm512_unpackhi_epi8(lo, hi);
  }
  // 64 e4m3 codes -> 4 vectors of 16 f32 (exact; a fixed permutation of the 64 positions).
  DI_VBMI_TARGET inline void decode(const uint8_t* p, __m512* out) const {
    const __m512i codes = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);  // index bit 7 (sign) is ignored
    __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);
    hi = _mm512_or_si512(hi, _mm512_and_si512(codes, sign));
    const __m512i b0 = _mm512_unpacklo_epi8(lo, hi), b1 = _mm512_unpackhi_epi8(lo, hi);  // bf16
    const __m512i z = _mm512_setzero_si512();
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, b0));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, b0));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, b1));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, b1));
  }
};

// Output columns [j0, j1) for rows 0..MM-1, kJT columns at a time with the K blocks outermost:
// the block's activations (MM·512 bytes) stay in L1 while the kJT weight rows stream past them,
// so the activations are read from L2 once per kJT columns instead of once per column.
constexpr int64_t kJT = 8;
template <int MM>
DI_VBMI_TARGET void Range(const GemmArgs& g, const __m512* act, int64_t j0, int64_t j1) {
  const Decoder dec;
  const int64_t K = g.k, kbs = K / 128;
  const auto* w = static_cast<const uint8_t*>(g.w);
  alignas(64) __m512 acc[kJT][MM];
  for (int64_t jt = j0; jt < j1; jt += kJT) {
    const int64_t nj = std::min(kJT, j1 - jt);
    for (int64_t c = 0; c < nj; ++c)
      for (int r = 0; r < MM; ++r) acc[c][r] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < kbs; ++kb) {
      const __m512* ab = act + size_t(kb) * MM * 8;  // [r][8]
      float sa[MM];
      for (int r = 0; r < MM; ++r) sa[r] = g.a_scales[r * kbs + kb];
      for (int64_t c = 0; c < nj; ++c) {
        const int64_t j = jt + c;
        __m512 wv[8];
        const float sw = g.w_scales[(j / 128) * kbs + kb];
        const uint8_t* blk = w + size_t(j) * size_t(K) + size_t(kb) * 128;
        dec.decode(blk, wv);
        dec.decode(blk + 64, wv + 4);
        for (int r = 0; r < MM; ++r) {
          const __m512* a = ab + r * 8;
          __m512 p0 = _mm512_mul_ps(a[0], wv[0]);
          __m512 p1 = _mm512_mul_ps(a[1], wv[1]);
          p0 = _mm512_fmadd_ps(a[2], wv[2], p0);
          p1 = _mm512_fmadd_ps(a[3], wv[3], p1);
          p0 = _mm512_fmadd_ps(a[4], wv[4], p0);
          p1 = _mm512_fmadd_ps(a[5], wv[5], p1);
          p0 = _mm512_fmadd_ps(a[6], wv[6], p0);
          p1 = _mm512_fmadd_ps(a[7], wv[7], p1);
          acc[c][r] = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(sa[r] * sw), acc[c][r]);
        }
      }
    }
    for (int64_t c = 0; c < nj; ++c)
      for (int r = 0; r < MM; ++r) {
        const float v = hsum(acc[c][r]);
        if (g.out)
          g.out[r * g.n + jt + c] = f32_to_bf16(v);
        else
          g.out_f32[r * g.n + jt + c] = v;
      }
  }
}

// Software prefetch this many bytes ahead in the weight stream: the hardware prefetcher alone left
// the kernel streaming at about half the read pass (docs/performance.md §8). 2 KiB was best of 0.5
// to 4 KiB on a VM that read 30 GB/s; at 50-75 GB/s the lines must be asked for further ahead to
// cover the same latency, and 8 KiB streamed 20-30% faster than 2 KiB (4 and 16 KiB in between).
// A prefetch past the end of the layout is harmless: prefetches never fault. Several streams
// (PanelGroup, Bf16DotRowStreams) and the pairs kernel share this distance.
constexpr int64_t kPrefetchAhead = 8192;
// Those prefetches fill L2, not L1 (T1): on the AMD EPYC VM, T0 held batch-1 decode a quarter
// slower and batch 16 a seventh. The lines wait in L1's few miss buffers and evict what the kernel
// is using (docs/performance.md §8, stop 44); L2 tracks more misses at once and has the room.
constexpr _mm_hint kStreamHint = _MM_HINT_T1;
// The AMX kernel keeps the distance it was measured with (2 KiB): no AMX CPU to measure it again.
constexpr int64_t kAmxPrefetchAhead = 2048;

// ---- bf16 rows with VDPBF16PS
// Lane l of a row's accumulator for a column takes the K pairs (32c + 2l, 32c + 2l + 1) for c = 0,
// 1, ... in order (the K edge by masked loads of zeros); the lanes are summed in order at the end.
// The order depends on K only, never on M or on how columns are tiled: every bf16 row of every
// call sums the same way (batch invariance, docs/numerics.md §10).
// Tiling: output columns in tiles of kDotCols, K in slices of kDotSlice steps (32 K each). In a
// slice every chunk of up to 8 rows runs over the tile's columns NC at a time (MM·NC accumulators
// in registers, kept in memory between slices), so the slice's weights (kDotCols rows × 1 KiB)
// and activations stay in L1 for every chunk and column group instead of streaming K whole past
// each pair of columns (docs/performance.md §8). The first chunk prefetches the weights the next
// slice (or the next tile's first slice) reads.
constexpr int64_t kDotCols = 8;
constexpr int64_t kDotSlice = 16;

// K pairs [32c, 32c + 32) (mask: the K edge) into the MM × NC accumulators.
template <int MM, int NC>
DI_BF16_TARGET inline __attribute__((always_inline)) void Bf16DotStep(__m512 (&acc)[MM][NC],
                                                                      const uint16_t* w, int64_t K,
                                                                      const uint16_t* a,
                                                                      int64_t lda, int64_t c,
                                                                      __mmask32 mask) {
  __m512bh wv[NC];
#pragma GCC unroll 8
  for (int n = 0; n < NC; ++n) wv[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + n * K + 32 * c);
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r) {
    const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(mask, a + r * lda + 32 * c);
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], av, wv[n]);
  }
}

// Steps [c0, c1) for rows 0..MM-1 of a and the NC weight rows at w, continuing the accumulators
// keep[r·kDotCols + n] (zeros where c0 == 0). pf, unless null: NC weight rows to prefetch, steps
// [p0, p0 + c1 - c0) of them.
template <int MM, int NC>
DI_BF16_TARGET void Bf16DotSteps(__m512* keep, const uint16_t* w, int64_t K, const uint16_t* a,
                                 int64_t lda, int64_t c0, int64_t c1, const uint16_t* pf,
                                 int64_t p0) {
  const int64_t full = K / 32;
  __m512 acc[MM][NC];
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r)
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) acc[r][n] = c0 == 0 ? _mm512_setzero_ps() : keep[r * kDotCols + n];
  for (int64_t c = c0; c < std::min(c1, full); ++c) {
    if (pf)
#pragma GCC unroll 8
      for (int n = 0; n < NC; ++n)
        _mm_prefetch(reinterpret_cast<const char*>(pf + n * K + 32 * (p0 + c - c0)), kStreamHint);
    Bf16DotStep<MM, NC>(acc, w, K, a, lda, c, __mmask32(~0u));
  }
  if (c1 > full) Bf16DotStep<MM, NC>(acc, w, K, a, lda, full, __mmask32((1u << (K % 32)) - 1));
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r)
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) keep[r * kDotCols + n] = acc[r][n];
}

// Slice steps [c0, c1) of rows 0..MM-1 for columns [j, j + nj) (nj <= kDotCols) of tile w.
template <int MM>
DI_BF16_TARGET void Bf16DotChunk(__m512* keep, const uint16_t* w, int64_t K, const uint16_t* a,
                                 int64_t lda, int64_t nj, int64_t c0, int64_t c1,
                                 const uint16_t* pf, int64_t p0) {
  // Two columns share each activation load from two rows up: four (tried for 2..4 rows) streamed
  // the LM head 5-12% slower on one core (docs/performance.md §8).
  constexpr int kNC = MM >= 2 ? 2 : 1;
  int64_t n = 0;
  for (; n + kNC <= nj; n += kNC)
    Bf16DotSteps<MM, kNC>(keep + n, w + n * K, K, a, lda, c0, c1, pf ? pf + n * K : nullptr, p0);
  for (; n < nj; ++n)
    Bf16DotSteps<MM, 1>(keep + n, w + n * K, K, a, lda, c0, c1, pf ? pf + n * K : nullptr, p0);
}

DI_BF16_TARGET void Bf16DotColumns(const GemmArgs& g, const uint16_t* a, int64_t lda, int64_t j0,
                                   int64_t j1) {
  const int64_t K = g.k, steps = (K + 31) / 32, ldo = g.ldo ? g.ldo : g.n;
  const auto* w = static_cast<const uint16_t*>(g.w);
  struct alignas(64) Lanes {
    float f[16];
  };
  // [m][kDotCols] accumulators between slices, and one spare row for the lane sums' pairs.
  thread_local std::vector<Lanes> keep_buf;
  keep_buf.resize(size_t((g.m + 1) * kDotCols));
  __m512* const keep = reinterpret_cast<__m512*>(keep_buf.data());
  for (int64_t jt = j0; jt < j1; jt += kDotCols) {
    const int64_t nj = std::min(kDotCols, j1 - jt);
    const uint16_t* wt = w + jt * K;
    for (int64_t c0 = 0; c0 < steps; c0 += kDotSlice) {
      const int64_t c1 = std::min(steps, c0 + kDotSlice);
      // What the next slice reads: this tile further on, or the next tile from its start (a
      // prefetch past the matrix's end is harmless).
      const bool last = c1 == steps;
      const uint16_t* pf = last ? wt + kDotCols * K : wt;
      const int64_t p0 = last ? 0 : c1;
      for (int64_t r0 = 0; r0 < g.m; r0 += kSmallM) {
        const uint16_t* ar = a + r0 * lda;
        const uint16_t* pr = r0 == 0 ? pf : nullptr;
        with_rows(std::min(kSmallM, g.m - r0), [&]<int MM>() {
          Bf16DotChunk<MM>(keep + r0 * kDotCols, wt, K, ar, lda, nj, c0, c1, pr, p0);
        });
      }
    }
    auto put = [&](int64_t r, int64_t n, float v) {
      if (g.out)
        g.out[r * ldo + jt + n] = f32_to_bf16(v);
      else
        g.out_f32[r * ldo + jt + n] = v;
    };
    // Two rows' accumulators (16, contiguous; one row and 8 spare ones for the last of an odd m)
    // at once: at K = 64..256 (the absorbed attention's per-head GEMMs) the lane sums one at a
    // time were most of the kernel's work. Columns past nj are other values, summed and dropped.
    for (int64_t r = 0; r < g.m; r += 2) {
      alignas(64) float v[16];
      _mm512_store_ps(v, Hsum16(keep + r * kDotCols));
      for (int64_t i = 0; i < std::min<int64_t>(2, g.m - r); ++i)
        for (int64_t n = 0; n < nj; ++n) put(r + i, n, v[i * kDotCols + n]);
    }
  }
}

// Outputs cols[0..filled) of row 0: the lane sums (Hsum16) of lanes[0..filled).
DI_BF16_TARGET inline void StoreLaneSums(const GemmArgs& g, const __m512* lanes,
                                         const int64_t* cols, int filled) {
  alignas(64) float v[16];
  _mm512_store_ps(v, Hsum16(lanes));
  for (int i = 0; i < filled; ++i) {
    if (g.out)
      g.out[cols[i]] = f32_to_bf16(v[i]);
    else
      g.out_f32[cols[i]] = v[i];
  }
}

// One row (M = 1): columns [j0, j1) cut into S contiguous ranges walked side by side, a whole
// weight row of each in turn, so the core reads S long sequential streams (the slices above give 8
// streams of 4 KiB a tile, restarted at every tile: docs/performance.md §8). Each column's lanes
// take its K pairs in the order Bf16DotSteps gives them and Hsum16 sums them as there: the same
// bytes.
// Four: 1.13-1.21x the slices from DRAM on the EPYC VM (LM head, 2 threads, three rounds), two
// 1.09-1.15x, eight 0.81-1.23x; each stream prefetched kPrefetchAhead / S ahead, as PanelGroup's.
constexpr int kRowStreams = 4;
template <int S>
DI_BF16_TARGET void Bf16DotRowStreams(const GemmArgs& g, const uint16_t* a, int64_t j0,
                                      int64_t j1) {
  constexpr int64_t ahead = kPrefetchAhead / S / 2;  // in bf16 elements
  const int64_t K = g.k, full = K / 32, len = (j1 - j0 + S - 1) / S;
  const __mmask32 tail = __mmask32((1u << (K % 32)) - 1);
  const auto* w = static_cast<const uint16_t*>(g.w);
  alignas(64) __m512 lanes[16];
  int64_t cols[16];
  int filled = 0;
  for (int64_t i = 0; i < len; ++i) {
    const uint16_t* wr[S];
    int64_t col[S];
#pragma GCC unroll 8
    for (int t = 0; t < S; ++t) {
      col[t] = j0 + t * len + i;
      wr[t] = w + std::min(col[t], j1 - 1) * K;  // past j1: a row read again, its sum dropped
    }
    __m512 acc[S];
#pragma GCC unroll 8
    for (int t = 0; t < S; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; ++c) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + 32 * c);
#pragma GCC unroll 8
      for (int t = 0; t < S; ++t) {
        _mm_prefetch(reinterpret_cast<const char*>(wr[t] + 32 * c + ahead), kStreamHint);
        acc[t] = _mm512_dpbf16_ps(acc[t], av, (__m512bh)_mm512_loadu_si512(wr[t] + 32 * c));
      }
    }
    if (tail) {
      const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(tail, a + 32 * full);
#pragma GCC unroll 8
      for (int t = 0; t < S; ++t)
        acc[t] = _mm512_dpbf16_ps(acc[t], av,
                                  (__m512bh)_mm512_maskz_loadu_epi16(tail, wr[t] + 32 * full));
    }
#pragma GCC unroll 8
    for (int t = 0; t < S; ++t) {
      if (col[t] >= std::min(j1, j0 + (t + 1) * len)) continue;
      lanes[filled] = acc[t];
      cols[filled++] = col[t];
      if (filled == 16) {
        StoreLaneSums(g, lanes, cols, filled);
        filled = 0;
      }
    }
  }
  if (filled > 0) StoreLaneSums(g, lanes, cols, filled);  // lanes past `filled`: summed, dropped
}

// ---- decode layout ------------------------------------------------------------------------------
// Panel = 32 output columns (two groups of 16), all of K. In a panel, group g's chunk c (64 bytes)
// holds K [4c, 4c+4) of its 16 columns: byte 16·(i/4) + 2·(i%4) + e is column i at K 4c + e, and
// 8 bytes further at K 4c + 2 + e, so that decode_bf16 gives lane i the K pairs (4c, 4c+1) in b0
// and (4c+2, 4c+3) in b1. Columns past n are zero codes. Order: [panel][chunk][g], so a range of
// panels is one sequential stream (with [panel][g][chunk], two streams 32 KiB apart restarted at
// every panel, the hardware prefetcher lost ground at each start: docs/performance.md §8).
constexpr int64_t kPanel = 32;
inline size_t panel_bytes(int64_t k) { return size_t(kPanel * k); }

void pack_panel(const uint8_t* w, int64_t n, int64_t k, int64_t panel, uint8_t* out) {
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t c = 0; c < k / 4; ++c) {
      uint8_t* o = out + size_t((2 * c + g) * 64);
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t col = panel * kPanel + g * 16 + i;
        for (int64_t e = 0; e < 4; ++e) {
          const size_t at = size_t(16 * (i / 4) + 2 * (i % 4) + (e & 1) + (e >> 1) * 8);
          o[at] = col < n ? w[size_t(col) * size_t(k) + size_t(4 * c + e)] : uint8_t{0};
        }
      }
    }
}

// Activations as bf16 pairs (exact), [m][k] in K order: 32-bit word i of a row is K (2i, 2i+1).
DI_VBMI_TARGET void ActivationsBf16(const GemmArgs& g, uint16_t* out) {
  const Decoder dec;
  const auto* a = static_cast<const uint8_t*>(g.a);
  __m512i interleave[2];
  {
    alignas(64) uint8_t idx[2][64];
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 32; ++j) {
        idx[h][2 * j] = uint8_t(32 * h + j);
        idx[h][2 * j + 1] = uint8_t(64 + 32 * h + j);
      }
    interleave[0] = _mm512_load_si512(idx[0]);
    interleave[1] = _mm512_load_si512(idx[1]);
  }
  for (int64_t i = 0; i < g.m * g.k; i += 64) {  // k % 128 == 0: whole vectors
    const __m512i codes = _mm512_loadu_si512(a + i);
    const __m512i lo = _mm512_permutex2var_epi8(dec.lo0, codes, dec.lo1);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(dec.hi0, codes, dec.hi1),
                                                 codes, dec.sign, 0xF8);
    for (int h = 0; h < 2; ++h)  // bytes (lo[j], hi[j]) for j in [32h, 32h + 32): K order
      _mm512_storeu_si512(out + i + 32 * h, _mm512_permutex2var_epi8(lo, interleave[h], hi));
  }
}

// Each 32-bit lane shifted right by 16. (The maskz form: GCC 12 warns inside _mm512_srli_epi32,
// whose pass-through operand is undefined, and CI builds with -Werror.)
DI_VBMI_TARGET inline __m512i High16(__m512i x) { return _mm512_maskz_srli_epi32(0xffff, x, 16); }

// f32_to_bf16 of 16 lanes (nearest even, NaN kept quiet), each in its lane's low 16 bits.
DI_VBMI_TARGET inline __m512i Bf16Bits(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(High16(x), _mm512_set1_epi32(1));
  const __m512i r = High16(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(High16(x), _mm512_set1_epi32(0x40)));
}

// ---- bf16 pairs layout (small K)
// ----------------------------------------------------------------- At K = 64..256 (the absorbed
// attention's per-head GEMMs) Bf16DotColumns does 2..8 dot products per output and then its 16-lane
// sum: the transposes of Hsum16 outweighed the products (7x the GEMMs' floor at batch 16,
// docs/performance.md §8). Here a lane is an output column instead, from the weight in the pairs
// layout: 16 accumulators A_l, A_l summing the K pairs 16c + l (c = 0, 1, ...) as lane l of
// Bf16DotColumns's accumulator does, each against the broadcast activation pair, then 0 + A_0 + A_1
// + ... + A_15 as Hsum16 adds: the same operations on the same values, in the same order, so the
// same bytes, with the sums vertical.
inline int64_t pair_cols(int64_t n) { return (n + kPairCols - 1) / kPairCols * kPairCols; }

// A pairs row's 16 sums to out (bf16) or out_f32 at element `at`, the columns `keep` says.
DI_BF16_TARGET inline void StorePairRow(const GemmArgs& g, int64_t at, __mmask16 keep, __m512 sum) {
  if (g.out_f32) {
    _mm512_mask_storeu_ps(g.out_f32 + at, keep, sum);
    return;
  }
  // Words 0, 2, ..., 30 first: the low halves, where Bf16Bits leaves each lane's bf16.
  const __m512i even =
      _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                       24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  _mm512_mask_storeu_epi16(g.out + at, __mmask32(keep),
                           _mm512_permutexvar_epi16(even, Bf16Bits(sum)));
}

// Up to 8 rows at once share each weight load: for l = 0..15, the rows' A_l (their K pairs 16c + l
// over c, in order) and then sum += A_l. The same operations in the same order as one row at a time
// with all 16 A_l live, but a weight vector is loaded once for MM broadcast products instead of
// once for each (two loads a product made the single-row walk 0.8-0.96x the rows kernel at K = 256
// and M = 16, docs/performance.md §8).
template <int MM>
DI_BF16_TARGET void Bf16PairRows(const GemmArgs& g, const uint16_t* a, int64_t lda,
                                 const uint32_t* wt, int64_t r0, int64_t jt, __mmask16 keep,
                                 const char* pf) {
  const int64_t groups = g.k / 32, ldo = g.ldo ? g.ldo : g.n;
  const uint32_t* ar[MM];
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r) ar[r] = reinterpret_cast<const uint32_t*>(a + (r0 + r) * lda);
  __m512 sum[MM];
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r) sum[r] = _mm512_setzero_ps();
  for (int l = 0; l < 16; ++l) {
    __m512 acc[MM];
#pragma GCC unroll 8
    for (int r = 0; r < MM; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < groups; ++c) {
      // Pair 16c + l of the tile's kPairCols columns.
      const __m512bh w = (__m512bh)_mm512_loadu_si512(wt + kPairCols * (16 * c + l));
      if (pf) _mm_prefetch(pf + 64 * (16 * c + l), kStreamHint);
#pragma GCC unroll 8
      for (int r = 0; r < MM; ++r)
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(int(ar[r][16 * c + l])), w);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MM; ++r) sum[r] = _mm512_add_ps(sum[r], acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MM; ++r) StorePairRow(g, (r0 + r) * ldo + jt, keep, sum[r]);
}

// One row (decode): all 16 A_l live, so the tile is read in address order (pair 16c + l for c, then
// l), one sequential stream, where the walk above strides 1 KiB through it per l, which streamed
// the weights from DRAM far below the read pass (docs/performance.md §8, stop 44). Each A_l still
// sums its pairs in c order and the sum adds A_0, A_1, ... in turn: the same bytes as
// Bf16PairRows<1>.
DI_BF16_TARGET void Bf16PairRow(const GemmArgs& g, const uint16_t* a, const uint32_t* wt,
                                int64_t jt, __mmask16 keep, const char* pf) {
  const int64_t groups = g.k / 32;
  const uint32_t* ar = reinterpret_cast<const uint32_t*>(a);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
  for (int64_t c = 0; c < groups; ++c) {
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) {
      const __m512bh w = (__m512bh)_mm512_loadu_si512(wt + kPairCols * (16 * c + l));
      _mm_prefetch(pf + 64 * (16 * c + l), kStreamHint);
      acc[l] = _mm512_dpbf16_ps(acc[l], (__m512bh)_mm512_set1_epi32(int(ar[16 * c + l])), w);
    }
  }
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l) sum = _mm512_add_ps(sum, acc[l]);
  StorePairRow(g, jt, keep, sum);
}

// Rows 0..m-1 of g, output columns [j0, j1) (j0 % 16 == 0) from pw, g's weight in the pairs
// layout; a: the rows' activations (bf16, row stride lda), k % 32 == 0.
DI_BF16_TARGET void Bf16PairColumns(const GemmArgs& g, const uint16_t* a, int64_t lda,
                                    const uint32_t* pw, int64_t j0, int64_t j1) {
  for (int64_t jt = j0; jt < j1; jt += kPairCols) {
    const int64_t nj = std::min(kPairCols, j1 - jt);
    const __mmask16 keep = __mmask16((1u << nj) - 1);
    const uint32_t* wt = pw + jt * (g.k / 2);  // the tile's k / 2 · 64 bytes, in order
    // A call's tiles (every head's, in order) are one sequential stream, which the first row block
    // prefetches kPrefetchAhead ahead: at decode the weights come from DRAM, and without it the
    // kernel waited on each tile's lines (8 KiB was best of 0 to 16 KiB, out of cache).
    const char* pf = reinterpret_cast<const char*>(wt) + kPrefetchAhead;
    if (g.m == 1) {
      Bf16PairRow(g, a, wt, jt, keep, pf);
      continue;
    }
    for (int64_t r0 = 0; r0 < g.m; r0 += kSmallM)  // they stay in L1 for every row
      with_rows(std::min(kSmallM, g.m - r0), [&]<int MM>() {
        Bf16PairRows<MM>(g, a, lda, wt, r0, jt, keep, r0 == 0 ? pf : nullptr);
      });
  }
}

// Row r of a panel's output, columns [j0, j0 + nj) (nj <= 32), from its two 16-column vectors.
DI_VBMI_TARGET inline void StorePanelRow(const GemmArgs& g, int64_t r, int64_t j0, int64_t nj,
                                         __m512 lo, __m512 hi) {
  const int64_t at = r * (g.ldo ? g.ldo : g.n) + j0;
  if (!g.out) {
    _mm512_mask_storeu_ps(g.out_f32 + at, __mmask16((1u << std::min<int64_t>(nj, 16)) - 1), lo);
    if (nj > 16) _mm512_mask_storeu_ps(g.out_f32 + at + 16, __mmask16((1u << (nj - 16)) - 1), hi);
    return;
  }
  alignas(64) static constexpr uint16_t kEven[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                     22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                                     44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  const __m512i words = _mm512_permutex2var_epi16(Bf16Bits(lo), _mm512_load_si512(kEven),
                                                  Bf16Bits(hi));  // the 32 low halves in order
  const __mmask32 m = nj >= 32 ? ~__mmask32(0) : __mmask32((1u << nj) - 1);
  _mm512_mask_storeu_epi16(g.out + at, m, words);
}

// S panels at once (panels[0..S)), each its own stream: chunk c of every panel in turn, so the
// core has S sequential streams in flight, each prefetched kPrefetchAhead / S ahead (the same
// bytes in flight as one stream; 2 KiB each for four streamed about 4% faster than 8 KiB each).
// Each panel's sums are exactly those of S = 1.
template <int MM, int S>
DI_BF16_TARGET inline void PanelGroup(const GemmArgs& g, const uint16_t* act,
                                      const int64_t (&panels)[S]) {
  const Decoder dec;
  const int64_t K = g.k, kbs = K / 128;
  alignas(64) __m512 acc[S][2][MM];
  const uint8_t* w[S];
  const float* sw[S];
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s) {
    for (int r = 0; r < MM; ++r) acc[s][0][r] = acc[s][1][r] = _mm512_setzero_ps();
    w[s] = g.w_decode + size_t(panels[s]) * panel_bytes(K);  // group 0; group 1 at +64
    sw[s] = g.w_scales + (panels[s] * kPanel / 128) * kbs;   // 128 % 32 == 0: one scale row
  }
  for (int64_t kb = 0; kb < kbs; ++kb) {
    __m512 part0[S][MM], part1[S][MM];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int r = 0; r < MM; ++r) part0[s][r] = part1[s][r] = _mm512_setzero_ps();
    const uint32_t* ab = reinterpret_cast<const uint32_t*>(act) + kb * 64;  // 64 pairs per block
    for (int64_t c = 0; c < 32; ++c) {
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        _mm_prefetch(reinterpret_cast<const char*>(w[s] + kPrefetchAhead / S), kStreamHint);
        _mm_prefetch(reinterpret_cast<const char*>(w[s] + kPrefetchAhead / S + 64), kStreamHint);
        __m512i x0, x1, y0, y1;
        dec.decode_bf16(w[s], x0, x1);
        dec.decode_bf16(w[s] + 64, y0, y1);
#pragma GCC unroll 8
        for (int r = 0; r < MM; ++r) {
          const uint32_t* ar = ab + r * (K / 2) + 2 * c;
          const __m512bh a0 = (__m512bh)_mm512_set1_epi32(int(ar[0]));
          const __m512bh a1 = (__m512bh)_mm512_set1_epi32(int(ar[1]));
          part0[s][r] = _mm512_dpbf16_ps(part0[s][r], a0, (__m512bh)x0);
          part1[s][r] = _mm512_dpbf16_ps(part1[s][r], a0, (__m512bh)y0);
          part0[s][r] = _mm512_dpbf16_ps(part0[s][r], a1, (__m512bh)x1);
          part1[s][r] = _mm512_dpbf16_ps(part1[s][r], a1, (__m512bh)y1);
        }
        w[s] += 128;
      }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int r = 0; r < MM; ++r) {
        const __m512 sc = _mm512_set1_ps(g.a_scales[r * kbs + kb] * sw[s][kb]);
        acc[s][0][r] = _mm512_fmadd_ps(part0[s][r], sc, acc[s][0][r]);
        acc[s][1][r] = _mm512_fmadd_ps(part1[s][r], sc, acc[s][1][r]);
      }
  }
  for (int s = 0; s < S; ++s) {
    const int64_t j0 = panels[s] * kPanel, nj = std::min(kPanel, g.n - j0);
    for (int r = 0; r < MM; ++r) StorePanelRow(g, r, j0, nj, acc[s][0][r], acc[s][1][r]);
  }
}

// Weight streams a core reads side by side, by row count: on the EPYC VM two cores read 38-43
// GB/s with one sequential stream each and 56-60 GB/s with four (the hardware prefetcher follows
// each stream on its own; docs/performance.md §8). Bounded by the registers: S·2·MM partial sums
// live through a 128-block.
template <int MM>
constexpr int kPanelStreams = MM <= 2   ? 4
                              : MM <= 4 ? 2
                                        : 1;

template <int MM>
DI_BF16_TARGET void PanelRange(const GemmArgs& g, const uint16_t* act, int64_t p0, int64_t p1) {
  // Panels [p0, p1) as S contiguous streams of L panels, walked side by side; the rest one by one.
  constexpr int S = kPanelStreams<MM>;
  const int64_t L = S > 1 ? (p1 - p0) / S : 0;
  for (int64_t i = 0; i < L; ++i) {
    int64_t panels[S];
    for (int s = 0; s < S; ++s) panels[s] = p0 + s * L + i;
    PanelGroup<MM, S>(g, act, panels);
  }
  for (int64_t p = p0 + S * L; p < p1; ++p) PanelGroup<MM, 1>(g, act, {p});
}

// AMX-TILE and AMX-BF16 in CPUID, their state enabled by the OS (XCR0 bits 17, 18), and this
// process allowed to use the tile data (Linux asks each process to request it: arch_prctl).
bool cpu_has_amx_bf16() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    uint32_t xlo = 0, xhi = 0;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

std::atomic<DecodeGemm> g_decode_gemm{DecodeGemm::automatic};

// DEEPINFER_AMX until set_amx says otherwise: -1 unread, 0 off, 1 on.
std::atomic<int> g_amx{-1};

// Whether AMX is asked for now (DEEPINFER_AMX, then set_amx).
bool amx_requested() {
  int want = g_amx.load(std::memory_order_relaxed);
  if (want < 0) g_amx = want = knobs().amx ? 1 : 0;
  return want == 1;
}

// Rows per AMX tile.
constexpr int64_t kAmxRows = 16;

// ---- AMX: the decode layout through tile products -----------------------------------------------
// The same panels, decoded by the same table lookups, but the products run on the tile unit: per
// 32 K, a panel group's 16 decoded rows (lane i of b0/b1 is column i's K pair, which is TDPBF16PS's
// B layout) go to memory and into a tile, and one TDPBF16PS multiplies them with up to 16
// activation rows (the A tile: the bf16 rows in K order, read in place). Its cost hardly depends on
// the row count, so 4 or 16 rows cost about what one does (VDPBF16PS: one instruction per row per
// 32 products); one row is also faster, the decode no longer sharing its ports with the dots.
// Each 128-block's partial (four TDPBF16PS into a zeroed tile) is scaled into the accumulator as in
// PanelRange. TDPBF16PS rounds its sums in its own way (docs/numerics.md §10), the same for every
// row count, so batch invariance holds by taking it at every M.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Decoded 32-K sub-blocks in flight: sub-block s is decoded into ring slot s % kAmxRing while the
// tile unit takes sub-block s - kAmxLag, so a tile load never waits for the stores just made (a
// lag of 1 beat 0 and 2 in whole decode steps: docs/performance.md §8).
constexpr int64_t kAmxRing = 4, kAmxLag = 1;

// The tile configuration this thread holds (0: none): the fp8 kernel's for M rows is M, the bf16
// kernel's for M rows a B tile is kBf16Config + M.
thread_local int64_t tile_config = 0;
constexpr int64_t kBf16Config = 64;

// Panels [p0, p1) of g (g.m <= 16 rows; act: its bf16 rows, row stride g.k).
DI_AMX_TARGET void PanelRangeAmx(const GemmArgs& g, const uint16_t* act, int64_t p0, int64_t p1) {
  const int64_t M = g.m, K = g.k, kbs = K / 128, subs = K / 32;
  if (tile_config != M) {
    TileConfig cfg;
    for (int t : {0, 1, 2}) {  // C (group 0, group 1) and A: M rows of 16 f32 / 32 bf16
      cfg.rows[t] = uint8_t(M);
      cfg.colsb[t] = 64;
    }
    for (int t : {3, 4}) {  // B (group 0, group 1): 16 K pairs × 16 columns
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    tile_config = M;
  }
  const Decoder dec;
  alignas(64) uint16_t ring[kAmxRing][2][16 * 32];
  alignas(64) float part[2][16][16];
  alignas(64) float acc[2][16][16];
  const int64_t total = (p1 - p0) * subs;
  for (int64_t s = 0; s < total + kAmxLag; ++s) {
    if (s < total) {  // decode sub-block s: chunks 8t .. 8t + 7 of both groups, 1 KiB in a row
      const int64_t panel = p0 + s / subs, t = s % subs;
      const uint8_t* src = g.w_decode + size_t(panel) * panel_bytes(K) + size_t(t) * 1024;
      uint16_t(*dst)[16 * 32] = ring[s % kAmxRing];
      for (int64_t c = 0; c < 8; ++c)
        for (int64_t grp = 0; grp < 2; ++grp) {
          // One prefetch per line decoded, spread over the sub-block as PanelRange spreads them:
          // sixteen at its start made batch-1 decode 10-17% slower than VDPBF16PS, spread it is
          // 2-3% faster (docs/performance.md §8).
          const uint8_t* line = src + (2 * c + grp) * 64;
          _mm_prefetch(reinterpret_cast<const char*>(line + kAmxPrefetchAhead), _MM_HINT_T0);
          __m512i b0, b1;
          dec.decode_bf16(line, b0, b1);
          _mm512_store_si512(dst[grp] + 64 * c, b0);
          _mm512_store_si512(dst[grp] + 64 * c + 32, b1);
        }
    }
    if (s < kAmxLag) continue;
    const int64_t q = s - kAmxLag, panel = p0 + q / subs, t = q % subs, kb = t / 4;
    if (t % 4 == 0) {
      _tile_zero(0);
      _tile_zero(1);
    }
    _tile_loadd(2, act + 32 * t, K * 2);
    _tile_loadd(3, ring[q % kAmxRing][0], 64);
    _tile_loadd(4, ring[q % kAmxRing][1], 64);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
    if (t % 4 != 3) continue;
    _tile_stored(0, part[0], 64);
    _tile_stored(1, part[1], 64);
    const float sw = g.w_scales[(panel * kPanel / 128) * kbs + kb];
    for (int64_t r = 0; r < M; ++r) {
      const __m512 sc = _mm512_set1_ps(g.a_scales[r * kbs + kb] * sw);
      for (int64_t grp = 0; grp < 2; ++grp) {
        const __m512 prev = kb == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc[grp][r]);
        _mm512_store_ps(acc[grp][r], _mm512_fmadd_ps(_mm512_load_ps(part[grp][r]), sc, prev));
      }
    }
    if (kb != kbs - 1) continue;
    const int64_t j0 = panel * kPanel, nj = std::min(kPanel, g.n - j0);
    for (int64_t r = 0; r < M; ++r)
      StorePanelRow(g, r, j0, nj, _mm512_load_ps(acc[0][r]), _mm512_load_ps(acc[1][r]));
  }
}

// Ends this thread's use of the tiles (a thread holding tile state costs 8 KiB more per context
// switch); the next PanelRangeAmx configures them again.
DI_AMX_TARGET void release_tiles() {
  if (tile_config == 0) return;
  _tile_release();
  tile_config = 0;
}

// ---- AMX: bf16 GEMMs ----------------------------------------------------------------------------
// The weight rows are the A tile, read in place (16 output columns × 32 K: 16 rows of 64 bytes,
// K·2 apart), the activations the B tile (16 K pairs × up to 16 rows: the pairs layout,
// amx_bf16_pack), and C[column][row] accumulates over all of K in the tile. No decode and no
// transposition of the weights: one TDPBF16PS per 16 columns × 32 K whatever the row count, where
// VDPBF16PS needs one per row. No software prefetch: 256 B to 2 KiB ahead in each of the 32 rows,
// or the next 32 rows as one line, all streamed slower than the hardware prefetcher alone
// (docs/performance.md §8).

// Columns [j0, j1) of g, every row, from the pairs layout bp.
DI_AMX_TARGET void Bf16ColumnsAmx(const GemmArgs& g, const uint32_t* bp, int64_t j0, int64_t j1) {
  const int64_t M = g.m, K = g.k, steps = K / 32, bm = std::min<int64_t>(M, kAmxRows);
  const int64_t ldo = g.ldo ? g.ldo : g.n, chunk = steps * 16 * bm;
  if (tile_config != kBf16Config + bm) {
    TileConfig cfg;
    for (int t : {0, 1}) {  // C (column groups 0, 1): 16 columns × bm f32
      cfg.rows[t] = 16;
      cfg.colsb[t] = uint16_t(4 * bm);
    }
    for (int t : {2, 3}) {  // A (column groups 0, 1): 16 weight rows × 32 bf16
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    cfg.rows[4] = 16;  // B: 16 K pairs × bm rows
    cfg.colsb[4] = uint16_t(4 * bm);
    _tile_loadconfig(&cfg);
    tile_config = kBf16Config + bm;
  }
  std::vector<uint16_t> edge;  // the matrix's last, partial column group, zero-padded to 16 rows
  alignas(64) float cb[2][16][16];
  for (int64_t j = j0; j < j1;) {
    const int64_t cols = std::min<int64_t>(j1 - j, 32), groups = cols > 16 ? 2 : 1;
    const uint16_t* wg[2] = {static_cast<const uint16_t*>(g.w) + j * K, nullptr};
    wg[1] = wg[0] + 16 * K;
    if (cols < 16 * groups) {  // fewer than 16 rows left (the matrix's end): read only those
      edge.assign(size_t(16 * K), 0);
      std::copy_n(wg[groups - 1], size_t((cols - 16 * (groups - 1)) * K), edge.begin());
      wg[groups - 1] = edge.data();
    }
    for (int64_t r0 = 0; r0 < M; r0 += kAmxRows) {
      const uint32_t* b = bp + (r0 / kAmxRows) * chunk;
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t c = 0; c < steps; ++c) {
        _tile_loadd(4, b + c * 16 * bm, 4 * bm);
        _tile_loadd(2, wg[0] + 32 * c, K * 2);
        _tile_dpbf16ps(0, 2, 4);
        if (groups == 2) {
          _tile_loadd(3, wg[1] + 32 * c, K * 2);
          _tile_dpbf16ps(1, 3, 4);
        }
      }
      _tile_stored(0, cb[0], 64);
      if (groups == 2) _tile_stored(1, cb[1], 64);
      const int64_t rows = std::min(kAmxRows, M - r0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = cb[c / 16][c % 16][r];
          if (g.out)
            g.out[(r0 + r) * ldo + j + c] = f32_to_bf16(v);
          else
            g.out_f32[(r0 + r) * ldo + j + c] = v;
        }
    }
    j += cols;
  }
}

// The prefill kernel's f32 weight panel [kk < 128][32] for one decode-layout panel and one K block:
// a lane of b0 holds K (4c, 4c+1) of its column as a bf16 pair, so the even K is the pair shifted
// up and the odd one the pair masked (both exact f32).
DI_VBMI_TARGET void PanelToF32(const uint8_t* panel, int64_t k, int64_t kb, float* out,
                               bool swap_pairs) {
  const Decoder dec;
  const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
  const int64_t ev = swap_pairs ? kPanel : 0, od = swap_pairs ? 0 : kPanel;  // rows of K 2i, 2i+1
  for (int64_t g = 0; g < 2; ++g) {
    const uint8_t* p = panel + size_t((kb * 32 * 2 + g) * 64);
    for (int64_t c = 0; c < 32; ++c, p += 128) {
      __m512i b0, b1;
      dec.decode_bf16(p, b0, b1);
      float* o = out + (4 * c) * kPanel + g * 16;
      _mm512_store_ps(o + ev,
                      _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), b0, 16)));
      _mm512_store_ps(o + od, _mm512_castsi512_ps(_mm512_and_si512(b0, high)));
      _mm512_store_ps(o + 2 * kPanel + ev,
                      _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), b1, 16)));
      _mm512_store_ps(o + 2 * kPanel + od, _mm512_castsi512_ps(_mm512_and_si512(b1, high)));
    }
  }
}

// Panels [p0, p1) of g for all its rows, in chunks of kSmallM rows (AMX: 16) that take a few panels
// at a time, so the chunks after the first find those panels' weights in L2 instead of streaming
// the matrix from memory once per chunk. a: g's activations [m, k].
DI_BF16_TARGET void PanelsAllRows(const GemmArgs& g, const uint16_t* a, int64_t p0, int64_t p1) {
  const bool amx = amx_active();
  const int64_t rows = amx ? kAmxRows : kSmallM;
  // Chunks after the first reread a group's panels from L2; one chunk streams its whole range.
  const int64_t group =
      g.m <= rows ? p1 - p0
                  : std::max<int64_t>(1, (int64_t(256) << 10) / int64_t(panel_bytes(g.k)));
  for (int64_t p = p0; p < p1; p += group) {
    const int64_t pe = std::min(p1, p + group);
    for (int64_t r = 0; r < g.m; r += rows) {
      const GemmArgs c = fp8_row_slice(g, r, std::min(rows, g.m - r));
      if (amx)
        PanelRangeAmx(c, a + r * g.k, p, pe);
      else
        with_rows(c.m, [&]<int MM>() { PanelRange<MM>(c, a + r * g.k, p, pe); });
    }
  }
}

// The pool's work units for one panel of a problem of m rows: about its cost, so the threads of a
// MoE layer's call, whose experts have 1..B rows, get equal work. VDPBF16PS: per 128 weight bytes
// ten decode instructions and six per row; AMX: the decode and about one tile product per 16 rows.
int64_t panel_units(int64_t m) {
  return amx_active() ? 3 * ((m + kAmxRows - 1) / kAmxRows) : m + 2;
}

// Every problem's activations as bf16 pairs, then one pool dispatch over the panels of all of them
// (problem i owns panels [first[i], first[i + 1])).
DI_BF16_TARGET void RunDecodeLayout(std::span<const GemmArgs> gs) {
  thread_local std::vector<uint16_t> act;
  thread_local std::vector<int64_t> first, act_at;
  // The pool splits work units (panel_units), not panels: with equal panel counts the thread
  // holding a MoE layer's many-row experts ran last, and the other waited.
  first.assign(1, 0);
  act_at.clear();
  int64_t elems = 0, work = 0;
  for (const GemmArgs& g : gs) {
    first.push_back(first.back() + (g.n + kPanel - 1) / kPanel * panel_units(g.m));
    act_at.push_back(elems);
    elems += g.m * g.k;
    work += streaming_work(int64_t(decode_layout_bytes(g.n, g.k)), g.m);
  }
  act.resize(size_t(elems));
  for (size_t i = 0; i < gs.size(); ++i) ActivationsBf16(gs[i], act.data() + act_at[size_t(i)]);
  // The workers see their own thread_locals: hand them this thread's.
  const int64_t* const start = first.data();
  const int64_t* const at = act_at.data();
  const uint16_t* const acts = act.data();
  const size_t count = gs.size();
  // Units [u0, u1) run the panels whose first unit lies in them.
  auto body = [&](int64_t u0, int64_t u1) {
    size_t i = size_t(std::upper_bound(start, start + count + 1, u0) - start) - 1;
    for (; u0 < u1; ++i) {
      const int64_t hi = std::min(u1, start[i + 1]), w = panel_units(gs[i].m);
      const int64_t p0 = (u0 - start[i] + w - 1) / w, p1 = (hi - start[i] + w - 1) / w;
      if (p1 > p0) PanelsAllRows(gs[i], acts + at[i], p0, p1);
      u0 = hi;
    }
    release_tiles();
  };
  parallel_for_streaming(start[count], work, body);
}

DI_VBMI_TARGET void Run(const GemmArgs& g) {
  const int64_t kbs = g.k / 128;
  // Activations decoded and scaled once, in the same permuted order: [kb][m][8 vectors].
  const size_t vecs = size_t(g.m * kbs * 8);
  std::unique_ptr<float, decltype(&std::free)> act_buf(
      static_cast<float*>(std::aligned_alloc(64, vecs * sizeof(__m512))), &std::free);
  __m512* const act = reinterpret_cast<__m512*>(act_buf.get());
  {
    const Decoder dec;
    const auto* a = static_cast<const uint8_t*>(g.a);
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t kb = 0; kb < kbs; ++kb) {
        __m512* dst = act + (size_t(kb) * size_t(g.m) + size_t(r)) * 8;
        dec.decode(a + r * g.k + kb * 128, dst);
        dec.decode(a + r * g.k + kb * 128 + 64, dst + 4);
      }
  }
  auto body = [&](int64_t j0, int64_t j1) {
    with_rows(g.m, [&]<int MM>() { Range<MM>(g, act, j0, j1); });
  };
  const int64_t threads = kernel_pool().num_threads();
  const int64_t grain = std::max<int64_t>(16, g.n / (4 * threads)) / kJT * kJT;
  kernel_pool().parallel_for(g.n, grain, body);
}

bool cpu_has_vbmi() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vbmi");
  return ok;
}

// How VDPBF16PS adds a lane's two products (a bf16 pair of K, 2i and 2i + 1) to its accumulator:
// one after the other, each rounded as an FMA would (odd K first, as Intel's manual writes it and
// the CI EPYC does; or even K first), or otherwise. Probed once with acc = 1 and products of 1/2
// and 3/4 of an ulp of 1: even first gives 1 + 1 ulp, odd first 1 + 2 ulp; 1/2 + 1/2 ulp gives 1
// only if each add rounds.
enum class DotOrder { none, even_first, odd_first, other };

// 1 + a0·b0 + a1·b1 in lane 0 of one VDPBF16PS (inputs exact in bf16).
DI_BF16_TARGET float dot_probe(float a0, float a1, float b0, float b1) {
  const int ab = int(f32_to_bf16(a0).bits) | (int(f32_to_bf16(a1).bits) << 16);
  const int bb = int(f32_to_bf16(b0).bits) | (int(f32_to_bf16(b1).bits) << 16);
  const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(1.0f), (__m512bh)_mm512_set1_epi32(ab),
                                    (__m512bh)_mm512_set1_epi32(bb));
  alignas(64) float out[16];
  _mm512_store_ps(out, r);
  return out[0];
}

DotOrder dot_order() {
  static const DotOrder order = [] {
    if (!cpu_has_bf16_dot()) return DotOrder::none;
    const float u = 0x1p-23f;
    if (dot_probe(1.0f, 1.0f, 0x1p-24f, 0x1p-24f) != 1.0f) return DotOrder::other;
    const float r = dot_probe(1.0f, 1.5f, 0x1p-24f, 0x1p-24f);
    return r == 1.0f + u       ? DotOrder::even_first
           : r == 1.0f + 2 * u ? DotOrder::odd_first
                               : DotOrder::other;
  }();
  return order;
}

}  // namespace

bool cpu_has_bf16_dot() {
  static const bool ok = cpu_has_vbmi() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

void set_decode_gemm(DecodeGemm k) { g_decode_gemm = k; }

bool cpu_has_amx() { return cpu_has_bf16_dot() && cpu_has_amx_bf16(); }
bool set_amx(bool on) {
  const bool was = amx_requested();
  g_amx = on ? 1 : 0;
  return was;
}
bool amx_active() {
  const DecodeGemm mode = g_decode_gemm;
  return amx_requested() && (mode == DecodeGemm::automatic || mode == DecodeGemm::invariant) &&
         cpu_has_amx();
}

bool small_m_invariant() {
  const DecodeGemm mode = g_decode_gemm;
  return mode == DecodeGemm::invariant || (mode == DecodeGemm::automatic && batch_invariant_knob());
}

bool amx_bf16_gemm(int64_t k) { return k > 0 && k % 32 == 0 && amx_active(); }

size_t amx_bf16_pairs_size(int64_t m, int64_t k) {
  return size_t((m + kAmxRows - 1) / kAmxRows * (k / 2) * std::min(m, kAmxRows));
}

void amx_bf16_pack(int64_t m, int64_t k, const uint16_t* a, int64_t lda, uint32_t* out) {
  const int64_t bm = std::min(m, kAmxRows), chunk = k / 2 * bm;
  std::fill(out, out + amx_bf16_pairs_size(m, k), 0u);  // rows past m in the last chunk
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* row = a + r * lda;
    uint32_t* dst = out + (r / kAmxRows) * chunk + r % kAmxRows;
    for (int64_t p = 0; p < k / 2; ++p)
      dst[p * bm] = uint32_t(row[2 * p]) | (uint32_t(row[2 * p + 1]) << 16);
  }
}

void amx_bf16_columns(const GemmArgs& g, const uint32_t* pairs, int64_t j0, int64_t j1) {
  DI_CHECK(g.bf16_inputs && g.m >= 1 && amx_bf16_gemm(g.k),
           "amx_bf16_columns: m={} k={} on a CPU or setting without it", g.m, g.k);
  Bf16ColumnsAmx(g, pairs, j0, j1);
}

void release_amx_tiles() { release_tiles(); }

namespace {
// The shapes and settings any VBMI decode kernel takes.
bool vbmi_decode_fits(const GemmArgs& g) {
  return !g.bf16_inputs && g.m >= 1 && g.m <= kSmallM && g.k % 128 == 0 && g.a_scales &&
         g.w_scales && g_decode_gemm != DecodeGemm::generic && cpu_has_vbmi();
}
}  // namespace

bool takes_decode_layout(const GemmArgs& g) {
  if (!vbmi_decode_fits(g) || !g.w_decode || !cpu_has_bf16_dot()) return false;
  if (amx_active()) return true;  // one kernel for every M: invariant by itself
  if (small_m_invariant()) {      // the prefill kernel's order (invariant_pairs_swapped)
    const DotOrder order = dot_order();
    return order == DotOrder::even_first || order == DotOrder::odd_first;
  }
  return g_decode_gemm == DecodeGemm::automatic;
}

bool gemm_fp8_small_m_vbmi(const GemmArgs& g) {
  if (takes_decode_layout(g)) {
    RunDecodeLayout(std::span<const GemmArgs>(&g, 1));
    return true;
  }
  if (!vbmi_decode_fits(g) || small_m_invariant()) return false;  // invariant: the prefill kernel
  Run(g);
  return true;
}

bool takes_decode_layout_chunked(const GemmArgs& g) {
  // Larger M in kSmallM-row chunks in either mode: faster than the prefill kernel at every M
  // measured (docs/performance.md §8), so the mode off has no reason to leave it.
  return takes_decode_layout(g.m <= kSmallM ? g : fp8_row_slice(g, 0, kSmallM));
}

void run_decode_layout_multi(std::span<const GemmArgs> problems) {
  for (const GemmArgs& g : problems)
    DI_CHECK(takes_decode_layout_chunked(g),
             "run_decode_layout_multi: m={} n={} k={} does not take it", g.m, g.n, g.k);
  if (!problems.empty()) RunDecodeLayout(problems);
}

bool bf16_dot_gemm() { return cpu_has_bf16_dot() && g_decode_gemm != DecodeGemm::generic; }

void bf16_dot_rows(const GemmArgs& g, const uint16_t* a, int64_t lda, int64_t j0, int64_t j1) {
  DI_CHECK(g.bf16_inputs && g.m >= 1 && bf16_dot_gemm(),
           "bf16_dot_rows: m={} on a CPU or setting without it", g.m);
  if (g.m == 1) {  // streaming-bound: long streams instead of slices (Bf16DotRowStreams)
    Bf16DotRowStreams<kRowStreams>(g, a, j0, j1);
    return;
  }
  // Rows in blocks, so the accumulators kept between K slices stay small (kDotRowBlock · 512 B a
  // thread); a block's rows share each weight tile while it is in cache.
  constexpr int64_t kDotRowBlock = 256;
  const int64_t ldo = g.ldo ? g.ldo : g.n;
  for (int64_t r0 = 0; r0 < g.m; r0 += kDotRowBlock) {
    GemmArgs s = g;
    s.m = std::min(kDotRowBlock, g.m - r0);
    if (s.out) s.out += r0 * ldo;
    if (s.out_f32) s.out_f32 += r0 * ldo;
    Bf16DotColumns(s, a + r0 * lda, lda, j0, j1);
  }
}

void bf16_pair_columns(const GemmArgs& g, const uint16_t* a, int64_t lda, const uint32_t* pairs,
                       int64_t j0, int64_t j1) {
  DI_CHECK(g.bf16_inputs && bf16_dot_gemm() && g.k % 32 == 0 && j0 % kPairCols == 0,
           "bf16_pair_columns: k={} j0={} on a CPU or setting without it", g.k, j0);
  Bf16PairColumns(g, a, lda, pairs, j0, j1);
}

bool invariant_pairs_swapped(const GemmArgs& g) {
  return !g.bf16_inputs && g.k % 128 == 0 && dot_order() == DotOrder::odd_first &&
         small_m_invariant();
}

bool decode_layout_f32_panel(const GemmArgs& g, int64_t n0, int64_t kb, float* out,
                             bool swap_pairs) {
  const DecodeGemm mode = g_decode_gemm;
  if (!g.w_decode || g.bf16_inputs || g.k % 128 != 0 || n0 % kPanel != 0 || !cpu_has_bf16_dot() ||
      (mode != DecodeGemm::automatic && mode != DecodeGemm::invariant))
    return false;
  if (n0 >= g.n)
    std::fill(out, out + 128 * kPanel, 0.0f);  // past the last panel: zero columns
  else
    PanelToF32(g.w_decode + size_t(n0 / kPanel) * panel_bytes(g.k), g.k, kb, out, swap_pairs);
  return true;
}

}  // namespace deepinfer::kernels::cpu

namespace deepinfer::kernels {

size_t decode_layout_bytes(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || k % 128 != 0 || !cpu::cpu_has_bf16_dot()) return 0;
  return size_t((n + cpu::kPanel - 1) / cpu::kPanel) * cpu::panel_bytes(k);
}

size_t bf16_pairs_words(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || k % 32 != 0 || !cpu::cpu_has_bf16_dot()) return 0;
  return size_t(k / 2 * cpu::pair_cols(n));
}

void pack_bf16_pairs(const bf16* w, int64_t n, int64_t k, uint32_t* out) {
  DI_CHECK(bf16_pairs_words(n, k) > 0, "pack_bf16_pairs: no pairs layout for n={} k={} on this CPU",
           n, k);
  constexpr int64_t T = cpu::kPairCols;
  for (int64_t j = 0; j < cpu::pair_cols(n); ++j)  // [tile j / T][pair p][column j % T]
    for (int64_t p = 0; p < k / 2; ++p)
      out[((j / T) * (k / 2) + p) * T + j % T] =
          j < n ? uint32_t(w[j * k + 2 * p].bits) | uint32_t(w[j * k + 2 * p + 1].bits) << 16 : 0u;
}

void pack_decode_layout(const fp8_e4m3* w, int64_t n, int64_t k, uint8_t* out) {
  DI_CHECK(decode_layout_bytes(n, k) > 0,
           "pack_decode_layout: no decode layout for n={} k={} on this CPU", n, k);
  const int64_t panels = (n + cpu::kPanel - 1) / cpu::kPanel;
  kernel_pool().parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      cpu::pack_panel(reinterpret_cast<const uint8_t*>(w), n, k, p,
                      out + size_t(p) * cpu::panel_bytes(k));
  });
}

}  // namespace deepinfer::kernels

#else
namespace deepinfer::kernels::cpu {
bool gemm_fp8_small_m_vbmi(const GemmArgs&) { return false; }
bool takes_decode_layout(const GemmArgs&) { return false; }
bool takes_decode_layout_chunked(const GemmArgs&) { return false; }
bool bf16_dot_gemm() { return false; }
void bf16_dot_rows(const GemmArgs&, const uint16_t*, int64_t, int64_t, int64_t) {
  DI_FAIL("bf16_dot_rows: no BF16 dot kernel on this build");
}
void run_decode_layout_multi(std::span<const GemmArgs> problems) {
  DI_CHECK(problems.empty(), "run_decode_layout_multi: no decode layout kernel on this build");
}
bool cpu_has_bf16_dot() { return false; }
bool decode_layout_f32_panel(const GemmArgs&, int64_t, int64_t, float*, bool) { return false; }
bool invariant_pairs_swapped(const GemmArgs&) { return false; }
void bf16_pair_columns(const GemmArgs&, const uint16_t*, int64_t, const uint32_t*, int64_t,
                       int64_t) {
  DI_FAIL("bf16_pair_columns: no BF16 dot kernel on this build");
}
namespace {
std::atomic<DecodeGemm> g_decode_gemm{DecodeGemm::automatic};
}
void set_decode_gemm(DecodeGemm k) { g_decode_gemm = k; }
bool cpu_has_amx() { return false; }
bool set_amx(bool) { return false; }
bool amx_active() { return false; }
bool amx_bf16_gemm(int64_t) { return false; }
size_t amx_bf16_pairs_size(int64_t, int64_t) { return 0; }
void amx_bf16_pack(int64_t, int64_t, const uint16_t*, int64_t, uint32_t*) {
  DI_FAIL("amx_bf16_pack: no AMX kernel on this build");
}
void amx_bf16_columns(const GemmArgs&, const uint32_t*, int64_t, int64_t) {
  DI_FAIL("amx_bf16_columns: no AMX kernel on this build");
}
void release_amx_tiles() {}
bool small_m_invariant() {
  const DecodeGemm mode = g_decode_gemm;
  return mode == DecodeGemm::invariant || (mode == DecodeGemm::automatic && batch_invariant_knob());
}
}  // namespace deepinfer::kernels::cpu
namespace deepinfer::kernels {
size_t decode_layout_bytes(int64_t, int64_t) { return 0; }
size_t bf16_pairs_words(int64_t, int64_t) { return 0; }
void pack_bf16_pairs(const bf16*, int64_t n, int64_t k, uint32_t*) {
  DI_FAIL("pack_bf16_pairs: no pairs layout for n={} k={} on this CPU", n, k);
}
void pack_decode_layout(const fp8_e4m3*, int64_t n, int64_t k, uint8_t*) {
  DI_FAIL("pack_decode_layout: no decode layout for n={} k={} on this CPU", n, k);
}
}  // namespace deepinfer::kernels
#endif
