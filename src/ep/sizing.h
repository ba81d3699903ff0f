// EP sizing in one place: the packed record of one dispatched token, and the capacities of
// every reusable buffer EPBuffer keeps (a size hint, as DeepEP's Config owns its buffer maths).
#pragma once

#include <deepinfer/ep.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer::ep {

constexpr size_t kRecordAlign = 8;  // bytes; every record part starts 8-byte aligned

constexpr size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// One dispatched token as bytes: [x | scales | weights | topk_idx | src_token?].
// ag knows the source token from the row position; a2a carries it.
struct RecordLayout {
  bool has_x = true;       // false: the x row travels apart (a2a over all_to_all_v_rows)
  size_t x_bytes = 0;      // H · sizeof(x elem), in the record or apart
  size_t scale_bytes = 0;  // P · 4
  size_t off_scales = 0, off_weights = 0, off_idx = 0, off_token = 0;
  size_t bytes = 0;  // total, multiple of kRecordAlign
};
RecordLayout record_layout(const EPConfig& cfg, bool with_token);
// [scales | weights | idx | token]: the a2a record when x rows are sent apart.
RecordLayout meta_layout(const EPConfig& cfg);

// Floats per token row in the ag combine reduction: exact = K products of H + K weights,
// fast = one H partial + K weights.
size_t ag_combine_cols(const EPConfig& cfg);

struct EpSizes {
  RecordLayout ag_record, a2a_record, a2a_meta;
  size_t ag_send_bytes = 0;         // M records
  size_t ag_recv_bytes = 0;         // W · M records
  size_t a2a_send_bytes = 0;        // worst case: every token to min(W, K) ranks
  size_t a2a_recv_bytes = 0;        // W · M records (each source sends a token at most once)
  size_t combine_chunk_rows = 0;    // ag combine rows per rank per chunk (>= 1)
  size_t combine_chunk_floats = 0;  // W · chunk_rows · cols
};
// The single sizing function (a size hint): the bounds EPBuffer's reusable buffers grow towards
// (on demand, never shrinking) and the ag combine chunking.
EpSizes ep_size_hint(const EPConfig& cfg, int world);

}  // namespace deepinfer::ep
