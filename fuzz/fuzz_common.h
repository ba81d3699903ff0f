// Shared by the fuzz targets: what counts as a clean outcome.
#pragma once

#include <deepinfer/error.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace deepinfer::fuzz {

// Runs `f`: an Error (the parser rejecting its input with a message) is a clean outcome. Every
// other exception escapes, so libFuzzer sees an abort and keeps the input: a json::exception or
// std::out_of_range means a check is missing, and an InternalError (a DI_CHECK) is a bug by its
// own definition (src/core/check.h).
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
  }
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace deepinfer::fuzz
