// Engram's compression table (docs/engram.md §1.2): the normalizer on hand-written strings (the
// expected keys worked out by hand from the Unicode data: NFKC, NFD, marks, lowercase, whitespace),
// and a hand-made byte-level vocabulary whose canonical ids follow from those keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/compression.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

TEST(EngramNormalize, HandWorkedKeys) {
  EXPECT_EQ(engram_normalize("Hello"), "hello");
  EXPECT_EQ(engram_normalize(" The"), "the");        // leading space stripped
  EXPECT_EQ(engram_normalize("a \t\r\n b"), "a b");  // one run, one space
  EXPECT_EQ(engram_normalize("a\n\nb  c"), "a b c");
  EXPECT_EQ(engram_normalize(" "), " ");     // a lone space is kept
  EXPECT_EQ(engram_normalize("\n\n"), " ");  // ... also after collapsing
  EXPECT_EQ(engram_normalize("\t "), " ");
  EXPECT_EQ(engram_normalize("  x \r"), "x");
  EXPECT_EQ(engram_normalize("Caf\u00e9"), "cafe");  // é = e + U+0301, the mark dropped
  EXPECT_EQ(engram_normalize("Cafe\u0301"), "cafe");
  EXPECT_EQ(engram_normalize("\ufb01ne"), "fine");  // NFKC: the ligature ﬁ is "fi"
  EXPECT_EQ(engram_normalize("\uff28\uff45\uff4c\uff4c\uff4f"), "hello");  // fullwidth
  EXPECT_EQ(engram_normalize("<\uff5cUser\uff5c>"), "<|user|>");           // DeepSeek's ｜
  EXPECT_EQ(engram_normalize("x\u00a0"), "x");  // NFKC: no-break space is a space
  EXPECT_EQ(engram_normalize("\u01c5"), "dz");  // ǅ -> Dž -> Dz (caron dropped) -> dz
  EXPECT_EQ(engram_normalize("\u0130"), "i");   // İ -> I + dot above -> I -> i
  EXPECT_EQ(engram_normalize("\u0391\u03a3"), "\u03b1\u03c3");  // per code point: no final ς
  EXPECT_EQ(engram_normalize("\u0915\u093f"), "\u0915");        // क + vowel sign (Mc) dropped
  EXPECT_EQ(engram_normalize("\u2003x\u3000"), "x");            // NFKC: em space, ideographic space
  EXPECT_EQ(engram_normalize("\u2028x"), "x");  // line separator: White_Space, stripped
  // Nothing left: the text itself is the key.
  EXPECT_EQ(engram_normalize("\u0301"), "\u0301");
  EXPECT_EQ(engram_normalize(""), "");
  EXPECT_EQ(engram_normalize(std::string("\0", 1)), std::string("\0", 1));
  EXPECT_EQ(engram_normalize("\u00c0\u00b2"), "a2");  // À -> a, superscript two -> 2
}

// A byte-level vocabulary: "Ġ" is the byte 0x20, "Ċ" 0x0A, "Ã" 0xC3 and "©" 0xA9
// (the GPT-2 byte-to-character map), so "Ã©" is é and "Ã" alone a cut character.
Tokenizer hand_vocab() {
  using json = nlohmann::json;
  json vocab = {{"the", 0},    {"\u0120the", 1},    {"The", 2},    {"\u0120The", 3},
                {"\u0120", 4}, {"\u010a\u010a", 5}, {"\u00c3", 6}, {"\u00c3\u00a9", 7},
                {"e", 8},      {"\u00c3\u00a8", 9}};
  json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 10},
         {"content", "<\uff5cUser\uff5c>"},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  return Tokenizer::from_json(j.dump());
}

TEST(EngramCompression, FirstAppearanceOrderOfTheKeys) {
  const CompressionTable t = build_compression_table(hand_vocab());
  // keys: the the the the | " " " " | "Ã" (raw token: a cut character) | e e | e (è) | <|user|>
  EXPECT_EQ(t.raw_to_canonical, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 2, 3, 3, 3, 4}));
  EXPECT_EQ(t.num_canonical, 5);
  EXPECT_EQ(t.canonical(7, 0), 3);
  EXPECT_EQ(t.canonical(11, 4), 1);  // past the vocabulary: the fallback's id
}

}  // namespace
}  // namespace deepinfer
