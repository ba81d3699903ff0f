#include "serve/stop_strings.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace deepinfer::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t k = 0; k < stops_.size(); ++k) {
    if (stops_[k].empty())
      DI_FAIL("stop[{}] is empty; a stop string needs at least one character", k);
    if (!utf8::is_valid(stops_[k])) DI_FAIL("stop[{}] is not valid UTF-8", k);
  }
}

StopMatcher::Out StopMatcher::push(std::string_view text) {
  Out out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf += text;
  // The earliest match wins. Everything before `buf` was emitted, and no match started there:
  // any suffix of it that could begin one was held back.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, buf.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    buf.resize(first);
    out.text = std::move(buf);
    out.stopped = true;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, buf.size()); n > hold; --n)
      if (buf.compare(buf.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  // ... and an incomplete UTF-8 character just before the cut. (A stop string is valid UTF-8,
  // so the held suffix itself starts at a character boundary.)
  size_t cut = buf.size() - hold;
  size_t lead = cut;
  while (lead > 0 && cut - lead < 3 && (static_cast<uint8_t>(buf[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0) {
    const size_t s = lead - 1;
    if (utf8::decode_one(std::string_view(buf).substr(s, cut - s)).status ==
        utf8::Status::incomplete)
      cut = s;
  }
  held_ = buf.substr(cut);
  buf.resize(cut);
  out.text = std::move(buf);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace deepinfer::serve
