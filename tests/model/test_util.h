// Helpers shared by the model tests.
#pragma once

#include <deepinfer/error.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <string>

namespace deepinfer::model::test_util {

// The message of the Error fn throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string read_text(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace deepinfer::model::test_util
