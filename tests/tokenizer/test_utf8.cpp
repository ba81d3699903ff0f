// UTF-8 decoding and replacement against the Unicode Standard's own examples.
#include <gtest/gtest.h>

#include "tokenizer/utf8.h"

namespace deepinfer::utf8 {
namespace {

const std::string kR(kReplacementUtf8);

TEST(Utf8, DecodesEachLength) {
  EXPECT_EQ(decode_one("A").cp, U'A');
  EXPECT_EQ(decode_one("\xC3\xA9").cp, U'\u00E9');
  EXPECT_EQ(decode_one("\xE4\xB8\xAD").cp, U'\u4E2D');
  const Step s = decode_one("\xF0\x9F\x98\x80");
  EXPECT_EQ(s.status, Status::ok);
  EXPECT_EQ(s.cp, U'\U0001F600');
  EXPECT_EQ(s.len, 4u);
}

TEST(Utf8, AppendInvertsDecode) {
  for (char32_t cp :
       {U'\0', U'\x7F', U'\x80', U'\u07FF', U'\u0800', U'\uFFFF', U'\U00010000', U'\U0010FFFF'}) {
    std::string s;
    append(s, cp);
    const Step st = decode_one(s);
    EXPECT_EQ(st.status, Status::ok);
    EXPECT_EQ(st.cp, cp);
    EXPECT_EQ(st.len, s.size());
  }
}

// Unicode Standard 15, §3.9, Table 3-8 ("U+FFFD for Non-Shortest Form Sequences" and the
// maximal-subpart rule): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD
// FFFD d
TEST(Utf8, MaximalSubpartReplacementTable3_8) {
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  size_t n = 0;
  EXPECT_EQ(sanitize(in, &n), "a" + kR + kR + kR + "b" + kR + "c" + kR + kR + "d");
  EXPECT_EQ(n, 6u);
}

TEST(Utf8, RejectsOverlongSurrogatesAndTooLarge) {
  EXPECT_EQ(sanitize("\xC0\xAF"), kR + kR);                    // overlong '/'
  EXPECT_EQ(sanitize("\xE0\x80\xAF"), kR + kR + kR);           // overlong 3-byte
  EXPECT_EQ(sanitize("\xED\xA0\x80"), kR + kR + kR);           // surrogate U+D800
  EXPECT_EQ(sanitize("\xF4\x90\x80\x80"), kR + kR + kR + kR);  // > U+10FFFF
  EXPECT_EQ(sanitize("\xFF"), kR);
  EXPECT_EQ(sanitize("\xE4\xB8"), kR);  // truncated at the end: one replacement
  EXPECT_EQ(decode_one("\xE4\xB8").status, Status::incomplete);
  EXPECT_EQ(decode_one("\xE4\x41").status, Status::invalid);
  EXPECT_EQ(decode_one("\xE4\x41").len, 1u);
  EXPECT_EQ(first_invalid("ab\xC3"), 2u);
  EXPECT_TRUE(is_valid("\xE4\xB8\xAD\xF0\x9F\x98\x80"));
}

TEST(Utf8, Whitespace) {
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\u00A0', U'\u3000', U'\u2028', U'\u0085'})
    EXPECT_TRUE(is_whitespace(c));
  for (char32_t c : {U'a', U'\u200B', U'\u00AD', U'0'}) EXPECT_FALSE(is_whitespace(c));
}

}  // namespace
}  // namespace deepinfer::utf8
