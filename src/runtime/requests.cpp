#include "runtime/requests.h"

#include <deepinfer/error.h>
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace deepinfer::runtime {

std::string sampling_problem(const SamplingConfig& s, const SamplingNames& names) {
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return fmt::format("{} must be a number >= 0 (0 = greedy), got {}", names.temperature,
                       s.temperature);
  if (s.top_k < 0)
    return fmt::format("{} must be >= 0 (0 = keep every token), got {}", names.top_k, s.top_k);
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return fmt::format("{} must be in (0, 1] (1 = keep every token), got {}", names.top_p, s.top_p);
  return {};
}

std::string request_problem(const Request& r, int64_t vocab_size, int64_t max_positions,
                            const SamplingNames& names) {
  if (r.prompt.empty()) return "the prompt has no tokens";
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_size)
      return fmt::format("prompt token {} is id {}, outside the model's vocabulary [0, {})", i,
                         r.prompt[i], vocab_size);
  if (r.max_new_tokens < 1)
    return fmt::format("max_new_tokens must be >= 1, got {}", r.max_new_tokens);
  const int64_t len = int64_t(r.prompt.size()) + r.max_new_tokens;
  if (len > max_positions || len < r.max_new_tokens)
    return fmt::format(
        "the prompt ({} tokens) + up to {} new tokens exceed the model's context of {} positions "
        "(max_position_embeddings)",
        r.prompt.size(), r.max_new_tokens, max_positions);
  return sampling_problem(r.sampling, names);
}

void agree_or_throw(Group& group, const std::string& problem) {
  const int W = group.size();
  int32_t mine = problem.empty() ? 0 : 1;
  std::vector<int32_t> bad(static_cast<size_t>(W));
  group.all_gather(&mine, bad.data(), 1, DType::i32);
  int root = -1;
  for (int r = 0; r < W && root < 0; ++r)
    if (bad[size_t(r)]) root = r;
  if (root < 0) return;
  int64_t len = group.rank() == root ? int64_t(problem.size()) : 0;
  group.broadcast(&len, 1, DType::i64, root);
  std::string text = group.rank() == root ? problem : std::string(size_t(len), '\0');
  group.broadcast(text.data(), size_t(len), DType::u8, root);
  if (W == 1) throw Error(text);
  throw Error(fmt::format("rank {}: {}", root, text));
}

std::vector<Prompt> read_prompts(std::istream& in) {
  std::vector<Prompt> out;
  int64_t index = 0;
  for (std::string line; std::getline(in, line); ++index) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back({index, std::move(line)});
  }
  return out;
}

std::vector<Prompt> read_prompts_file(const std::string& path, std::istream& stdin_stream) {
  std::vector<Prompt> prompts;
  if (path == "-") {
    prompts = read_prompts(stdin_stream);
  } else {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      DI_FAIL(
          "--prompts-file {} is a folder; give a text file with one prompt per line (or - for "
          "stdin)",
          path);
    std::ifstream in(path);
    if (!in)
      DI_FAIL(
          "cannot read --prompts-file {}: {}; give a text file with one prompt per line (or - for "
          "stdin)",
          path, std::strerror(errno));
    prompts = read_prompts(in);
  }
  if (prompts.empty())
    DI_FAIL("--prompts-file {} holds no prompt (every line is empty); write one prompt per line",
            path == "-" ? "- (stdin)" : path);
  return prompts;
}

}  // namespace deepinfer::runtime
