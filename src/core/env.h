// Environment knobs (docs/architecture.md §9), parsed and validated in one place. An invalid value
// is a startup error naming the variable and its allowed values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

// Core parses every knob and checks it against its allowed values; it knows no type of an upper
// layer. A knob with a fixed set of words keeps the word, and the layer that owns the knob maps it
// to its own enum once (EPConfig::from_knobs, comm_kind_from_knobs, kernels::backend_from_knobs).
struct Knobs {
  std::string comm = "local";           // DEEPINFER_COMM = local|mpi
  double comm_timeout_s = 60.0;         // DEEPINFER_COMM_TIMEOUT_S (> 0)
  std::string ep_algo = "auto";         // DEEPINFER_EP_ALGO = ag|a2a|auto
  std::string ep_ag_rows = "max";       // DEEPINFER_EP_AG_ROWS = max|cap
  std::string ep_reduce = "rs";         // DEEPINFER_EP_REDUCE = rs|ar
  size_t ep_chunk_bytes = 64ull << 20;  // DEEPINFER_EP_CHUNK_BYTES (>= 4096)
  std::string ep_combine = "exact";     // DEEPINFER_EP_COMBINE = exact|fast
  std::string ep_peer_memory = "auto";  // DEEPINFER_EP_PEER_MEMORY = on|off|auto
  bool ep_split = true;                 // DEEPINFER_EP_SPLIT = on|off
  std::string kernels = "cpu";          // DEEPINFER_KERNELS = host|cpu
  bool decode_layout = true;            // DEEPINFER_DECODE_LAYOUT = on|off
  bool amx = true;                      // DEEPINFER_AMX = on|off
  bool batch_invariant = true;          // DEEPINFER_BATCH_INVARIANT = on|off
  int threads = 0;                      // DEEPINFER_THREADS (0 = hardware threads)
  bool pin_ranks = true;                // DEEPINFER_PIN_RANKS = on|off
  std::string load = "auto";            // DEEPINFER_LOAD = mmap|bucket|auto
  std::string fault;                    // DEEPINFER_FAULT = kernel:<op>:<call> (the op: kernels)
  std::string capabilities_file;        // DEEPINFER_CAPABILITIES
  std::string log_level = "info";       // DEEPINFER_LOG = debug|info|warn|error
};

// Parses every knob from `getenv` (tests pass their own lookup). Throws Error naming the
// variable, the bad value and the allowed values.
Knobs parse_knobs(const std::function<std::optional<std::string>(const char*)>& getenv);

// Throws Error if `names` (environment variable names, e.g. from `environ`) holds a
// DEEPINFER_* name that is not a known knob (a typo such as DEEPINFER_EP_ALG0 would
// otherwise be silently ignored). Names without the prefix are ignored.
void check_unknown_knobs(std::span<const std::string> names);

// The process-wide knobs, parsed from the real environment on first use (thread-safe);
// also rejects unknown DEEPINFER_* variables.
const Knobs& knobs();
// Replaces the process-wide knobs (CLI flags override the environment). Call it at startup,
// before rank or pool threads read knobs(): readers hold a reference to the same object.
void set_knobs(const Knobs& k);

// One row per knob for the README/`deepinfer --help-env`: name, allowed values, default, meaning.
struct KnobDoc {
  const char* name;
  const char* allowed;
  const char* def;
  const char* meaning;
};
std::span<const KnobDoc> knob_docs();

// The words a knob with a fixed set of values accepts, from its `allowed` column (e.g. {"ag",
// "a2a", "auto"} for DEEPINFER_EP_ALGO); empty for a knob that takes a number, a path or a form.
std::vector<std::string_view> knob_choices(std::string_view name);

// A DEEPINFER_FAULT value split into its parts: kernel:<op>:<call>. Throws Error naming the knob,
// the value and the form when it is not of that form (the op name is the kernels layer's to check).
struct FaultKnob {
  std::string op;
  uint64_t call = 0;
};
FaultKnob parse_fault_knob(const std::string& value);

}  // namespace deepinfer
