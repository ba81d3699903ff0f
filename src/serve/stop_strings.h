// OpenAI `stop` strings over streamed text: generation ends when the decoded text contains one;
// the stop string and everything after it are not returned. Matching is on the text, across
// token boundaries: a tail that could still become a stop string is held back until it cannot.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::serve {

class StopMatcher {
 public:
  // Each stop must be non-empty valid UTF-8 (an Error otherwise). No stops: push passes
  // everything through.
  explicit StopMatcher(std::vector<std::string> stops);

  struct Out {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was found: `text` is everything before it
  };
  // Feeds the next piece of decoded text (e.g. StreamDecoder::push's). The emitted text never
  // ends inside a UTF-8 character: an incomplete tail is held back too. After a stop, push
  // returns {"", true} and ignores its input.
  Out push(std::string_view text);
  // What is held back, when generation ends for another reason (length, EOS); "" after a stop.
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace deepinfer::serve
