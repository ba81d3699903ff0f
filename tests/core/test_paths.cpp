// output_file_problem: an output path that cannot be written is found before a long run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/paths.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

TEST(Paths, OutputFileProblemSaysWhatIsWrong) {
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer_paths_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_EQ(output_file_problem((dir / "new.json").string()), "");
  std::ofstream((dir / "old.json").string()) << "x";
  EXPECT_EQ(output_file_problem((dir / "old.json").string()), "");
  EXPECT_NE(output_file_problem(dir.string()).find("it is a folder"), std::string::npos);
  const std::string missing = output_file_problem((dir / "no" / "such" / "r.json").string());
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  EXPECT_NE(missing.find((dir / "no" / "such").string()), std::string::npos) << missing;
  EXPECT_TRUE(fs::exists(dir / "old.json"));  // nothing created or truncated
  EXPECT_FALSE(fs::exists(dir / "new.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer
