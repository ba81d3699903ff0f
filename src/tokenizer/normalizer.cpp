#include "tokenizer/normalizer.h"

#include <deepinfer/error.h>

#include <nlohmann/json.hpp>

#include "core/check.h"

#if DEEPINFER_HAVE_ICU
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#endif

namespace deepinfer {

using json = nlohmann::json;

Normalizer Normalizer::from_json(const json& j, const std::string& path) {
  Normalizer n;
  if (!j.is_null()) n.parse(j, path);
  return n;
}

void Normalizer::parse(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    DI_FAIL("{} must be null or an object with a string \"type\", got {}", path,
            j.dump().substr(0, 200));
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      DI_FAIL("{}: Sequence needs an array \"normalizers\"", path);
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      parse(j["normalizers"][i], fmt::format("{}.normalizers[{}]", path, i));
    return;
  }
  if (type != "NFC" && type != "NFD" && type != "NFKC" && type != "NFKD")
    DI_FAIL(
        "{}.type = \"{}\" is not supported (supported normalizers: null, NFC, NFD, NFKC, NFKD, "
        "Sequence). Byte-level BPE tokenizers such as DeepSeek-V3's use none.",
        path, type);
#if DEEPINFER_HAVE_ICU
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* f = type == "NFC"    ? unorm2_getNFCInstance(&err)
                          : type == "NFD"  ? unorm2_getNFDInstance(&err)
                          : type == "NFKC" ? unorm2_getNFKCInstance(&err)
                                           : unorm2_getNFKDInstance(&err);
  if (U_FAILURE(err) || !f)
    DI_FAIL("{}: ICU has no {} normalizer: {}", path, type, u_errorName(err));
  forms_.push_back(f);
  names_.push_back(type);
#else
  DI_FAIL(
      "{}.type = \"{}\" needs ICU, and deepinfer was built without it: install libicu-dev "
      "and reconfigure.",
      path, type);
#endif
}

std::string Normalizer::apply(std::string_view text) const {
  if (forms_.empty() || text.empty()) return std::string(text);
#if DEEPINFER_HAVE_ICU
  std::string cur(text);
  for (size_t k = 0; k < forms_.size(); ++k) {
    const auto* f = static_cast<const UNormalizer2*>(forms_[k]);
    UErrorCode err = U_ZERO_ERROR;
    // UTF-8 -> UTF-16 -> normalize -> UTF-8 (ICU's C API normalizes UTF-16).
    int32_t n16 = 0;
    u_strFromUTF8(nullptr, 0, &n16, cur.data(), static_cast<int32_t>(cur.size()), &err);
    err = U_ZERO_ERROR;
    std::u16string in(static_cast<size_t>(n16), u'\0');
    u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), n16, nullptr, cur.data(),
                  static_cast<int32_t>(cur.size()), &err);
    // Normalization can grow text (NFKD up to 18x per char); retry with the size ICU reports.
    std::u16string out(in.size() * 2 + 16, u'\0');
    int32_t nout = unorm2_normalize(f, reinterpret_cast<const UChar*>(in.data()), n16,
                                    reinterpret_cast<UChar*>(out.data()),
                                    static_cast<int32_t>(out.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      err = U_ZERO_ERROR;
      out.assign(static_cast<size_t>(nout), u'\0');
      nout = unorm2_normalize(f, reinterpret_cast<const UChar*>(in.data()), n16,
                              reinterpret_cast<UChar*>(out.data()), nout, &err);
    }
    if (U_FAILURE(err)) DI_FAIL("{} normalization failed: {}", names_[k], u_errorName(err));
    int32_t n8 = 0;
    err = U_ZERO_ERROR;
    u_strToUTF8(nullptr, 0, &n8, reinterpret_cast<const UChar*>(out.data()), nout, &err);
    err = U_ZERO_ERROR;
    cur.assign(static_cast<size_t>(n8), '\0');
    u_strToUTF8(cur.data(), n8, nullptr, reinterpret_cast<const UChar*>(out.data()), nout, &err);
    if (U_FAILURE(err))
      DI_FAIL("{} normalization: UTF-8 conversion failed: {}", names_[k], u_errorName(err));
  }
  return cur;
#else
  return std::string(text);
#endif
}

}  // namespace deepinfer
