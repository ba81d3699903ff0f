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
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
    out = DATA / "expected.json"
    out.write_text(json.dumps({"generator": "tools/serve/render_jinja.py", "jinja2": jinja2.__version__,
                               "cases": cases}, ensure_ascii=False, indent=1) + "\n",
                   encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(f"{out}: {len(cases)} cases ({errors} raise an error)", file=sys.stderr)


if __name__ == "__main__":
    main()
