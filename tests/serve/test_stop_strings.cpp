// StopMatcher against a plain reference: after each piece, look for every stop in all the text so
// far; the first time one is there, the answer is the text before the earliest match.
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::serve {
namespace {

struct Streamed {
  std::vector<std::string> chunks;  // what each push emitted, then flush's (if not stopped)
  std::string text;                 // all of it
  bool stopped = false;
};

Streamed run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Streamed r;
  for (const std::string& p : pieces) {
    StopMatcher::Out o = m.push(p);
    r.chunks.push_back(o.text);
    r.text += o.text;
    if (o.stopped) {
      r.stopped = true;
      EXPECT_EQ(m.flush(), "");
      return r;
    }
  }
  r.chunks.push_back(m.flush());
  r.text += r.chunks.back();
  return r;
}

// The reference: no holding back, just a search of everything so far after every piece.
Streamed reference(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  Streamed r;
  std::string all;
  for (const std::string& p : pieces) {
    all += p;
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, all.find(s));
    if (first != std::string::npos) {
      r.text = all.substr(0, first);
      r.stopped = true;
      return r;
    }
  }
  r.text = all;
  return r;
}

TEST(StopMatcher, StopSpanningSeveralPushes) {
  const Streamed r = run({"STOP"}, {"abc S", "TO", "P tail", "more"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc ");
  EXPECT_EQ(r.chunks, (std::vector<std::string>{"abc ", "", ""}));
}

TEST(StopMatcher, HeldTextIsReleasedWhenTheStopDoesNotComplete) {
  const Streamed r = run({"STOP"}, {"abc ST", "OX", "yz"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.chunks, (std::vector<std::string>{"abc ", "STOX", "yz", ""}));
  const Streamed tail = run({"STOP"}, {"abc STO"});  // generation ended: flush gives the held tail
  EXPECT_EQ(tail.chunks, (std::vector<std::string>{"abc ", "STO"}));
}

TEST(StopMatcher, OverlappingCandidates) {
  // "aab" inside "aaab": the first 'a' is not part of the match.
  EXPECT_EQ(run({"aab"}, {"a", "a", "a", "b", "c"}).text, "a");
  EXPECT_EQ(run({"aab"}, {"aaab"}).text, "a");
  EXPECT_EQ(run({"abab"}, {"aba", "bab"}).text, "");
  EXPECT_EQ(run({"abac"}, {"ab", "ab", "ac"}).text, "ab");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  const Streamed r = run({"world", "lo w", "xyz"}, {"hello world"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hel");
  EXPECT_EQ(run({"d", "c", "b"}, {"abcd"}).text, "a");
  // Streaming: "bc" is complete (and generation ends) before "abcd" could be.
  EXPECT_EQ(run({"abcd", "bc"}, {"a", "b", "c", "d"}).text, "a");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  const Streamed r = run({"Hi"}, {"Hi there"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(run({"Hi"}, {"H", "i", "!"}).chunks, (std::vector<std::string>{"", ""}));
}

TEST(StopMatcher, NoStopsPassEverythingThrough) {
  const Streamed r = run({}, {"a", "bc", "", "世界"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.chunks, (std::vector<std::string>{"a", "bc", "", "世界", ""}));
}

TEST(StopMatcher, AfterAStopPushIgnoresItsInput) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.push("axb").stopped);
  EXPECT_TRUE(m.stopped());
  const StopMatcher::Out o = m.push("more");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, UnicodeStopsAndSplitCharacters) {
  const std::string text = "你好世界再见";
  EXPECT_EQ(run({"世界"}, {text}).text, "你好");
  // Pieces cut inside characters: nothing emitted may end inside one.
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const Streamed r = run({"世界"}, bytes);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "你好");
  for (const std::string& c : r.chunks) EXPECT_TRUE(utf8::is_valid(c)) << c;
  const Streamed n = run({"世纪"}, bytes);  // shares the first character with "世界"
  EXPECT_FALSE(n.stopped);
  EXPECT_EQ(n.text, text);
  for (const std::string& c : n.chunks) EXPECT_TRUE(utf8::is_valid(c)) << c;
  // No stops at all: an incomplete character is still held back.
  EXPECT_EQ(run({}, {"a\xE4\xB8", "\x96z"}).chunks,
            (std::vector<std::string>{"a", "\xE4\xB8\x96z", ""}));
}

TEST(StopMatcher, RejectsEmptyAndInvalidStops) {
  EXPECT_THROW(StopMatcher({"ok", ""}), Error);
  EXPECT_THROW(StopMatcher({"\xFF"}), Error);
}

TEST(StopMatcher, RandomSplitsMatchTheReference) {
  std::mt19937 rng(20);
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "é", "世", "\n"};
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int stopped = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const size_t len = pick(40);
    for (size_t k = 0; k < len; ++k) text += alphabet[pick(alphabet.size())];
    std::vector<std::string> stops;
    const size_t num_stops = pick(5);  // 0..4, as OpenAI allows
    for (size_t k = 0; k < num_stops; ++k) {
      std::string s;
      const size_t sl = 1 + pick(4);
      for (size_t j = 0; j < sl; ++j) s += alphabet[pick(3 + (iter % 5))];
      stops.push_back(s);
    }
    // Split at random byte offsets (inside characters too), or at characters like a decoder.
    std::vector<std::string> pieces;
    const bool bytewise = iter % 2 == 0;
    for (size_t p = 0; p < text.size();) {
      size_t n = 1 + pick(6);
      if (!bytewise)
        for (size_t q = p, c = 0;; ++c) {
          if (q >= text.size() || c == n) {
            n = q - p;
            break;
          }
          q += utf8::decode_one(std::string_view(text).substr(q)).len;
        }
      n = std::min(n, text.size() - p);
      pieces.push_back(text.substr(p, n));
      p += n;
    }
    const Streamed got = run(stops, pieces), want = reference(stops, pieces);
    ASSERT_EQ(got.text, want.text) << "iteration " << iter;
    ASSERT_EQ(got.stopped, want.stopped) << "iteration " << iter;
    for (const std::string& c : got.chunks) ASSERT_TRUE(utf8::is_valid(c)) << "iteration " << iter;
    stopped += got.stopped;
  }
  EXPECT_GT(stopped, 300);  // the sweep exercises both outcomes
  EXPECT_LT(stopped, 2700);
}

TEST(StopMatcher, OverTheStreamDecoderOfTheTinyModel) {
  const Tokenizer tok = Tokenizer::from_dir(std::string(DEEPINFER_SOURCE_DIR) + "/models/tiny");
  const std::string text = "The cat sat on the mat. Héllo wörld! The end.";
  const std::vector<TokenId> ids = tok.encode(text, {.add_special_tokens = false});
  ASSERT_GT(ids.size(), 5u);
  for (const std::vector<std::string>& stops :
       std::vector<std::vector<std::string>>{{"mat."}, {"ö"}, {"t s", "zzz"}, {"nothing"}}) {
    StreamDecoder dec(tok);
    StopMatcher m(stops);
    std::vector<std::string> pieces;
    std::string out;
    bool stopped = false;
    for (TokenId id : ids) {
      pieces.push_back(dec.push(id));
      const StopMatcher::Out o = m.push(pieces.back());
      out += o.text;
      if ((stopped = o.stopped)) break;
    }
    if (!stopped) out += m.push(dec.flush()).text + m.flush();
    EXPECT_EQ(out, reference(stops, {text}).text) << stops[0];
  }
}

}  // namespace
}  // namespace deepinfer::serve
