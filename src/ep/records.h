// Dispatch records: packing a token into one, and the received rows every dispatch lowering
// lists for the common unpack (ep_buffer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ep/context.h"
#include "ep/handle.h"
#include "ep/sizing.h"

namespace deepinfer::ep {

// A received row and where it came from: where its x bytes, scales (fp8), K weights and K ids
// are (in a record, or in the source rank's own arrays).
struct RowRef {
  int32_t src_rank;
  int32_t src_token;
  const std::byte* x;
  const std::byte* scales;
  const std::byte* weights;
  const std::byte* idx;
};
// The fields of a packed record `rec` (x at x, in the record or apart).
inline RowRef record_row(const RecordLayout& rl, int32_t src_rank, int32_t src_token,
                         const std::byte* x, const std::byte* rec) {
  return {src_rank, src_token, x, rec + rl.off_scales, rec + rl.off_weights, rec + rl.off_idx};
}

// Everything a record is packed from.
struct PackSource {
  const std::byte* x;    // [T, x_bytes]
  const float* scales;   // [T, P] or null
  const float* weights;  // [T, K]
  const int64_t* idx;    // [T, K]
};

// Token t of s as a record of rl at dst (with its token id where with_token). Every byte is
// written once: no memset of the whole record first, which would double this copy's stores.
// Inline: the pack loops are copy-bound.
inline void pack_record(const RecordLayout& rl, const PackSource& s, int p, int k, int64_t t,
                        std::byte* dst, bool with_token) {
  auto zero = [&](size_t from, size_t to) {
    if (to > from) std::memset(dst + from, 0, to - from);
  };
  if (rl.has_x) std::memcpy(dst, s.x + size_t(t) * rl.x_bytes, rl.x_bytes);
  zero(rl.has_x ? rl.x_bytes : 0, rl.off_scales);
  if (rl.scale_bytes) std::memcpy(dst + rl.off_scales, s.scales + t * p, rl.scale_bytes);
  zero(rl.off_scales + rl.scale_bytes, rl.off_weights);
  std::memcpy(dst + rl.off_weights, s.weights + t * k, size_t(k) * 4);
  zero(rl.off_weights + size_t(k) * 4, rl.off_idx);
  std::memcpy(dst + rl.off_idx, s.idx + t * k, size_t(k) * 8);
  if (with_token) std::memcpy(dst + rl.off_token, &t, 8);
  zero(rl.off_token + (with_token ? 8 : 0), rl.bytes);
}

// Padding row of the ag all_gather: no expert selects it.
inline void pack_padding(const RecordLayout& rl, int k, std::byte* dst) {
  std::memset(dst, 0, rl.bytes);
  const int64_t masked = -1;
  for (int j = 0; j < k; ++j) std::memcpy(dst + rl.off_idx + size_t(j) * 8, &masked, 8);
}

// The a2a rows received into `recv` as records of rl, source ranks in order, with their x in the
// record or, given x_apart, at the same position there.
void list_received(const Context& c, const HandleData& h, const RecordLayout& rl,
                   const std::byte* recv, const std::byte* x_apart, std::vector<RowRef>& rows);

// This rank's tokens grouped by destination rank, ascending within each (h.send_offsets,
// h.send_tokens): one pass counts, one places.
void build_send_lists(const Context& c, HandleData& h);

// The rows an a2a dispatch brings this rank: its column of the split matrix.
int64_t a2a_recv_rows(const Context& c, const HandleData& h);

}  // namespace deepinfer::ep
