// `deepinfer diff` core (docs/architecture.md §5): a Recorder that replays every kernel call on the
// `host` backend as it happens, compares the outputs and keeps one summary row per call (never the
// tensors), plus the ranking, per-op summary, EP merge and report formatting.
//
//   DiffRecorder rec;                      // thread-safe; rank threads bind their rank
//   { ScopedRecorder on(&rec); DiffRankScope r(rec, group.rank()); run_model(); }
//   auto rows = gather_diff_rows(group, rec.rows(group.rank()));   // rank 0 gets every rank's rows
//   DiffReport rep = make_report(rows, {.top = 20});
#pragma once

#include <deepinfer/comm.h>
#include <deepinfer/dtype.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/recorder.h"

namespace deepinfer::kernels::diff {

// Allowed ‖a−b‖₂/‖b‖₂ of one output tensor (b = host), by output element type. The same figures as
// the op harness (src/kernels/testing/cases_*.cpp): cpu and host round differently in bf16/fp8 and
// sum in different orders in f32. Integer outputs (router ids, sampled tokens) must match exactly.
struct DiffTolerance {
  double f32 = 1e-5;
  double bf16 = 2e-3;
  double fp8 = 2e-2;
  double attention = 2e-3;  // mla_* outputs (incl. the f32 LSE): fp32 softmax in another order
};

// Tolerance of output `dtype` of `op`; 0 = exact.
double tolerance_for(std::string_view op, DType dtype, const DiffTolerance& tol = {});

// One output buffer of one call compared with its host replay.
struct BufferDiff {
  double max_abs = 0;  // max |a−b| over finite pairs (integers: max |a−b| too)
  double rel_err = 0;  // ‖a−b‖₂/‖b‖₂ over finite pairs; integers: fraction of differing elements
  int64_t over_tol = 0;  // elements with |a−b| > tol·max(|b|, rms(b)) (integers: any difference)
  int64_t nonfinite = 0;  // NaN/inf in a or b that the other side does not match exactly
  int64_t nan_a = 0;      // NaN in the backend output (never passes)
  int64_t numel = 0;
};

// Compares flat buffers a (backend) and b (host reference). Matching infinities count as equal.
BufferDiff compare_buffer(DType dtype, const void* a, const void* b, int64_t numel, double tol);

// One recorded call: the worst output of the call (by score) is summarised.
struct DiffRow {
  int32_t rank = 0;
  std::string op;
  std::string tag;
  uint64_t index = 0;
  std::string shape;
  std::string output;  // the output buffer the figures are from, e.g. "out"
  double max_abs = 0;
  double rel_err = 0;
  double tol = 0;
  int64_t over_tol = 0;
  int64_t nonfinite = 0;  // NaN/inf mismatches, both sides
  int64_t numel = 0;

  bool bad() const;      // over tolerance or any NaN/inf mismatch
  double score() const;  // ranking key: +inf with NaN/inf, else rel_err/tol (tol 0: rel_err·1e12)
};

// Sorts worst first: score descending, ties by rank, op, index (deterministic).
void rank_rows(std::vector<DiffRow>& rows);

struct OpSummary {
  std::string op;
  int64_t calls = 0;
  int64_t bad_calls = 0;
  double worst_rel = 0;
  double median_rel = 0;
  double tol = 0;  // the tolerance of its worst call
  int64_t nonfinite = 0;
};

// Per-op summary, ops sorted by name.
std::vector<OpSummary> summarize(const std::vector<DiffRow>& rows);

// The recorder. Replays each call on host inside on_call and stores one row; memory grows by one
// row per call (never tensors). Rows are kept per rank (the rank bound to the calling thread with
// DiffRankScope; 0 if none).
class DiffRecorder final : public Recorder {
 public:
  explicit DiffRecorder(DiffTolerance tol = {}) : tol_(tol) {}
  void on_call(const KernelCall& call) override;

  std::vector<DiffRow> rows(int rank) const;  // in call order
  std::vector<DiffRow> all_rows() const;      // every rank, rank order then call order
  int64_t calls() const;

 private:
  friend class DiffRankScope;
  DiffTolerance tol_;
  mutable std::mutex mu_;
  std::map<int, std::vector<DiffRow>> rows_;
};

// Binds the calling thread's kernel calls to `rank` for the scope.
class DiffRankScope {
 public:
  DiffRankScope(DiffRecorder& rec, int rank);
  ~DiffRankScope();
  DiffRankScope(const DiffRankScope&) = delete;
  DiffRankScope& operator=(const DiffRankScope&) = delete;

 private:
  int saved_;
};

// Rows <-> bytes (for the EP merge over Group byte collectives).
std::string serialize_rows(const std::vector<DiffRow>& rows);
std::vector<DiffRow> deserialize_rows(const std::string& bytes);

// Collective: every rank passes its rows; every rank gets all ranks' rows, in rank order.
std::vector<DiffRow> gather_diff_rows(Group& group, const std::vector<DiffRow>& local);

struct ReportOptions {
  int top = 20;
};

struct DiffReport {
  std::vector<DiffRow> ranked;  // every row, worst first
  std::vector<OpSummary> ops;
  int64_t calls = 0;
  int64_t bad_calls = 0;
  bool ok() const { return bad_calls == 0; }
};

DiffReport make_report(std::vector<DiffRow> rows);

// The human-readable tables (top `opts.top` calls, then the per-op summary, then a verdict line).
std::string format_report(const DiffReport& rep, const ReportOptions& opts);
// The whole report as JSON: {"calls":..,"bad_calls":..,"ok":..,"ops":[..],"ranked":[top rows]}.
std::string report_json(const DiffReport& rep, const ReportOptions& opts);

}  // namespace deepinfer::kernels::diff
