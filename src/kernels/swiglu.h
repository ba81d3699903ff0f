// SwiGLU (+ fused routing weight and per-token fp8 cast): docs/numerics.md §4,
// docs/architecture.md §5.
//
// y = bf16(silu(g) * u * w_row), silu(g) = g * sigmoid(g), computed in fp32 (host: fp64),
// rounded once; w_row = 1 without row weights. The fused cast quantizes that bf16 y 1x128
// exactly as quant_per_token does (token_cast.h).
#pragma once

#include <deepinfer/dtype.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "kernels/quant.h"
#include "kernels/registry.h"

namespace deepinfer::kernels {

// Set y, or q + scales (fused cast), or all three. For a fused gate_up GEMM output
// [T, 2I] = [gate | up] pass gate = gate_up, up = gate_up + I (in_stride 0 means 2I).
struct SwigluParams {
  const bf16* gate = nullptr;         // [T, in_stride] bf16, first I channels used
  const bf16* up = nullptr;           // [T, in_stride] bf16, first I channels used
  const float* row_weight = nullptr;  // [T] f32 (routing weight per row) or null (= 1)
  bf16* y = nullptr;                  // [T, out_stride] bf16 or null
  fp8_e4m3* q = nullptr;              // [T, I] e4m3 (row stride I) or null
  float* scales = nullptr;            // [T, num_blocks(I)] f32, with q
  int64_t num_tokens = 0;             // T
  int64_t inter = 0;                  // I
  int64_t in_stride = 0;              // elements between rows of gate / up (0 = 2I)
  int64_t out_stride = 0;             // elements between rows of y (0 = I)
  bool ue8m0 = false;                 // fused cast: power-of-two scales

  int64_t x_stride() const { return in_stride ? in_stride : 2 * inter; }
  int64_t y_stride() const { return out_stride ? out_stride : inter; }
  void validate() const;
};

void swiglu(const SwigluParams& p);

namespace host {
void swiglu(const SwigluParams& p);
}
namespace cpu {
void swiglu(const SwigluParams& p);
}

template <>
struct OpSpec<SwigluParams> {
  static constexpr const char* name = "swiglu";
  static std::string shape(const SwigluParams& p) {
    return fmt::format("t={} i={}{}{}{}", p.num_tokens, p.inter, p.row_weight ? " weighted" : "",
                       p.q ? " fp8" : "", p.ue8m0 ? " ue8m0" : "");
  }
  template <class V>
  static void visit(SwigluParams& p, V& v) {
    const int64_t rows = p.num_tokens;
    v.in("gate", p.gate, rows ? (rows - 1) * p.x_stride() + p.inter : 0);
    v.in("up", p.up, rows ? (rows - 1) * p.x_stride() + p.inter : 0);
    v.in("row_weight", p.row_weight, rows);
    v.out("y", p.y, rows ? (rows - 1) * p.y_stride() + p.inter : 0);
    v.out("q", p.q, rows * p.inter);
    v.out("scales", p.scales, rows * num_blocks(p.inter));
  }
};

}  // namespace deepinfer::kernels
