// cpu: MLA attention. One tiled online-softmax kernel (flash-attention style, fp32) serves all
// three entry points: a job is (query rows that share their keys, key range); keys come in tiles
// of 64 rows converted to fp32 once per tile and reused by every row of the job (all heads in the
// absorbed form: MQA). Highway SIMD for q.k (4 rows x 2 keys per step) and P.V (4 rows per step).
// Batch invariance (docs/numerics.md §10): a row's keys are cut into fixed segments of kSegKeys;
// each segment runs its own online softmax and the segments are merged by LSE in order, always
// the same way, whether one job runs them all (prefill) or jobs split them across threads
// (FlashMLA's split-KV, for decode). So a query's output does not depend on how many rows, chunks
// or sequences share the call, nor on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cpp"
// foreach_target re-includes this file per target; the order matters:
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/activation_simd-inl.h"

// Target-independent types: defined once although foreach_target re-includes this file.
#ifndef DEEPINFER_KERNELS_CPU_ATTENTION_TYPES_
#define DEEPINFER_KERNELS_CPU_ATTENTION_TYPES_
namespace deepinfer::kernels::cpu {

constexpr int64_t kKeyTile = 64;   // keys per tile
constexpr int64_t kRowBlock = 16;  // query rows per job
constexpr int64_t kSegKeys = 512;  // keys per softmax segment (whole tiles)
static_assert(kSegKeys % kKeyTile == 0);
inline int64_t num_segments(int64_t n_k) {
  return std::max<int64_t>(1, (n_k + kSegKeys - 1) / kSegKeys);
}

// Where the keys of one job live. Key t is row t of the sequence: paged (pages != nullptr) or
// contiguous. Values: the first Dv channels of the key row (shared_kv) or their own rows.
struct KeySource {
  const bf16* k = nullptr;
  int64_t k_stride = 0;  // elements between consecutive key rows (within a page when paged)
  const bf16* v = nullptr;
  int64_t v_stride = 0;
  bool shared_kv = false;          // v is the key row itself (absorbed form)
  const int32_t* pages = nullptr;  // paged: key t is row t % page_size of page pages[t / page_size]
  int64_t page_size = 0;
  const bf16* key(int64_t t) const {
    return pages ? k + (int64_t(pages[t / page_size]) * page_size + t % page_size) * k_stride
                 : k + t * k_stride;
  }
  const bf16* val(int64_t t) const {
    return pages ? v + (int64_t(pages[t / page_size]) * page_size + t % page_size) * v_stride
                 : v + t * v_stride;
  }
};

// One job: rows j in [j0, j1) of a sequence's query block; row j is query i = j / rows_per_query.
struct AttnJob {
  const bf16* q = nullptr;  // row j at q + j * q_stride, D channels
  int64_t q_stride = 0;
  int64_t j0 = 0, j1 = 0;
  int64_t rows_per_query = 1;
  int64_t n_q = 0, n_k = 0;  // the sequence's query and key counts (visibility)
  int64_t kb = 0, ke = 0;    // key range of this job (a split of [0, n_k))
  KeySource keys;
  int64_t D = 0, Dv = 0;
  float scale = 0;
  bool causal = true;
  // Final output (splits == 1): row j -> o + j * o_stride (bf16); lse at lse_index(j) if lse.
  bf16* o = nullptr;
  int64_t o_stride = 0;
  float* lse = nullptr;
  int64_t lse_base = 0, lse_head_stride = 0, lse_query_stride = 0;
  // Split jobs (several jobs per row block; kb, ke on segment edges): row j - j0, segment s ->
  // part_o [rows, segments, Dv] f32 (normalised), part_lse [rows, segments] (-inf: none visible),
  // merged by merge_segments once every job of the row block is done.
  float* part_o = nullptr;
  float* part_lse = nullptr;

  int64_t visible(int64_t j) const {
    const int64_t i = j / rows_per_query;
    return causal ? std::clamp<int64_t>(n_k - n_q + i + 1, 0, n_k) : n_k;
  }
  int64_t lse_index(int64_t j) const {
    return lse_base + (j % rows_per_query) * lse_head_stride +
           (j / rows_per_query) * lse_query_stride;
  }
};

// Rows [j0, j0 + R) of the job's sequence from their per-segment partials (o_s normalised, lse_s):
// o = sum_s exp(lse_s - mx) o_s / sum_s exp(lse_s - mx), lse = mx + ln(that sum), segments in
// order; nothing visible -> o = 0, lse = +inf. One definition (baseline code, no per-target
// variant): every job, split or not, merges with the same roundings.
inline void merge_segments(const AttnJob& job, int64_t j0, int64_t R, int64_t nseg,
                           const float* part_o, const float* part_lse) {
  const int64_t Dv = job.Dv;
  thread_local std::vector<float> w, v;
  w.resize(static_cast<size_t>(nseg));
  v.resize(static_cast<size_t>(Dv));
  for (int64_t r = 0; r < R; ++r) {
    const float* lse_r = part_lse + r * nseg;
    const float* o_r = part_o + r * nseg * Dv;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < nseg; ++k) mx = std::max(mx, lse_r[k]);
    bf16* o = job.o + (j0 + r) * job.o_stride;
    if (mx == -std::numeric_limits<float>::infinity()) {
      for (int64_t c = 0; c < Dv; ++c) o[c] = bf16{0};
      if (job.lse) job.lse[job.lse_index(j0 + r)] = std::numeric_limits<float>::infinity();
      continue;
    }
    float wsum = 0.0f;
    for (int64_t k = 0; k < nseg; ++k) wsum += (w[size_t(k)] = std::exp(lse_r[k] - mx));
    std::fill(v.begin(), v.end(), 0.0f);
    for (int64_t k = 0; k < nseg; ++k) {  // per channel: segments in order
      const float wk = w[size_t(k)];
      const float* ok = o_r + k * Dv;
      for (int64_t c = 0; c < Dv; ++c) v[size_t(c)] += wk * ok[c];
    }
    for (int64_t c = 0; c < Dv; ++c) o[c] = f32_to_bf16(v[size_t(c)] / wsum);
    if (job.lse) job.lse[job.lse_index(j0 + r)] = mx + std::log(wsum);
  }
}

}  // namespace deepinfer::kernels::cpu
#endif  // DEEPINFER_KERNELS_CPU_ATTENTION_TYPES_

HWY_BEFORE_NAMESPACE();
namespace deepinfer::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
HWY_INLINE void bf16_row_to_f32(DF df, const bf16* src, int64_t n, float* dst) {
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t c = 0;
  for (; c + N <= n; c += N) hn::StoreU(load_bf16(df, src + c), df, dst + c);
  for (; c < n; ++c) dst[c] = bf16_to_f32(src[c]);
}

template <class DF>
HWY_INLINE float dot_tail(DF, const float* a, const float* b, int64_t c0, int64_t n) {
  float s = 0.0f;
  for (int64_t c = c0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// s[r * ld + t] = qf[r] . kf[t] for r < nr, t < nt (D channels).
template <class DF>
HWY_INLINE void scores_tile(DF df, const float* qf, int64_t nr, const float* kf, int64_t nt,
                            int64_t D, float* s, int64_t ld) {
  const int64_t N = int64_t(hn::Lanes(df)), Dv = D / N * N;
  int64_t r = 0;
  for (; r + 4 <= nr; r += 4) {
    const float* q0 = qf + r * D;
    const float* q1 = q0 + D;
    const float* q2 = q1 + D;
    const float* q3 = q2 + D;
    int64_t t = 0;
#if HWY_TARGET <= HWY_AVX3
    // 4 rows x 4 keys (32 vector registers): 8 loads feed 16 FMAs, where 4 x 2 needs 6 for 8.
    for (; t + 4 <= nt; t += 4) {
      const float* k0 = kf + t * D;
      const float* k1 = k0 + D;
      const float* k2 = k1 + D;
      const float* k3 = k2 + D;
      decltype(hn::Zero(df)) acc[4][4];
      for (auto& row : acc)
        for (auto& v : row) v = hn::Zero(df);
      for (int64_t c = 0; c < Dv; c += N) {
        const auto x0 = hn::LoadU(df, q0 + c), x1 = hn::LoadU(df, q1 + c);
        const auto x2 = hn::LoadU(df, q2 + c), x3 = hn::LoadU(df, q3 + c);
        const auto y0 = hn::LoadU(df, k0 + c), y1 = hn::LoadU(df, k1 + c);
        const auto y2 = hn::LoadU(df, k2 + c), y3 = hn::LoadU(df, k3 + c);
        acc[0][0] = hn::MulAdd(x0, y0, acc[0][0]), acc[0][1] = hn::MulAdd(x0, y1, acc[0][1]);
        acc[0][2] = hn::MulAdd(x0, y2, acc[0][2]), acc[0][3] = hn::MulAdd(x0, y3, acc[0][3]);
        acc[1][0] = hn::MulAdd(x1, y0, acc[1][0]), acc[1][1] = hn::MulAdd(x1, y1, acc[1][1]);
        acc[1][2] = hn::MulAdd(x1, y2, acc[1][2]), acc[1][3] = hn::MulAdd(x1, y3, acc[1][3]);
        acc[2][0] = hn::MulAdd(x2, y0, acc[2][0]), acc[2][1] = hn::MulAdd(x2, y1, acc[2][1]);
        acc[2][2] = hn::MulAdd(x2, y2, acc[2][2]), acc[2][3] = hn::MulAdd(x2, y3, acc[2][3]);
        acc[3][0] = hn::MulAdd(x3, y0, acc[3][0]), acc[3][1] = hn::MulAdd(x3, y1, acc[3][1]);
        acc[3][2] = hn::MulAdd(x3, y2, acc[3][2]), acc[3][3] = hn::MulAdd(x3, y3, acc[3][3]);
      }
      const float* qs[4] = {q0, q1, q2, q3};
      const float* ks[4] = {k0, k1, k2, k3};
      for (int i = 0; i < 4; ++i)
        for (int u = 0; u < 4; ++u)
          s[(r + i) * ld + t + u] =
              hn::GetLane(hn::SumOfLanes(df, acc[i][u])) + dot_tail(df, qs[i], ks[u], Dv, D);
    }
#endif
    for (; t + 2 <= nt; t += 2) {
      const float* ka = kf + t * D;
      const float* kb = ka + D;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      auto b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
      for (int64_t c = 0; c < Dv; c += N) {
        const auto x0 = hn::LoadU(df, q0 + c), x1 = hn::LoadU(df, q1 + c);
        const auto x2 = hn::LoadU(df, q2 + c), x3 = hn::LoadU(df, q3 + c);
        const auto ya = hn::LoadU(df, ka + c), yb = hn::LoadU(df, kb + c);
        a0 = hn::MulAdd(x0, ya, a0);
        a1 = hn::MulAdd(x1, ya, a1);
        a2 = hn::MulAdd(x2, ya, a2);
        a3 = hn::MulAdd(x3, ya, a3);
        b0 = hn::MulAdd(x0, yb, b0);
        b1 = hn::MulAdd(x1, yb, b1);
        b2 = hn::MulAdd(x2, yb, b2);
        b3 = hn::MulAdd(x3, yb, b3);
      }
      s[(r + 0) * ld + t] = hn::GetLane(hn::SumOfLanes(df, a0)) + dot_tail(df, q0, ka, Dv, D);
      s[(r + 1) * ld + t] = hn::GetLane(hn::SumOfLanes(df, a1)) + dot_tail(df, q1, ka, Dv, D);
      s[(r + 2) * ld + t] = hn::GetLane(hn::SumOfLanes(df, a2)) + dot_tail(df, q2, ka, Dv, D);
      s[(r + 3) * ld + t] = hn::GetLane(hn::SumOfLanes(df, a3)) + dot_tail(df, q3, ka, Dv, D);
      s[(r + 0) * ld + t + 1] = hn::GetLane(hn::SumOfLanes(df, b0)) + dot_tail(df, q0, kb, Dv, D);
      s[(r + 1) * ld + t + 1] = hn::GetLane(hn::SumOfLanes(df, b1)) + dot_tail(df, q1, kb, Dv, D);
      s[(r + 2) * ld + t + 1] = hn::GetLane(hn::SumOfLanes(df, b2)) + dot_tail(df, q2, kb, Dv, D);
      s[(r + 3) * ld + t + 1] = hn::GetLane(hn::SumOfLanes(df, b3)) + dot_tail(df, q3, kb, Dv, D);
    }
    for (; t < nt; ++t)
      for (int64_t i = 0; i < 4; ++i) {
        const float* qi = qf + (r + i) * D;
        auto a = hn::Zero(df);
        for (int64_t c = 0; c < Dv; c += N)
          a = hn::MulAdd(hn::LoadU(df, qi + c), hn::LoadU(df, kf + t * D + c), a);
        s[(r + i) * ld + t] =
            hn::GetLane(hn::SumOfLanes(df, a)) + dot_tail(df, qi, kf + t * D, Dv, D);
      }
  }
  for (; r < nr; ++r)
    for (int64_t t = 0; t < nt; ++t) {
      const float* qi = qf + r * D;
      auto a = hn::Zero(df);
      for (int64_t c = 0; c < Dv; c += N)
        a = hn::MulAdd(hn::LoadU(df, qi + c), hn::LoadU(df, kf + t * D + c), a);
      s[r * ld + t] = hn::GetLane(hn::SumOfLanes(df, a)) + dot_tail(df, qi, kf + t * D, Dv, D);
    }
}

// acc[r] += sum_t p[r * ld + t] * vf[t] (Dv channels, vf row stride vs) for r < nr, t < nt.
template <class DF>
HWY_INLINE void pv_tile(DF df, const float* p, int64_t ld, int64_t nr, const float* vf, int64_t vs,
                        int64_t nt, int64_t Dv, float* acc) {
  const int64_t N = int64_t(hn::Lanes(df)), Dvv = Dv / N * N;
  int64_t r = 0;
  // 4 rows x 4 vectors of accumulators: per key, 4 loads of v and 4 broadcasts feed 16 FMAs.
  for (; r + 4 <= nr; r += 4) {
    float* o0 = acc + r * Dv;
    const float* p0 = p + r * ld;
    int64_t c = 0;
    for (; c + 4 * N <= Dvv; c += 4 * N) {
      auto a00 = hn::LoadU(df, o0 + c), a01 = hn::LoadU(df, o0 + c + N);
      auto a02 = hn::LoadU(df, o0 + c + 2 * N), a03 = hn::LoadU(df, o0 + c + 3 * N);
      auto a10 = hn::LoadU(df, o0 + Dv + c), a11 = hn::LoadU(df, o0 + Dv + c + N);
      auto a12 = hn::LoadU(df, o0 + Dv + c + 2 * N), a13 = hn::LoadU(df, o0 + Dv + c + 3 * N);
      auto a20 = hn::LoadU(df, o0 + 2 * Dv + c), a21 = hn::LoadU(df, o0 + 2 * Dv + c + N);
      auto a22 = hn::LoadU(df, o0 + 2 * Dv + c + 2 * N),
           a23 = hn::LoadU(df, o0 + 2 * Dv + c + 3 * N);
      auto a30 = hn::LoadU(df, o0 + 3 * Dv + c), a31 = hn::LoadU(df, o0 + 3 * Dv + c + N);
      auto a32 = hn::LoadU(df, o0 + 3 * Dv + c + 2 * N),
           a33 = hn::LoadU(df, o0 + 3 * Dv + c + 3 * N);
      for (int64_t t = 0; t < nt; ++t) {
        const float* vt = vf + t * vs + c;
        const auto v0 = hn::LoadU(df, vt), v1 = hn::LoadU(df, vt + N);
        const auto v2 = hn::LoadU(df, vt + 2 * N), v3 = hn::LoadU(df, vt + 3 * N);
        const auto w0 = hn::Set(df, p0[t]), w1 = hn::Set(df, p0[ld + t]);
        const auto w2 = hn::Set(df, p0[2 * ld + t]), w3 = hn::Set(df, p0[3 * ld + t]);
        a00 = hn::MulAdd(w0, v0, a00), a01 = hn::MulAdd(w0, v1, a01), a02 = hn::MulAdd(w0, v2, a02);
        a03 = hn::MulAdd(w0, v3, a03);
        a10 = hn::MulAdd(w1, v0, a10), a11 = hn::MulAdd(w1, v1, a11), a12 = hn::MulAdd(w1, v2, a12);
        a13 = hn::MulAdd(w1, v3, a13);
        a20 = hn::MulAdd(w2, v0, a20), a21 = hn::MulAdd(w2, v1, a21), a22 = hn::MulAdd(w2, v2, a22);
        a23 = hn::MulAdd(w2, v3, a23);
        a30 = hn::MulAdd(w3, v0, a30), a31 = hn::MulAdd(w3, v1, a31), a32 = hn::MulAdd(w3, v2, a32);
        a33 = hn::MulAdd(w3, v3, a33);
      }
      hn::StoreU(a00, df, o0 + c), hn::StoreU(a01, df, o0 + c + N);
      hn::StoreU(a02, df, o0 + c + 2 * N), hn::StoreU(a03, df, o0 + c + 3 * N);
      hn::StoreU(a10, df, o0 + Dv + c), hn::StoreU(a11, df, o0 + Dv + c + N);
      hn::StoreU(a12, df, o0 + Dv + c + 2 * N), hn::StoreU(a13, df, o0 + Dv + c + 3 * N);
      hn::StoreU(a20, df, o0 + 2 * Dv + c), hn::StoreU(a21, df, o0 + 2 * Dv + c + N);
      hn::StoreU(a22, df, o0 + 2 * Dv + c + 2 * N), hn::StoreU(a23, df, o0 + 2 * Dv + c + 3 * N);
      hn::StoreU(a30, df, o0 + 3 * Dv + c), hn::StoreU(a31, df, o0 + 3 * Dv + c + N);
      hn::StoreU(a32, df, o0 + 3 * Dv + c + 2 * N), hn::StoreU(a33, df, o0 + 3 * Dv + c + 3 * N);
    }
    for (; c < Dvv; c += N) {
      auto a0 = hn::LoadU(df, o0 + c), a1 = hn::LoadU(df, o0 + Dv + c);
      auto a2 = hn::LoadU(df, o0 + 2 * Dv + c), a3 = hn::LoadU(df, o0 + 3 * Dv + c);
      for (int64_t t = 0; t < nt; ++t) {
        const auto v = hn::LoadU(df, vf + t * vs + c);
        a0 = hn::MulAdd(hn::Set(df, p0[t]), v, a0);
        a1 = hn::MulAdd(hn::Set(df, p0[ld + t]), v, a1);
        a2 = hn::MulAdd(hn::Set(df, p0[2 * ld + t]), v, a2);
        a3 = hn::MulAdd(hn::Set(df, p0[3 * ld + t]), v, a3);
      }
      hn::StoreU(a0, df, o0 + c);
      hn::StoreU(a1, df, o0 + Dv + c);
      hn::StoreU(a2, df, o0 + 2 * Dv + c);
      hn::StoreU(a3, df, o0 + 3 * Dv + c);
    }
  }
  for (; r < nr; ++r)
    for (int64_t c = 0; c < Dvv; c += N) {
      auto a = hn::LoadU(df, acc + r * Dv + c);
      for (int64_t t = 0; t < nt; ++t)
        a = hn::MulAdd(hn::Set(df, p[r * ld + t]), hn::LoadU(df, vf + t * vs + c), a);
      hn::StoreU(a, df, acc + r * Dv + c);
    }
  for (r = 0; r < nr; ++r)
    for (int64_t c = Dvv; c < Dv; ++c) {
      float a = acc[r * Dv + c];
      for (int64_t t = 0; t < nt; ++t) a += p[r * ld + t] * vf[t * vs + c];
      acc[r * Dv + c] = a;
    }
}

void run_attn_job(const AttnJob& job) {
  const hn::ScalableTag<float> df;
  const int64_t D = job.D, Dv = job.Dv, R = job.j1 - job.j0;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Per-thread scratch, reused across calls: fresh large buffers would cost a page fault per 4 KiB
  // on every call, each expensive on a VM (docs/performance.md §6).
  thread_local std::vector<float> qf, kf, vf, s, acc, m, l, seg_o, seg_lse;
  thread_local std::vector<int64_t> vis;
  qf.resize(static_cast<size_t>(R * D));
  kf.resize(static_cast<size_t>(kKeyTile * D));
  vf.resize(job.keys.shared_kv ? 0 : static_cast<size_t>(kKeyTile * Dv));
  s.resize(static_cast<size_t>(R * kKeyTile));
  acc.resize(static_cast<size_t>(R * Dv));
  m.resize(static_cast<size_t>(R));
  l.resize(static_cast<size_t>(R));
  vis.resize(static_cast<size_t>(R));
  int64_t max_vis = 0;
  for (int64_t r = 0; r < R; ++r) {
    bf16_row_to_f32(df, job.q + (job.j0 + r) * job.q_stride, D, qf.data() + r * D);
    vis[size_t(r)] = std::min(job.visible(job.j0 + r), job.ke);
    max_vis = std::max(max_vis, vis[size_t(r)]);
  }
  // Segments [sg0, sg1) of the sequence's nseg; one segment in all: the output directly.
  const int64_t nseg = num_segments(job.n_k);
  const int64_t sg0 = job.kb / kSegKeys,
                sg1 = std::max(sg0 + 1, (job.ke + kSegKeys - 1) / kSegKeys);
  float* part_o = job.part_o;
  float* part_lse = job.part_lse;
  if (nseg > 1 && !part_o) {  // this job holds every segment: merge them itself
    seg_o.resize(static_cast<size_t>(R * nseg * Dv));
    seg_lse.resize(static_cast<size_t>(R * nseg));
    part_o = seg_o.data();
    part_lse = seg_lse.data();
  }
  for (int64_t sg = sg0; sg < sg1; ++sg) {
    const int64_t kb = sg * kSegKeys, ke = std::min(job.ke, kb + kSegKeys);
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(m.begin(), m.end(), neg_inf);
    std::fill(l.begin(), l.end(), 0.0f);
    for (int64_t k0 = kb; k0 < std::min(ke, max_vis); k0 += kKeyTile) {
      const int64_t nt = std::min({kKeyTile, ke - k0, max_vis - k0});
      for (int64_t t = 0; t < nt; ++t) {
        bf16_row_to_f32(df, job.keys.key(k0 + t), D, kf.data() + t * D);
        if (!job.keys.shared_kv) bf16_row_to_f32(df, job.keys.val(k0 + t), Dv, vf.data() + t * Dv);
      }
      scores_tile(df, qf.data(), R, kf.data(), nt, D, s.data(), kKeyTile);
      for (int64_t r = 0; r < R; ++r) {
        float* sr = s.data() + r * kKeyTile;
        const int64_t n_vis = std::clamp<int64_t>(vis[size_t(r)] - k0, 0, nt);
        if (n_vis == 0) {
          std::fill(sr, sr + nt, 0.0f);
          continue;
        }
        const int64_t NL = int64_t(hn::Lanes(df)), nv = n_vis / NL * NL;
        const auto vscale = hn::Set(df, job.scale);
        auto vmax = hn::Set(df, neg_inf);
        for (int64_t t = 0; t < nv; t += NL) {
          const auto x = hn::Mul(hn::LoadU(df, sr + t), vscale);
          hn::StoreU(x, df, sr + t);
          vmax = hn::Max(vmax, x);
        }
        float mt = hn::GetLane(hn::MaxOfLanes(df, vmax));
        for (int64_t t = nv; t < n_vis; ++t) mt = std::max(mt, sr[t] *= job.scale);
        const float m_new = std::max(m[size_t(r)], mt);
        const float corr = std::exp(m[size_t(r)] - m_new);  // exp(-inf) = 0 on the first tile
        // Vector exp (Highway's, within 1 ulp of expf); the sum order differs from host only.
        const auto vm = hn::Set(df, m_new);
        auto vsum = hn::Zero(df);
        for (int64_t t = 0; t < nv; t += NL) {
          const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, sr + t), vm));
          hn::StoreU(e, df, sr + t);
          vsum = hn::Add(vsum, e);
        }
        float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
        for (int64_t t = nv; t < n_vis; ++t) sum += (sr[t] = std::exp(sr[t] - m_new));
        std::fill(sr + n_vis, sr + nt, 0.0f);
        l[size_t(r)] = l[size_t(r)] * corr + sum;
        m[size_t(r)] = m_new;
        if (corr != 1.0f)
          for (int64_t c = 0; c < Dv; ++c) acc[size_t(r * Dv + c)] *= corr;
      }
      if (job.keys.shared_kv)
        pv_tile(df, s.data(), kKeyTile, R, kf.data(), D, nt, Dv, acc.data());
      else
        pv_tile(df, s.data(), kKeyTile, R, vf.data(), Dv, nt, Dv, acc.data());
    }
    const int64_t N = int64_t(hn::Lanes(df));
    for (int64_t r = 0; r < R; ++r) {
      const float lr = l[size_t(r)];
      const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
      const float lse = lr > 0.0f ? m[size_t(r)] + std::log(lr) : neg_inf;
      const float* a = acc.data() + r * Dv;
      if (nseg > 1) {
        float* po = part_o + (r * nseg + sg) * Dv;
        for (int64_t c = 0; c < Dv; ++c) po[c] = a[c] * inv;
        part_lse[r * nseg + sg] = lse;
        continue;
      }
      bf16* o = job.o + (job.j0 + r) * job.o_stride;
      const auto vinv = hn::Set(df, inv);
      int64_t c = 0;
      for (; c + N <= Dv; c += N) store_bf16(df, hn::Mul(hn::LoadU(df, a + c), vinv), o + c);
      for (; c < Dv; ++c) o[c] = f32_to_bf16(a[c] * inv);
      if (job.lse)
        job.lse[job.lse_index(job.j0 + r)] =
            lr > 0.0f ? lse : std::numeric_limits<float>::infinity();
    }
  }
  if (nseg > 1 && !job.part_o) merge_segments(job, job.j0, R, nseg, part_o, part_lse);
}

}  // namespace deepinfer::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::kernels::cpu {

HWY_EXPORT(run_attn_job);

namespace {

// One sequence's attention problem before it is cut into jobs.
struct SeqProblem {
  AttnJob base;  // everything but j0/j1/kb/ke/part_*
  int64_t rows;  // query rows (queries x rows_per_query)
};

// Cuts every sequence into row blocks and, where there are too few jobs for the pool, splits a
// block's key segments over several jobs; runs them on kernel_pool() and merges split partials by
// LSE. How many jobs share a block changes no result (see kSegKeys).
void run_problems(const std::vector<SeqProblem>& seqs) {
  ThreadPool& pool = kernel_pool();
  int64_t blocks = 0;
  for (const auto& sp : seqs) blocks += (sp.rows + kRowBlock - 1) / kRowBlock;
  if (blocks == 0) return;
  const int64_t want = 2 * int64_t(pool.num_threads());
  const int64_t splits = std::max<int64_t>(1, (want + blocks - 1) / blocks);

  std::vector<AttnJob> jobs;
  struct PartRef {
    size_t first_job, n_jobs;
    int64_t nseg;
    size_t o_off, lse_off;
  };
  std::vector<PartRef> parts;
  size_t part_floats = 0, part_rows = 0;
  for (const auto& sp : seqs) {
    const int64_t nseg = num_segments(sp.base.n_k);
    const int64_t n_split = std::min(splits, nseg);
    const int64_t per = (nseg + n_split - 1) / n_split;  // segments per job
    for (int64_t j0 = 0; j0 < sp.rows; j0 += kRowBlock) {
      const int64_t j1 = std::min(sp.rows, j0 + kRowBlock);
      if (n_split > 1) {
        parts.push_back({jobs.size(), 0, nseg, part_floats, part_rows});
        part_floats += size_t((j1 - j0) * nseg * sp.base.Dv);
        part_rows += size_t((j1 - j0) * nseg);
      }
      for (int64_t s0 = 0; s0 < nseg; s0 += per) {
        AttnJob job = sp.base;
        job.j0 = j0;
        job.j1 = j1;
        job.kb = n_split > 1 ? std::min(sp.base.n_k, s0 * kSegKeys) : 0;
        job.ke = n_split > 1 ? std::min(sp.base.n_k, (s0 + per) * kSegKeys) : sp.base.n_k;
        jobs.push_back(job);
        if (n_split == 1) break;
      }
      if (n_split > 1) parts.back().n_jobs = jobs.size() - parts.back().first_job;
    }
  }
  thread_local std::vector<float> part_o, part_lse;  // reused: see run_attn_job's scratch
  part_o.resize(part_floats);
  part_lse.resize(part_rows);
  for (const PartRef& pr : parts) {
    for (size_t i = pr.first_job; i < pr.first_job + pr.n_jobs; ++i) {
      jobs[i].part_o = part_o.data() + pr.o_off;
      jobs[i].part_lse = part_lse.data() + pr.lse_off;
    }
  }
  pool.parallel_for(int64_t(jobs.size()), 1, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) HWY_DYNAMIC_DISPATCH(run_attn_job)(jobs[size_t(i)]);
  });
  // Merge row by row over the pool (a decode step may have one row block).
  std::vector<int64_t> row_start(parts.size() + 1, 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    const AttnJob& first = jobs[parts[i].first_job];
    row_start[i + 1] = row_start[i] + (first.j1 - first.j0);
  }
  pool.parallel_for(row_start.back(), 1, [&](int64_t a, int64_t b) {
    for (int64_t x = a; x < b; ++x) {
      const size_t pi =
          size_t(std::upper_bound(row_start.begin(), row_start.end(), x) - row_start.begin() - 1);
      const PartRef& pr = parts[pi];
      const AttnJob& first = jobs[pr.first_job];
      const int64_t r = x - row_start[pi];
      merge_segments(first, first.j0 + r, 1, pr.nseg, first.part_o + r * pr.nseg * first.Dv,
                     first.part_lse + r * pr.nseg);
    }
  });
}

}  // namespace

void mla_prefill(const MlaPrefillParams& p) {
  p.validate();
  const int64_t H = p.num_heads, D = p.head_dim, Dv = p.head_dim_v, Tq = p.total_q();
  std::vector<SeqProblem> seqs;
  for (int64_t b = 0; b < p.num_seqs; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], nq = p.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = p.cu_seqlens_k[b], nk = p.cu_seqlens_k[b + 1] - k0;
    if (nq == 0) continue;
    AttnJob base;
    base.n_q = nq;
    base.n_k = nk;
    base.D = D;
    base.Dv = Dv;
    base.scale = p.softmax_scale;
    base.causal = p.causal;
    if (p.absorbed()) {
      // All heads of a sequence share the latent rows: one problem, rows (query, head).
      base.q = p.q + q0 * H * D;
      base.q_stride = D;
      base.rows_per_query = H;
      base.keys = {p.kv + k0 * D, D, p.kv + k0 * D, D, true, nullptr, 0};
      base.o = p.o + q0 * H * Dv;
      base.o_stride = Dv;
      base.lse = p.lse;
      base.lse_base = q0;
      base.lse_head_stride = Tq;
      base.lse_query_stride = 1;
      seqs.push_back({base, nq * H});
    } else {
      // Each head has its own K and V: one problem per head, rows = queries.
      for (int64_t h = 0; h < H; ++h) {
        AttnJob hb = base;
        hb.q = p.q + (q0 * H + h) * D;
        hb.q_stride = H * D;
        hb.rows_per_query = 1;
        hb.keys = {
            p.k + (k0 * H + h) * D, H * D, p.v + (k0 * H + h) * Dv, H * Dv, false, nullptr, 0};
        hb.o = p.o + (q0 * H + h) * Dv;
        hb.o_stride = H * Dv;
        hb.lse = p.lse;
        hb.lse_base = h * Tq + q0;
        hb.lse_head_stride = 0;
        hb.lse_query_stride = 1;
        seqs.push_back({hb, nq});
      }
    }
  }
  run_problems(seqs);
}

void mla_decode(const MlaDecodeParams& p) {
  p.validate();
  const int64_t H = p.num_heads, D = p.head_dim, Dv = p.head_dim_v, S = p.s_q;
  std::vector<SeqProblem> seqs;
  for (int64_t b = 0; b < p.batch; ++b) {
    AttnJob base;
    base.q = p.q + b * S * H * D;
    base.q_stride = D;
    base.rows_per_query = H;
    base.n_q = S;
    base.n_k = p.cache_seqlens[b];
    base.keys = {p.kv_cache, D, p.kv_cache, D, true, p.block_table + b * p.max_pages_per_seq,
                 p.page_size};
    base.D = D;
    base.Dv = Dv;
    base.scale = p.softmax_scale;
    base.causal = p.causal;
    base.o = p.o + b * S * H * Dv;
    base.o_stride = Dv;
    base.lse = p.lse;
    base.lse_base = b * H * S;
    base.lse_head_stride = S;
    base.lse_query_stride = 1;
    seqs.push_back({base, S * H});
  }
  run_problems(seqs);
}

}  // namespace deepinfer::kernels::cpu
#endif
