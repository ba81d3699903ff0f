"""Writes the golden data the C++ engine is checked against (format: models/tiny/golden/README.md).

For each line of prompts.txt: token ids ([BOS] + the reference encoder's ids), the greedy
continuation (full recompute each step, reference forward in "fp8" mode), fp32 logits at every
position of the final pass, per-position top-1/top-2 margins, routing decisions per MoE layer and
the smallest router margin. Also tokenizer_cases.json: the reference encoder's ids for mixed text.
For a checkpoint with an MTP module, also the MTP logits, drafts and routing over each golden
sequence and greedy speculative-decoding traces for each k of --draft-tokens (format:
models/tiny-mtp/golden/README.md). For a checkpoint with Engram and/or mHC, also the compression
table, prompt 0's hash rows and its ablation logits (format: models/tiny-engram/golden/README.md).

    /usr/bin/python3 tools/reference/write_golden.py --model models/tiny --out models/tiny/golden
"""

import argparse
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bpe import Tokenizer  # noqa: E402
from model import Model, greedy, speculative_greedy  # noqa: E402

MAX_NEW_TOKENS = 16

# Mixed text for the tokenizer golden: scripts, digits, whitespace runs, CRLF, special tokens.
TOKENIZER_TEXTS = [
    "",
    "This program is free software; you can redistribute it and/or modify it",
    "Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>",
    "  leading spaces,\ttabs,\nnewlines\r\nand   runs   of   spaces  ",
    "trailing newlines\n\n\n",
    "numbers 1 12 123 1234 12345 3.14159 -42 1,000,000 ２０２５",
    "数字と漢字のテスト、そして한국어 문장도 있어요. 中文分词测试。",
    "Привет, мир! Ελληνικά κείμενα. עברית ועוד. العربية ١٢٣",
    "Emoji 🙂🌊🦓 and symbols €£¥ © ® ™ ∑ ∫ √ — “quotes” ‘single’ …",
    "combining e\u0301 and precomposed é; ligature ﬁ; Zürich, São Paulo, Ærøskøbing",
    "def main():\n    return {'key': [1, 2, 3]}  # code\n\nprint(main())",
    "URLs like https://example.com/path?q=1&r=2 and e-mail@example.org",
    "<｜User｜>What is copyleft?<｜Assistant｜>Copyleft is a license.<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>text after BOS<｜User｜><｜Assistant｜>",
    "IN NO EVENT SHALL THE AUTHORS BE LIABLE; don't, won't, it's, we'll, they've",
    "tab\tthen\u00a0nbsp and\u3000ideographic space",
]


def top2_margin(logits):
    v = torch.topk(logits, 2, dim=-1).values
    return v[:, 0] - v[:, 1]


def routing_json(tr):
    return {"experts": tr["experts"].tolist(), "weights": [[float(w) for w in row] for row in tr["weights"]],
            "margins": [float(m) for m in tr["margin"]]}


def write_prompt_golden(model, tok, index, text, out_dir, max_new, draft_tokens=()):
    ids = tok.encode(text, add_bos=True)
    new_ids, logits, trace, h = greedy(model, ids, max_new, return_hidden=True)
    t_len, vocab = logits.shape
    fn = f"logits_{index}.f32"
    logits.contiguous().numpy().astype("<f4").tofile(os.path.join(out_dir, fn))
    margins = top2_margin(logits)
    routing = {}
    router_margins = []
    for layer, tr in sorted(trace.items()):
        routing[str(layer)] = routing_json(tr)
        router_margins.append(float(tr["margin"].min()))
    entry = {
        "index": index,
        "text": text,
        "ids": ids,
        "generated_ids": new_ids,
        "generated_text": tok.decode(new_ids),
        "num_positions": t_len,
        "logits_file": fn,
        "logits_shape": [t_len, vocab],
        "top1": [int(i) for i in torch.argmax(logits, dim=-1)],
        "margins": [float(m) for m in margins],
        "min_margin": float(margins.min()),
        "routing": routing,
        "min_router_margin": min(router_margins) if router_margins else None,
    }
    if draft_tokens:
        entry.update(mtp_golden(model, index, ids, new_ids, h, out_dir, max_new, draft_tokens))
    return entry


def mtp_golden(model, index, ids, new_ids, h, out_dir, max_new, draft_tokens):
    """The MTP fields of one prompt (models/tiny-mtp/golden/README.md)."""
    seq = ids + new_ids  # the golden sequence is seq[:-1]; T = len(seq) - 1 positions
    t_len = len(seq) - 1
    _, mlogits, mtrace = model.mtp(h[:-1], seq[1:t_len])  # MTP position t: h_t and token t+1 -> token t+2
    fn = f"mtp_logits_{index}.f32"
    mlogits.contiguous().numpy().astype("<f4").tofile(os.path.join(out_dir, fn))
    margins = top2_margin(mlogits)
    top1 = [int(i) for i in torch.argmax(mlogits, dim=-1)]
    # teacher-forced drafts over the continuation: MTP positions t >= len(ids) - 1, whose token t+1
    # is generated (the one a decode step drafts from) and whose target t+2 is too
    tf = [top1[t] == seq[t + 2] for t in range(len(ids) - 1, t_len - 1)]
    out = {
        "mtp_logits_file": fn,
        "mtp_logits_shape": list(mlogits.shape),
        "mtp_draft_top1": top1,
        "mtp_margins": [float(m) for m in margins],
        "mtp_min_margin": float(margins.min()),
        "mtp_routing": routing_json(mtrace),
        "mtp_min_router_margin": float(mtrace["margin"].min()),
        "mtp_teacher_forced": [sum(tf), len(tf)],
        "speculative": {},
    }
    for k in draft_tokens:
        emitted, steps = speculative_greedy(model, ids, max_new, k)
        if emitted != new_ids:
            raise RuntimeError(f"prompt {index}: speculative decoding with k={k} emitted {emitted}, plain greedy "
                               f"{new_ids}: the reference is not greedy-identical (a logit near-tie?)")
        accepted = sum(s["accepted"] for s in steps)
        out["speculative"][str(k)] = {
            "steps": steps,
            "num_steps": len(steps),
            "accepted": accepted,
            "first_accepted": sum(s["accepted"] > 0 for s in steps),
            "acceptance": accepted / (k * len(steps)),
        }
    return out


def engram_golden(model, entry, out_dir):
    """Files of a model with Engram and/or mHC (models/tiny-engram/golden/README.md), for the golden
    sequence of prompt `entry` (its ids + generated_ids[:-1], the positions of its logits file):
    compression.json, engram_hash.json and the ablation logits. Returns golden.json's "ablations"."""
    c = model.cfg
    seq = entry["ids"] + entry["generated_ids"][:-1]
    ref = np.fromfile(os.path.join(out_dir, entry["logits_file"]), dtype="<f4").reshape(entry["logits_shape"])
    ablations = {}

    def ablation(name, m):
        logits, _ = m.forward(seq)
        fn = f"logits_ablate_{name}_{entry['index']}.f32"
        logits.contiguous().numpy().astype("<f4").tofile(os.path.join(out_dir, fn))
        delta = float(np.abs(logits.numpy() - ref).max())
        ablations[name] = {"logits_file": fn, "logits_shape": list(logits.shape), "prompt_index": entry["index"],
                           "max_abs_delta": delta}
        print(f"ablation {name}: max |logits - logits_{entry['index']}| = {delta:.4f}", flush=True)

    if c.engram is not None:
        table, v = model.compression
        with open(os.path.join(out_dir, "compression.json"), "w") as f:
            json.dump({"vocab_size_compressed": v, "raw_to_canonical": table}, f)
            f.write("\n")
        layers = c.engram.layer_ids
        rows = torch.cat([model.engram_rows(layer, seq) for layer in layers], dim=1)  # [T, L*H]
        with open(os.path.join(out_dir, "engram_hash.json"), "w") as f:
            json.dump({"layer_ids": layers,
                       "multipliers": {str(layer): model.engram_hash[layer][0] for layer in layers},
                       "table_sizes": {str(layer): model.engram_hash[layer][1] for layer in layers},
                       "prompt_index": entry["index"], "ids": seq, "canonical_ids": model.canonical_ids(seq).tolist(),
                       "indices": rows.tolist()}, f)
            f.write("\n")
        zeroed = dict(model.t)
        for layer in layers:
            name = f"model.layers.{layer}.engram.embedding.weight"
            zeroed[name] = (zeroed[name][0], torch.zeros_like(zeroed[name][1]))
        ablation("engram", Model(c, zeroed, model.mode, model.compression))
    if c.hc_mult > 1:
        model.identity_comb = True
        try:
            ablation("comb", model)
        finally:
            model.identity_comb = False
    return ablations


def acceptance_summary(entries, draft_tokens):
    """Over all prompts, per k: accepted drafts / (k * steps), the first draft's acceptance, and the
    tokens emitted per step."""
    out = {}
    for k in draft_tokens:
        sp = [e["speculative"][str(k)] for e in entries]
        steps, accepted = sum(s["num_steps"] for s in sp), sum(s["accepted"] for s in sp)
        out[str(k)] = {"steps": steps, "accepted": accepted, "acceptance": accepted / (k * steps),
                       "first_draft_acceptance": sum(s["first_accepted"] for s in sp) / steps,
                       "tokens_per_step": (accepted + steps) / steps}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--out", required=True, help="golden folder to write")
    ap.add_argument("--prompts", help="prompts file, one per line (default: OUT/prompts.txt)")
    ap.add_argument("--mode", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    ap.add_argument("--draft-tokens", default="1,2", help="k of the speculative traces (models with an MTP module)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    prompts_path = args.prompts or os.path.join(args.out, "prompts.txt")
    with open(prompts_path, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    tok = Tokenizer.load(os.path.join(args.model, "tokenizer.json"))
    model = Model.load(args.model, mode=args.mode)
    draft_tokens = [int(k) for k in args.draft_tokens.split(",") if k] if model.cfg.num_nextn_predict_layers else []

    entries = []
    for i, text in enumerate(prompts):
        e = write_prompt_golden(model, tok, i, text, args.out, args.max_new_tokens, draft_tokens)
        entries.append(e)
        print(f"prompt {i}: {len(e['ids'])} ids, min logit margin {e['min_margin']:.3f}, "
              f"min router margin {e['min_router_margin']:.4f}\n  {text!r} -> {e['generated_text']!r}", flush=True)
        if draft_tokens:
            print(f"  mtp: min margin {e['mtp_min_margin']:.3f}, min router margin {e['mtp_min_router_margin']:.4f}, "
                  f"teacher-forced {e['mtp_teacher_forced'][0]}/{e['mtp_teacher_forced'][1]}, "
                  + ", ".join(f"k={k}: {s['accepted']}/{int(k) * s['num_steps']} accepted in {s['num_steps']} steps"
                              for k, s in e["speculative"].items()), flush=True)
    golden = {
        "format": "deepinfer-golden-1",
        "generator": "tools/reference/write_golden.py",
        "torch_version": torch.__version__,
        "mode": args.mode,
        "add_bos": True,
        "max_new_tokens": args.max_new_tokens,
        "vocab_size": model.cfg.vocab_size,
        "moe_layers": [i for i in range(model.cfg.num_hidden_layers) if model.cfg.is_moe_layer(i)],
        "min_margin": min(e["min_margin"] for e in entries),
        "min_router_margin": min(e["min_router_margin"] for e in entries),
    }
    if draft_tokens:
        golden["num_nextn_predict_layers"] = model.cfg.num_nextn_predict_layers
        golden["mtp_draft_tokens"] = draft_tokens
        golden["mtp_min_margin"] = min(e["mtp_min_margin"] for e in entries)
        golden["mtp_min_router_margin"] = min(e["mtp_min_router_margin"] for e in entries)
        golden["mtp_teacher_forced"] = [sum(e["mtp_teacher_forced"][j] for e in entries) for j in (0, 1)]
        golden["mtp_acceptance"] = acceptance_summary(entries, draft_tokens)
    if model.cfg.engram is not None or model.cfg.hc_mult > 1:
        golden["hc_mult"] = model.cfg.hc_mult
        golden["engram_layers"] = model.cfg.engram.layer_ids if model.cfg.engram is not None else []
        golden["ablations"] = engram_golden(model, entries[0], args.out)
    golden["prompts"] = entries
    with open(os.path.join(args.out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    cases = [{"text": t, "ids": tok.encode(t)} for t in TOKENIZER_TEXTS]
    with open(os.path.join(args.out, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"write_golden: {len(entries)} prompts, min logit margin {golden['min_margin']:.4f}, "
          f"min router margin {golden['min_router_margin']:.4f}; {len(cases)} tokenizer cases -> {args.out}")
    if draft_tokens:
        tf = golden["mtp_teacher_forced"]
        print(f"write_golden: mtp min margin {golden['mtp_min_margin']:.4f}, min router margin "
              f"{golden['mtp_min_router_margin']:.4f}, teacher-forced drafts {tf[0]}/{tf[1]}; "
              + "; ".join(f"k={k}: acceptance {a['acceptance']:.3f} (first draft {a['first_draft_acceptance']:.3f}, "
                          f"{a['tokens_per_step']:.2f} tokens/step over {a['steps']} steps)"
                          for k, a in golden["mtp_acceptance"].items()))


if __name__ == "__main__":
    main()
