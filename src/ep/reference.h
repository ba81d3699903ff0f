// Host reference for EP dispatch/combine: sees every rank's inputs and computes what each rank
// must receive and what combine must return, directly from docs/ep.md §4-§5 (no packing, no
// collectives). Also the deterministic input generator: inputs are a function of (seed, rank),
// so every rank regenerates all ranks' inputs without communication.
#pragma once

#include <deepinfer/ep.h>

#include <cstdint>
#include <vector>

namespace deepinfer::ep::ref {

struct GenParams {
  uint64_t seed = 1;
  int world = 1;
  EPConfig cfg;  // E, H, K, M, dispatch dtype are used
};

// One rank's dispatch input as plain vectors.
struct RankInput {
  int64_t num_tokens = 0;
  std::vector<uint8_t> x;                       // [T, H·elem] bytes (bf16 or e4m3)
  std::vector<float> scales;                    // [T, P] (fp8)
  std::vector<int64_t> topk_idx;                // [T, K]
  std::vector<float> weights;                   // [T, K]
  DispatchInput as_input(const EPConfig& cfg);  // borrows the vectors
};

// Uneven routing: some ranks have 0 tokens, T differs per rank, some experts get no token,
// masked slots, and a token masked in all slots.
RankInput make_input(const GenParams& p, int rank);

// Expert output of global token `gtok` for key (expert id in expand mode, E + rank otherwise).
uint16_t y_value(uint64_t seed, int64_t gtok, int64_t key, int h);

struct ExpectedDispatch {
  int64_t num_recv = 0;                           // N
  std::vector<int64_t> per_rank;                  // [W]
  std::vector<int64_t> count_raw, count_aligned;  // [L]
  // Non-expand rows [N] or expand rows [S]:
  std::vector<uint8_t> x;         // [rows, H·elem]
  std::vector<float> scales;      // [rows, P]
  std::vector<int64_t> topk_idx;  // [N, K] or [S]
  std::vector<float> weights;     // [N, K] or [S]
  std::vector<int64_t> src;       // [rows]
};
ExpectedDispatch expected_dispatch(const std::vector<RankInput>& all, const EPConfig& cfg,
                                   int world, int me);

// Combined output of rank `me`'s tokens: [T, H] bf16 bits, and weights [T, K].
// exact: Σ_k w_k·y_k in fp32, slot order, one rounding (independent of world).
// fast: per-rank partials in slot order rounded to bf16, summed in ascending rank order.
// token_offset[r] = global index of rank r's first token.
struct ExpectedCombine {
  std::vector<uint16_t> x;
  std::vector<float> weights;
};
ExpectedCombine expected_combine(const std::vector<RankInput>& all, const EPConfig& cfg, int world,
                                 int me, uint64_t seed, const std::vector<int64_t>& token_offset);

}  // namespace deepinfer::ep::ref
