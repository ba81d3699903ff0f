// Engram's tokenizer compression (docs/engram.md §1.2): every raw token id maps to a canonical id
// shared by the tokens whose text normalizes to the same key (" The", "the" and "THE" become one),
// so the n-gram hash sees fewer distinct ids. Built once at load from the model's tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

// The key of one token's text (valid UTF-8): NFKC, then NFD with every mark (general categories
// Mn, Mc, Me) dropped, then each code point lowercased (its own mapping, no context), then every
// run of space/tab/CR/LF becomes one space; a string that is then exactly one space stays " ",
// anything else loses its leading and trailing whitespace (Unicode White_Space). An empty result
// gives `text` itself.
std::string engram_normalize(std::string_view text);

struct CompressionTable {
  std::vector<int64_t> raw_to_canonical;  // [tokenizer vocab]: canonical id of each raw id
  int64_t num_canonical = 0;              // V': distinct keys, canonical ids are 0..V'-1

  // The canonical id of `raw` (>= 0). Ids past the tokenizer's vocabulary (rows of the embedding
  // that no token names) map to the canonical id of `fallback`.
  int32_t canonical(int64_t raw, int64_t fallback) const;
};

// Scans the raw ids 0..vocab-1 in order. The key of id t: the text decode([t]) gives (special
// tokens kept); if that text holds U+FFFD (the id is part of a UTF-8 character), the stored token
// string instead, so byte pieces stay apart; else engram_normalize(text). A key's canonical id is
// the order of its first appearance. An id the vocabulary skips has the key "".
CompressionTable build_compression_table(const Tokenizer& tok);

}  // namespace deepinfer
