#include "ep/sizing.h"

#include <algorithm>

namespace deepinfer::ep {

RecordLayout record_layout(const EPConfig& cfg, bool with_token) {
  RecordLayout r;
  const size_t x_elem = cfg.dispatch_dtype == DispatchDType::fp8 ? 1 : 2;
  const size_t k = size_t(cfg.num_topk);
  r.x_bytes = size_t(cfg.hidden) * x_elem;
  r.scale_bytes = size_t(cfg.scale_cols()) * 4;
  r.off_scales = align_up(r.x_bytes, kRecordAlign);
  r.off_weights = align_up(r.off_scales + r.scale_bytes, kRecordAlign);
  r.off_idx = align_up(r.off_weights + k * 4, kRecordAlign);
  r.off_token = r.off_idx + k * 8;
  r.bytes = align_up(r.off_token + (with_token ? 8 : 0), kRecordAlign);
  return r;
}

RecordLayout meta_layout(const EPConfig& cfg) {
  RecordLayout r = record_layout(cfg, true);
  const size_t shift = r.off_scales;  // drop the x region; every later field moves down as one
  r.has_x = false;
  r.off_scales -= shift;
  r.off_weights -= shift;
  r.off_idx -= shift;
  r.off_token -= shift;
  r.bytes -= shift;
  return r;
}

size_t ag_combine_cols(const EPConfig& cfg) {
  const size_t h = size_t(cfg.hidden), k = size_t(cfg.num_topk);
  return (cfg.combine == CombineMode::exact ? k * h : h) + k;
}

EpSizes ep_size_hint(const EPConfig& cfg, int world) {
  EpSizes s;
  const size_t w = size_t(world), m = size_t(cfg.num_max_tokens_per_rank);
  s.ag_record = record_layout(cfg, false);
  s.a2a_record = record_layout(cfg, true);
  s.a2a_meta = meta_layout(cfg);
  s.ag_send_bytes = m * s.ag_record.bytes;
  s.ag_recv_bytes = w * m * s.ag_record.bytes;
  s.a2a_send_bytes = m * std::min(w, size_t(cfg.num_topk)) * s.a2a_record.bytes;
  s.a2a_recv_bytes = w * m * s.a2a_record.bytes;
  const size_t row_bytes = w * ag_combine_cols(cfg) * 4;
  s.combine_chunk_rows = std::max<size_t>(1, cfg.chunk_bytes / row_bytes);
  s.combine_chunk_rows = std::min(s.combine_chunk_rows, std::max<size_t>(m, 1));
  s.combine_chunk_floats = w * s.combine_chunk_rows * ag_combine_cols(cfg);
  return s;
}

}  // namespace deepinfer::ep
