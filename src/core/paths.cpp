#include "core/paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "core/check.h"

namespace deepinfer {

std::string output_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return "it is a folder; give a file name";
  if (fs::exists(p, ec)) {
    if (::access(path.c_str(), W_OK) != 0)
      return "the file exists and is not writable; give a file you may write";
    return {};
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    return fmt::format("its folder {} does not exist; create it first", dir.string());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return fmt::format("no permission to create files in {}; give a path you may write",
                       dir.string());
  return {};
}

}  // namespace deepinfer
