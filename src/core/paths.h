// Checks on paths a user names, made before a long run rather than after it.
#pragma once

#include <string>

namespace deepinfer {

// Empty when `path` can be created or overwritten as a file; otherwise why not and what to do
// ("its folder /x does not exist", "it is a folder", "no permission to write ..."). Creates and
// changes nothing.
std::string output_file_problem(const std::string& path);

}  // namespace deepinfer
