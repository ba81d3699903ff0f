// Normalizers of tokenizer.json: null, NFC/NFD/NFKC/NFKD (through ICU), Sequence of those.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

class Normalizer {
 public:
  // `j` is the "normalizer" value (may be null); `path` its JSON path for errors.
  static Normalizer from_json(const nlohmann::json& j, const std::string& path);
  bool is_identity() const { return forms_.empty(); }
  std::string apply(std::string_view text) const;  // text: valid UTF-8

 private:
  void parse(const nlohmann::json& j, const std::string& path);
  std::vector<std::string> names_;  // for error messages
  std::vector<const void*> forms_;  // const UNormalizer2*
};

}  // namespace deepinfer
