// OpenAI `stop` strings over streamed text: generation ends at the first occurrence of any stop
// string in the decoded text, matched across token boundaries; the match and what follows are
// never returned. Text that could still become a match is held back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  struct Out {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched: text ends where the match began
  };
  Out push(std::string_view text);
  std::string flush();  // what is held back, when generation ends for another reason

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace deepinfer::serve
