// A small Jinja2 interpreter for HuggingFace chat templates (lexer -> parser -> AST -> evaluator),
// with the environment transformers renders them in: trim_blocks, lstrip_blocks, the loopcontrols
// extension, raise_exception, and a tojson that writes json.dumps(ensure_ascii=False).
//
// Supported:
//   tags         {{ expr }}, {% if/elif/else/endif %}, {% for x in xs [if cond] %} ... [{% else %}]
//                {% endfor %} (x or a tuple "k, v"; loop.index0/index/revindex/revindex0/first/
//                last/length/previtem/nextitem), {% set x = expr %}, {% set ns.attr = expr %},
//                {% set x %}...{% endset %}, {% break %}, {% continue %}, {# comments #},
//                whitespace control with '-' (and '+' to keep lstrip_blocks off) on either side.
//   expressions  string (Python escapes), integer, float, true/false/none literals, lists,
//                tuples, dicts; variables; .attr, [key], [a:b:c] slices; calls; a if c else b;
//                or, and, not; == != < > <= >= in, not in (chained as in Python: a < b < c);
//                + - * / // % ** with Python's int/float rules; ~; unary - +; filters (x|f,
//                x|f(args)) and tests (x is [not] t). Printing follows Python's str()/repr().
//   functions    namespace(k=v, ...), range(...), raise_exception(msg), dict(k=v, ...).
//   filters      trim, length, count, lower, upper, capitalize, tojson(indent), string, int,
//                join, first, last, default/d, replace, list, items, reverse, safe.
//   tests        defined, undefined, none, string, number, integer, float, boolean, mapping,
//                iterable, sequence, true, false, odd, even.
//   methods      str: strip lstrip rstrip split startswith endswith upper lower replace find join;
//                dict: get items keys values. upper/lower/capitalize use Unicode case mappings.
// Anything else (macros, include, other filters, str % x formatting, ...) is an Error naming the
// construct and its line:column in the template, at parse time where it can be known then, else
// when evaluated. Values come from JSON, so dict keys iterate in nlohmann::json's (sorted) order.
//
// Untrusted text: strings taken from the `untrusted` variables are flagged byte by byte, and the
// flags follow the text through concatenation, slicing, stripping, splitting and tojson, so the
// caller can tell which bytes of the output came from them (e.g. user messages, which must not
// be read as special tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::serve::jinja {

struct Program;  // the parsed template

// Throws Error ("chat template, line L column C: ...") on syntax errors and unsupported tags.
std::shared_ptr<const Program> parse(std::string_view source);

struct Rendered {
  std::string text;
  std::vector<uint8_t> untrusted;  // one flag per byte of text: 1 = from an untrusted variable
};

// `context` and `untrusted` are JSON objects whose keys become the template's variables (a key in
// both is an Error). Throws Error on evaluation errors, with the position of the expression.
Rendered render(const Program& program, const nlohmann::json& context,
                const nlohmann::json& untrusted);

}  // namespace deepinfer::serve::jinja
