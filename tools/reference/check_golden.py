"""Compares a regenerated golden folder with the committed one (scripts/stages/reference.sh).

    /usr/bin/python3 tools/reference/check_golden.py COMMITTED_DIR REGENERATED_DIR [--rtol 1e-5]
Token ids, greedy continuations, routing decisions and tokenizer cases must be identical (and, for
a model with an MTP module, its drafts, routing and speculative traces; for a model with Engram,
compression.json and engram_hash.json); logits (MTP logits, ablation logits) must agree per
position to ||a-b||/||b|| <= rtol (the same reference on the same inputs is expected
bit-identical; rtol only absorbs a different BLAS's float64 summation order).
Last line: `reference: N passed, M failed`.
"""

import argparse
import json
import os
import sys

import numpy as np


def load(d):
    with open(os.path.join(d, "golden.json"), encoding="utf-8") as f:
        g = json.load(f)
    with open(os.path.join(d, "tokenizer_cases.json"), encoding="utf-8") as f:
        t = json.load(f)
    return g, t


def logits(d, entry, key="logits"):
    a = np.fromfile(os.path.join(d, entry[key + "_file"]), dtype="<f4")
    t, v = entry[key + "_shape"]
    if a.size != t * v:
        raise ValueError(f"{d}/{entry[key + '_file']}: {a.size} floats, expected {t}x{v}")
    return a.reshape(t, v)


def compare_logits(report, name, da, a, db, b, key, rtol):
    la, lb = logits(da, a, key), logits(db, b, key)
    if la.shape != lb.shape:
        report(name, False, f"shape {la.shape} vs {lb.shape}")
        return
    rel = np.linalg.norm(la - lb, axis=1) / np.maximum(np.linalg.norm(la, axis=1), 1e-30)
    bitwise = int((la.view(np.uint32) == lb.view(np.uint32)).sum())
    report(name, bool(rel.max() <= rtol) and not np.isnan(lb).any(),
           f"max rel {rel.max():.2e} over {la.shape[0]} positions, {bitwise}/{la.size} bit-identical")


def compare_mtp(report, name, da, a, db, b, rtol):
    """The MTP fields of one prompt: drafts, routing and speculative traces identical, logits close."""
    if "mtp_logits_file" not in b:
        report(f"{name} mtp", False, "the regenerated golden has no MTP fields")
        return
    report(f"{name} mtp drafts", a["mtp_draft_top1"] == b.get("mtp_draft_top1"),
           f"{len(a['mtp_draft_top1'])} positions, min margin {a['mtp_min_margin']:.4f}")
    report(f"{name} mtp routing", a["mtp_routing"]["experts"] == b.get("mtp_routing", {}).get("experts"),
           f"min router margin {a['mtp_min_router_margin']:.4f}")
    compare_logits(report, f"{name} mtp logits", da, a, db, b, "mtp_logits", rtol)
    for k, sa in a["speculative"].items():
        sb = b.get("speculative", {}).get(k, {})
        same = [(s["drafts"], s["accepted"], s["emitted"]) for s in sa["steps"]] == \
               [(s["drafts"], s["accepted"], s["emitted"]) for s in sb.get("steps", [])]
        report(f"{name} speculative k={k}", same, f"{sa['accepted']}/{int(k) * sa['num_steps']} drafts accepted")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("committed")
    ap.add_argument("regenerated")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    (ga, ta), (gb, tb) = load(args.committed), load(args.regenerated)
    passed = failed = 0

    def report(name, ok, detail):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
        passed, failed = passed + ok, failed + (not ok)

    report("prompt count", len(ga["prompts"]) == len(gb["prompts"]), f"{len(ga['prompts'])} vs {len(gb['prompts'])}")
    for a, b in zip(ga["prompts"], gb["prompts"]):
        name = f"prompt {a['index']}"
        same = a["ids"] == b["ids"] and a["generated_ids"] == b["generated_ids"]
        report(f"{name} ids + greedy", same, f"{len(a['ids'])} ids, {len(a['generated_ids'])} generated")
        route_same = all(a["routing"][k]["experts"] == b["routing"].get(k, {}).get("experts") for k in a["routing"])
        report(f"{name} routing", route_same, f"layers {sorted(a['routing'])}, min router margin {a['min_router_margin']:.4f}")
        compare_logits(report, f"{name} logits", args.committed, a, args.regenerated, b, "logits", args.rtol)
        if "mtp_draft_top1" in a:
            compare_mtp(report, name, args.committed, a, args.regenerated, b, args.rtol)
    for name, a in ga.get("ablations", {}).items():
        b = gb.get("ablations", {}).get(name)
        if b is None:
            report(f"ablation {name}", False, "missing in the regenerated golden")
        else:
            compare_logits(report, f"ablation {name} logits", args.committed, a, args.regenerated, b, "logits", args.rtol)
    for fn in ("compression.json", "engram_hash.json"):
        if os.path.exists(os.path.join(args.committed, fn)):
            pa, pb = os.path.join(args.committed, fn), os.path.join(args.regenerated, fn)
            same = os.path.exists(pb) and json.load(open(pa)) == json.load(open(pb))
            report(fn, same, "identical" if same else "differs or missing")
    tok_same = [x["ids"] == y["ids"] and x["text"] == y["text"] for x, y in zip(ta, tb)]
    report("tokenizer cases", len(ta) == len(tb) and all(tok_same), f"{sum(tok_same)}/{len(ta)} identical")
    print(f"reference: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
