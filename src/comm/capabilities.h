// Capability files: which all_to_all lowerings a backend is trusted with, as measured by
// `deepinfer check collectives --save-capabilities FILE`, applied with DEEPINFER_CAPABILITIES.
// Format (JSON): {"all_to_all": bool, "all_to_all_v": bool, "ordered_reduce": bool, "backend":
// "..."}
#pragma once

#include <deepinfer/comm.h>

#include <memory>
#include <string>

namespace deepinfer {

struct CapabilitiesFile {
  Capabilities caps;
  std::string backend;  // the backend it was measured on, e.g. "local", "faulty(a2av-hang)/mpi"
};

void save_capabilities(const std::string& path, const Capabilities& caps,
                       const std::string& backend);
// Throws Error naming the file and the problem (missing, not JSON, missing or mistyped field).
CapabilitiesFile load_capabilities(const std::string& path);
// The same checks on the file's text; `path` names it in the messages.
CapabilitiesFile parse_capabilities(const std::string& text, const std::string& path);

// Wraps `inner` so capabilities() reports the file's values (all else forwards). Warns when the
// file was measured on a different backend.
std::unique_ptr<Group> with_capabilities_override(std::unique_ptr<Group> inner,
                                                  const CapabilitiesFile& file);

}  // namespace deepinfer
