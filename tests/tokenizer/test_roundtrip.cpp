// Round trips on megabytes of generated mixed-script text, and the fast BPE (priority queue,
// cache) against a naive GPT-2 `bpe()` loop on a tokenizer trained here with a few hundred merges.
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using Ids = std::vector<TokenId>;

const std::string kDs = std::string(DEEPINFER_TOKENIZER_TEST_DATA) + "/deepseek_style";
const std::string kGpt2 = std::string(DEEPINFER_TOKENIZER_TEST_DATA) + "/gpt2_style";

EncodeOptions plain() {
  EncodeOptions o;
  o.add_special_tokens = false;
  return o;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Range {
  char32_t lo, hi;
};

// Letters of many scripts: Latin (ASCII, Latin-1, Extended-A), Greek, Cyrillic, Hebrew,
// Arabic, Devanagari, Thai, Hangul, Hiragana, Katakana, CJK, math alphanumerics (4 bytes).
constexpr Range kScripts[] = {
    {0x61, 0x7A},     {0x41, 0x5A},     {0xC0, 0xFF},     {0x100, 0x17F},   {0x3B1, 0x3C9},
    {0x410, 0x44F},   {0x5D0, 0x5EA},   {0x627, 0x64A},   {0x905, 0x939},   {0xE01, 0xE30},
    {0xAC00, 0xD7A3}, {0x3041, 0x3096}, {0x30A1, 0x30FA}, {0x4E00, 0x9FA5}, {0x1D400, 0x1D433}};

// Mixed-script text: words, emoji (with ZWJ and variation selectors), combining marks,
// whitespace runs (tabs, CRLF, NBSP, ideographic space, NEL), digits of three systems,
// punctuation, contractions, control characters, and (optionally) added-token text.
std::string mixed_text(size_t bytes, uint32_t seed, bool with_added_tokens) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto cp_in = [&](char32_t lo, char32_t hi) {
    return static_cast<char32_t>(lo + rng() % (hi - lo + 1));
  };
  static const char* const kSeps[] = {
      " ",      " ",  " ",   "  ", "\t",  "\n", "\r\n", "\n\n", "   \n", "\u3000", "\u00A0",
      "\u0085", ". ", ", ",  "; ", "!",   "?",  "(",    ")",    "[",     "]",      "\"",
      "-",      "'s", "'ll", "'t", " — ", "…",  "\x01", "\x7F", ""};  // "" stands for NUL
  static const char* const kAdded[] = {"<｜User｜>", "<｜Assistant｜>", "<think>",
                                       "<tag>>",     "<tag>",           "<｜end▁of▁sentence｜>"};
  std::string out;
  out.reserve(bytes + 64);
  while (out.size() < bytes) {
    const size_t kind = pick(100);
    if (kind < 60) {  // a word of one script
      const Range r = kScripts[pick(std::size(kScripts))];
      const size_t len = 1 + pick(10);
      for (size_t i = 0; i < len; ++i) {
        utf8::append(out, cp_in(r.lo, r.hi));
        if (pick(8) == 0) utf8::append(out, cp_in(0x300, 0x36F));  // combining mark
      }
    } else if (kind < 68) {  // digits: ASCII, Arabic-Indic, fullwidth
      const char32_t base = std::array<char32_t, 3>{U'0', 0x660, 0xFF10}[pick(3)];
      const size_t len = 1 + pick(9);
      for (size_t i = 0; i < len; ++i) utf8::append(out, base + static_cast<char32_t>(pick(10)));
    } else if (kind < 74) {  // emoji, sometimes a ZWJ sequence or with VS16
      utf8::append(out, cp_in(0x1F300, 0x1F64F));
      if (pick(3) == 0) utf8::append(out, 0x200D), utf8::append(out, cp_in(0x1F300, 0x1F64F));
      if (pick(4) == 0) utf8::append(out, 0xFE0F);
    } else if (kind < 76) {  // symbols and arrows
      utf8::append(out, cp_in(0x2190, 0x22FF));
    } else if (kind < 77 && with_added_tokens) {
      out += kAdded[pick(std::size(kAdded))];
    } else {
      const size_t k = pick(std::size(kSeps));
      out += k + 1 == std::size(kSeps) ? std::string(1, '\0') : std::string(kSeps[k]);
    }
  }
  return out;
}

void expect_round_trip(const Tokenizer& tok, const std::string& text, const char* what) {
  // CPU time, not wall time: the CI machine is shared. Informational only (bench measures speed).
  const std::clock_t c0 = std::clock();
  const Ids ids = tok.encode(text, plain());
  const double s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const std::string back = tok.decode(ids);
  std::printf("[ %s ] %.2f MB -> %zu ids, encode %.1f MB/s of CPU time (mostly unique words)\n",
              what, text.size() / 1e6, ids.size(), text.size() / 1e6 / std::max(s, 1e-6));
  ASSERT_EQ(back.size(), text.size()) << what;
  if (back != text) {
    const size_t at = std::mismatch(back.begin(), back.end(), text.begin()).first - back.begin();
    FAIL() << what << ": round trip differs at byte " << at;
  }
  // Streaming gives the same text, one token at a time.
  StreamDecoder sd(tok, /*skip_special_tokens=*/false);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string piece = sd.push(id);
    ASSERT_TRUE(utf8::is_valid(piece));
    streamed += piece;
  }
  streamed += sd.flush();
  EXPECT_TRUE(streamed == text) << what << ": streamed decode differs";
}

TEST(RoundTrip, DeepSeekStyleMixedScripts2MB) {
  const Tokenizer tok = Tokenizer::from_dir(kDs);
  const std::string text = mixed_text(2 << 20, 1, /*with_added_tokens=*/true);
  ASSERT_TRUE(utf8::is_valid(text));
  expect_round_trip(tok, text, "deepseek_style");
  // The pre-tokenizer loses nothing and invents nothing.
  const std::string sample = mixed_text(200 << 10, 2, false);
  std::string joined;
  for (const std::string& p : tok.pre_tokenize(sample)) joined += p;
  EXPECT_TRUE(joined == sample);
}

TEST(RoundTrip, Gpt2StyleMixedScripts1MB) {
  expect_round_trip(Tokenizer::from_dir(kGpt2), mixed_text(1 << 20, 3, true), "gpt2_style");
}

TEST(RoundTrip, InvalidUtf8NeverCrashes) {
  const Tokenizer tok = Tokenizer::from_dir(kDs);
  std::mt19937 rng(4);
  for (int round = 0; round < 8; ++round) {
    std::string junk(16 << 10, '\0');
    for (char& c : junk)
      c = static_cast<char>(rng() % (round % 2 ? 256 : 64) + (round % 2 ? 0 : 0x80));
    const std::string clean = utf8::sanitize(junk);
    EXPECT_EQ(tok.decode(tok.encode(junk, plain())), clean);
  }
}

// Rank threads share one Tokenizer: concurrent encodes (shared word cache, per-thread PCRE2
// match data) give the single-threaded ids.
TEST(RoundTrip, ConcurrentEncodesAgree) {
  const Tokenizer tok = Tokenizer::from_dir(kDs);
  constexpr int kThreads = 4;
  std::vector<std::string> texts;
  std::vector<Ids> expect;
  for (int t = 0; t < kThreads; ++t)
    texts.push_back(mixed_text(64 << 10, 100 + t % 2, true));  // overlapping words
  for (const auto& t : texts)
    expect.push_back(Tokenizer::from_dir(kDs).encode(t, plain()));  // fresh caches
  std::vector<Ids> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 2; ++rep) got[t] = tok.encode(texts[t], plain());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(got[t] == expect[t]) << "thread " << t;
}

// ---- fast BPE vs the naive GPT-2 loop on a tokenizer trained here -------------------------------

using Sym = std::string;  // a byte-level token string

std::vector<Sym> byte_syms(std::string_view piece) {
  std::vector<Sym> s;
  for (char c : piece) s.push_back(byte_to_unicode_utf8(static_cast<uint8_t>(c)));
  return s;
}

// Greedy BPE training: repeatedly merge the most frequent adjacent pair (ties: the pair whose
// symbols were created first). Symbols are ints here so the test trains in well under a second.
std::vector<std::pair<Sym, Sym>> train_merges(const std::vector<std::string>& pieces,
                                              size_t num_merges) {
  std::vector<Sym> names;
  std::unordered_map<Sym, int32_t> ids;
  auto sym_id = [&](const Sym& s) {
    auto [it, fresh] = ids.emplace(s, static_cast<int32_t>(names.size()));
    if (fresh) names.push_back(s);
    return it->second;
  };
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& p : pieces) ++counts[p];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [p, c] : counts) {
    std::vector<int32_t> w;
    for (const Sym& s : byte_syms(p)) w.push_back(sym_id(s));
    words.emplace_back(std::move(w), c);
  }
  std::vector<std::pair<Sym, Sym>> merges;
  std::unordered_map<uint64_t, int64_t> pairs;
  for (size_t m = 0; m < num_merges; ++m) {
    pairs.clear();
    for (const auto& [w, c] : words)
      for (size_t i = 0; i + 1 < w.size(); ++i)
        pairs[(uint64_t(w[i]) << 32) | uint32_t(w[i + 1])] += c;
    if (pairs.empty()) break;
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [k, c] : pairs)
      if (c > best_count || (c == best_count && k < best)) best = k, best_count = c;
    const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xFFFFFFFF);
    merges.emplace_back(names[a], names[b]);
    const int32_t ab = sym_id(names[a] + names[b]);
    for (auto& [w, c] : words) {
      size_t o = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b)
          w[o++] = ab, ++i;
        else
          w[o++] = w[i];
      }
      w.resize(o);
    }
  }
  return merges;
}

// GPT-2 encoder.py bpe(): merge every occurrence of the lowest-ranked pair, left to right.
std::vector<Sym> naive_bpe(std::vector<Sym> w, const std::map<std::pair<Sym, Sym>, size_t>& ranks) {
  while (w.size() > 1) {
    size_t best_rank = SIZE_MAX;
    std::pair<Sym, Sym> best;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      const auto it = ranks.find({w[i], w[i + 1]});
      if (it != ranks.end() && it->second < best_rank) best_rank = it->second, best = it->first;
    }
    if (best_rank == SIZE_MAX) break;
    std::vector<Sym> nw;
    for (size_t i = 0; i < w.size(); ++i) {
      if (i + 1 < w.size() && w[i] == best.first && w[i + 1] == best.second) {
        nw.push_back(w[i] + w[i + 1]);
        ++i;
      } else {
        nw.push_back(w[i]);
      }
    }
    w.swap(nw);
  }
  return w;
}

TEST(RoundTrip, FastBpeMatchesNaiveLoopOnTrainedMerges) {
  const Tokenizer base = Tokenizer::from_dir(kDs);
  const std::string corpus = mixed_text(96 << 10, 5, false);
  const auto merges = train_merges(base.pre_tokenize(corpus), 400);
  ASSERT_EQ(merges.size(), 400u);

  json j = json::parse(slurp(kDs + "/tokenizer.json"));
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode_utf8(static_cast<uint8_t>(b))] = b;
  json jm = json::array();
  std::map<std::pair<Sym, Sym>, size_t> ranks;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = vocab.size();
    jm.push_back({a, b});
    ranks.emplace(std::pair{a, b}, ranks.size());
  }
  const TokenId first_added = static_cast<TokenId>(vocab.size());
  for (size_t i = 0; i < j["added_tokens"].size(); ++i)
    j["added_tokens"][i]["id"] = first_added + static_cast<TokenId>(i);
  j["post_processor"] = nullptr;
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = jm;
  const Tokenizer tok = Tokenizer::from_json(j.dump());

  const std::string text = mixed_text(512 << 10, 6, false);  // other text than the corpus
  Ids naive;
  for (const std::string& piece : tok.pre_tokenize(text))
    for (const Sym& s : naive_bpe(byte_syms(piece), ranks))
      naive.push_back(vocab.at(s).get<TokenId>());
  const Ids fast = tok.encode(text, plain());
  ASSERT_EQ(fast.size(), naive.size());
  EXPECT_TRUE(fast == naive);
  EXPECT_LT(fast.size(), text.size() * 7 / 10) << "the trained merges should compress the text";
  // The cache must not change results: a second encode is identical.
  EXPECT_TRUE(tok.encode(text, plain()) == fast);
  expect_round_trip(tok, mixed_text(2 << 20, 7, true), "trained 400 merges");
}

}  // namespace
}  // namespace deepinfer
