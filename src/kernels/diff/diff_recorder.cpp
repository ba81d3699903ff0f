#include "kernels/diff/diff_recorder.h"

#include <deepinfer/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/element.h"

namespace deepinfer::kernels::diff {

namespace {

thread_local int t_rank = 0;

// A byte-oriented writer/reader for the EP merge (host byte order: ranks share one machine type).
struct Writer {
  std::string out;
  template <class T>
  void pod(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod(uint32_t(s.size()));
    out += s;
  }
};
struct Reader {
  const std::string& in;
  size_t pos = 0;
  template <class T>
  T pod() {
    DI_CHECK(pos + sizeof(T) <= in.size(), "diff: truncated row data ({} bytes)", in.size());
    T v;
    std::memcpy(&v, in.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = pod<uint32_t>();
    DI_CHECK(pos + n <= in.size(), "diff: truncated row data ({} bytes)", in.size());
    std::string s = in.substr(pos, n);
    pos += n;
    return s;
  }
};

std::string json_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      o += fmt::format("\\u{:04x}", int(c));
    else
      o += c;
  }
  return o;
}

std::string json_num(double v) {
  if (std::isnan(v)) return "null";
  if (std::isinf(v)) return v > 0 ? "1e308" : "-1e308";
  return fmt::format("{:.6g}", v);
}

std::string fmt_sci(double v) {
  return std::isfinite(v) ? fmt::format("{:.3e}", v) : fmt::format("{}", v);
}

}  // namespace

double tolerance_for(std::string_view op, DType dtype, const DiffTolerance& tol) {
  if (!dtype_is_float(dtype)) return 0;
  if (op.starts_with("mla_")) return tol.attention;
  switch (dtype) {
    case DType::bf16:
      return tol.bf16;
    case DType::e4m3:
    case DType::e5m2:
      return tol.fp8;
    default:
      return tol.f32;
  }
}

BufferDiff compare_buffer(DType dtype, const void* a, const void* b, int64_t numel, double tol) {
  BufferDiff d;
  d.numel = numel;
  if (!dtype_is_float(dtype)) {
    for (int64_t i = 0; i < numel; ++i) {
      const double x = load_as_double(dtype, a, i), y = load_as_double(dtype, b, i);
      if (x != y) {
        ++d.over_tol;
        d.max_abs = std::max(d.max_abs, std::fabs(x - y));
      }
    }
    d.rel_err = numel ? double(d.over_tol) / double(numel) : 0.0;
    return d;
  }
  // Pass 1: norms over finite pairs, and the non-finite mismatches.
  double diff2 = 0, ref2 = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const double x = load_as_double(dtype, a, i), y = load_as_double(dtype, b, i);
    if (std::isnan(x)) ++d.nan_a;
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!(x == y)) ++d.nonfinite;  // NaN never equals; matching infinities do
      continue;
    }
    diff2 += (x - y) * (x - y);
    ref2 += y * y;
    d.max_abs = std::max(d.max_abs, std::fabs(x - y));
    ++finite;
  }
  if (ref2 > 0)
    d.rel_err = std::sqrt(diff2 / ref2);
  else
    d.rel_err = diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  // Pass 2: elements over the per-element bound tol·max(|b|, rms(b)) (rms keeps near-zero
  // elements from counting as huge relative errors).
  const double rms = finite ? std::sqrt(ref2 / double(finite)) : 0.0;
  for (int64_t i = 0; i < numel; ++i) {
    const double x = load_as_double(dtype, a, i), y = load_as_double(dtype, b, i);
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    if (std::fabs(x - y) > tol * std::max(std::fabs(y), rms)) ++d.over_tol;
  }
  return d;
}

bool DiffRow::bad() const { return nonfinite > 0 || rel_err > tol; }

double DiffRow::score() const {
  if (nonfinite > 0) return std::numeric_limits<double>::infinity();
  if (tol > 0) return rel_err / tol;
  return rel_err * 1e12;  // exact outputs: any difference outranks every in-tolerance float
}

void rank_rows(std::vector<DiffRow>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const DiffRow& x, const DiffRow& y) {
    const double sx = x.score(), sy = y.score();
    if (sx != sy) return sx > sy;
    if (x.nonfinite != y.nonfinite) return x.nonfinite > y.nonfinite;
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.op != y.op) return x.op < y.op;
    return x.index < y.index;
  });
}

std::vector<OpSummary> summarize(const std::vector<DiffRow>& rows) {
  std::map<std::string, std::vector<const DiffRow*>> by_op;
  for (const auto& r : rows) by_op[r.op].push_back(&r);
  std::vector<OpSummary> out;
  for (auto& [op, rs] : by_op) {
    OpSummary s;
    s.op = op;
    s.calls = int64_t(rs.size());
    std::vector<double> rels;
    const DiffRow* worst = nullptr;
    for (const DiffRow* r : rs) {
      s.bad_calls += r->bad();
      s.nonfinite += r->nonfinite;
      rels.push_back(r->rel_err);
      if (!worst || r->score() > worst->score()) worst = r;
    }
    std::sort(rels.begin(), rels.end());
    s.worst_rel = rels.back();
    s.median_rel = rels[rels.size() / 2];
    s.tol = worst->tol;
    out.push_back(std::move(s));
  }
  return out;
}

// ---- recorder --------------------------------------------------------------------------------

void DiffRecorder::on_call(const KernelCall& call) {
  DiffRow row;
  row.rank = t_rank;
  row.op = std::string(call.op);
  row.tag = std::string(call.tag);
  row.index = call.index;
  row.shape = call.shape;
  // The host replay owns its outputs; they die at the end of this call (bounded memory).
  const std::vector<Tensor> ref = call.replay_on_host();
  DI_CHECK(ref.size() == call.outputs.size(),
           "diff: host replay of {} gave {} outputs, expected {}", call.op, ref.size(),
           call.outputs.size());
  bool first = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    const CallBuffer& out = call.outputs[i];
    const double tol = tolerance_for(call.op, out.dtype, tol_);
    const BufferDiff d = compare_buffer(out.dtype, out.data, ref[i].raw(), out.numel, tol);
    DiffRow cand = row;
    cand.output = out.name;
    cand.max_abs = d.max_abs;
    cand.rel_err = d.rel_err;
    cand.tol = tol;
    cand.over_tol = d.over_tol;
    cand.nonfinite = d.nonfinite;
    cand.numel = d.numel;
    if (first || cand.score() > row.score()) row = std::move(cand);
    first = false;
  }
  std::lock_guard lk(mu_);
  rows_[row.rank].push_back(std::move(row));
}

std::vector<DiffRow> DiffRecorder::rows(int rank) const {
  std::lock_guard lk(mu_);
  auto it = rows_.find(rank);
  return it == rows_.end() ? std::vector<DiffRow>{} : it->second;
}

std::vector<DiffRow> DiffRecorder::all_rows() const {
  std::lock_guard lk(mu_);
  std::vector<DiffRow> out;
  for (const auto& [r, rs] : rows_) out.insert(out.end(), rs.begin(), rs.end());
  return out;
}

int64_t DiffRecorder::calls() const {
  std::lock_guard lk(mu_);
  int64_t n = 0;
  for (const auto& [r, rs] : rows_) n += int64_t(rs.size());
  return n;
}

DiffRankScope::DiffRankScope(DiffRecorder&, int rank) : saved_(t_rank) { t_rank = rank; }
DiffRankScope::~DiffRankScope() { t_rank = saved_; }

// ---- EP merge --------------------------------------------------------------------------------

std::string serialize_rows(const std::vector<DiffRow>& rows) {
  Writer w;
  w.pod(uint64_t(rows.size()));
  for (const auto& r : rows) {
    w.pod(r.rank);
    w.str(r.op);
    w.str(r.tag);
    w.pod(r.index);
    w.str(r.shape);
    w.str(r.output);
    w.pod(r.max_abs);
    w.pod(r.rel_err);
    w.pod(r.tol);
    w.pod(r.over_tol);
    w.pod(r.nonfinite);
    w.pod(r.numel);
  }
  return std::move(w.out);
}

std::vector<DiffRow> deserialize_rows(const std::string& bytes) {
  Reader rd{bytes};
  const auto n = rd.pod<uint64_t>();
  std::vector<DiffRow> rows;
  for (uint64_t i = 0; i < n; ++i) {
    DiffRow r;
    r.rank = rd.pod<int32_t>();
    r.op = rd.str();
    r.tag = rd.str();
    r.index = rd.pod<uint64_t>();
    r.shape = rd.str();
    r.output = rd.str();
    r.max_abs = rd.pod<double>();
    r.rel_err = rd.pod<double>();
    r.tol = rd.pod<double>();
    r.over_tol = rd.pod<int64_t>();
    r.nonfinite = rd.pod<int64_t>();
    r.numel = rd.pod<int64_t>();
    rows.push_back(std::move(r));
  }
  DI_CHECK(rd.pos == bytes.size(), "diff: {} trailing bytes after {} rows", bytes.size() - rd.pos,
           n);
  return rows;
}

std::vector<DiffRow> gather_diff_rows(Group& group, const std::vector<DiffRow>& local) {
  const std::string mine = serialize_rows(local);
  const int W = group.size();
  std::vector<int64_t> sizes(size_t(W), 0);
  const int64_t my_size = int64_t(mine.size());
  group.all_gather(&my_size, sizes.data(), 1, DType::i64);
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, '\0');
  group.all_gather_v(mine.data(), mine.size(), all.data(), counts, DType::u8);
  std::vector<DiffRow> rows;
  size_t off = 0;
  for (int r = 0; r < W; ++r) {
    auto part = deserialize_rows(all.substr(off, counts[size_t(r)]));
    off += counts[size_t(r)];
    for (auto& row : part) row.rank = r;  // the sender's rank, whatever thread binding it had
    rows.insert(rows.end(), std::make_move_iterator(part.begin()),
                std::make_move_iterator(part.end()));
  }
  return rows;
}

// ---- report ----------------------------------------------------------------------------------

DiffReport make_report(std::vector<DiffRow> rows) {
  DiffReport rep;
  rep.calls = int64_t(rows.size());
  for (const auto& r : rows) rep.bad_calls += r.bad();
  rep.ops = summarize(rows);
  rank_rows(rows);
  rep.ranked = std::move(rows);
  return rep;
}

std::string format_report(const DiffReport& rep, const ReportOptions& opts) {
  std::string s;
  const size_t top = std::min(rep.ranked.size(), size_t(std::max(opts.top, 0)));
  s += fmt::format(
      "Kernel calls ranked by error (score = rel_err / tol; NaN/inf first), top {} of {}:\n", top,
      rep.calls);
  s += fmt::format(
      "{:>4} {:>4} {:<28} {:<26} {:>6} {:<40} {:<12} {:>10} {:>10} {:>8} {:>9} {:>6} {:>9} {}\n",
      "#", "rank", "op", "tag", "call", "shape", "output", "max_abs", "rel_err", "tol", "over_tol",
      "nan/inf", "score", "");
  for (size_t i = 0; i < top; ++i) {
    const DiffRow& r = rep.ranked[i];
    s += fmt::format(
        "{:>4} {:>4} {:<28} {:<26} {:>6} {:<40} {:<12} {:>10} {:>10} {:>8.1e} {:>9} {:>6} {:>9} "
        "{}\n",
        i + 1, r.rank, r.op, r.tag.empty() ? "-" : r.tag, r.index, r.shape, r.output,
        fmt_sci(r.max_abs), fmt_sci(r.rel_err), r.tol, r.over_tol, r.nonfinite,
        fmt::format("{:.3g}", r.score()), r.bad() ? "FAIL" : "ok");
  }
  s += "\nPer op:\n";
  s += fmt::format("{:<28} {:>7} {:>7} {:>11} {:>11} {:>8} {:>7}\n", "op", "calls", "bad",
                   "worst_rel", "median_rel", "tol", "nan/inf");
  for (const auto& o : rep.ops)
    s += fmt::format("{:<28} {:>7} {:>7} {:>11} {:>11} {:>8.1e} {:>7}\n", o.op, o.calls,
                     o.bad_calls, fmt_sci(o.worst_rel), fmt_sci(o.median_rel), o.tol, o.nonfinite);
  if (rep.ok())
    s += fmt::format("\nOK: all {} kernel calls within tolerance of the host reference\n",
                     rep.calls);
  else
    s += fmt::format(
        "\nFAIL: {} of {} kernel calls exceed tolerance or produce NaN/inf; worst: {} call {} "
        "({})\n",
        rep.bad_calls, rep.calls, rep.ranked.front().op, rep.ranked.front().index,
        rep.ranked.front().tag.empty() ? "-" : rep.ranked.front().tag);
  return s;
}

std::string report_json(const DiffReport& rep, const ReportOptions& opts) {
  std::string s = fmt::format("{{\"calls\":{},\"bad_calls\":{},\"ok\":{},\"ops\":[", rep.calls,
                              rep.bad_calls, rep.ok() ? "true" : "false");
  for (size_t i = 0; i < rep.ops.size(); ++i) {
    const auto& o = rep.ops[i];
    s += fmt::format(
        "{}{{\"op\":\"{}\",\"calls\":{},\"bad_calls\":{},\"worst_rel\":{},\"median_rel\":{},"
        "\"tol\":{},\"nonfinite\":{}}}",
        i ? "," : "", json_escape(o.op), o.calls, o.bad_calls, json_num(o.worst_rel),
        json_num(o.median_rel), json_num(o.tol), o.nonfinite);
  }
  s += "],\"ranked\":[";
  const size_t top = std::min(rep.ranked.size(), size_t(std::max(opts.top, 0)));
  for (size_t i = 0; i < top; ++i) {
    const auto& r = rep.ranked[i];
    s += fmt::format(
        "{}{{\"rank\":{},\"op\":\"{}\",\"tag\":\"{}\",\"call\":{},\"shape\":\"{}\",\"output\":\"{}"
        "\","
        "\"max_abs\":{},\"rel_err\":{},\"tol\":{},\"over_tol\":{},\"nonfinite\":{},\"numel\":{},"
        "\"score\":{},\"bad\":{}}}",
        i ? "," : "", r.rank, json_escape(r.op), json_escape(r.tag), r.index, json_escape(r.shape),
        json_escape(r.output), json_num(r.max_abs), json_num(r.rel_err), json_num(r.tol),
        r.over_tol, r.nonfinite, r.numel, json_num(r.score()), r.bad() ? "true" : "false");
  }
  s += "]}\n";
  return s;
}

}  // namespace deepinfer::kernels::diff
