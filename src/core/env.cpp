// Environment knobs (docs/architecture.md §9): every DEEPINFER_* variable is parsed and validated
// here.
#include "core/env.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "core/check.h"

extern char** environ;

namespace deepinfer {
namespace {

// The single table of knobs: the parser, the unknown-name check and the docs all read it.
constexpr std::array<KnobDoc, 19> kKnobDocs{{
    {"DEEPINFER_COMM", "local, mpi", "local",
     "collective backend: `local` = one thread per rank, `mpi` = one process per rank (mpirun)"},
    {"DEEPINFER_COMM_TIMEOUT_S", "number > 0", "60",
     "deadline in seconds for every collective; a missed deadline is a CommTimeout"},
    {"DEEPINFER_EP_ALGO", "ag, a2a, auto", "auto",
     "expert-parallel dispatch: all-gather, all-to-all, or chosen from the backend's capabilities"},
    {"DEEPINFER_EP_AG_ROWS", "max, cap", "max",
     "all-gather dispatch row count: the max over ranks, or a fixed capacity"},
    {"DEEPINFER_EP_REDUCE", "rs, ar", "rs", "all-gather combine: reduce-scatter or all-reduce"},
    {"DEEPINFER_EP_CHUNK_BYTES", "integer >= 4096, suffix K/M/G allowed", "64M",
     "largest single collective message EP issues; bigger transfers are split"},
    {"DEEPINFER_EP_COMBINE", "exact, fast", "exact",
     "combine order: `exact` = bit-identical to single rank, `fast` = backend reduction order"},
    {"DEEPINFER_EP_PEER_MEMORY", "auto, on, off", "auto",
     "a2a where the ranks share memory (local, or mpi on one host): combine (and on local "
     "dispatch) reads the peers' buffers in place instead of exchanging them; auto: once a call "
     "moves >= 256 KiB per rank"},
    {"DEEPINFER_EP_SPLIT", "on, off", "on",
     "several ranks with few rows in all (<= 8), batch-invariant GEMMs: the ranks share the "
     "replicated fp8 work (attention projections split by output columns, a MoE layer's shared "
     "expert on the least-loaded rank) instead of each reading every weight for its own rows; "
     "the same bits either way"},
    {"DEEPINFER_KERNELS", "host, cpu", "cpu",
     "kernel backend: `host` = plain reference loops, `cpu` = optimised CPU kernels"},
    {"DEEPINFER_DECODE_LAYOUT", "on, off", "on",
     "cpu kernels: copy each fp8 weight at load into the decode layout (+1 byte per weight) that "
     "decode and prefill GEMMs read"},
    {"DEEPINFER_AMX", "on, off", "on",
     "cpu kernels on CPUs with AMX-BF16: fp8 GEMMs on the decode layout and bf16 GEMMs (K % 32 "
     "== 0) take AMX tile products (TDPBF16PS) at every M (prefill, batched decode and MTP "
     "verify much faster, docs/performance.md §8); "
     "they round differently from VDPBF16PS, so logits can differ in the last bits between the "
     "two settings (docs/numerics.md §10)"},
    {"DEEPINFER_BATCH_INVARIANT", "on, off", "on",
     "cpu kernels: GEMMs sum a row in one order for every M, so a request's tokens do not depend "
     "on what shares its batch or how its prompt is chunked (docs/numerics.md §10); off: decode "
     "(M <= 8) and prefill GEMMs sum in different orders"},
    {"DEEPINFER_THREADS", "integer >= 0", "0",
     "kernel (and EP combine) threads per process, split between local rank threads; 0 = all "
     "hardware threads (mpi: / ranks on the host)"},
    {"DEEPINFER_PIN_RANKS", "on, off", "on",
     "local: each rank thread (and its kernel pool) runs on its own share of the CPUs the process "
     "may use, where there are at least as many CPUs as ranks; off: the OS places them (for CPUs "
     "shared with other busy processes)"},
    {"DEEPINFER_LOAD", "mmap, bucket, auto", "auto",
     "how each rank reads the replicated (non-expert) weights: `mmap` = in place from the mapped "
     "checkpoint, `bucket` = 1/W of their bytes each, assembled by a bucketed all_gather (W× "
     "fewer bytes read per rank, a private copy per rank); auto: bucket where the ranks span "
     "several hosts"},
    {"DEEPINFER_FAULT", "kernel:<op>:<call>, op a kernel op name, call an integer >= 0", "(none)",
     "perturb the first output of call number <call> (from 0, per thread) of kernel op <op> on the "
     "cpu backend, to test `deepinfer diff` (collective faults: `check collectives --fault`)"},
    {"DEEPINFER_CAPABILITIES", "file path", "(none)",
     "collective capabilities file written by `deepinfer check collectives --save-capabilities`"},
    {"DEEPINFER_LOG", "debug, info, warn, error", "info", "lowest log level printed"},
}};

constexpr std::string_view kPrefix = "DEEPINFER_";

std::string_view allowed_of_doc(std::string_view name) {
  for (const KnobDoc& d : kKnobDocs)
    if (name == d.name) return d.allowed;
  return {};
}

std::string allowed_of(std::string_view name) {
  const std::string_view a = allowed_of_doc(name);
  return a.empty() ? "?" : std::string(a);
}

[[noreturn]] void invalid(std::string_view name, std::string_view value,
                          std::string_view why = {}) {
  DI_FAIL("{}='{}' is not valid{}; allowed values: {}", name, value,
          why.empty() ? std::string() : fmt::format(" ({})", why), allowed_of(name));
}

// One of the knob's words (knob_choices), else a startup error listing them.
std::string parse_choice(std::string_view name, const std::string& value) {
  for (std::string_view word : knob_choices(name))
    if (value == word) return value;
  invalid(name, value);
}

bool parse_on_off(std::string_view name, const std::string& value) {
  return parse_choice(name, value) == "on";
}

// Integer with an optional binary suffix K, M or G (case-insensitive), e.g. "64M".
uint64_t parse_size(std::string_view name, const std::string& value) {
  size_t i = 0;
  while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
  if (i == 0 || i > 19) invalid(name, value);
  errno = 0;
  const unsigned long long base = std::strtoull(value.substr(0, i).c_str(), nullptr, 10);
  if (errno == ERANGE) invalid(name, value, "too large");
  int shift = 0;
  if (i < value.size()) {
    if (i + 1 != value.size()) invalid(name, value);
    switch (value[i]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        invalid(name, value);
    }
  }
  if (shift && base > (~0ull >> shift)) invalid(name, value, "too large");
  return uint64_t(base) << shift;
}

double parse_positive(std::string_view name, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || !(v > 0))
    invalid(name, value);
  return v;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::mutex g_mutex;
std::once_flag g_once;
Knobs g_knobs;

}  // namespace

Knobs parse_knobs(const std::function<std::optional<std::string>(const char*)>& getenv) {
  Knobs k;
  // An empty value means "unset" (e.g. `DEEPINFER_FAULT= cmd`).
  auto get = [&](const char* name) -> std::optional<std::string> {
    std::optional<std::string> v = getenv(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  if (auto v = get("DEEPINFER_COMM")) k.comm = parse_choice("DEEPINFER_COMM", *v);
  if (auto v = get("DEEPINFER_COMM_TIMEOUT_S"))
    k.comm_timeout_s = parse_positive("DEEPINFER_COMM_TIMEOUT_S", *v);
  if (auto v = get("DEEPINFER_EP_ALGO")) k.ep_algo = parse_choice("DEEPINFER_EP_ALGO", *v);
  if (auto v = get("DEEPINFER_EP_AG_ROWS")) k.ep_ag_rows = parse_choice("DEEPINFER_EP_AG_ROWS", *v);
  if (auto v = get("DEEPINFER_EP_REDUCE")) k.ep_reduce = parse_choice("DEEPINFER_EP_REDUCE", *v);
  if (auto v = get("DEEPINFER_EP_CHUNK_BYTES")) {
    const uint64_t b = parse_size("DEEPINFER_EP_CHUNK_BYTES", *v);
    if (b < 4096) invalid("DEEPINFER_EP_CHUNK_BYTES", *v, "below the minimum 4096");
    k.ep_chunk_bytes = size_t(b);
  }
  if (auto v = get("DEEPINFER_EP_COMBINE")) k.ep_combine = parse_choice("DEEPINFER_EP_COMBINE", *v);
  if (auto v = get("DEEPINFER_EP_PEER_MEMORY"))
    k.ep_peer_memory = parse_choice("DEEPINFER_EP_PEER_MEMORY", *v);
  if (auto v = get("DEEPINFER_EP_SPLIT")) k.ep_split = parse_on_off("DEEPINFER_EP_SPLIT", *v);
  if (auto v = get("DEEPINFER_KERNELS")) k.kernels = parse_choice("DEEPINFER_KERNELS", *v);
  if (auto v = get("DEEPINFER_DECODE_LAYOUT"))
    k.decode_layout = parse_on_off("DEEPINFER_DECODE_LAYOUT", *v);
  if (auto v = get("DEEPINFER_AMX")) k.amx = parse_on_off("DEEPINFER_AMX", *v);
  if (auto v = get("DEEPINFER_BATCH_INVARIANT"))
    k.batch_invariant = parse_on_off("DEEPINFER_BATCH_INVARIANT", *v);
  if (auto v = get("DEEPINFER_THREADS")) {
    if (v->find_first_not_of("0123456789") != std::string::npos) invalid("DEEPINFER_THREADS", *v);
    const uint64_t t = parse_size("DEEPINFER_THREADS", *v);
    if (t > 4096) invalid("DEEPINFER_THREADS", *v, "more than 4096 threads");
    k.threads = int(t);
  }
  if (auto v = get("DEEPINFER_PIN_RANKS")) k.pin_ranks = parse_on_off("DEEPINFER_PIN_RANKS", *v);
  if (auto v = get("DEEPINFER_LOAD")) k.load = parse_choice("DEEPINFER_LOAD", *v);
  if (auto v = get("DEEPINFER_FAULT")) {
    parse_fault_knob(*v);
    k.fault = *v;
  }
  if (auto v = get("DEEPINFER_CAPABILITIES")) k.capabilities_file = *v;
  if (auto v = get("DEEPINFER_LOG")) k.log_level = parse_choice("DEEPINFER_LOG", *v);
  return k;
}

void check_unknown_knobs(std::span<const std::string> names) {
  for (const std::string& name : names) {
    if (!name.starts_with(kPrefix)) continue;
    const KnobDoc* best = nullptr;
    size_t best_dist = ~size_t(0);
    for (const KnobDoc& d : kKnobDocs) {
      if (name == d.name) {
        best = nullptr;
        best_dist = 0;
        break;
      }
      const size_t dist = edit_distance(name, d.name);
      if (dist < best_dist) best = &d, best_dist = dist;
    }
    if (best_dist == 0) continue;
    std::string known;
    for (const KnobDoc& d : kKnobDocs) known += (known.empty() ? "" : ", ") + std::string(d.name);
    DI_FAIL("unknown environment variable {}{}; unset it or use one of the known knobs: {}", name,
            best && best_dist <= 3 ? fmt::format(" (did you mean {}?)", best->name) : "", known);
  }
}

const Knobs& knobs() {
  std::call_once(g_once, [] {
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e) {
      const std::string_view entry(*e);
      names.emplace_back(entry.substr(0, entry.find('=')));
    }
    check_unknown_knobs(names);
    Knobs k = parse_knobs([](const char* name) -> std::optional<std::string> {
      const char* v = std::getenv(name);
      return v ? std::optional<std::string>(v) : std::nullopt;
    });
    std::lock_guard lock(g_mutex);
    g_knobs = std::move(k);
  });
  return g_knobs;
}

void set_knobs(const Knobs& k) {
  // Mark the environment as parsed so a later knobs() does not overwrite these values.
  std::call_once(g_once, [] {});
  std::lock_guard lock(g_mutex);
  g_knobs = k;
}

std::span<const KnobDoc> knob_docs() { return kKnobDocs; }

std::vector<std::string_view> knob_choices(std::string_view name) {
  // The allowed column of a knob with a fixed set of values is its words, comma-separated.
  std::vector<std::string_view> words;
  const std::string_view allowed = allowed_of_doc(name);
  size_t i = 0;
  while (i < allowed.size()) {
    size_t end = allowed.find(", ", i);
    if (end == std::string_view::npos) end = allowed.size();
    const std::string_view word = allowed.substr(i, end - i);
    if (word.empty() ||
        word.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") != std::string_view::npos)
      return {};
    words.push_back(word);
    i = end + 2;
  }
  return words;
}

FaultKnob parse_fault_knob(const std::string& value) {
  constexpr std::string_view kName = "DEEPINFER_FAULT", kKernel = "kernel:";
  const std::string_view v(value);
  if (!v.starts_with(kKernel))
    invalid(kName, value, "the only fault kind is kernel:<op>:<call>, e.g. kernel:rms_norm:3");
  const std::string_view rest = v.substr(kKernel.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    invalid(kName, value, "want kernel:<op>:<call>, e.g. kernel:rms_norm:3");
  FaultKnob f;
  f.op = std::string(rest.substr(0, colon));
  const std::string_view call = rest.substr(colon + 1);
  if (call.empty() || call.size() > 19 ||
      call.find_first_not_of("0123456789") != std::string_view::npos)
    invalid(kName, value, fmt::format("call '{}' is not an integer >= 0", call));
  f.call = std::strtoull(std::string(call).c_str(), nullptr, 10);
  return f;
}

}  // namespace deepinfer
