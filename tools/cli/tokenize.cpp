// `deepinfer tokenize`: a model's tokenizer on its own. Encoding prints the ids on one line,
// separated by spaces; --decode "ID ID ..." prints the text they decode to.
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct TokenizeCli {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::string file;
  std::string decode;
  bool no_bos = false;
};

Tokenizer load_tokenizer(const TokenizeCli& o) {
  const std::string path = o.model.empty() ? o.tokenizer : o.model + "/tokenizer.json";
  const char* opt = o.model.empty() ? "--tokenizer" : "--model";
  std::error_code ec;
  if (!o.model.empty() && !std::filesystem::is_directory(o.model, ec))
    DI_USAGE(
        "--model {}: no such folder; give the model folder that holds tokenizer.json (e.g. "
        "models/tiny)",
        o.model);
  if (!std::filesystem::is_regular_file(path, ec))
    DI_USAGE(
        "{} {}: {} not found; give {}", opt, o.model.empty() ? o.tokenizer : o.model, path,
        o.model.empty() ? "a tokenizer.json file" : "a model folder that holds tokenizer.json");
  return Tokenizer::from_file(path);
}

std::string read_input(const std::string& file) {
  if (file == "-") return {std::istreambuf_iterator<char>(std::cin), {}};
  std::ifstream in(file, std::ios::binary);
  if (!in) DI_USAGE("cannot read --file {}; give a text file (or - for stdin)", file);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<TokenId> parse_ids(const std::string& s, size_t vocab) {
  std::vector<TokenId> ids;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '\n') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != ',' && s[j] != '\t' && s[j] != '\n') ++j;
    TokenId v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + j, v);
    if (ec != std::errc() || p != s.data() + j)
      DI_USAGE(
          "--decode expects token ids separated by spaces, like \"0 1421 520\"; '{}' is not an id",
          s.substr(i, j - i));
    if (v < 0 || size_t(v) >= vocab)
      DI_USAGE("--decode: id {} is outside this tokenizer's vocabulary [0, {})", v, vocab);
    ids.push_back(v);
    i = j;
  }
  return ids;
}

int run_tokenize(const TokenizeCli& o) {
  if (o.model.empty() == o.tokenizer.empty())
    DI_USAGE("give the tokenizer: --model DIR or --tokenizer FILE");
  const int inputs = int(!o.text.empty()) + int(!o.file.empty()) + int(!o.decode.empty());
  if (inputs != 1)
    DI_USAGE("give one input: --text T or --file F to encode, or --decode \"ID ID ...\"");
  if (!o.decode.empty() && o.no_bos)
    DI_USAGE("--no-bos is for encoding; --decode prints every id it is given");
  const Tokenizer tok = load_tokenizer(o);
  if (!o.decode.empty()) {
    const std::string text = tok.decode(parse_ids(o.decode, tok.vocab_size()));
    std::fputs((text + "\n").c_str(), stdout);
    return 0;
  }
  EncodeOptions eo;
  eo.add_special_tokens = !o.no_bos;
  const std::vector<TokenId> ids = tok.encode(o.text.empty() ? read_input(o.file) : o.text, eo);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::fputs((line + "\n").c_str(), stdout);
  return 0;
}

DEEPINFER_COMMAND("", "tokenize",
                  "Encode text to token ids (one line, space-separated) or decode ids to text with "
                  "a model's tokenizer",
                  [](CLI::App& app) {
                    auto o = std::make_shared<TokenizeCli>();
                    auto* model =
                        app.add_option("--model", o->model, "Model folder holding tokenizer.json");
                    app.add_option("--tokenizer", o->tokenizer,
                                   "A tokenizer.json file (tokenizer_config.json "
                                   "next to it is read too)")
                        ->excludes(model);
                    auto* text = app.add_option("--text", o->text, "Text to encode");
                    auto* file =
                        app.add_option("--file", o->file, "File to encode (all of it; - for stdin)")
                            ->excludes(text);
                    app.add_option("--decode", o->decode,
                                   "Token ids to decode, separated by spaces")
                        ->excludes(text)
                        ->excludes(file);
                    app.add_flag("--no-bos", o->no_bos,
                                 "Encode without the special tokens the tokenizer adds (the BOS)");
                    return [o] { return run_tokenize(*o); };
                  });

}  // namespace
}  // namespace deepinfer::cli
