// fp8 decode GEMM on AVX512-VBMI + AVX512-BF16. Decode (M <= 8) streams the weights once, so the
// per-byte decode cost decides the speed: here an e4m3 code becomes bf16 (exact: 4 exponent and 3
// mantissa bits fit) with two 128-entry byte lookups (VPERMI2B, low/high byte of the bf16 code)
// and an interleave, 64 codes at a time, and VDPBF16PS multiplies pairs and accumulates in f32.
// Products of two e4m3 values are exact in f32 and are multiples of 2^-18, so the flush of f32
// denormals VDPBF16PS applies never changes anything; only the f32 summation order differs from
// the host (DESIGN §2), as in the generic kernel. The interleave permutes elements within each
// 64-code group; activations go through the same decode, so pairs still line up.
#include <algorithm>
#include <array>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/registry.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace deepinfer::kernels::cpu {
namespace {

#define DI_BF16DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16")))

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

struct Decoder {
  __m512i lo0, lo1, hi0, hi1, sign;
  DI_BF16DOT_TARGET Decoder() {
    const Tables& t = tables();
    lo0 = _mm512_load_si512(t.lo.data());
    lo1 = _mm512_load_si512(t.lo.data() + 64);
    hi0 = _mm512_load_si512(t.hi.data());
    hi1 = _mm512_load_si512(t.hi.data() + 64);
    sign = _mm512_set1_epi8(char(0x80));
  }
  // 64 e4m3 codes -> two vectors of 32 bf16 (a fixed permutation of the 64 positions).
  DI_BF16DOT_TARGET inline void decode(const uint8_t* p, __m512i& v0, __m512i& v1) const {
    const __m512i codes = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);  // index bit 7 (sign) is ignored
    __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);
    hi = _mm512_or_si512(hi, _mm512_and_si512(codes, sign));
    v0 = _mm512_unpacklo_epi8(lo, hi);
    v1 = _mm512_unpackhi_epi8(lo, hi);
  }
};

template <int MM>
DI_BF16DOT_TARGET void Range(const GemmArgs& g, const __m512i* act, int64_t j0, int64_t j1) {
  const Decoder dec;
  const int64_t K = g.k, kbs = K / 128;
  const auto* w = static_cast<const uint8_t*>(g.w);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* wrow = w + size_t(j) * size_t(K);
    const float* sw_row = g.w_scales + (j / 128) * kbs;
    __m512 acc[MM];
    for (int r = 0; r < MM; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < kbs; ++kb) {
      __m512i w0, w1, w2, w3;
      dec.decode(wrow + kb * 128, w0, w1);
      dec.decode(wrow + kb * 128 + 64, w2, w3);
      const float sw = sw_row[kb];
      for (int r = 0; r < MM; ++r) {
        const __m512i* a = act + (size_t(r) * size_t(kbs) + size_t(kb)) * 4;
        __m512 p0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), __m512bh(a[0]), __m512bh(w0));
        __m512 p1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), __m512bh(a[1]), __m512bh(w1));
        p0 = _mm512_dpbf16_ps(p0, __m512bh(a[2]), __m512bh(w2));
        p1 = _mm512_dpbf16_ps(p1, __m512bh(a[3]), __m512bh(w3));
        acc[r] = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(g.a_scales[r * kbs + kb] * sw), acc[r]);
      }
    }
    for (int r = 0; r < MM; ++r) {
      const float v = _mm512_reduce_add_ps(acc[r]);
      if (g.out) g.out[r * g.n + j] = f32_to_bf16(v);
      else g.out_f32[r * g.n + j] = v;
    }
  }
}

DI_BF16DOT_TARGET void Run(const GemmArgs& g) {
  const int64_t kbs = g.k / 128;
  // Activations decoded once into the same permuted bf16 layout: [m][kb][4 vectors].
  std::vector<__m512i> act(size_t(g.m * kbs * 4));
  {
    const Decoder dec;
    const auto* a = static_cast<const uint8_t*>(g.a);
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t kb = 0; kb < kbs; ++kb) {
        __m512i* dst = act.data() + (size_t(r) * size_t(kbs) + size_t(kb)) * 4;
        dec.decode(a + r * g.k + kb * 128, dst[0], dst[1]);
        dec.decode(a + r * g.k + kb * 128 + 64, dst[2], dst[3]);
      }
  }
  auto body = [&](int64_t j0, int64_t j1) {
    switch (g.m) {
      case 1: Range<1>(g, act.data(), j0, j1); break;
      case 2: Range<2>(g, act.data(), j0, j1); break;
      case 3: Range<3>(g, act.data(), j0, j1); break;
      case 4: Range<4>(g, act.data(), j0, j1); break;
      case 5: Range<5>(g, act.data(), j0, j1); break;
      case 6: Range<6>(g, act.data(), j0, j1); break;
      case 7: Range<7>(g, act.data(), j0, j1); break;
      default: Range<8>(g, act.data(), j0, j1); break;
    }
  };
  const int64_t threads = kernel_pool().num_threads();
  kernel_pool().parallel_for(g.n, std::max<int64_t>(16, g.n / (4 * threads)), body);
}

bool cpu_has_bf16dot() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

}  // namespace

bool gemm_fp8_small_m_bf16dot(const GemmArgs& g) {
  if (g.bf16_inputs || g.m < 1 || g.m > kSmallM || g.k % 128 != 0 || !g.a_scales || !g.w_scales) return false;
  if (!cpu_has_bf16dot()) return false;
  Run(g);
  return true;
}

}  // namespace deepinfer::kernels::cpu

#else
namespace deepinfer::kernels::cpu {
bool gemm_fp8_small_m_bf16dot(const GemmArgs&) { return false; }
}  // namespace deepinfer::kernels::cpu
#endif
