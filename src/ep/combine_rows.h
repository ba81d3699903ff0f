// What the combine lowerings share about an expert rank's own rows: where the y row of a
// (received row, slot) is, and the fast mode's per-row partial. The arithmetic is row_math's.
#pragma once

#include <array>
#include <cstdint>

#include "ep/handle.h"
#include "ep/row_math.h"

namespace deepinfer::ep {

// y row of received row i for slot j (expand: that slot's expanded row).
inline const uint16_t* y_row(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                             int j) {
  const int64_t row = cfg.expand ? h.expand_slot[size_t(i * cfg.num_topk + j)] : i;
  return y + size_t(row) * size_t(cfg.hidden);
}

// partial[h] = canon(bf16(Σ_local w_k·y_k[h])) in slot order (fast mode), as bf16 bits and/or
// their f32 values.
inline void local_partial(const EPConfig& cfg, const HandleData& h, const uint16_t* y, int64_t i,
                          uint16_t* bits, float* f32) {
  const int k = cfg.num_topk;
  std::array<float, 64> w;
  std::array<const uint16_t*, 64> rows;
  int m = 0;
  for (int j = 0; j < k; ++j) {
    if (h.recv_local_idx[size_t(i * k + j)] < 0) continue;
    w[size_t(m)] = h.recv_weights[size_t(i * k + j)];
    rows[size_t(m++)] = y_row(cfg, h, y, i, j);
  }
  rows::weighted_sum(w.data(), rows.data(), m, size_t(cfg.hidden), true, bits, f32);
}

}  // namespace deepinfer::ep
