// What the cpu GEMM kernels take: one GEMM on one weight matrix.
#pragma once

#include <deepinfer/dtype.h>

#include <cstdint>
#include <functional>
#include <span>

namespace deepinfer::kernels::cpu {

struct GemmArgs {
  const void* a;          // [m, k] e4m3 or bf16
  const float* a_scales;  // [m, kb] or null (bf16: unit scales)
  const void* w;          // [n, k]
  const float* w_scales;  // [nb, kb] or null
  bf16* out;              // [m, n] or null
  float* out_f32;         // [m, n] or null
  int64_t m, n, k;
  bool bf16_inputs;
  const uint8_t* w_decode = nullptr;  // w in the decode layout, or null
  int64_t ldo = 0;                    // output row stride (0: n); the small-M kernels only
};
constexpr int64_t kSmallM = 8;  // up to this many rows: the streaming (decode) kernel

// The pool dispatch of the weight-streaming GEMMs (decode layout, BF16-dot): fn(u0, u1) over work
// units [0, units) of a call worth `work` bytes (streaming_work: its weight bytes, scaled up for
// rows past the first).
// - From kPerThreadBelow up, tapering chunks down to 1/32 of a thread's share. How fast a core
//   streams varies within a call (the VM's bandwidth, the other core's work), and with a few equal
//   chunks a thread the caller waited out about half a chunk at the end of each call: 2.5-3.5 ms of
//   a 35 ms batch-16 step (docs/performance.md §8).
// - Below it, one contiguous range a thread: in a short call each further chunk cost more than the
//   imbalance it saved (a chunk under four panels reads its weights as one stream, at about 0.6
//   of four streams' speed): at M = 1 a 0.5 MB call took a third less time, an 8 MB one a few
//   percent less, a batch-1 step 4-6% less (§8, stop 43).
constexpr int64_t kPerThreadBelow = int64_t(16) << 20;
void parallel_for_streaming(int64_t units, int64_t work,
                            const std::function<void(int64_t, int64_t)>& fn);
// A call's work for parallel_for_streaming: weight bytes × (m + 2) / 3, the decode-layout kernel's
// cost per panel (about ten decode instructions per 128 weight bytes and six per row), so M = 1
// counts its bytes and a prefill-sized M, which computes for milliseconds, tapers.
inline int64_t streaming_work(int64_t weight_bytes, int64_t m) {
  return weight_bytes / 3 * (m + 2);
}

// Rows [r, r + rows) of an fp8 GEMM g as a GEMM of its own.
inline GemmArgs fp8_row_slice(const GemmArgs& g, int64_t r, int64_t rows) {
  GemmArgs c = g;
  c.m = rows;
  c.a = static_cast<const fp8_e4m3*>(g.a) + r * g.k;
  c.a_scales = g.a_scales ? g.a_scales + r * ((g.k + 127) / 128) : nullptr;
  const int64_t ldo = g.ldo ? g.ldo : g.n;
  if (c.out) c.out += r * ldo;
  if (c.out_f32) c.out_f32 += r * ldo;
  return c;
}

// fp8 decode GEMM (m <= kSmallM) on CPUs with AVX512-VBMI (Ice Lake+, Zen 4+), from the decode
// layout where g.w_decode is set and the CPU has AVX512-BF16: returns false, doing nothing, where
// the CPU or the shape (k % 128) does not fit.
bool gemm_fp8_small_m_vbmi(const GemmArgs& g);
// Whether gemm_fp8_small_m_vbmi runs g on the decode layout kernel.
bool takes_decode_layout(const GemmArgs& g);
// Whether g runs on the decode layout kernel: M <= kSmallM as takes_decode_layout says, larger M
// in kSmallM-row chunks where the first chunk would (in the batch-invariant mode each row then
// gets the prefill kernel's bytes; outside it the chunks are simply the faster kernel).
bool takes_decode_layout_chunked(const GemmArgs& g);
// Problems that each take it (takes_decode_layout_chunked), in one pool dispatch over all their
// panels, a larger M's row chunks panel by panel; every problem gets the bytes it gets alone.
void run_decode_layout_multi(std::span<const GemmArgs> problems);
// AVX512-VBMI and AVX512-BF16 (VDPBF16PS): what the decode layout needs.
bool cpu_has_bf16_dot();
// That, AMX-TILE and AMX-BF16, and the OS lets this process use the tiles.
bool cpu_has_amx();
// Whether the decode layout kernel, and the bf16 GEMMs whose K allows (amx_bf16_gemm), take AMX
// tile products (TDPBF16PS) for every M: DEEPINFER_AMX
// (default on) until set_amx (tests, benches) says otherwise, on a CPU with it
// (cpu_has_amx), under DecodeGemm automatic or invariant. Its rows sum in TDPBF16PS's order, not
// VDPBF16PS's (docs/numerics.md §10).
bool amx_active();
// Asks for AMX (or not) from now on; returns what was asked before.
bool set_amx(bool on);
// Asks for AMX in a scope (tests, benches), then restores what was asked before.
struct ScopedAmx {
  explicit ScopedAmx(bool on) : was(set_amx(on)) {}
  ~ScopedAmx() { set_amx(was); }
  ScopedAmx(const ScopedAmx&) = delete;
  ScopedAmx& operator=(const ScopedAmx&) = delete;
  bool was;
};
// Whether bf16 GEMM rows sum with VDPBF16PS (bf16_dot_rows): the CPU has it and DecodeGemm is not
// generic. Then every M <= kSmallM row, and in the batch-invariant mode every row, takes it.
bool bf16_dot_gemm();
// bf16 GEMM rows [0, g.m), output columns [j0, j1), with VDPBF16PS (32 products an instruction,
// no decode to f32): a holds the rows' activations (bf16, row stride lda), g.w the weight [n, k].
// A row's sum order depends on k only.
void bf16_dot_rows(const GemmArgs& g, const uint16_t* a, int64_t lda, int64_t j0, int64_t j1);
// bf16 GEMM rows [0, g.m), output columns [j0, j1) (j0 % 16 == 0), with VDPBF16PS from the
// weight in the pairs layout (pack_bf16_pairs), a lane per output column: the bytes bf16_dot_rows
// gives, without its horizontal sums (the absorbed attention's K = 64..256). k % 32 == 0. The bf16
// GEMM takes it where w_pairs is given and k <= 128 or m <= kSmallM.
void bf16_pair_columns(const GemmArgs& g, const uint16_t* a, int64_t lda, const uint32_t* pairs,
                       int64_t j0, int64_t j1);
// Output columns of a pairs-layout tile (one vector lane each), bf16_pair_columns' work unit.
constexpr int64_t kPairCols = 16;
// Output columns per pool work unit of bf16_dot_rows: whole column tiles (two of its 8).
constexpr int64_t kDotTaskCols = 16;
// The prefill kernel's weight panel from the decode layout: W[n0 + j, 128·kb + kk] as f32 at
// out[p·32 + j] for j < 32, p = kk (swap_pairs: kk ^ 1) (64-byte aligned; columns past n are
// zero). Returns false, doing nothing, where g has no decode layout, n0 % 32 != 0, or the CPU or
// the DecodeGemm setting says no.
bool decode_layout_f32_panel(const GemmArgs& g, int64_t n0, int64_t kb, float* out,
                             bool swap_pairs);
// Batch-invariant mode on a CPU whose BF16 dot products add a K pair odd K first: the prefill
// kernel then sums each pair (2i, 2i + 1) in that order too (k % 128 == 0 fp8 only), so the decode
// layout kernel and it agree bit for bit.
bool invariant_pairs_swapped(const GemmArgs& g);
// Whether bf16 GEMMs of inner size k take AMX tile products at every M (amx_bf16_columns):
// amx_active() and k % 32 == 0. Their rows sum in TDPBF16PS's order (docs/numerics.md §10).
bool amx_bf16_gemm(int64_t k);
// uint32 elements of m rows of k in the pairs layout (amx_bf16_pack).
size_t amx_bf16_pairs_size(int64_t m, int64_t k);
// The pairs layout, the B tiles of amx_bf16_columns: rows in chunks of 16 (the last chunk zero-
// padded to 16 rows where m > 16), each chunk [k / 2 pairs][min(m, 16) rows] of (a[r][2p],
// a[r][2p + 1]) as one uint32. a: m rows of k bf16, row stride lda.
void amx_bf16_pack(int64_t m, int64_t k, const uint16_t* a, int64_t lda, uint32_t* out);
// bf16 GEMM g, every row, output columns [j0, j1), on AMX tiles: the weight rows
// are the A tiles, read in place, the activations (pairs: amx_bf16_pack of g's rows) the B tiles.
// A row's sum order depends on k only. The calling thread keeps its tile configuration for the next
// call until release_amx_tiles.
void amx_bf16_columns(const GemmArgs& g, const uint32_t* pairs, int64_t j0, int64_t j1);
// Ends this thread's use of the AMX tiles (at the end of each pool task body).
void release_amx_tiles();
// Which decode kernel serves m <= kSmallM (the harness and the bench check each of them):
//  - invariant: batch invariant (docs/numerics.md §10): a row's bytes do not depend on M. fp8
//    rows of every M sum in the prefill kernel's order: M <= kSmallM from the decode layout where
//    given and the CPU's BF16 dot products add a pair one product at a time (checked once; the
//    prefill kernel then takes the pair in the same order), else in the prefill kernel itself. bf16
//    rows of every M sum in the Highway decode kernel's order (8 rows a pass).
//  - automatic: invariant under DEEPINFER_BATCH_INVARIANT=on; otherwise the decode layout where
//    given, else VBMI rows, else Highway (faster where there is no decode layout, and bf16, but a
//    row of M <= 8 then sums in another order than the same row in a larger call).
//  - rows = VBMI rows even where a decode layout is given; generic = the Highway kernel.
// The prefill kernel reads its weight panels from the decode layout under automatic and invariant.
enum class DecodeGemm { automatic, invariant, rows, generic };
void set_decode_gemm(DecodeGemm k);
// Whether m <= kSmallM GEMMs run in the batch-invariant order now (see DecodeGemm).
bool small_m_invariant();

}  // namespace deepinfer::kernels::cpu
