// Logging: rank prefix per thread, level filtering from the knobs, whole lines under contention.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/log.h"

namespace deepinfer {
namespace {

// Redirects file descriptor 2 into a temporary file for the lifetime of the object.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    file_ = std::tmpfile();
    saved_ = dup(2);
    dup2(fileno(file_), 2);
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    std::fclose(file_);
    return out;
  }

 private:
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = knobs(); }
  void TearDown() override {
    set_knobs(saved_);
    set_log_rank(-1, 0);
  }
  void set_level(const char* level) {
    Knobs k = saved_;
    k.log_level = level;
    set_knobs(k);
  }
  Knobs saved_;
};

TEST_F(LogTest, RankPrefixAndFormatting) {
  set_level("info");
  StderrCapture cap;
  set_log_rank(3, 8);
  log_info("hello {} {}", 42, "x");
  set_log_rank(-1, 0);
  log_info("no rank");
  EXPECT_EQ(cap.finish(), "[deepinfer r3/8] hello 42 x\n[deepinfer] no rank\n");
}

TEST_F(LogTest, LevelFiltering) {
  set_level("warn");
  EXPECT_FALSE(log_enabled(LogLevel::debug));
  EXPECT_FALSE(log_enabled(LogLevel::info));
  EXPECT_TRUE(log_enabled(LogLevel::warn));
  EXPECT_TRUE(log_enabled(LogLevel::error));
  StderrCapture cap;
  set_log_rank(0, 2);
  log_debug("d");
  log_info("i");
  log_warn("w");
  log_error("e");
  const std::string out = cap.finish();
  EXPECT_EQ(out, "[deepinfer r0/2] warning: w\n[deepinfer r0/2] error: e\n");

  set_level("debug");
  EXPECT_TRUE(log_enabled(LogLevel::debug));
  set_level("error");
  EXPECT_FALSE(log_enabled(LogLevel::warn));
  EXPECT_TRUE(log_enabled(LogLevel::error));
}

// 8 rank threads log concurrently; every line must come out whole, with its own rank.
TEST_F(LogTest, ConcurrentLinesStayWhole) {
  set_level("info");
  constexpr int kThreads = 8, kLines = 300;
  StderrCapture cap;
  std::vector<std::thread> ts;
  for (int r = 0; r < kThreads; ++r)
    ts.emplace_back([r] {
      set_log_rank(r, kThreads);
      for (int i = 0; i < kLines; ++i)
        log_info("line {} of rank {} {}", i, r, std::string(50, 'a' + char(r)));
    });
  for (auto& t : ts) t.join();
  std::istringstream in(cap.finish());
  std::map<int, int> next_line;
  int total = 0;
  for (std::string line; std::getline(in, line); ++total) {
    int r = -1, world = -1, i = -1, r2 = -2;
    char tail[64] = {};
    ASSERT_EQ(std::sscanf(line.c_str(), "[deepinfer r%d/%d] line %d of rank %d %63s", &r, &world,
                          &i, &r2, tail),
              5)
        << line;
    ASSERT_EQ(r, r2) << line;
    ASSERT_EQ(world, kThreads);
    ASSERT_EQ(std::string(tail), std::string(50, 'a' + char(r))) << line;
    ASSERT_EQ(i, next_line[r]++) << "lines of rank " << r << " out of order";
  }
  EXPECT_EQ(total, kThreads * kLines);
}

}  // namespace
}  // namespace deepinfer
