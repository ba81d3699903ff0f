// Environment knobs (DESIGN §8), parsed and validated in one place. An invalid value is a
// startup error naming the variable and its allowed values.
#pragma once

#include <deepinfer/comm.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

enum class EpAlgo : uint8_t { ag, a2a, automatic };
enum class AgRows : uint8_t { max, cap };
enum class EpReduce : uint8_t { rs, ar };
enum class CombineMode : uint8_t { exact, fast };
// a2a's direct lowering (peer memory): never, always, or where the call moves enough bytes.
enum class EpPeerMemory : uint8_t { off, on, automatic };
enum class KernelBackend : uint8_t { host, cpu };

struct Knobs {
  CommKind comm = CommKind::local;         // DEEPINFER_COMM
  double comm_timeout_s = 60.0;            // DEEPINFER_COMM_TIMEOUT_S (> 0)
  EpAlgo ep_algo = EpAlgo::automatic;      // DEEPINFER_EP_ALGO = ag|a2a|auto
  AgRows ep_ag_rows = AgRows::max;         // DEEPINFER_EP_AG_ROWS = max|cap
  EpReduce ep_reduce = EpReduce::rs;       // DEEPINFER_EP_REDUCE = rs|ar
  size_t ep_chunk_bytes = 64ull << 20;     // DEEPINFER_EP_CHUNK_BYTES (>= 4096)
  CombineMode ep_combine = CombineMode::exact;  // DEEPINFER_EP_COMBINE = exact|fast
  EpPeerMemory ep_peer_memory = EpPeerMemory::automatic;  // DEEPINFER_EP_PEER_MEMORY = on|off|auto
  KernelBackend kernels = KernelBackend::cpu;   // DEEPINFER_KERNELS = host|cpu
  bool decode_layout = true;               // DEEPINFER_DECODE_LAYOUT = on|off
  int threads = 0;                         // DEEPINFER_THREADS (0 = hardware threads)
  bool pin_ranks = true;                   // DEEPINFER_PIN_RANKS = on|off
  std::string fault;                       // DEEPINFER_FAULT (e.g. kernel:<op>:<call>)
  std::string capabilities_file;           // DEEPINFER_CAPABILITIES
  std::string log_level = "info";          // DEEPINFER_LOG = debug|info|warn|error
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

std::string_view to_string(EpAlgo);
std::string_view to_string(CombineMode);
std::string_view to_string(EpPeerMemory);
std::string_view to_string(KernelBackend);
std::string_view to_string(CommKind);
std::string_view to_string(AgRows);
std::string_view to_string(EpReduce);

}  // namespace deepinfer
