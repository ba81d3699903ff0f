#!/usr/bin/env python3
"""Writes tests/serve/data/expected.json: every template of tests/serve/data/templates/ (and the
tiny model's chat_template) rendered over every conversation of tests/serve/data/contexts.json by
Jinja2 itself, in the environment transformers renders chat templates in (trim_blocks,
lstrip_blocks, loopcontrols, raise_exception, tojson as json.dumps(ensure_ascii=False)).
The C++ interpreter (src/serve/jinja.cpp) must give the same text, or an error where Jinja2
raised one. Needs python3-jinja2 (Debian). Run from anywhere: python3 tools/serve/render_jinja.py
"""
import json
import pathlib
import random
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/serve/data"


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def templates():
    out = {}
    cfg = json.loads((ROOT / "models/tiny/tokenizer_config.json").read_text(encoding="utf-8"))
    out["tiny"] = cfg["chat_template"]
    for p in sorted((DATA / "templates").glob("*.jinja")):
        out[p.stem] = p.read_text(encoding="utf-8")
    return out


GENERATED_CONTEXT = {"n": 2, "s": "  padded  ", "xs": [3, "q", None], "d": {"j": "v", "k": [1]}}


def random_templates(count):
    """Random mixes of text and tags with every whitespace-control mark: the lexer's corner."""
    rng = random.Random(20)
    texts = ["a", "b", " ", "  ", "\t", "\n", "\n  ", " \n", "x y", "\n\n", "  \n  ", "\u00a0",
             "\u3000x\u2003"]

    def mark_open():
        return rng.choice(["", "", "-", "+"])

    def mark_close():
        return rng.choice(["", "", "-", "+"])

    def tag(body):
        return "{%" + mark_open() + " " + body + " " + mark_close() + "%}"

    def seq(depth):
        out = []
        for _ in range(rng.randint(0, 5)):
            r = rng.random()
            if r < 0.4:
                out.append(rng.choice(texts))
            elif r < 0.55:
                out.append("{{" + rng.choice(["", "-"]) + " " +
                           rng.choice(["'e'", "n", "s", "n + 1", "t", "i", "loop.index", "loop.last",
                                       "loop.revindex", "ns.c"]) +
                           " " + rng.choice(["", "-"]) + "}}")
            elif r < 0.65:
                out.append("{#" + rng.choice(["", "-", "+"]) + " c " + mark_close() + "#}")
            elif r < 0.7:
                out.append(tag(rng.choice(["set t = 'q'", "set t = t ~ 'r'", "set ns.c = ns.c + 1",
                                           "set ns = namespace(c=0)", "set i = 7"])))
            elif depth < 2 and r < 0.85:
                out.append(tag("if " + rng.choice(["true", "false", "n > 1"])) + seq(depth + 1))
                if rng.random() < 0.5:
                    out.append(tag("else") + seq(depth + 1))
                out.append(tag("endif"))
            elif depth < 2:
                out.append(tag("for i in range(2)") + seq(depth + 1) + tag("endfor"))
        return "".join(out)

    return [seq(0) + rng.choice(["", "\n"]) for _ in range(count)]


def random_expressions(count):
    """Random expressions over small values: operator precedence, Python's arithmetic and
    comparison rules, filters, tests, slicing, and the errors Python raises."""
    rng = random.Random(21)
    atoms = ["0", "1", "2", "3", "-1", "2.5", "0.5", "'ab'", "'a b '", "\"x'y\"", "''", "'é世'",
             "true", "false", "none", "[1, 2, 3]", "[]", "['a', 'b']", "(1, 'x')", "{'k': 1}",
             "n", "s", "xs", "d", "missing", "d.k", "d['j']", "d.get('j')", "d.get('z', 1)",
             "s.strip()", "s.split()", "'a,b'.split(',')", "s.startswith(' ')",
             "(s ~ 'x').endswith('x')", "xs|length", "d.items()|list", "d|tojson", "xs|tojson",
             "range(3)|list", "namespace(a=1).a", "{'a': [1, 2]}|tojson(indent=1)", "s.lstrip()",
             "s.rstrip(' d')", "'a-b-c'.split('-', 1)", "'héllo'.upper()", "'AbC'.lower()",
             "'x'.replace('x', 'yy')", "'hello'.find('l')", "', '.join(['a', 'b'])", "d.keys()|list",
             "d.values()|list", "xs[0]", "xs[5]", "(xs|first)", "(xs|last)"]
    binops = ["+", "-", "*", "/", "//", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in",
              "not in", "and", "or"]
    filters = ["length", "string", "trim", "upper", "lower", "first", "last", "list", "reverse|list",
               "tojson", "int", "abs", "join(',')", "default('D')", "count"]
    tests = ["defined", "none", "string", "number", "integer", "float", "odd", "even", "mapping",
             "iterable", "sequence", "boolean", "true", "false", "undefined"]

    def expr(depth):
        r = rng.random()
        if depth >= 3 or r < 0.3:
            return rng.choice(atoms)
        if r < 0.6:
            return expr(depth + 1) + " " + rng.choice(binops) + " " + expr(depth + 1)
        if r < 0.64:
            return rng.choice(["(not ", "-(", "+("]) + expr(depth + 1) + ")"
        if r < 0.68:  # % only between numbers (str % x is Python's printf formatting)
            return rng.choice(["7", "-7", "2.5", "0", "n"]) + " % " + rng.choice(["3", "-2", "0", "n"])
        if r < 0.78:
            return "(" + expr(depth + 1) + ")|" + rng.choice(filters)
        if r < 0.85:
            return "(" + expr(depth + 1) + ") is " + rng.choice(["", "not "]) + rng.choice(tests)
        if r < 0.9:
            return (expr(depth + 1) + " if " + expr(depth + 1) + " else " + expr(depth + 1))
        if r < 0.95:
            lo, hi = rng.choice(["", "0", "1", "-1", "-2"]), rng.choice(["", "2", "-1", "5"])
            step = rng.choice(["", ":-1", ":2"])
            return "(" + rng.choice(["'abcdé'", "[1, 2, 3, 4]", "xs", "s"]) + ")[" + lo + ":" + hi + step + "]"
        return "(" + expr(depth + 1) + ")[" + rng.choice(["0", "-1", "1", "'k'"]) + "]"

    return ["{{ " + expr(0) + " }}" for _ in range(count)]


def main():
    # The C++ side reads JSON objects with sorted keys (nlohmann::json); so does this script,
    # so that iterating a dict gives the same order on both sides.
    sorted_hook = lambda pairs: dict(sorted(pairs))  # noqa: E731
    ctx = json.loads((DATA / "contexts.json").read_text(encoding="utf-8"),
                     object_pairs_hook=sorted_hook)
    env = environment()
    cases = []
    for tname, source in templates().items():
        tmpl = env.from_string(source)
        for cname, conv in ctx["conversations"].items():
            context = dict(ctx["common"])
            context.update(conv)
            case = {"template": tname, "conversation": cname}
            try:
                case["output"] = tmpl.render(**context)
            except jinja2.exceptions.TemplateError as e:  # raise_exception, undefined, ...
                case["error"] = str(e)
            except Exception as e:  # e.g. TypeError from tojson: the C++ side must fail too
                case["python_error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    generated = []
    for source in random_templates(400) + random_expressions(1500):
        case = {"source": source}
        try:
            case["output"] = env.from_string(source).render(**GENERATED_CONTEXT)
        except Exception as e:  # the C++ side must fail too
            case["error"] = f"{type(e).__name__}: {e}"
        generated.append(case)
    out = DATA / "expected.json"
    out.write_text(json.dumps({"generator": "tools/serve/render_jinja.py", "jinja2": jinja2.__version__,
                               "cases": cases, "generated_context": GENERATED_CONTEXT,
                               "generated": generated}, ensure_ascii=False, indent=1) + "\n",
                   encoding="utf-8")
    errors = sum("error" in c or "python_error" in c for c in cases)
    gen_errors = sum("error" in c for c in generated)
    print(f"{out}: {len(cases)} cases ({errors} raise an error), {len(generated)} generated "
          f"templates ({gen_errors} raise an error)", file=sys.stderr)


if __name__ == "__main__":
    main()
