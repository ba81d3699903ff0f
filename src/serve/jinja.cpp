#include "serve/jinja.h"

#include <fmt/format.h>
#include <unicode/locid.h>
#include <unicode/stringoptions.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <utility>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace deepinfer::serve::jinja {
namespace {

using json = nlohmann::json;

// Guards against templates (or contexts) that would exhaust memory or the stack.
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int64_t kMaxRange = 100'000;
constexpr int kMaxDepth = 200;  // nesting of expressions and blocks
// Tokens in one tag: bounds the depth of an expression tree (a + b + ... nests without
// parentheses), hence the evaluator's recursion. Real chat templates stay under 100.
constexpr size_t kMaxTagTokens = 1000;

// ---- Values ----------------------------------------------------------------------------------

enum class Kind : uint8_t { undefined, none, boolean, integer, real, string, list, dict, ns };

struct Value;
using List = std::vector<Value>;
struct Dict;

// A Python value as Jinja sees it. Strings carry per-byte untrusted flags in `mark` (empty when
// every byte is trusted). Dicts keep insertion order, as Python's do.
struct Value {
  Kind kind = Kind::undefined;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;     // string; undefined: the name that was missing, for messages
  std::string mark;  // string: empty, or one byte per byte of s (1 = untrusted)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // dict or namespace (a namespace is mutated in place)

  static Value undefined(std::string name) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return make(Kind::none); }
  static Value boolean(bool x) {
    Value v = make(Kind::boolean);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::integer);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Kind::real);
    v.d = x;
    return v;
  }
  static Value str(std::string x, std::string m = {}) {
    Value v = make(Kind::string);
    v.s = std::move(x);
    if (m.find('\1') != std::string::npos) v.mark = std::move(m);
    return v;
  }
  static Value of_list(List x, bool tuple = false) {
    Value v = make(Kind::list);
    v.list = std::make_shared<List>(std::move(x));
    v.b = tuple;  // a tuple prints as (a, b) and never equals a list
    return v;
  }
  static Value of_dict(Dict x, Kind k = Kind::dict);

  bool is(Kind k) const { return kind == k; }
  bool numeric() const {
    return kind == Kind::boolean || kind == Kind::integer || kind == Kind::real;
  }
  bool int_like() const { return kind == Kind::boolean || kind == Kind::integer; }
  int64_t as_int() const { return kind == Kind::boolean ? int64_t{b} : i; }
  double as_double() const { return kind == Kind::real ? d : static_cast<double>(as_int()); }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(std::string key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) {
        old = std::move(v);
        return;
      }
    items.emplace_back(std::move(key), std::move(v));
  }
};

Value Value::of_dict(Dict x, Kind k) {
  Value v = make(k);
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::real:
      return "float";
    case Kind::string:
      return "str";
    case Kind::list:
      return "list";
    case Kind::dict:
      return "dict";
    case Kind::ns:
      return "Namespace";
  }
  return "?";
}

// A string under construction, with its untrusted flags.
struct Buf {
  std::string s, m;  // m empty while every byte is trusted

  void append(std::string_view text, std::string_view mark = {}) {
    if (mark.empty() && m.empty()) {
      s += text;
    } else {
      if (m.empty()) m.assign(s.size(), '\0');
      s += text;
      if (mark.empty())
        m.append(text.size(), '\0');
      else
        m += mark;
    }
    if (s.size() > kMaxOutputBytes)
      DI_FAIL("chat template: the output passed {} MiB; the template or conversation is too large",
              kMaxOutputBytes >> 20);
  }
  void append(const Value& str) { append(str.s, str.mark); }
  // Appends generated text (quotes, escapes) that stands for `untrusted` input.
  void append_as(std::string_view text, bool untrusted) {
    append(text, untrusted ? std::string(text.size(), '\1') : std::string());
  }
  Value take() { return Value::str(std::move(s), std::move(m)); }
};

Value substr(const Value& v, size_t pos, size_t n = std::string::npos) {
  return Value::str(v.s.substr(pos, n), v.mark.empty() ? std::string() : v.mark.substr(pos, n));
}

// Byte offsets of the characters of `s` and s.size() at the end (Python indexes by character).
std::vector<size_t> char_starts(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t p = 0; p < s.size(); p += utf8::decode_one(s.substr(p)).len) out.push_back(p);
  out.push_back(s.size());
  return out;
}

char32_t char_at(std::string_view s, size_t pos) { return utf8::decode_one(s.substr(pos)).cp; }

// Python's str.isspace(): the Unicode White_Space property plus the separators U+001C..U+001F.
bool py_space(char32_t c) { return utf8::is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // shortest round trip, "d.ddde+XX"
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t k = 0; k < e; ++k)
    if (sci[k] >= '0' && sci[k] <= '9') digits += sci[k];
  std::string out = x < 0 || (x == 0 && std::signbit(x)) ? "-" : "";
  if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent notation here
    out += digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp >= 0) {
    const size_t int_digits = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_digits)
      out += digits + std::string(int_digits - digits.size(), '0') + ".0";
    else
      out.append(digits, 0, int_digits).append(".").append(digits, int_digits);
  } else {
    out.append("0.").append(static_cast<size_t>(-exp - 1), '0').append(digits);
  }
  return out;
}

bool has_mark(const Value& v) { return v.mark.find('\1') != std::string::npos; }

void repr_to(const Value& v, Buf& out);

// Python's str(): what {{ v }} prints.
void str_to(const Value& v, Buf& out) {
  switch (v.kind) {
    case Kind::undefined:
      return;
    case Kind::none:
      return out.append("None");
    case Kind::boolean:
      return out.append(v.b ? "True" : "False");
    case Kind::integer:
      return out.append(fmt::format("{}", v.i));
    case Kind::real:
      return out.append(float_repr(v.d));
    case Kind::string:
      return out.append(v);
    default:
      return repr_to(v, out);
  }
}

Value to_str(const Value& v) {
  if (v.is(Kind::string)) return v;
  Buf b;
  str_to(v, b);
  return b.take();
}

// Python's repr() (lists and dicts print their items this way). A string with any untrusted
// byte is flagged whole, quotes included: flagging more than needed is the safe side.
void repr_to(const Value& v, Buf& out) {
  switch (v.kind) {
    case Kind::string: {
      const bool q1 = v.s.find('\'') != std::string::npos, q2 = v.s.find('"') != std::string::npos;
      const char q = q1 && !q2 ? '"' : '\'';
      std::string r(1, q);
      for (char c : v.s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == q || c == '\\') {
          r += '\\';
          r += c;
        } else if (c == '\n') {
          r += "\\n";
        } else if (c == '\r') {
          r += "\\r";
        } else if (c == '\t') {
          r += "\\t";
        } else if (u < 0x20 || u == 0x7F) {
          r += fmt::format("\\x{:02x}", u);
        } else {
          r += c;
        }
      }
      r += q;
      return out.append_as(r, has_mark(v));
    }
    case Kind::list: {
      out.append(v.b ? "(" : "[");
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(", ");
        repr_to((*v.list)[k], out);
      }
      if (v.b && v.list->size() == 1) out.append(",");
      return out.append(v.b ? ")" : "]");
    }
    case Kind::dict: {
      out.append("{");
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out.append(", ");
        first = false;
        repr_to(Value::str(k), out);
        out.append(": ");
        repr_to(x, out);
      }
      return out.append("}");
    }
    case Kind::ns:
      DI_FAIL("chat template: a namespace cannot be printed; print one of its attributes");
    default:
      return str_to(v, out);
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent): the tojson transformers installs.
void tojson_to(const Value& v, Buf& out, int indent, int level) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    std::string nl(1, '\n');
    nl.append(static_cast<size_t>(indent * lvl), ' ');
    out.append(nl);
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Kind::none:
      return out.append("null");
    case Kind::boolean:
      return out.append(v.b ? "true" : "false");
    case Kind::integer:
      return out.append(fmt::format("{}", v.i));
    case Kind::real:
      if (std::isnan(v.d)) return out.append("NaN");
      if (std::isinf(v.d)) return out.append(v.d > 0 ? "Infinity" : "-Infinity");
      return out.append(float_repr(v.d));
    case Kind::string: {
      std::string r = "\"";
      for (char c : v.s) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
          case '"':
            r += "\\\"";
            break;
          case '\\':
            r += "\\\\";
            break;
          case '\n':
            r += "\\n";
            break;
          case '\r':
            r += "\\r";
            break;
          case '\t':
            r += "\\t";
            break;
          case '\b':
            r += "\\b";
            break;
          case '\f':
            r += "\\f";
            break;
          default:
            if (u < 0x20)
              r += fmt::format("\\u{:04x}", u);
            else
              r += c;
        }
      }
      r += '"';
      return out.append_as(r, has_mark(v));
    }
    case Kind::list: {
      if (v.list->empty()) return out.append("[]");
      out.append("[");
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(item_sep);
        newline(level + 1);
        tojson_to((*v.list)[k], out, indent, level + 1);
      }
      newline(level);
      return out.append("]");
    }
    case Kind::dict: {
      if (v.dict->items.empty()) return out.append("{}");
      out.append("{");
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out.append(item_sep);
        first = false;
        newline(level + 1);
        tojson_to(Value::str(k), out, indent, level + 1);
        out.append(": ");
        tojson_to(x, out, indent, level + 1);
      }
      newline(level);
      return out.append("}");
    }
    default:
      DI_FAIL("chat template: tojson: a value of type {} is not JSON serializable", type_name(v));
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return v.b;
    case Kind::integer:
      return v.i != 0;
    case Kind::real:
      return v.d != 0;
    case Kind::string:
      return !v.s.empty();
    case Kind::list:
      return !v.list->empty();
    case Kind::dict:
      return !v.dict->items.empty();
    case Kind::ns:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.numeric() && b.numeric()) {
    if (a.int_like() && b.int_like()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::string:
      return a.s == b.s;
    case Kind::list:
      return a.b == b.b && a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), equal);
    case Kind::dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case Kind::ns:
      return a.dict == b.dict;
    default:
      return true;  // undefined, none
  }
}

Value from_json(const json& j, bool untrusted) {
  switch (j.type()) {
    case json::value_t::null:
      return Value::none();
    case json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        DI_FAIL("chat template: the integer {} in the context is too large", u);
      return Value::integer(static_cast<int64_t>(u));
    }
    case json::value_t::number_float:
      return Value::real(j.get<double>());
    case json::value_t::string: {
      std::string s = j.get<std::string>();
      std::string m = untrusted ? std::string(s.size(), '\1') : std::string();
      return Value::str(std::move(s), std::move(m));
    }
    case json::value_t::array: {
      List l;
      for (const json& x : j) l.push_back(from_json(x, untrusted));
      return Value::of_list(std::move(l));
    }
    case json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) d.items.emplace_back(k, from_json(x, untrusted));
      return Value::of_dict(std::move(d));
    }
    default:
      DI_FAIL("chat template: the context holds a {} value, which templates cannot use",
              j.type_name());
  }
}

// ---- Lexer -----------------------------------------------------------------------------------

struct Tok {
  enum Type : uint8_t { name, string, integer, real, op, end } type = end;
  std::string text;  // name, operator, or the decoded string
  int64_t i = 0;
  double d = 0;
  size_t pos = 0;  // byte offset in the source
};

// The template as alternating text and tags: text, tag, text, ..., text.
struct Item {
  enum Kind : uint8_t { plain, expr, stmt, comment } kind = plain;
  size_t pos = 0;
  std::string text;
  std::vector<Tok> toks;  // expr and stmt; the last is an `end` token at the closing delimiter
  // '-' strips; '+' keeps: no lstrip_blocks before the tag, no trim_blocks after it.
  char open_ws = 0, close_ws = 0;
};

struct Source {
  std::string text;  // newlines normalized to "\n", one trailing newline dropped (as Jinja does)

  std::string where(size_t pos) const {
    size_t line = 1, col = 1;
    for (size_t p = 0; p < pos && p < text.size(); p += utf8::decode_one(text.substr(p)).len) {
      if (text[p] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    return fmt::format("line {} column {}", line, col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw Error(fmt::format("chat template, {}: {}", where(pos), msg));
  }
};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(const Source& src) : src_(src), s_(src.text) {}

  std::vector<Item> run() {
    std::vector<Item> items;
    size_t p = 0;
    for (;;) {
      size_t q = p;
      while (q < s_.size() && !(s_[q] == '{' && q + 1 < s_.size() &&
                                (s_[q + 1] == '{' || s_[q + 1] == '%' || s_[q + 1] == '#')))
        ++q;
      items.push_back({Item::plain, p, std::string(s_.substr(p, q - p)), {}, 0, 0});
      if (q >= s_.size()) break;
      items.push_back(tag(q, p));
    }
    apply_whitespace(items);
    return items;
  }

 private:
  // Reads the tag at `start`; sets `next` to the offset after it.
  Item tag(size_t start, size_t& next) {
    Item it;
    it.pos = start;
    const char kind = s_[start + 1];
    it.kind = kind == '{' ? Item::expr : kind == '%' ? Item::stmt : Item::comment;
    size_t p = start + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) it.open_ws = s_[p++];
    if (it.kind == Item::comment) {
      const size_t e = s_.find("#}", p);
      if (e == std::string_view::npos) src_.fail(start, "unclosed comment: '{#' without '#}'");
      if (e > p && (s_[e - 1] == '-' || s_[e - 1] == '+')) it.close_ws = s_[e - 1];
      next = e + 2;
      return it;
    }
    const std::string_view close = it.kind == Item::expr ? "}}" : "%}";
    int depth = 0;  // open brackets: a '}' inside a dict literal does not close the tag
    for (;;) {
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
      if (p >= s_.size())
        src_.fail(start,
                  fmt::format("unclosed tag: '{}' without '{}'", s_.substr(start, 2), close));
      if (depth == 0 && (s_[p] == '-' || (s_[p] == '+' && it.kind == Item::stmt)) &&
          s_.substr(p + 1, 2) == close) {
        it.close_ws = s_[p];
        p += 1;
      }
      if (depth == 0 && s_.substr(p, 2) == close) {
        it.toks.push_back({Tok::end, std::string(close), 0, 0, p});
        next = p + 2;
        break;
      }
      if (it.toks.size() >= kMaxTagTokens)
        src_.fail(start, fmt::format("a tag longer than {} tokens", kMaxTagTokens));
      Tok t = token(p);
      if (t.type == Tok::op) {
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if (t.text == ")" || t.text == "]" || t.text == "}") --depth;
      }
      it.toks.push_back(std::move(t));
    }
    if (it.kind == Item::stmt && it.toks.size() > 1 && it.toks[0].type == Tok::name &&
        it.toks[0].text == "raw")
      src_.fail(start, "{% raw %} blocks are not supported");
    return it;
  }

  Tok token(size_t& p) {
    Tok t;
    t.pos = p;
    const char c = s_[p];
    if (is_name_start(c)) {
      size_t q = p;
      while (q < s_.size() && (is_name_start(s_[q]) || is_digit(s_[q]))) ++q;
      t.type = Tok::name;
      t.text = std::string(s_.substr(p, q - p));
      p = q;
      return t;
    }
    if (is_digit(c)) {
      size_t q = p;
      while (q < s_.size() && is_digit(s_[q])) ++q;
      bool real = false;
      if (q + 1 < s_.size() && s_[q] == '.' && is_digit(s_[q + 1])) {
        real = true;
        for (++q; q < s_.size() && is_digit(s_[q]);) ++q;
      }
      if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
        size_t r = q + 1;
        if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) ++r;
        if (r < s_.size() && is_digit(s_[r])) {
          real = true;
          for (q = r; q < s_.size() && is_digit(s_[q]);) ++q;
        }
      }
      const std::string num(s_.substr(p, q - p));
      if (real) {
        t.type = Tok::real;
        t.d = std::strtod(num.c_str(), nullptr);
      } else {
        t.type = Tok::integer;
        const auto r = std::from_chars(num.data(), num.data() + num.size(), t.i);
        if (r.ec != std::errc()) src_.fail(p, fmt::format("the integer {} is too large", num));
      }
      p = q;
      return t;
    }
    if (c == '\'' || c == '"') {
      t.type = Tok::string;
      t.text = string_literal(p);
      return t;
    }
    static constexpr std::string_view kOps2[] = {"**", "//", "==", "!=", "<=", ">="};
    for (std::string_view op : kOps2)
      if (s_.substr(p, 2) == op) {
        t.type = Tok::op;
        t.text = std::string(op);
        p += 2;
        return t;
      }
    if (std::string_view("+-*/%~<>=()[]{}.,:|").find(c) != std::string_view::npos) {
      t.type = Tok::op;
      t.text = std::string(1, c);
      ++p;
      return t;
    }
    src_.fail(p, fmt::format("unexpected character '{}' in a tag",
                             s_.substr(p, utf8::decode_one(s_.substr(p)).len)));
  }

  // A quoted string with Python's escapes (Jinja decodes them as "unicode-escape").
  std::string string_literal(size_t& p) {
    const size_t start = p;
    const char q = s_[p++];
    std::string out;
    auto hex = [&](size_t n) {
      if (p + n > s_.size()) src_.fail(start, "a truncated \\x, \\u or \\U escape in a string");
      uint32_t v = 0;
      for (size_t k = 0; k < n; ++k) {
        const char h = s_[p + k];
        const int d = is_digit(h)              ? h - '0'
                      : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                               : -1;
        if (d < 0) src_.fail(p - 2, "a malformed \\x, \\u or \\U escape in a string");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      p += n;
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        src_.fail(start, fmt::format("the escape U+{:X} is not a Unicode scalar value", v));
      utf8::append(out, static_cast<char32_t>(v));
    };
    while (true) {
      if (p >= s_.size()) src_.fail(start, "unclosed string literal");
      const char c = s_[p++];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= s_.size()) src_.fail(start, "unclosed string literal");
      const char e = s_[p++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < s_.size() && s_[p] >= '0' && s_[p] <= '7'; ++k)
              v = v * 8 + static_cast<uint32_t>(s_[p++] - '0');
            utf8::append(out, static_cast<char32_t>(v));
          } else if (e == 'N') {
            src_.fail(p - 2, "\\N{...} escapes are not supported");
          } else {
            out += '\\';  // Python keeps unknown escapes as they are
            out += e;
          }
      }
    }
    return out;
  }

  // '-' strips all whitespace on its side; trim_blocks drops the first newline after a block or
  // comment tag (unless it closes with '+'); lstrip_blocks drops the whitespace before a block or
  // comment tag that starts its line (unless it opens with '+').
  static void apply_whitespace(std::vector<Item>& items) {
    auto strip_left = [](std::string& s) {  // Unicode whitespace too, as Python's \s
      size_t k = 0;
      while (k < s.size() && py_space(char_at(s, k))) k += utf8::decode_one(s.substr(k)).len;
      s.erase(0, k);
    };
    for (size_t k = 0; k < items.size(); k += 2) {
      std::string& text = items[k].text;
      bool line_start = k == 0;
      if (k > 0) {
        const Item& prev = items[k - 1];
        if (prev.close_ws == '-') {
          strip_left(text);
        } else if (prev.close_ws != '+' &&
                   (prev.kind == Item::stmt || prev.kind == Item::comment)) {
          if (!text.empty() && text[0] == '\n') text.erase(0, 1), line_start = true;
        }
      }
      if (k + 1 < items.size()) {
        const Item& next = items[k + 1];
        if (next.open_ws == '-') {
          size_t e = text.size();
          while (e > 0) {
            const size_t n = utf8::last_char_len(std::string_view(text).substr(0, e));
            if (!py_space(char_at(text, e - n))) break;
            e -= n;
          }
          text.resize(e);
        } else if (next.open_ws != '+' && (next.kind == Item::stmt || next.kind == Item::comment)) {
          const size_t nl = text.rfind('\n');
          const size_t line = nl == std::string::npos ? 0 : nl + 1;
          bool blank = true;  // only whitespace (Python's \s) since the line began
          for (size_t q = line; blank && q < text.size(); q += utf8::decode_one(text.substr(q)).len)
            blank = py_space(char_at(text, q));
          if ((nl != std::string::npos || line_start) && blank) text.resize(line);
        }
      }
    }
  }

  const Source& src_;
  std::string_view s_;
};

// ---- AST -------------------------------------------------------------------------------------

// clang-format off
enum class Op : uint8_t {
  literal, name, list, tuple, dict, attr, item, slice, call, filter, test, cond, compare,
  neg, pos, not_, and_, or_, add, sub, mul, div, floordiv, mod, pow, concat,
  eq, ne, lt, gt, le, ge, in, not_in  // the operators of a compare node
};
// clang-format on

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  Op op = Op::literal;
  size_t pos = 0;
  std::string name;             // name, attribute, filter, test
  Value value;                  // literal
  std::vector<ExprP> args;      // operands; call: callee then arguments; filter/test: subject first
  std::vector<std::string> kw;  // call/filter: names of the trailing keyword arguments
  bool negate = false;          // "is not"
  std::vector<Op> ops;          // compare: a op0 b op1 c ... (Python's chained comparisons)
  std::vector<size_t> op_pos;   // compare: where each operator is
};

struct Node {
  enum Kind : uint8_t { plain, output, if_, for_, set, set_attr, set_block, break_, continue_ };
  Kind kind = plain;
  size_t pos = 0;
  std::string text;               // text; set/set_block: the variable; set_attr: the attribute
  std::string target;             // set_attr: the namespace variable
  std::vector<std::string> vars;  // for: the loop variables
  ExprP expr;                     // output and set: the value; for: the iterable
  ExprP filter;                   // for ... if filter
  std::vector<std::pair<ExprP, std::vector<Node>>> branches;  // if: (condition or null, body)
  std::vector<Node> body, else_body;
};

// ---- Parser ----------------------------------------------------------------------------------

class Parser {
 public:
  Parser(const Source& src, const std::vector<Item>& items) : src_(src), items_(items) {}

  std::vector<Node> run() {
    std::string stop;
    std::vector<Node> body = parse_body({}, stop);
    return body;
  }

 private:
  // Statements up to (not including) one of the `stops` tags, whose name is returned in `stop`;
  // the end of the template when `stops` is empty.
  std::vector<Node> parse_body(std::initializer_list<std::string_view> stops, std::string& stop,
                               size_t opener = 0) {
    if (++depth_ > kMaxDepth) src_.fail(items_[idx_].pos, "blocks are nested too deeply");
    std::vector<Node> out;
    for (; idx_ < items_.size(); ++idx_) {
      const Item& it = items_[idx_];
      if (it.kind == Item::comment) continue;
      if (it.kind == Item::plain) {
        if (!it.text.empty()) {
          Node n;
          n.kind = Node::plain;
          n.pos = it.pos;
          n.text = it.text;
          out.push_back(std::move(n));
        }
        continue;
      }
      begin_tag(it);
      if (it.kind == Item::expr) {
        Node n;
        n.kind = Node::output;
        n.pos = it.pos;
        n.expr = parse_expr();
        expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const Tok& kw = peek();
      if (kw.type != Tok::name) src_.fail(kw.pos, "a tag must start with a keyword");
      for (std::string_view s : stops)
        if (kw.text == s) {
          stop = kw.text;
          --depth_;
          return out;
        }
      out.push_back(parse_stmt());
    }
    if (stops.size()) {
      std::string names;
      for (std::string_view s : stops)
        names += fmt::format("{}'{}'", names.empty() ? "" : " or ", s);
      src_.fail(items_[opener].pos,
                fmt::format("this block is never closed (expected {} before the end)", names));
    }
    --depth_;
    return out;
  }

  Node parse_stmt() {
    const Item& it = items_[idx_];
    const Tok kw = next();
    Node n;
    n.pos = it.pos;
    if (kw.text == "if") {
      n.kind = Node::if_;
      ExprP cond = parse_expr();
      expect_end();
      const size_t opener = idx_;
      for (;;) {
        ++idx_;
        std::string stop;
        std::vector<Node> body = parse_body({"elif", "else", "endif"}, stop, opener);
        n.branches.emplace_back(std::move(cond), std::move(body));
        begin_tag(items_[idx_]);
        next();
        if (stop == "endif") break;
        if (stop == "elif") {
          cond = parse_expr();
        } else {
          expect_end();
          ++idx_;
          std::vector<Node> else_body = parse_body({"endif"}, stop, opener);
          n.branches.emplace_back(nullptr, std::move(else_body));
          begin_tag(items_[idx_]);
          next();
          break;
        }
        expect_end();
      }
      expect_end();
      return n;
    }
    if (kw.text == "for") {
      n.kind = Node::for_;
      do {
        const Tok v = next();
        if (v.type != Tok::name) src_.fail(v.pos, "expected a loop variable name after 'for'");
        n.vars.push_back(v.text);
      } while (accept_op(","));
      const Tok in = next();
      if (in.type != Tok::name || in.text != "in")
        src_.fail(in.pos, "expected 'in' in the for tag");
      n.expr = parse_or();  // not a conditional expression: "if" here starts the loop filter
      if (peek().type == Tok::name && peek().text == "if") {
        next();
        n.filter = parse_or();
      }
      if (peek().type == Tok::name && peek().text == "recursive")
        src_.fail(peek().pos, "recursive for loops are not supported");
      expect_end();
      const size_t opener = idx_;
      ++idx_;
      std::string stop;
      n.body = parse_body({"else", "endfor"}, stop, opener);
      begin_tag(items_[idx_]);
      next();
      expect_end();
      if (stop == "else") {
        ++idx_;
        n.else_body = parse_body({"endfor"}, stop, opener);
        begin_tag(items_[idx_]);
        next();
        expect_end();
      }
      return n;
    }
    if (kw.text == "set") {
      const Tok v = next();
      if (v.type != Tok::name) src_.fail(v.pos, "expected a variable name after 'set'");
      if (accept_op(".")) {
        const Tok a = next();
        if (a.type != Tok::name) src_.fail(a.pos, "expected an attribute name after '.'");
        n.kind = Node::set_attr;
        n.target = v.text;
        n.text = a.text;
      } else {
        n.kind = Node::set;
        n.text = v.text;
      }
      if (peek().type == Tok::op && peek().text == ",")
        src_.fail(peek().pos, "{% set a, b = ... %} (tuple assignment) is not supported");
      if (n.kind == Node::set && peek().type == Tok::end) {  // {% set x %}...{% endset %}
        n.kind = Node::set_block;
        expect_end();
        const size_t opener = idx_;
        ++idx_;
        std::string stop;
        n.body = parse_body({"endset"}, stop, opener);
        begin_tag(items_[idx_]);
        next();
        expect_end();
        return n;
      }
      expect_op("=");
      n.expr = parse_expr();
      expect_end();
      return n;
    }
    if (kw.text == "break" || kw.text == "continue") {
      n.kind = kw.text == "break" ? Node::break_ : Node::continue_;
      expect_end();
      return n;
    }
    static constexpr std::string_view kEnds[] = {"elif", "else", "endif", "endfor", "endset"};
    for (std::string_view e : kEnds)
      if (kw.text == e) src_.fail(kw.pos, fmt::format("'{}' without a matching opening tag", e));
    src_.fail(kw.pos, fmt::format("the tag '{}' is not supported (supported: if, for, set, break, "
                                  "continue)",
                                  kw.text));
  }

  // ---- expressions (Jinja's precedence, loosest first) ----

  ExprP parse_expr() {  // a if b else c
    ExprP e = parse_or();
    while (peek().type == Tok::name && peek().text == "if") {
      const size_t pos = next().pos;
      ExprP cond = parse_or();
      ExprP other;
      if (peek().type == Tok::name && peek().text == "else") {
        next();
        other = parse_expr();
      }
      ExprP c = make(Op::cond, pos);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (peek().type == Tok::name && peek().text == "or") {
      const size_t pos = next().pos;
      e = binary(Op::or_, pos, std::move(e), parse_and());
    }
    return e;
  }

  ExprP parse_and() {
    ExprP e = parse_not();
    while (peek().type == Tok::name && peek().text == "and") {
      const size_t pos = next().pos;
      e = binary(Op::and_, pos, std::move(e), parse_not());
    }
    return e;
  }

  ExprP parse_not() {
    if (peek().type == Tok::name && peek().text == "not") {
      const size_t pos = next().pos;
      Deeper d(*this, pos);
      ExprP e = make(Op::not_, pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    ExprP first = parse_math1();
    ExprP e;
    for (;;) {
      const Tok& t = peek();
      Op op;
      if (t.type == Tok::op && t.text == "==") {
        op = Op::eq;
      } else if (t.type == Tok::op && t.text == "!=") {
        op = Op::ne;
      } else if (t.type == Tok::op && t.text == "<") {
        op = Op::lt;
      } else if (t.type == Tok::op && t.text == ">") {
        op = Op::gt;
      } else if (t.type == Tok::op && t.text == "<=") {
        op = Op::le;
      } else if (t.type == Tok::op && t.text == ">=") {
        op = Op::ge;
      } else if (t.type == Tok::name && t.text == "in") {
        op = Op::in;
      } else if (t.type == Tok::name && t.text == "not" && peek(1).type == Tok::name &&
                 peek(1).text == "in") {
        next();
        op = Op::not_in;
      } else {
        return e ? std::move(e) : std::move(first);
      }
      const size_t pos = next().pos;
      if (!e) {
        e = make(Op::compare, pos);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->op_pos.push_back(pos);
      e->args.push_back(parse_math1());
    }
  }

  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (peek().type == Tok::op && (peek().text == "+" || peek().text == "-")) {
      const Tok t = next();
      e = binary(t.text == "+" ? Op::add : Op::sub, t.pos, std::move(e), parse_concat());
    }
    return e;
  }

  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (peek().type == Tok::op && peek().text == "~") {
      const size_t pos = next().pos;
      e = binary(Op::concat, pos, std::move(e), parse_math2());
    }
    return e;
  }

  ExprP parse_math2() {
    ExprP e = parse_pow();
    for (;;) {
      const Tok& t = peek();
      if (t.type != Tok::op) return e;
      Op op;
      if (t.text == "*")
        op = Op::mul;
      else if (t.text == "/")
        op = Op::div;
      else if (t.text == "//")
        op = Op::floordiv;
      else if (t.text == "%")
        op = Op::mod;
      else
        return e;
      const size_t pos = next().pos;
      e = binary(op, pos, std::move(e), parse_pow());
    }
  }

  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (peek().type == Tok::op && peek().text == "**") {
      const size_t pos = next().pos;
      e = binary(Op::pow, pos, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprP parse_unary(bool with_filter) {
    const Tok& t = peek();
    ExprP e;
    if (t.type == Tok::op && (t.text == "-" || t.text == "+")) {
      const Tok u = next();
      Deeper d(*this, u.pos);
      e = make(u.text == "-" ? Op::neg : Op::pos, u.pos);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprP parse_primary() {
    const Tok t = next();
    Deeper d(*this, t.pos);
    if (t.type == Tok::name) {
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.pos);
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.pos);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
      ExprP e = make(Op::name, t.pos);
      e->name = t.text;
      return e;
    }
    if (t.type == Tok::string) {
      std::string s = t.text;
      while (peek().type == Tok::string) s += next().text;  // adjacent literals concatenate
      return literal(Value::str(std::move(s)), t.pos);
    }
    if (t.type == Tok::integer) return literal(Value::integer(t.i), t.pos);
    if (t.type == Tok::real) return literal(Value::real(t.d), t.pos);
    if (t.type == Tok::op && t.text == "(") {
      if (accept_op(")")) return make(Op::tuple, t.pos);
      ExprP first = parse_expr();
      if (accept_op(")")) return first;
      ExprP tup = make(Op::tuple, t.pos);
      tup->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (peek().type == Tok::op && peek().text == ")") break;
        tup->args.push_back(parse_expr());
      }
      expect_op(")");
      return tup;
    }
    if (t.type == Tok::op && t.text == "[") {
      ExprP l = make(Op::list, t.pos);
      while (!accept_op("]")) {
        if (!l->args.empty()) {
          expect_op(",");
          if (accept_op("]")) break;
        }
        l->args.push_back(parse_expr());
      }
      return l;
    }
    if (t.type == Tok::op && t.text == "{") {
      ExprP m = make(Op::dict, t.pos);
      while (!accept_op("}")) {
        if (!m->args.empty()) {
          expect_op(",");
          if (accept_op("}")) break;
        }
        m->args.push_back(parse_expr());
        expect_op(":");
        m->args.push_back(parse_expr());
      }
      return m;
    }
    if (t.type == Tok::end) src_.fail(t.pos, "expected an expression before the end of the tag");
    src_.fail(t.pos, fmt::format("unexpected '{}' where an expression was expected", t.text));
  }

  ExprP parse_postfix(ExprP e) {
    for (;;) {
      const Tok& t = peek();
      if (t.type != Tok::op) return e;
      if (t.text == ".") {
        const size_t pos = next().pos;
        const Tok a = next();
        ExprP x;
        if (a.type == Tok::name) {
          x = make(Op::attr, pos);
          x->name = a.text;
          x->args.push_back(std::move(e));
        } else if (a.type == Tok::integer) {  // foo.0 is foo[0] in Jinja
          x = make(Op::item, pos);
          x->args.push_back(std::move(e));
          x->args.push_back(literal(Value::integer(a.i), a.pos));
        } else {
          src_.fail(a.pos, "expected an attribute name after '.'");
        }
        e = std::move(x);
      } else if (t.text == "[") {
        const size_t pos = next().pos;
        ExprP lo, hi, step;
        bool slice = false;
        if (!(peek().type == Tok::op && peek().text == ":")) lo = parse_expr();
        if (accept_op(":")) {
          slice = true;
          if (!is_op(":") && !is_op("]")) hi = parse_expr();
          if (accept_op(":") && !is_op("]")) step = parse_expr();
        }
        expect_op("]");
        ExprP x = make(slice ? Op::slice : Op::item, pos);
        x->args.push_back(std::move(e));
        x->args.push_back(std::move(lo));
        if (slice) {
          x->args.push_back(std::move(hi));
          x->args.push_back(std::move(step));
        }
        e = std::move(x);
      } else if (t.text == "(") {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP parse_call(ExprP callee) {
    const size_t pos = next().pos;  // "("
    ExprP c = make(Op::call, pos);
    c->args.push_back(std::move(callee));
    parse_arguments(*c);
    return c;
  }

  ExprP parse_filters(ExprP e) {
    for (;;) {
      const Tok& t = peek();
      if (t.type == Tok::op && t.text == "|") {
        next();
        const Tok f = next();
        if (f.type != Tok::name) src_.fail(f.pos, "expected a filter name after '|'");
        ExprP x = make(Op::filter, f.pos);
        x->name = f.text;
        x->args.push_back(std::move(e));
        if (accept_op("(")) parse_arguments(*x);
        e = std::move(x);
      } else if (t.type == Tok::name && t.text == "is") {
        next();
        ExprP x = make(Op::test, peek().pos);
        if (peek().type == Tok::name && peek().text == "not") {
          next();
          x->negate = true;
        }
        const Tok name = next();
        if (name.type != Tok::name) src_.fail(name.pos, "expected a test name after 'is'");
        x->name = name.text;
        x->pos = name.pos;
        x->args.push_back(std::move(e));
        const Tok& a = peek();
        if (accept_op("(")) {
          parse_arguments(*x);
        } else if ((a.type == Tok::name && a.text != "else" && a.text != "or" && a.text != "and") ||
                   a.type == Tok::string || a.type == Tok::integer || a.type == Tok::real ||
                   (a.type == Tok::op && (a.text == "[" || a.text == "{"))) {
          // One argument without parentheses ("is divisibleby 3"), as Jinja parses it: so
          // "x is defined if c else d" is a syntax error there, and here.
          if (a.type == Tok::name && a.text == "is")
            src_.fail(a.pos, "tests cannot be chained (x is a is b)");
          x->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(x);
      } else if (t.type == Tok::op && t.text == "(") {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // Arguments up to ")" (the "(" is consumed), positional then name=value, appended after
  // args[0] (the callee, or the subject of a filter or test).
  void parse_arguments(Expr& into) {
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (peek().type == Tok::name && peek(1).type == Tok::op && peek(1).text == "=") {
        into.kw.push_back(next().text);
        next();
        into.args.push_back(parse_expr());
      } else {
        if (!into.kw.empty())
          src_.fail(peek().pos, "a positional argument follows a keyword argument");
        into.args.push_back(parse_expr());
      }
    }
  }

  // ---- helpers ----

  struct Deeper {  // bounds the recursion on inputs like "((((((..."
    Deeper(Parser& p, size_t pos) : p_(p) {
      if (++p_.depth_ > kMaxDepth) p_.src_.fail(pos, "the expression is nested too deeply");
    }
    ~Deeper() { --p_.depth_; }
    Parser& p_;
  };

  void begin_tag(const Item& it) {
    toks_ = &it.toks;
    t_ = 0;
  }
  const Tok& peek(size_t ahead = 0) const {
    return (*toks_)[std::min(t_ + ahead, toks_->size() - 1)];
  }
  Tok next() {
    const Tok& t = peek();
    if (t.type != Tok::end) ++t_;
    return t;
  }
  bool is_op(std::string_view op) const { return peek().type == Tok::op && peek().text == op; }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) {
      const Tok& t = peek();
      src_.fail(t.pos, fmt::format("expected '{}', found {}", op,
                                   t.type == Tok::end ? "the end of the tag"
                                                      : fmt::format("'{}'", t.text)));
    }
  }
  void expect_end() {
    const Tok& t = peek();
    if (t.type != Tok::end)
      src_.fail(t.pos, fmt::format("expected the end of the tag, found '{}'",
                                   t.type == Tok::string ? "a string" : t.text));
  }
  static ExprP make(Op op, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->pos = pos;
    return e;
  }
  static ExprP literal(Value v, size_t pos) {
    ExprP e = make(Op::literal, pos);
    e->value = std::move(v);
    return e;
  }
  static ExprP binary(Op op, size_t pos, ExprP a, ExprP b) {
    ExprP e = make(op, pos);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  const Source& src_;
  const std::vector<Item>& items_;
  size_t idx_ = 0;
  const std::vector<Tok>* toks_ = nullptr;
  size_t t_ = 0;
  int depth_ = 0;
};

// ---- Evaluator -------------------------------------------------------------------------------

// Call arguments: positional, then keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // The argument at `index` or named `name`; null when not given.
  const Value* get(size_t index, std::string_view name) const {
    if (index < pos.size()) return &pos[index];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

class Evaluator {
 public:
  explicit Evaluator(const Source& src) : src_(src) { scopes_.emplace_back(); }

  void define(const std::string& name, Value v, size_t pos = 0) {
    if (scopes_.front().count(name))
      src_.fail(pos, fmt::format("the variable '{}' is given twice", name));
    scopes_.front()[name] = std::move(v);
  }

  enum class Flow : uint8_t { normal, break_, continue_ };

  Flow exec(const std::vector<Node>& body, Buf& out) {
    for (const Node& n : body) {
      switch (n.kind) {
        case Node::plain:
          out.append(n.text);
          break;
        case Node::output: {
          const Value v = eval(*n.expr);
          if (v.is(Kind::ns))
            fail(n.expr->pos, "a namespace cannot be printed; print an attribute");
          str_to(v, out);
          break;
        }
        case Node::if_:
          for (const auto& [cond, branch] : n.branches) {
            if (cond && !truthy(eval(*cond))) continue;
            const Flow f = exec(branch, out);
            if (f != Flow::normal) return f;
            break;
          }
          break;
        case Node::for_:
          exec_for(n, out);
          break;
        case Node::set:
          scopes_.back()[n.text] = eval(*n.expr);
          break;
        case Node::set_attr: {
          Value* target = lookup(n.target);
          if (!target || !target->is(Kind::ns))
            fail(n.pos,
                 fmt::format("{{% set {}.{} %}}: only attributes of a namespace() can be set",
                             n.target, n.text));
          target->dict->set(n.text, eval(*n.expr));
          break;
        }
        case Node::set_block: {
          Buf b;
          if (exec(n.body, b) != Flow::normal) fail(n.pos, "break/continue inside {% set %} block");
          scopes_.back()[n.text] = b.take();
          break;
        }
        case Node::break_:
        case Node::continue_:
          if (loops_ == 0)
            fail(n.pos, fmt::format("'{}' outside a for loop",
                                    n.kind == Node::break_ ? "break" : "continue"));
          return n.kind == Node::break_ ? Flow::break_ : Flow::continue_;
      }
    }
    return Flow::normal;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) const { src_.fail(pos, msg); }
  [[noreturn]] void fail_undefined(const Value& v, size_t pos) const {
    fail(pos, fmt::format("'{}' is undefined", v.s));
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return &f->second;
    return nullptr;
  }

  List iterate(const Value& v, size_t pos) {
    switch (v.kind) {
      case Kind::undefined:
        return {};
      case Kind::list:
        return *v.list;
      case Kind::dict: {
        List keys;
        for (const auto& [k, x] : v.dict->items) keys.push_back(Value::str(k));
        return keys;
      }
      case Kind::string: {
        List chars;
        const auto st = char_starts(v.s);
        for (size_t k = 0; k + 1 < st.size(); ++k)
          chars.push_back(substr(v, st[k], st[k + 1] - st[k]));
        return chars;
      }
      default:
        fail(pos, fmt::format("a value of type {} is not iterable", type_name(v)));
    }
  }

  void bind(const Node& n, const Value& item) {
    auto& scope = scopes_.back();
    if (n.vars.size() == 1) {
      scope[n.vars[0]] = item;
      return;
    }
    if (!item.is(Kind::list) || item.list->size() != n.vars.size())
      fail(n.pos, fmt::format("cannot unpack a {} into {} loop variables", type_name(item),
                              n.vars.size()));
    for (size_t k = 0; k < n.vars.size(); ++k) scope[n.vars[k]] = (*item.list)[k];
  }

  // Each iteration has its own scope: a {% set %} in the body is gone at the next iteration and
  // after the loop (Jinja's rule; namespace() is the way out).
  void exec_for(const Node& n, Buf& out) {
    List items = iterate(eval(*n.expr), n.expr->pos);
    if (n.filter) {
      List kept;
      for (Value& item : items) {
        scopes_.emplace_back();
        bind(n, item);
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto len = static_cast<int64_t>(items.size());
    ++loops_;
    for (int64_t k = 0; k < len; ++k) {
      scopes_.emplace_back();
      bind(n, items[static_cast<size_t>(k)]);
      Dict loop;
      loop.items = {
          {"index0", Value::integer(k)},         {"index", Value::integer(k + 1)},
          {"revindex", Value::integer(len - k)}, {"revindex0", Value::integer(len - k - 1)},
          {"first", Value::boolean(k == 0)},     {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},       {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)}};
      if (k > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(k - 1)]);
      if (k + 1 < len) loop.items.emplace_back("nextitem", items[static_cast<size_t>(k + 1)]);
      scopes_.back()["loop"] = Value::of_dict(std::move(loop));
      const Flow f = exec(n.body, out);
      scopes_.pop_back();
      if (f == Flow::break_) break;
    }
    --loops_;
    if (len == 0 && !n.else_body.empty()) {
      if (exec(n.else_body, out) != Flow::normal) fail(n.pos, "break/continue in a for's else");
    }
  }

  Value eval(const Expr& e) {
    switch (e.op) {
      case Op::literal:
        return e.value;
      case Op::name: {
        const Value* v = lookup(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case Op::list:
      case Op::tuple: {
        List l;
        for (const ExprP& a : e.args) l.push_back(eval(*a));
        return Value::of_list(std::move(l), e.op == Op::tuple);
      }
      case Op::dict: {
        Dict d;
        for (size_t k = 0; k < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (!key.is(Kind::string)) fail(e.args[k]->pos, "dict keys must be strings");
          d.set(key.s, eval(*e.args[k + 1]));
        }
        return Value::of_dict(std::move(d));
      }
      case Op::attr:
        return get_attr(eval(*e.args[0]), e.name, e.pos);
      case Op::item:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), e.pos);
      case Op::slice:
        return slice(e);
      case Op::call:
        return call(e);
      case Op::filter:
        return filter(e);
      case Op::test:
        return Value::boolean(test(e) != e.negate);
      case Op::cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("<if without else>");
      case Op::not_:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case Op::and_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Op::or_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Op::neg:
      case Op::pos: {
        const Value a = eval(*e.args[0]);
        if (a.is(Kind::undefined)) fail_undefined(a, e.pos);
        if (!a.numeric())
          fail(e.pos, fmt::format("bad operand type for unary {}: '{}'",
                                  e.op == Op::neg ? '-' : '+', type_name(a)));
        if (e.op == Op::pos) return a.int_like() ? Value::integer(a.as_int()) : a;
        if (a.int_like()) {
          if (a.as_int() == std::numeric_limits<int64_t>::min()) fail(e.pos, "integer overflow");
          return Value::integer(-a.as_int());
        }
        return Value::real(-a.d);
      }
      case Op::concat: {
        Buf b;
        for (const ExprP& a : e.args) {
          const Value v = eval(*a);
          if (v.is(Kind::ns)) fail(e.pos, "a namespace cannot be converted to a string");
          str_to(v, b);
        }
        return b.take();
      }
      case Op::compare: {  // a < b < c is a < b and b < c, each operand evaluated once
        Value left = eval(*e.args[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1]);
          if (!compare_op(e.ops[k], left, right, e.op_pos[k])) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      default:
        return arith(e.op, eval(*e.args[0]), eval(*e.args[1]), e.pos);
    }
  }

  static const char* op_text(Op op) {
    switch (op) {
      case Op::add:
        return "+";
      case Op::sub:
        return "-";
      case Op::mul:
        return "*";
      case Op::div:
        return "/";
      case Op::floordiv:
        return "//";
      case Op::mod:
        return "%";
      case Op::pow:
        return "**";
      case Op::lt:
        return "<";
      case Op::gt:
        return ">";
      case Op::le:
        return "<=";
      default:
        return ">=";
    }
  }

  bool compare_op(Op op, const Value& a, const Value& b, size_t pos) {
    switch (op) {
      case Op::eq:
        return equal(a, b);
      case Op::ne:
        return !equal(a, b);
      case Op::in:
        return contains(b, a, pos);
      case Op::not_in:
        return !contains(b, a, pos);
      default: {
        const int c = compare(a, b, op, pos);
        return op == Op::lt ? c < 0 : op == Op::gt ? c > 0 : op == Op::le ? c <= 0 : c >= 0;
      }
    }
  }

  int compare(const Value& a, const Value& b, Op op, size_t pos) {
    if (a.is(Kind::undefined)) fail_undefined(a, pos);
    if (b.is(Kind::undefined)) fail_undefined(b, pos);
    if (a.numeric() && b.numeric()) {
      if (a.int_like() && b.int_like())
        return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
      return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double();
    }
    if (a.is(Kind::string) && b.is(Kind::string)) return a.s.compare(b.s) < 0 ? -1 : a.s != b.s;
    if (a.is(Kind::list) && b.is(Kind::list) && a.b == b.b) {  // not a tuple with a list
      for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k], op, pos);
      return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size();
    }
    fail(pos, fmt::format("'{}' is not supported between {} and {}", op_text(op), type_name(a),
                          type_name(b)));
  }

  bool contains(const Value& hay, const Value& needle, size_t pos) {
    switch (hay.kind) {
      case Kind::undefined:
        return false;
      case Kind::string:
        if (!needle.is(Kind::string))
          fail(pos,
               fmt::format("'in <string>' needs a string on the left, not {}", type_name(needle)));
        return hay.s.find(needle.s) != std::string::npos;
      case Kind::list:
        return std::any_of(hay.list->begin(), hay.list->end(),
                           [&](const Value& x) { return equal(x, needle); });
      case Kind::dict:
        if ((needle.is(Kind::list) && !needle.b) || needle.is(Kind::dict) || needle.is(Kind::ns))
          fail(pos, fmt::format("unhashable type: '{}'", type_name(needle)));
        return needle.is(Kind::string) && hay.dict->find(needle.s) != nullptr;
      default:
        fail(pos, fmt::format("'in' needs a string, list or dict, not {}", type_name(hay)));
    }
  }

  Value arith(Op op, const Value& a, const Value& b, size_t pos) {
    if (a.is(Kind::undefined)) fail_undefined(a, pos);
    if (b.is(Kind::undefined)) fail_undefined(b, pos);
    if (a.numeric() && b.numeric()) {
      const bool ints = a.int_like() && b.int_like();
      const int64_t x = a.as_int(), y = b.as_int();
      const double p = a.as_double(), q = b.as_double();
      int64_t r = 0;
      switch (op) {
        case Op::add:
          if (!ints) return Value::real(p + q);
          if (__builtin_add_overflow(x, y, &r)) fail(pos, "integer overflow");
          return Value::integer(r);
        case Op::sub:
          if (!ints) return Value::real(p - q);
          if (__builtin_sub_overflow(x, y, &r)) fail(pos, "integer overflow");
          return Value::integer(r);
        case Op::mul:
          if (!ints) return Value::real(p * q);
          if (__builtin_mul_overflow(x, y, &r)) fail(pos, "integer overflow");
          return Value::integer(r);
        case Op::div:
          if (q == 0) fail(pos, "division by zero");
          return Value::real(p / q);
        case Op::floordiv:
        case Op::mod: {
          if (q == 0) fail(pos, op == Op::mod ? "modulo by zero" : "division by zero");
          if (ints) {
            if (x == std::numeric_limits<int64_t>::min() && y == -1) fail(pos, "integer overflow");
            int64_t d = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) --d, m += y;  // Python floors
            return Value::integer(op == Op::mod ? m : d);
          }
          // CPython's float_divmod, signed zeros included.
          double m = std::fmod(p, q), div = (p - m) / q;
          if (m != 0) {
            if ((q < 0) != (m < 0)) m += q, div -= 1.0;
          } else {
            m = std::copysign(0.0, q);
          }
          if (op == Op::mod) return Value::real(m);
          if (div == 0) return Value::real(std::copysign(0.0, p / q));
          double fd = std::floor(div);
          if (div - fd > 0.5) fd += 1.0;
          return Value::real(fd);
        }
        case Op::pow:
          if (ints && y >= 0) {
            int64_t acc = 1;
            for (int64_t k = 0; k < y; ++k) {
              if (__builtin_mul_overflow(acc, x, &acc)) fail(pos, "integer overflow");
              if (acc == 0 || acc == 1) break;
            }
            return Value::integer(acc);
          }
          if (p == 0 && q < 0) fail(pos, "zero cannot be raised to a negative power");
          if (p < 0 && q != std::floor(q))
            fail(pos, "a negative number to a fractional power (a complex number)");
          if (const double r = std::pow(p, q); std::isfinite(r) || !std::isfinite(p))
            return Value::real(r);
          fail(pos, "the power overflows");
        default:
          fail(pos, fmt::format("unsupported operand types for {}: {} and {}", op_text(op),
                                type_name(a), type_name(b)));
      }
    }
    if (op == Op::add && a.is(Kind::string) && b.is(Kind::string)) {
      Buf buf;
      buf.append(a);
      buf.append(b);
      return buf.take();
    }
    if (op == Op::add && a.is(Kind::list) && b.is(Kind::list) && a.b == b.b) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(l), a.b);
    }
    if (op == Op::mul && (a.is(Kind::string) || a.is(Kind::list)) && b.int_like())
      return repeat(a, b.as_int(), pos);
    if (op == Op::mul && (b.is(Kind::string) || b.is(Kind::list)) && a.int_like())
      return repeat(b, a.as_int(), pos);
    fail(pos, fmt::format("unsupported operand types for {}: {} and {}", op_text(op), type_name(a),
                          type_name(b)));
  }

  Value repeat(const Value& v, int64_t n, size_t pos) {
    if (n > 0 && static_cast<uint64_t>(n) * (v.is(Kind::string) ? v.s.size() : v.list->size()) >
                     kMaxOutputBytes)
      fail(pos, "the repetition is too large");
    if (v.is(Kind::string)) {
      Buf b;
      for (int64_t k = 0; k < n; ++k) b.append(v);
      return b.take();
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), v.list->begin(), v.list->end());
    return Value::of_list(std::move(l), v.b);
  }

  static bool is_method(const Value& v, std::string_view name) {
    static constexpr std::string_view kStr[] = {"strip",      "lstrip",   "rstrip", "split",
                                                "startswith", "endswith", "upper",  "lower",
                                                "replace",    "find",     "join"};
    static constexpr std::string_view kDict[] = {"get", "items", "keys", "values"};
    if (v.is(Kind::string))
      return std::find(std::begin(kStr), std::end(kStr), name) != std::end(kStr);
    if (v.is(Kind::dict))
      return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
    return false;
  }

  Value get_attr(const Value& obj, const std::string& name, size_t pos) {
    if (obj.is(Kind::undefined)) fail_undefined(obj, pos);
    if (obj.is(Kind::dict) || obj.is(Kind::ns)) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
    if (is_method(obj, name))
      fail(pos, fmt::format("'{}' is a method: call it, as {}(...)", name, name));
    return Value::undefined(name);
  }

  Value get_item(const Value& obj, const Value& key, size_t pos) {
    if (obj.is(Kind::undefined)) fail_undefined(obj, pos);
    if (key.is(Kind::undefined)) fail_undefined(key, pos);
    if ((obj.is(Kind::dict) || obj.is(Kind::ns)) && key.is(Kind::string)) {
      const Value* v = obj.dict->find(key.s);
      return v ? *v : Value::undefined(key.s);
    }
    if (key.int_like() && (obj.is(Kind::list) || obj.is(Kind::string))) {
      int64_t k = key.as_int();
      if (obj.is(Kind::list)) {
        const auto n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined(fmt::format("[{}]", key.as_int()));
        return (*obj.list)[static_cast<size_t>(k)];
      }
      const auto st = char_starts(obj.s);
      const auto n = static_cast<int64_t>(st.size()) - 1;
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined(fmt::format("[{}]", key.as_int()));
      const auto u = static_cast<size_t>(k);
      return substr(obj, st[u], st[u + 1] - st[u]);
    }
    Buf b;
    str_to(key, b);
    return Value::undefined(b.s);
  }

  // Python's slice semantics, over list items or string characters.
  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    if (obj.is(Kind::undefined)) fail_undefined(obj, e.pos);
    if (!obj.is(Kind::list) && !obj.is(Kind::string))
      fail(e.pos, fmt::format("a value of type {} cannot be sliced", type_name(obj)));
    auto bound = [&](const ExprP& x) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      const Value v = eval(*x);
      if (v.is(Kind::none)) return std::nullopt;
      if (!v.int_like()) fail(x->pos, "slice bounds must be integers or none");
      return v.as_int();
    };
    const std::optional<int64_t> lo = bound(e.args[1]), hi = bound(e.args[2]),
                                 st = bound(e.args[3]);
    const int64_t step = st.value_or(1);
    if (step == 0) fail(e.pos, "slice step cannot be zero");
    std::vector<size_t> starts;
    int64_t len;
    if (obj.is(Kind::string)) {
      starts = char_starts(obj.s);
      len = static_cast<int64_t>(starts.size()) - 1;
    } else {
      len = static_cast<int64_t>(obj.list->size());
    }
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t x = *v;
      if (x < 0) {
        x += len;
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= len) {
        x = step < 0 ? len - 1 : len;
      }
      return x;
    };
    const int64_t a = clamp(lo, step < 0 ? len - 1 : 0), b = clamp(hi, step < 0 ? -1 : len);
    List items;
    Buf text;
    for (int64_t k = a; step > 0 ? k < b : k > b; k += step) {
      const auto u = static_cast<size_t>(k);
      if (obj.is(Kind::list))
        items.push_back((*obj.list)[u]);
      else
        text.append(substr(obj, starts[u], starts[u + 1] - starts[u]));
    }
    return obj.is(Kind::list) ? Value::of_list(std::move(items)) : text.take();
  }

  Args arguments(const Expr& e, size_t first) {
    Args a;
    const size_t num_kw = e.kw.size();
    for (size_t k = first; k < e.args.size(); ++k) {
      Value v = eval(*e.args[k]);
      if (k + num_kw < e.args.size())
        a.pos.push_back(std::move(v));
      else
        a.kw.emplace_back(e.kw[k - (e.args.size() - num_kw)], std::move(v));
    }
    return a;
  }

  // Checks that `a` has at most `max_pos` positional arguments and only the keywords `names`.
  void check_args(const Args& a, size_t max_pos, std::initializer_list<std::string_view> names,
                  std::string_view what, size_t pos) {
    if (a.pos.size() > max_pos)
      fail(pos, fmt::format("{} takes at most {} argument{}, got {}", what, max_pos,
                            max_pos == 1 ? "" : "s", a.pos.size()));
    for (const auto& [k, v] : a.kw)
      if (std::find(names.begin(), names.end(), k) == names.end())
        fail(pos, fmt::format("{} got an unsupported keyword argument '{}'", what, k));
  }

  std::string need_str(const Value* v, std::string_view what, size_t pos) {
    if (!v || !v->is(Kind::string))
      fail(pos, fmt::format("{} needs a string argument{}", what,
                            v ? fmt::format(", not {}", type_name(*v)) : std::string()));
    return v->s;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    Args a = arguments(e, 1);
    if (callee.op == Op::attr) {
      const Value obj = eval(*callee.args[0]);
      if (obj.is(Kind::undefined)) fail_undefined(obj, callee.pos);
      return method(obj, callee.name, a, callee.pos);
    }
    if (callee.op != Op::name) fail(e.pos, "only functions and methods can be called");
    const std::string& f = callee.name;
    if (f == "raise_exception") {
      check_args(a, 1, {}, "raise_exception()", e.pos);
      Buf msg;
      if (!a.pos.empty()) str_to(a.pos[0], msg);
      throw Error(fmt::format("chat template, {}: the template rejected the conversation: {}",
                              src_.where(e.pos), msg.s));
    }
    if (f == "namespace" || f == "dict") {
      if (!a.pos.empty()) fail(e.pos, fmt::format("{}() takes keyword arguments only", f));
      Dict d;
      for (auto& [k, v] : a.kw) d.set(k, std::move(v));
      return Value::of_dict(std::move(d), f == "namespace" ? Kind::ns : Kind::dict);
    }
    if (f == "range") {
      check_args(a, 3, {}, "range()", e.pos);
      if (a.pos.empty()) fail(e.pos, "range() needs at least one argument");
      for (const Value& v : a.pos)
        if (!v.int_like()) fail(e.pos, "range() needs integer arguments");
      int64_t lo = 0, hi = 0, step = 1;
      if (a.pos.size() == 1) {
        hi = a.pos[0].as_int();
      } else {
        lo = a.pos[0].as_int(), hi = a.pos[1].as_int();
        if (a.pos.size() == 3) step = a.pos[2].as_int();
      }
      if (step == 0) fail(e.pos, "range() step cannot be zero");
      List l;
      for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
        if (l.size() >= static_cast<size_t>(kMaxRange))
          fail(e.pos, fmt::format("range() longer than {} items", kMaxRange));
        l.push_back(Value::integer(k));
      }
      return Value::of_list(std::move(l));
    }
    if (lookup(f)) fail(callee.pos, fmt::format("'{}' is not callable", f));
    fail(callee.pos,
         fmt::format("the function '{}' is not supported (supported: namespace, range, dict, "
                     "raise_exception)",
                     f));
  }

  // ---- string helpers (by character, keeping the untrusted flags) ----

  static Value strip(const Value& v, bool left, bool right, const Value* chars) {
    std::vector<char32_t> set;
    if (chars && chars->is(Kind::string))
      for (size_t p = 0; p < chars->s.size(); p += utf8::decode_one(chars->s.substr(p)).len)
        set.push_back(char_at(chars->s, p));
    const bool ws = !chars || chars->is(Kind::none);
    auto strip_char = [&](char32_t c) {
      return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
    };
    const auto st = char_starts(v.s);
    size_t b = 0, e = st.size() - 1;
    while (left && b < e && strip_char(char_at(v.s, st[b]))) ++b;
    while (right && e > b && strip_char(char_at(v.s, st[e - 1]))) --e;
    return substr(v, st[b], st[e] - st[b]);
  }

  Value split(const Value& v, const Value* sep, const Value* maxsplit, size_t pos) {
    int64_t max = -1;
    if (maxsplit) {
      if (!maxsplit->int_like()) fail(pos, "split(): maxsplit must be an integer");
      max = maxsplit->as_int();
    }
    List out;
    if (!sep || sep->is(Kind::none)) {  // runs of whitespace; no empty pieces
      const auto st = char_starts(v.s);
      const size_t n = st.size() - 1;
      size_t k = 0;
      for (;;) {
        while (k < n && py_space(char_at(v.s, st[k]))) ++k;
        if (k == n) break;
        if (max >= 0 && static_cast<int64_t>(out.size()) == max) {
          out.push_back(substr(v, st[k]));
          break;
        }
        const size_t b = k;
        while (k < n && !py_space(char_at(v.s, st[k]))) ++k;
        out.push_back(substr(v, st[b], st[k] - st[b]));
      }
      return Value::of_list(std::move(out));
    }
    const std::string s = need_str(sep, "split()", pos);
    if (s.empty()) fail(pos, "split(): empty separator");
    size_t p = 0;
    for (;;) {
      const size_t q = v.s.find(s, p);
      if (q == std::string::npos || (max >= 0 && static_cast<int64_t>(out.size()) == max)) break;
      out.push_back(substr(v, p, q - p));
      p = q + s.size();
    }
    out.push_back(substr(v, p));
    return Value::of_list(std::move(out));
  }

  Value replace(const Value& v, const Value* from, const Value* to, const Value* count,
                size_t pos) {
    const std::string f = need_str(from, "replace()", pos);
    need_str(to, "replace()", pos);
    if (f.empty()) fail(pos, "replace() of an empty string is not supported");
    int64_t max = -1;
    if (count && !count->is(Kind::none)) {
      if (!count->int_like()) fail(pos, "replace(): count must be an integer");
      max = count->as_int();
    }
    Buf b;
    size_t p = 0;
    for (int64_t n = 0; max < 0 || n < max; ++n) {
      const size_t q = v.s.find(f, p);
      if (q == std::string::npos) break;
      b.append(substr(v, p, q - p));
      b.append(*to);
      p = q + f.size();
    }
    b.append(substr(v, p));
    return b.take();
  }

  // Python's str.lower/upper/capitalize: full Unicode case mappings (ICU's, root locale), so
  // "Straße".upper() is "STRASSE". A string whose length changes keeps its flags as a whole.
  Value change_case(const Value& v, int mode) {  // 0 lower, 1 upper, 2 capitalize
    if (std::all_of(v.s.begin(), v.s.end(),
                    [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
      std::string s = v.s;
      for (size_t k = 0; k < s.size(); ++k) {
        const char c = s[k];
        const bool up = mode == 1 || (mode == 2 && k == 0);
        if (up && c >= 'a' && c <= 'z') s[k] = static_cast<char>(c - 'a' + 'A');
        if (!up && c >= 'A' && c <= 'Z') s[k] = static_cast<char>(c - 'A' + 'a');
      }
      return Value::str(std::move(s), v.mark);
    }
    auto map = [](std::string_view text, int m) {
      icu::UnicodeString u = icu::UnicodeString::fromUTF8(
          icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
      if (m == 0) u.toLower(icu::Locale::getRoot());
      if (m == 1) u.toUpper(icu::Locale::getRoot());
      if (m == 2)  // titlecase (not uppercase) of one character, as Python's capitalize
        u.toTitle(nullptr, icu::Locale::getRoot(),
                  U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
      std::string out;
      u.toUTF8String(out);
      return out;
    };
    std::string s;
    if (mode == 2) {
      const size_t first = utf8::decode_one(v.s).len;
      s = map(std::string_view(v.s).substr(0, first), 2) +
          map(std::string_view(v.s).substr(first), 0);
    } else {
      s = map(v.s, mode);
    }
    return Value::str(s, has_mark(v) ? std::string(s.size(), '\1') : std::string());
  }

  Value join(const Value& items, const Value& sep, size_t pos) {
    Buf b;
    bool first = true;
    for (const Value& x : iterate(items, pos)) {
      if (!first) b.append(sep);
      first = false;
      if (x.is(Kind::ns)) fail(pos, "join(): a namespace cannot be converted to a string");
      str_to(x, b);
    }
    return b.take();
  }

  int64_t length(const Value& v, size_t pos) {
    switch (v.kind) {
      case Kind::undefined:
        return 0;
      case Kind::string:
        return static_cast<int64_t>(char_starts(v.s).size()) - 1;
      case Kind::list:
        return static_cast<int64_t>(v.list->size());
      case Kind::dict:
        return static_cast<int64_t>(v.dict->items.size());
      default:
        fail(pos, fmt::format("a value of type {} has no length", type_name(v)));
    }
  }

  Value items_of(const Value& d) {
    List l;
    for (const auto& [k, v] : d.dict->items) l.push_back(Value::of_list({Value::str(k), v}, true));
    return Value::of_list(std::move(l));
  }

  Value method(const Value& obj, const std::string& name, const Args& a, size_t pos) {
    const std::string what = fmt::format("{}()", name);
    if (obj.is(Kind::string)) {
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        check_args(a, 1, {}, what, pos);
        const Value* chars = a.get(0, "");
        if (chars && !chars->is(Kind::string) && !chars->is(Kind::none))
          fail(pos, fmt::format("{} needs a string argument", what));
        return strip(obj, name != "rstrip", name != "lstrip", chars);
      }
      if (name == "split") {
        check_args(a, 2, {"sep", "maxsplit"}, what, pos);
        return split(obj, a.get(0, "sep"), a.get(1, "maxsplit"), pos);
      }
      if (name == "startswith" || name == "endswith") {
        check_args(a, 1, {}, what, pos);
        const Value* arg = a.get(0, "");
        std::vector<std::string> options;
        if (arg && arg->is(Kind::list)) {
          for (const Value& x : *arg->list) options.push_back(need_str(&x, what, pos));
        } else {
          options.push_back(need_str(arg, what, pos));
        }
        for (const std::string& o : options) {
          if (o.size() > obj.s.size()) continue;
          if (name == "startswith" ? obj.s.compare(0, o.size(), o) == 0
                                   : obj.s.compare(obj.s.size() - o.size(), o.size(), o) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "upper" || name == "lower") {
        check_args(a, 0, {}, what, pos);
        return change_case(obj, name == "upper" ? 1 : 0);
      }
      if (name == "replace") {
        check_args(a, 3, {}, what, pos);
        return replace(obj, a.get(0, ""), a.get(1, ""), a.get(2, ""), pos);
      }
      if (name == "find") {
        check_args(a, 1, {}, what, pos);
        const size_t q = obj.s.find(need_str(a.get(0, ""), what, pos));
        if (q == std::string::npos) return Value::integer(-1);
        return Value::integer(static_cast<int64_t>(char_starts(obj.s.substr(0, q)).size()) - 1);
      }
      if (name == "join") {
        check_args(a, 1, {}, what, pos);
        if (a.pos.empty()) fail(pos, "join() needs an argument");
        for (const Value& x : iterate(a.pos[0], pos))
          if (!x.is(Kind::string))
            fail(pos, fmt::format("join(): expected strings, found {}", type_name(x)));
        return join(a.pos[0], obj, pos);
      }
    }
    if (obj.is(Kind::dict)) {
      if (name == "get") {
        check_args(a, 2, {}, what, pos);
        const Value* key = a.get(0, "");
        if (!key) fail(pos, "get() needs a key");
        if (key->is(Kind::string))
          if (const Value* v = obj.dict->find(key->s)) return *v;
        const Value* def = a.get(1, "");
        return def ? *def : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        check_args(a, 0, {}, what, pos);
        if (name == "items") return items_of(obj);
        List l;
        for (const auto& [k, v] : obj.dict->items) l.push_back(name == "keys" ? Value::str(k) : v);
        return Value::of_list(std::move(l));
      }
    }
    fail(pos, fmt::format("the method {}.{}() is not supported", type_name(obj), name));
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const Args a = arguments(e, 1);
    const std::string& f = e.name;
    const std::string what = fmt::format("the filter '{}'", f);
    const size_t pos = e.pos;
    auto as_string = [&]() {  // these filters apply str() first, as Jinja's do
      if (v.is(Kind::ns)) fail(pos, "a namespace cannot be converted to a string");
      return to_str(v);
    };
    if (f == "default" || f == "d") {
      check_args(a, 2, {"default_value", "boolean"}, what, pos);
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = v.is(Kind::undefined) || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::str("")) : v;
    }
    if (f == "length" || f == "count") {
      check_args(a, 0, {}, what, pos);
      return Value::integer(length(v, pos));
    }
    if (f == "safe") {
      check_args(a, 0, {}, what, pos);
      return v;
    }
    if (f == "string") {
      check_args(a, 0, {}, what, pos);
      if (v.is(Kind::ns)) fail(pos, "a namespace cannot be converted to a string");
      return to_str(v);
    }
    if (f == "tojson") {
      check_args(a, 1, {"indent"}, what, pos);
      const Value* ind = a.get(0, "indent");
      int indent = -1;
      if (ind && !ind->is(Kind::none)) {
        if (!ind->int_like() || ind->as_int() < 0 || ind->as_int() > 64)
          fail(pos, "tojson: indent must be an integer in [0, 64]");
        indent = static_cast<int>(ind->as_int());
      }
      if (v.is(Kind::undefined)) fail_undefined(v, pos);
      Buf b;
      tojson_to(v, b, indent, 0);
      return b.take();
    }
    if (f == "trim") {
      check_args(a, 1, {"chars"}, what, pos);
      return strip(as_string(), true, true, a.get(0, "chars"));
    }
    if (f == "lower" || f == "upper" || f == "capitalize") {
      check_args(a, 0, {}, what, pos);
      return change_case(as_string(), f == "lower" ? 0 : f == "upper" ? 1 : 2);
    }
    if (f == "replace") {
      check_args(a, 3, {"count"}, what, pos);
      return replace(as_string(), a.get(0, ""), a.get(1, ""), a.get(2, "count"), pos);
    }
    if (f == "join") {
      check_args(a, 1, {"d"}, what, pos);
      const Value* sep = a.get(0, "d");
      if (sep && !sep->is(Kind::string)) fail(pos, "join: the separator must be a string");
      return join(v, sep ? *sep : Value::str(""), pos);
    }
    if (f == "first" || f == "last") {
      check_args(a, 0, {}, what, pos);
      List items = iterate(v, pos);
      if (items.empty()) return Value::undefined(fmt::format("{} of an empty sequence", f));
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") {
      check_args(a, 0, {}, what, pos);
      return Value::of_list(iterate(v, pos));
    }
    if (f == "reverse") {
      check_args(a, 0, {}, what, pos);
      List items = iterate(v, pos);
      std::reverse(items.begin(), items.end());
      if (!v.is(Kind::string)) return Value::of_list(std::move(items));
      Buf b;
      for (const Value& c : items) b.append(c);
      return b.take();
    }
    if (f == "items") {
      check_args(a, 0, {}, what, pos);
      if (v.is(Kind::undefined)) return Value::of_list({});
      if (!v.is(Kind::dict)) fail(pos, fmt::format("{} needs a dict, not {}", what, type_name(v)));
      return items_of(v);
    }
    if (f == "int") {
      check_args(a, 1, {"default"}, what, pos);
      const Value* def = a.get(0, "default");
      const Value fallback = def ? *def : Value::integer(0);
      if (v.is(Kind::undefined)) fail_undefined(v, pos);
      if (v.int_like()) return Value::integer(v.as_int());
      if (v.is(Kind::real)) {
        if (!std::isfinite(v.d) || std::fabs(v.d) >= 9.2e18) return fallback;
        return Value::integer(static_cast<int64_t>(v.d));
      }
      if (!v.is(Kind::string)) return fallback;
      const Value t = strip(v, true, true, nullptr);
      int64_t r = 0;
      const char* b = t.s.data() + (!t.s.empty() && t.s[0] == '+' ? 1 : 0);
      const auto res = std::from_chars(b, t.s.data() + t.s.size(), r);
      if (t.s.empty() || res.ec != std::errc() || res.ptr != t.s.data() + t.s.size())
        return fallback;
      return Value::integer(r);
    }
    if (f == "abs") {
      check_args(a, 0, {}, what, pos);
      if (v.int_like()) {
        if (v.as_int() == std::numeric_limits<int64_t>::min()) fail(pos, "integer overflow");
        return Value::integer(std::abs(v.as_int()));
      }
      if (v.is(Kind::real)) return Value::real(std::fabs(v.d));
      fail(pos, fmt::format("{} needs a number, not {}", what, type_name(v)));
    }
    fail(pos, fmt::format("the filter '{}' is not supported (supported: abs, capitalize, count, "
                          "default, d, first, int, items, join, last, length, list, lower, "
                          "replace, reverse, safe, string, tojson, trim, upper)",
                          f));
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::string& t = e.name;
    if (e.args.size() > 1)
      fail(e.pos, fmt::format("the test '{}' with arguments is not supported", t));
    if (t == "defined") return !v.is(Kind::undefined);
    if (t == "undefined") return v.is(Kind::undefined);
    if (t == "none") return v.is(Kind::none);
    if (t == "string") return v.is(Kind::string);
    if (t == "number") return v.numeric();
    if (t == "integer") return v.is(Kind::integer);
    if (t == "float") return v.is(Kind::real);
    if (t == "boolean") return v.is(Kind::boolean);
    if (t == "true") return v.is(Kind::boolean) && v.b;
    if (t == "false") return v.is(Kind::boolean) && !v.b;
    if (t == "mapping") return v.is(Kind::dict);
    if (t == "iterable" || t == "sequence")
      return v.is(Kind::list) || v.is(Kind::dict) || v.is(Kind::string) || v.is(Kind::undefined);
    if (t == "odd" || t == "even") {  // Jinja: value % 2 == 1 (or == 0)
      const Value m = arith(Op::mod, v, Value::integer(2), e.pos);
      return equal(m, Value::integer(t == "odd" ? 1 : 0));
    }
    fail(e.pos, fmt::format("the test '{}' is not supported (supported: boolean, defined, even, "
                            "false, float, integer, iterable, mapping, none, number, odd, "
                            "sequence, string, true, undefined)",
                            t));
  }

  const Source& src_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int loops_ = 0;
};

}  // namespace

struct Program {
  Source src;
  std::vector<Node> body;
};

std::shared_ptr<const Program> parse(std::string_view source) {
  auto p = std::make_shared<Program>();
  std::string& s = p->src.text;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {  // Jinja normalizes newlines to "\n"
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline = False
  if (!utf8::is_valid(s)) DI_FAIL("chat template: the template is not valid UTF-8");
  const std::vector<Item> items = Lexer(p->src).run();
  p->body = Parser(p->src, items).run();
  return p;
}

Rendered render(const Program& program, const json& context, const json& untrusted) {
  Evaluator ev(program.src);
  for (const auto* vars : {&context, &untrusted}) {
    if (vars->is_null()) continue;
    if (!vars->is_object()) DI_FAIL("chat template: the variables must be a JSON object");
    for (const auto& [k, v] : vars->items()) {
      if (vars == &untrusted && context.is_object() && context.contains(k))
        DI_FAIL("chat template: the variable '{}' is given twice", k);
      ev.define(k, from_json(v, vars == &untrusted));
    }
  }
  Buf out;
  ev.exec(program.body, out);
  Rendered r;
  r.untrusted.assign(out.s.size(), 0);
  for (size_t k = 0; k < out.m.size(); ++k) r.untrusted[k] = static_cast<uint8_t>(out.m[k]);
  r.text = std::move(out.s);
  return r;
}

}  // namespace deepinfer::serve::jinja
