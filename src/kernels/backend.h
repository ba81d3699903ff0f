// The kernel backends (DEEPINFER_KERNELS); kernels/registry.h selects one per op call.
#pragma once

#include <cstdint>
#include <string_view>

namespace deepinfer {

// host = plain reference loops, cpu = optimised CPU kernels.
enum class KernelBackend : uint8_t { host, cpu };
std::string_view to_string(KernelBackend);  // "host", "cpu"

}  // namespace deepinfer
