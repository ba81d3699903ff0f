// What a caller may ask of the engine, checked in one place: the engine agrees on it across ranks
// before its first step (so a bad request is an error on every rank, not a hang on the peers),
// and the CLI runs the same checks before it loads anything.
#pragma once

#include <deepinfer/comm.h>

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace deepinfer::runtime {

// The names a caller knows the sampling fields by (the CLI passes its option names).
struct SamplingNames {
  std::string temperature = "temperature";
  std::string top_k = "top_k";
  std::string top_p = "top_p";
};

// Empty when valid; otherwise what is wrong and the allowed range, in `names`' words.
// temperature: finite, >= 0 (0 = greedy); top_k: >= 0 (0 = all); top_p: in (0, 1].
std::string sampling_problem(const SamplingConfig& s, const SamplingNames& names = {});

// Empty when the request fits a model with this vocabulary and context length; otherwise what
// is wrong (prompt, token ids, max_new_tokens, length, sampling).
std::string request_problem(const Request& r, int64_t vocab_size, int64_t max_positions,
                            const SamplingNames& names = {});

// Collective: every rank passes its own `problem` (empty = fine). Returns when every rank's is
// empty; otherwise every rank throws the same Error, the lowest failing rank's problem.
void agree_or_throw(Group& group, const std::string& problem);

// One prompt per line. `index` is the line's number counting from 0, so output `[i]` is line i
// of the file (line i + 1 in an editor). A trailing '\r' (CRLF files) is dropped; empty lines
// hold no prompt but keep their number.
struct Prompt {
  int64_t index = 0;
  std::string text;
};
std::vector<Prompt> read_prompts(std::istream& in);

// read_prompts of a file, or of standard input for "-". Throws Error (what is wrong and what to
// do) when the file cannot be read or holds no prompt.
std::vector<Prompt> read_prompts_file(const std::string& path, std::istream& stdin_stream);

}  // namespace deepinfer::runtime
