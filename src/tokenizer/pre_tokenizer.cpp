#include "tokenizer/pre_tokenizer.h"

#include <deepinfer/error.h>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace deepinfer {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;

bool get_bool(const json& j, const char* key, bool def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean())
    DI_FAIL("{}.{} must be true or false, got {}", path, key, j[key].dump());
  return j[key].get<bool>();
}

SplitBehavior parse_behavior(const json& j, const std::string& path) {
  if (!j.is_string()) DI_FAIL("{} must be a string, got {}", path, j.dump());
  const std::string s = j.get<std::string>();
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  DI_FAIL(
      "{} = \"{}\" is not a split behavior (Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous)",
      path, s);
}

struct Span {
  size_t b, e;
  bool is_match;
};

// HF NormalizedString::split: the match/gap spans covering `text`, merged per behavior.
void split_piece(std::string_view text, const PreTokenizerStep& st, std::vector<std::string>& out,
                 std::vector<std::pair<size_t, size_t>>& scratch, std::vector<Span>& spans) {
  scratch.clear();
  st.regex->find_all(text, scratch);
  spans.clear();
  size_t prev = 0;
  for (const auto& [b, e] : scratch) {
    if (prev != b) spans.push_back({prev, b, st.invert});
    spans.push_back({b, e, !st.invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), st.invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.emplace_back(text.substr(b, e - b));
  };
  switch (st.behavior) {
    case SplitBehavior::isolated:
      for (const Span& s : spans) emit(s.b, s.e);
      break;
    case SplitBehavior::removed:
      for (const Span& s : spans)
        if (!s.is_match) emit(s.b, s.e);
      break;
    case SplitBehavior::contiguous: {
      // Consecutive spans of the same kind join.
      std::vector<Span> acc;
      bool prev_match = false;
      for (const Span& s : spans) {
        if (!acc.empty() && s.is_match == prev_match)
          acc.back().e = s.e;
        else
          acc.push_back(s);
        prev_match = s.is_match;
      }
      for (const Span& s : acc) emit(s.b, s.e);
      break;
    }
    case SplitBehavior::merged_with_previous: {
      std::vector<Span> acc;
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !prev_match && !acc.empty())
          acc.back().e = s.e;
        else
          acc.push_back(s);
        prev_match = s.is_match;
      }
      for (const Span& s : acc) emit(s.b, s.e);
      break;
    }
    case SplitBehavior::merged_with_next: {
      std::vector<Span> acc;  // built from the right
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !prev_match && !acc.empty())
          acc.back().b = it->b;
        else
          acc.push_back(*it);
        prev_match = it->is_match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->b, it->e);
      break;
    }
  }
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& path) {
  PreTokenizer p;
  if (!j.is_null()) p.parse(j, path);
  return p;
}

void PreTokenizer::parse(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    DI_FAIL("{} must be an object with a string \"type\", got {}", path, j.dump().substr(0, 200));
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      DI_FAIL("{}: Sequence needs an array \"pretokenizers\"", path);
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      parse(j["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", path, i));
    return;
  }
  // The byte-level map must come last: a regex after it would see mapped characters.
  if (byte_level_)
    DI_FAIL(
        "{}: a {} pre-tokenizer after ByteLevel is not supported (ByteLevel must be the "
        "last step, as in GPT-2 and DeepSeek-V3 tokenizers)",
        path, type);
  PreTokenizerStep st;
  if (type == "ByteLevel") {
    st.kind = PreTokenizerStep::Kind::byte_level;
    st.add_prefix_space = get_bool(j, "add_prefix_space", true, path);
    if (get_bool(j, "use_regex", true, path))
      st.regex = std::make_shared<Regex>(kGpt2Pattern, path + " (ByteLevel GPT-2 regex)");
    byte_level_ = true;
  } else if (type == "Split") {
    if (!j.contains("pattern") || !j["pattern"].is_object())
      DI_FAIL("{}: Split needs \"pattern\": {{\"Regex\": ...}} or {{\"String\": ...}}", path);
    const json& pat = j["pattern"];
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      st.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), path + ".pattern.Regex");
    } else if (pat.contains("String") && pat["String"].is_string()) {
      st.regex = std::make_shared<Regex>(pat["String"].get<std::string>(), path + ".pattern.String",
                                         /*literal=*/true);
    } else {
      DI_FAIL("{}.pattern must be {{\"Regex\": string}} or {{\"String\": string}}, got {}", path,
              pat.dump());
    }
    if (!j.contains("behavior")) DI_FAIL("{}: Split needs \"behavior\"", path);
    st.behavior = parse_behavior(j["behavior"], path + ".behavior");
    st.invert = get_bool(j, "invert", false, path);
  } else if (type == "Digits") {
    // HF Digits: runs of numeric chars (Contiguous) or each digit alone.
    const bool individual = get_bool(j, "individual_digits", false, path);
    st.regex = std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", path);
    st.behavior = SplitBehavior::isolated;
  } else {
    DI_FAIL(
        "{}.type = \"{}\" is not supported (supported pre-tokenizers: ByteLevel, Split, "
        "Digits, Sequence). This engine handles byte-level BPE tokenizers such as GPT-2's and "
        "DeepSeek-V3's.",
        path, type);
  }
  steps_.push_back(std::move(st));
}

void PreTokenizer::apply(std::string_view text, std::vector<std::string>& out) const {
  if (text.empty()) return;  // HF drops empty splits before pre-tokenizing (no prefix space)
  std::vector<std::string> cur, next;
  cur.emplace_back(text);
  std::vector<std::pair<size_t, size_t>> scratch;
  std::vector<Span> spans;
  for (const PreTokenizerStep& st : steps_) {
    next.clear();
    for (std::string& piece : cur) {
      if (st.kind == PreTokenizerStep::Kind::byte_level) {
        // HF prepends the space to every piece reaching ByteLevel that lacks one.
        if (st.add_prefix_space && piece[0] != ' ') piece.insert(piece.begin(), ' ');
        if (!st.regex) {
          next.push_back(std::move(piece));
          continue;
        }
      }
      split_piece(piece, st, next, scratch, spans);
    }
    cur.swap(next);
  }
  for (std::string& p : cur)
    if (!p.empty()) out.push_back(std::move(p));
}

}  // namespace deepinfer
