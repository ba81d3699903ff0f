"""Self-checks of the reference against closed forms and brute force (run by scripts/stages/reference.sh).

    /usr/bin/python3 tools/reference/test_reference.py [--model models/tiny]
Prints one line per check and exits non-zero on any failure.
"""

import argparse
import math
import os
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numerics as nx  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from model import (Config, ConfigError, Model, compression_normalize, compression_table, engram_hash_params,  # noqa: E402
                   engram_indices, greedy, mtp_chain, rope_inv_freq, sinkhorn, softmax_scale, speculative_greedy)
from safetensors_io import SafetensorsError, read_safetensors, write_safetensors  # noqa: E402

FAILURES = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name}{('  ' + detail) if detail else ''}")
    if not ok:
        FAILURES.append(name)


def e4m3_brute(x):
    """Nearest e4m3 code by exhaustive search in float64, ties to the even code, saturating."""
    vals = nx.E4M3_TABLE[:127].double()
    out = []
    for v in x.tolist():
        a = abs(v)
        if math.isnan(v):
            out.append(0x7F | (0x80 if math.copysign(1, v) < 0 else 0))
            continue
        if a >= 448:
            c = 126
        else:
            d = (vals - a).abs()
            cands = (d == d.min()).nonzero().flatten().tolist()
            c = cands[0] if len(cands) == 1 else [k for k in cands if k % 2 == 0][0]
        out.append(c | (0x80 if math.copysign(1, v) < 0 else 0))
    return torch.tensor(out, dtype=torch.uint8)


def test_fp8():
    t = nx.E4M3_TABLE
    check("e4m3 decode table", t[0x7E] == 448 and t[0x01] == 2.0**-9 and t[0x08] == 2.0**-6
          and t[0x38] == 1.0 and t[0xB8] == -1.0 and math.isnan(t[0x7F]) and math.isnan(t[0xFF]))
    g = torch.Generator().manual_seed(1)
    mids = (nx.E4M3_TABLE[:126] + nx.E4M3_TABLE[1:127]) / 2
    x = torch.cat([torch.randn(4000, generator=g) * 60, torch.randn(2000, generator=g) * 0.005, mids, -mids,
                   torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 1e9, -1e9, float("inf"), float("-inf"), float("nan")])])
    got, want = nx.e4m3_encode(x), e4m3_brute(x)
    check("e4m3 encode == brute-force RNE (incl. every midpoint, saturation, NaN)", bool((got == want).all()),
          f"{int((got != want).sum())} of {x.numel()} differ")

    xa = nx.bf16(torch.randn(3, 256, generator=g) * 3)
    xa[1, :128] = 0  # an all-zero group takes the 1e-4 clamp
    q, s = nx.act_quant(xa)
    amax = xa.reshape(3, 2, 128).abs().amax(-1)
    check("act_quant scale = max(amax,1e-4)/448", bool((s == torch.clamp(amax, min=1e-4) / 448).all())
          and s[1, 0].item() == torch.tensor(1e-4 / 448, dtype=torch.float32).item())
    check("act_quant hits +-448 in every non-zero group", bool((q.abs().amax(-1)[amax > 0] == 448).all()))

    w = torch.randn(160, 256, generator=g) * 0.05
    w[128:, 128:] = 0  # a zero edge block
    qw = nx.quantize_weight(w)
    blocks_amax = torch.stack([w[:128, :128].abs().max(), w[:128, 128:].abs().max(), w[128:, :128].abs().max(),
                               torch.tensor(0.0)]).reshape(2, 2)
    check("weight scales: [ceil(N/128), ceil(K/128)], amax/448, zero block -> 0",
          tuple(qw.scale_inv.shape) == (2, 2) and bool((qw.scale_inv == blocks_amax / 448).all()))
    err = (qw.dequant_fp32() - w).abs() / qw.row_col_scales().clamp(min=1e-30)
    check("weight dequant error <= half an e4m3 step (<= 16 units of S)", float(err.max()) <= 16.0,
          f"max {float(err.max()):.3f}")

    xx = nx.bf16(torch.randn(7, 256, generator=g))
    y = nx.fp8_linear(xx, qw)
    qa, sa = nx.act_quant(xx)
    exact = (qa.reshape(7, 256).double() * sa.repeat_interleave(128, 1).double()) @ qw.dequant_fp32().double().t()
    ulps = (y.double() - nx.bf16(exact).double()).abs() / nx.bf16(exact).double().abs().clamp(min=1e-30) * 256
    check("fp8_linear == bf16(exact dequantized product) within 1 bf16 ulp", float(ulps.max()) <= 1.0 + 1e-9,
          f"{int((y != nx.bf16(exact)).sum())} of {y.numel()} differ by 1 ulp")


def test_safetensors():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        a = torch.randn(3, 5)
        b = torch.randn(130).to(torch.bfloat16)
        c = nx.e4m3_encode(torch.randn(4, 4))
        write_safetensors(p, {"a": ("F32", a), "b": ("BF16", b), "c": ("F8_E4M3", c)}, {"format": "pt"})
        t, meta = read_safetensors(p)
        ok = (t["a"][0] == "F32" and torch.equal(t["a"][1], a) and torch.equal(t["b"][1].view(torch.int16), b.view(torch.int16))
              and t["c"][0] == "F8_E4M3" and torch.equal(t["c"][1], c) and meta == {"format": "pt"})
        check("safetensors round trip F32/BF16/F8_E4M3 + metadata", ok)
        with open(p, "rb") as f:
            blob = f.read()
        with open(p, "wb") as f:
            f.write(blob[:-10])
        try:
            read_safetensors(p)
            check("safetensors truncated file is an error", False)
        except SafetensorsError as e:
            check("safetensors truncated file is an error", "data_offsets" in str(e), str(e)[:80])


def test_rope_router():
    v3 = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
          "num_hidden_layers": 61, "num_attention_heads": 128, "first_k_dense_replace": 3, "n_routed_experts": 256,
          "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
          "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
          "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    cfg = Config(v3)
    f = rope_inv_freq(cfg)
    base = torch.tensor([10000 ** (-(2.0 * i) / 64) for i in range(32)], dtype=torch.float64).float()
    check("YaRN V3: indices <= 10 untouched, >= 23 divided by 40",
          bool((f[:11] == base[:11]).all()) and bool(torch.allclose(f[23:], base[23:] / 40, rtol=1e-6)))
    check("softmax scale V3 = 0.1352338", abs(softmax_scale(cfg) - 0.1352338) < 1e-6, f"{softmax_scale(cfg):.7f}")
    lite = dict(v3, qk_nope_head_dim=128, rope_scaling=dict(v3["rope_scaling"], mscale=0.707, mscale_all_dim=0.707))
    check("softmax scale V2-Lite = 0.1147214", abs(softmax_scale(Config(lite)) - 0.1147214) < 1e-6)

    # Router on a hand-built case: 8 experts, 4 groups of 2, keep 2 groups, top-2.
    small = dict(v3, hidden_size=2, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                 routed_scaling_factor=2.0)
    logit = torch.tensor([[0.0, 0.0, 1.0, -1.0, 2.0, 2.0, -3.0, 0.5]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0])  # bias lifts expert 6 into the top-2
    m = Model(Config(small), {"model.layers.0.mlp.gate.weight": ("F32", torch.zeros(8, 2)),
                              "model.layers.0.mlp.gate.e_score_correction_bias": ("F32", bias)})
    import model as mdl
    saved = mdl.dot_f32
    mdl.dot_f32 = lambda x, w: logit  # inject the router logits
    try:
        idx, w, margin = m.route(0, torch.zeros(1, 2))
    finally:
        mdl.dot_f32 = saved
    s = torch.sigmoid(logit[0])
    # biased: e6 = 5.047; groups: g3 = e6+e7, g2 = e4+e5 (tie e4 == e5 -> lower id e4 first)
    want_w = torch.stack([s[6], s[4]]) / (s[6] + s[4]) * 2.0
    check("router: bias selects but does not weight; ties -> lower id; slot order by biased score",
          idx.tolist() == [[6, 4]] and torch.allclose(w[0], want_w), f"idx {idx.tolist()} w {w.tolist()}")
    check("router margin: tie between e4 and e5 gives margin 0", float(margin[0]) == 0.0, f"{float(margin[0])}")


def test_tokenizer(model_dir):
    tok = Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))
    texts = ["This program is free software.", "  mixed 数字と漢字 Привет 🙂 e\u0301 \r\n\t x  ", "",
             "<｜User｜>hi<｜Assistant｜>"]
    ok = all(tok.decode(tok.encode(t)) == t for t in texts)
    check("tokenizer round trip (mixed scripts, whitespace, special tokens)", ok)
    ids = tok.encode("<｜User｜>hi<｜Assistant｜>", add_bos=True)
    check("special tokens are single ids; BOS = 0", ids[0] == 0 and ids[1] == 2 and ids[-1] == 3, str(ids))


def test_attention_forms(model_dir):
    """The absorbed form used by the reference agrees with the naive form (float64) to bf16 noise."""
    m = Model.load(model_dir)
    c = m.cfg
    g = torch.Generator().manual_seed(3)
    x = nx.bf16(torch.randn(9, c.hidden_size, generator=g))
    pos = torch.arange(9)
    absorbed = m.mla_heads(0, x, pos)  # before o_proj, whose fp8 cast would amplify rounding flips
    # naive, all float64 after the same q/kv projections
    from model import apply_rope, rms_norm
    p = "model.layers.0.self_attn."
    nh, dn, dr, dv, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    q = m.linear(p + "q_b_proj", rms_norm(m.linear(p + "q_a_proj", x), m.vec(p + "q_a_layernorm.weight"), c.rms_norm_eps))
    q = q.reshape(9, nh, dn + dr)
    q_pe = apply_rope(q[..., dn:], pos, m.inv_freq, m.attn_factor)
    kv = m.linear(p + "kv_a_proj_with_mqa", x)
    c_n = rms_norm(kv[:, :r], m.vec(p + "kv_a_layernorm.weight"), c.rms_norm_eps)
    k_pe = apply_rope(kv[:, r:], pos, m.inv_freq, m.attn_factor)
    kvb = (c_n.double() @ m.dense_weight(p + "kv_b_proj").double().t()).reshape(9, nh, dn + dv)
    s = (torch.einsum("thd,shd->hts", q[..., :dn].double(), kvb[..., :dn]) +
         torch.einsum("thd,sd->hts", q_pe.double(), k_pe.double())) * m.scale
    s = s.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1)[None], float("-inf"))
    o = torch.einsum("hts,shv->thv", torch.softmax(s, -1), kvb[..., dn:]).reshape(9, nh * dv)
    rel = float((absorbed - o).norm() / o.norm())
    check("MLA absorbed form == naive form (float64) within bf16 noise", rel < 5e-3, f"rel {rel:.2e}")


def test_mtp(model_dir):
    """The MTP forward (model.mtp, mtp_chain, speculative_greedy) against explicit applications, its
    causality, and the training code's independent fp32 forward (naive MLA, its own chain attention)."""
    m = Model.load(model_dir)
    tok = Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))
    ids = tok.encode("Redistribution and use in source and binary forms, with or without modification, are", add_bos=True)
    _, _, h = m.forward(ids, return_hidden=True)
    n = len(ids) - 1  # drafts from the newest token ids[n]
    drafts, rows = mtp_chain(m, h[:n], ids[1:], 2)
    g1, l1, _ = m.mtp(h[:n], ids[1:])
    d1 = int(torch.argmax(l1[-1]))
    _, l2, _ = m.mtp(torch.cat([h[:n], g1[-1:]]), ids[1:] + [d1])
    check("mtp chain k=2 == two explicit applications (bitwise)",
          drafts == [d1, int(torch.argmax(l2[-1]))] and torch.equal(rows[0], l1[-1]) and torch.equal(rows[1], l2[-1]),
          f"drafts {drafts}")

    # causality: MTP position t sees tokens <= t+1 only (its h_t and token t+1, and positions < t)
    t = 8
    other = ids[: t + 2] + [(x * 7 + 3) % m.cfg.vocab_size for x in ids[t + 2:]]
    _, _, h_o = m.forward(other, return_hidden=True)
    _, lo, _ = m.mtp(h_o[:-1], other[1:])
    _, la, _ = m.mtp(h[:-1], ids[1:])
    check("mtp logits at positions <= t do not depend on tokens after t+1",
          torch.equal(la[: t + 1], lo[: t + 1]) and not torch.equal(la[t + 1:], lo[t + 1:]))

    for k in (1, 3):
        spec, steps = speculative_greedy(m, ids[:6], 6, k)
        want = greedy(m, ids[:6], 6)[0]
        check(f"speculative greedy k={k} == plain greedy", spec == want,
              f"{sum(s['accepted'] for s in steps)}/{k * len(steps)} accepted")

    # the training code's forward (fp32, naive MLA, dequantized weights) from the exported checkpoint
    import train_mtp
    import train_tiny
    tm = train_mtp.TinyDeepseekMTP(Config(train_mtp.MTP_CONFIG))
    train_tiny.load_exported(tm, model_dir)
    tm.eval()
    mtp = tm.mtp()
    with torch.no_grad():
        full = torch.tensor([ids])
        t_len = len(ids) - 1
        cos, sin = tm.rope(t_len)
        th = tm.main_hidden(full[:, :t_len])
        emb = tm.embed_tokens(full[:, 1:])
        x1, tg1 = mtp.step(emb, th, cos, sin)
        tl1 = tm.mtp_logits(tg1)[0]
        g_prev = torch.cat([torch.zeros_like(tg1[:, :1]), tg1[:, :-1]], 1)
        _, tg2 = mtp.step(emb, g_prev, cos, sin, ctx=x1)
        tl2 = tm.mtp_logits(tg2)[0]
        _, tg2_wrong = mtp.step(emb, g_prev, cos, sin)  # a wrong window: attends to chain entries only
        tl2_wrong = tm.mtp_logits(tg2_wrong)[0]
    g_ref, l_ref, _ = m.mtp(h[:-1], ids[1:])
    rel = float((l_ref - tl1).norm() / tl1.norm())
    top2 = torch.topk(tl1, 2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5  # positions whose argmax fp8 noise cannot flip
    agree = bool((l_ref.argmax(-1) == tl1.argmax(-1))[clear].all())
    check("mtp forward == the training code's fp32 forward within fp8 noise", rel < 0.1 and agree,
          f"rel {rel:.3f}, argmax agrees at all {int(clear.sum())} of {len(clear)} positions with margin > 0.5")
    # chain position p: real positions 0..p-1, then (g_{p-1}, token p+1), as train_mtp's ctx attention;
    # fp8 noise compounds over two applications, so also require it far closer than a wrong window
    rels, wrong = [], []
    for p in (3, 9, t_len - 1):
        _, lc, _ = m.mtp(torch.cat([h[:p], g_ref[p - 1: p]]), ids[1: p + 2])
        rels.append(float((lc[-1] - tl2[p]).norm() / tl2[p].norm()))
        wrong.append(float((lc[-1] - tl2_wrong[p]).norm() / tl2_wrong[p].norm()))
    check("mtp chain step == the training code's chain attention within fp8 noise",
          max(rels) < 0.15 and all(r < w / 2 for r, w in zip(rels, wrong)),
          "rel " + ", ".join(f"{r:.3f}" for r in rels) + " (wrong window: " + ", ".join(f"{w:.3f}" for w in wrong) + ")")


class _FakeTokenizer:
    """A bpe.Tokenizer over a hand-written byte-level vocabulary (no merges)."""

    def __new__(cls, vocab, added):
        return Tokenizer(vocab, [], added)


def test_engram_config():
    base = dict(train_tiny_config("tiny-engram"))
    bad = {
        "unknown engram key": dict(base, engram=dict(base["engram"], n_heads=4)),
        "missing engram key": dict(base, engram={k: v for k, v in base["engram"].items() if k != "seed"}),
        "hc_mult 2": dict(base, hc_mult=2),
        "layer id out of range": dict(base, engram=dict(base["engram"], layer_ids=[1, 4])),
        "layer ids not increasing": dict(base, engram=dict(base["engram"], layer_ids=[1, 1])),
        "budget list length": dict(base, engram=dict(base["engram"], engram_vocab_size=[1024])),
        "D not integral": dict(base, engram=dict(base["engram"], n_embed_per_ngram=130)),
    }
    errors = {}
    for name, raw in bad.items():
        try:
            Config(raw)
            errors[name] = None
        except ConfigError as e:
            errors[name] = str(e)
    check("engram/mHC config mistakes are ConfigErrors naming the field", all(errors.values()),
          "; ".join(f"{k}: {(v or 'ACCEPTED')[:60]}" for k, v in errors.items() if not v) or
          f"{len(errors)} cases, e.g. '{errors['unknown engram key'][:70]}'")
    c = Config(base)
    check("tiny-engram config: D = 32, E = 256, 8 heads, dilation 3, hc 4",
          (c.engram.head_dim, c.engram.embed_dim, c.engram.num_heads, c.engram.dilation, c.hc_mult) == (32, 256, 8, 3, 4))


def train_tiny_config(arch):
    import train_tiny
    return train_tiny.ARCHS[arch]


def test_sinkhorn():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(50, 4, 4, generator=g)
    c = sinkhorn(logits, 10, 1e-6)
    rows, cols = (c.sum(-1) - 1).abs().max().item(), (c.sum(-2) - 1).abs().max().item()
    c100 = sinkhorn(logits, 100, 1e-6)
    rows100 = (c100.sum(-1) - 1).abs().max().item()
    check("Sinkhorn (10 repeats) is near doubly stochastic and positive; more repeats converge",
          rows < 5e-3 and cols < 1e-5 and rows100 < 1e-5 and bool((c > 0).all()),
          f"max |row sum - 1| {rows:.1e} (100 repeats: {rows100:.1e}), |column sum - 1| {cols:.1e}")
    one = sinkhorn(torch.zeros(1, 4, 4), 1, 0.0)
    check("Sinkhorn of equal logits = 1/n everywhere", torch.allclose(one, torch.full((1, 4, 4), 0.25)))


def test_compression():
    cases = {"Café": "cafe", "ÉCOLE  Normale": "ecole normale", "  Hello\t\n World  ": "hello world",
             " ": " ", "\n": " ", "\t\r\n ": " ", "\u00a0": " ", "ﬁne": "fine", "Ｆｕｌｌ": "full",
             "e\u0301": "e", "Zürich": "zurich", "\x0b": "", "": "", "A\u3000B": "a b",
             "\u0915\u093f": "\u0915", "o\u20dd": "o", "ΑΣ": "ασ", "x\x1c": "x\x1c"}  # Mc, Me, no final sigma
    got = {t: compression_normalize(t) for t in cases}
    check("compression normalizer: NFKC, NFD, drop marks, per-char lower, whitespace runs, lone space kept",
          got == cases, "; ".join(f"{t!r} -> {got[t]!r} (want {w!r})" for t, w in cases.items() if got[t] != w))
    # byte-level vocabulary: 'Ġ' = space, 'Ċ' = LF, 'Ã'/'©' = the bytes C3/A9 (lone: incomplete UTF-8)
    vocab = {"Hello": 0, "hello": 1, "Ġhello": 2, "Ã": 3, "©": 4, "Ġ": 5, "Ċ": 6, "ĠĠ": 7, "Ã©": 8, "e": 9,
             "ċ": 10}
    tok = _FakeTokenizer(vocab, {"<｜User｜>": 11})
    table, v = compression_table(tok)
    want = [0, 0, 0, 1, 2, 3, 3, 3, 4, 4, 5, 6]  # 'ċ' = byte 0x0B: normalizes to '', keeps its text
    check("compression table: first-appearance ids, U+FFFD fragments stay distinct, whitespace tokens merge",
          table == want and v == 7, f"{table}, V' = {v}")


def test_engram_hash():
    # closed form: multipliers [3, 5, 7], one head per order with sizes 11 (order 2) and 13 (order 3)
    rows = engram_indices(torch.tensor([4, 1, 2]), 1, [3, 5, 7], [11, 13], 1).tolist()
    # t=0: (4*3 ^ 1*5) = 9 -> 9 % 11 = 9; (9 ^ 1*7) = 14 -> 14 % 13 = 1, + 11
    # t=1: (1*3 ^ 4*5) = 23 -> 1; (23 ^ 7) = 16 -> 3, + 11;  t=2: (6 ^ 5) = 3 -> 3; (3 ^ 28) = 31 -> 5, + 11
    check("engram hash of a hand-computed example (pad fills t-k < 0, head offsets)",
          rows == [[9, 12], [1, 14], [3, 16]], str(rows))
    demo = {"layer_ids": [1, 15], "max_ngram_size": 3, "n_head_per_ngram": 8, "n_embed_per_ngram": 512,
            "engram_vocab_size": [646400, 646400], "kernel_size": 4, "pad_id": 2, "seed": 0}
    cfg = Config(dict(train_tiny_config("tiny"), num_hidden_layers=30, engram=demo))
    params = engram_hash_params(cfg.engram, 129280)
    primes1 = [646403, 646411, 646421, 646423, 646433, 646453, 646519, 646523,
               646537, 646543, 646549, 646571, 646573, 646577, 646609, 646619]
    primes15 = [646631, 646637, 646643, 646669, 646687, 646721, 646757, 646771,
                646781, 646823, 646831, 646837, 646843, 646859, 646873, 646879]
    check("demo config: primes of layers 1 and 15 (spec §1.3), row totals 10,344,164 / 10,348,242",
          params[1][1] == primes1 and params[15][1] == primes15 and sum(primes1) == 10344164
          and sum(primes15) == 10348242)
    check("demo config: layer 1 multipliers at V' = 129280",
          params[1][0] == [58737837727525, 3709723095905, 27562777300965], str(params[1][0]))
    # large ids and multipliers: the int64 tensor arithmetic against Python's exact integers
    mult, sizes = params[1]
    canon = [129279, 0, 77777, 2, 129278, 5]
    got = engram_indices(torch.tensor(canon), 2, mult, sizes, 8).tolist()
    want = []
    for t in range(len(canon)):
        s = [canon[t - k] if t - k >= 0 else 2 for k in range(3)]
        mix2 = (s[0] * mult[0]) ^ (s[1] * mult[1])
        mix3 = mix2 ^ (s[2] * mult[2])
        row = [(mix2 if h < 8 else mix3) % sizes[h] + sum(sizes[:h]) for h in range(16)]
        want.append(row)
    check("engram hash with the demo multipliers == Python exact integers", got == want)


def engram_test_model():
    """An untrained tiny-engram (random init, the training code's export) on models/tiny's tokenizer."""
    import train_tiny
    here = os.path.dirname(os.path.abspath(__file__))
    tok = Tokenizer.load(os.path.join(here, "..", "..", "models", "tiny", "tokenizer.json"))
    cfg = Config(train_tiny_config("tiny-engram"))
    comp = compression_table(tok)
    torch.manual_seed(7)
    tm = train_tiny.TinyDeepseek(cfg, comp)
    with torch.no_grad():  # larger Engram values than the init, so its effect is well above bf16 noise
        for i in range(4):
            tm.layers[1].engram.key_projs[i].bias.normal_(std=0.5)
        tm.layers[1].engram.value_proj.bias.normal_(std=0.5)
    tm.eval()
    return tm, Model(cfg, train_tiny.export_tensors(tm), "fp8", comp)


def test_engram_block():
    tm, m = engram_test_model()
    g = torch.Generator().manual_seed(11)
    ids = [0] + torch.randint(4, 2048, (20,), generator=g).tolist()
    r = nx.bf16(torch.randn(len(ids), 4, 256, generator=g) * 0.01)
    out = m.engram(1, r, ids)
    t = 9
    # a later token: nothing before it changes
    other = ids[:t] + [(x * 7 + 1) % 2048 for x in ids[t:]]
    out2 = m.engram(1, r, other)
    check("engram block is causal: changing tokens >= t leaves positions < t bit-identical",
          torch.equal(out[:t], out2[:t]) and not torch.equal(out[t:], out2[t:]))
    # one hidden state at t: the gate changes there, the dilated conv carries it to t+3, t+6, t+9 only
    r2 = r.clone()
    r2[t] = nx.bf16(r2[t] * 3 + 0.05)
    diff = (m.engram(1, r2, ids) - out).abs().amax(dim=(1, 2))
    changed = [p for p in range(len(ids)) if diff[p] > 0]
    check("short conv: kernel 4, dilation 3 (a change at t reaches t, t+3, t+6, t+9 only)",
          changed == [t, t + 3, t + 6, t + 9], f"changed positions {changed}")
    with torch.no_grad():
        rows = tm.engram_rows(torch.tensor([ids]), 1)
        want = tm.layers[1].engram(r[None], rows)[0]
    rel = float((out - want).norm() / (want - r).norm())
    check("engram block == the training code's fp32 Engram (F.conv1d) within bf16 noise",
          torch.equal(rows[0], m.engram_rows(1, ids)) and rel < 1e-2, f"rel {rel:.2e} of the Engram delta")

    c = m.cfg
    x, post, comb = m.mhc_pre(r, "model.layers.2.ffn_hc")
    y = nx.bf16(torch.randn(len(ids), 256, generator=g))
    with torch.no_grad():
        hc = tm.layers[2].ffn_hc
        tx, tp, tcomb = hc.pre(r[None], c)
        ty = hc.post(y[None], r[None], tp, tcomb)[0]
        th = tm.hc_head.head(r[None], c)[0]
    rel_x = float((x - tx[0]).norm() / tx.norm())
    rel_y = float((m.mhc_post(y, r, post, comb) - ty).norm() / ty.norm())
    rel_h = float((m.mhc_head(r) - th).norm() / th.norm())
    check("mhc pre / post / head == the training code's fp32 forms within bf16 noise",
          max(rel_x, rel_y, rel_h) < 5e-3, f"rel x {rel_x:.1e}, R' {rel_y:.1e}, head {rel_h:.1e}")

    tensors = dict(m.t)
    tensors["model.layers.1.engram.multipliers"] = ("I64", torch.tensor([3, 5, 7]))
    m2 = Model(c, tensors, "fp8", m.compression)
    tensors["model.layers.1.engram.multipliers"] = ("I64", torch.tensor([3, 4, 7]))
    try:
        Model(c, tensors, "fp8", m.compression)
        err = ""
    except ValueError as e:
        err = str(e)
    check("checkpoint multipliers replace the derived ones; an even one is an error",
          m2.engram_hash[1][0] == [3, 5, 7] and "odd" in err, err[:80])


def test_engram_model(model_dir):
    """A trained Engram/mHC checkpoint: the reference's fp8 forward against the training code's fp32
    forward of the same exported weights (F.conv1d, einsum mHC), and what the ablations change."""
    import train_tiny
    m = Model.load(model_dir)
    tok = Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))
    tm = train_tiny.TinyDeepseek(m.cfg, m.compression)
    train_tiny.load_exported(tm, model_dir)
    tm.eval()
    ids = tok.encode("Redistribution and use in source and binary forms, with or without modification, are", add_bos=True)
    logits, _ = m.forward(ids)
    with torch.no_grad():
        want = tm(torch.tensor([ids]))[0]
    rel = float((logits - want).norm() / want.norm())
    top2 = torch.topk(want, 2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    agree = bool((logits.argmax(-1) == want.argmax(-1))[clear].all())
    check("engram/mHC forward == the training code's fp32 forward within fp8 noise", rel < 0.1 and agree,
          f"rel {rel:.3f}, argmax agrees at all {int(clear.sum())} of {len(clear)} positions with margin > 0.5")
    m.identity_comb = True
    no_comb, _ = m.forward(ids)
    m.identity_comb = False
    check("identity comb changes the logits by far more than fp8 noise",
          float((no_comb - logits).norm() / logits.norm()) > 2 * rel, f"rel {float((no_comb - logits).norm() / logits.norm()):.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "..", "models", "tiny"))
    ap.add_argument("--mtp-model", help="a checkpoint with an MTP module (models/tiny-mtp): MTP checks")
    ap.add_argument("--engram-model", help="a checkpoint with Engram and mHC (models/tiny-engram): end-to-end checks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    test_fp8()
    test_safetensors()
    test_rope_router()
    test_tokenizer(args.model)
    test_engram_config()
    test_sinkhorn()
    test_compression()
    test_engram_hash()
    test_engram_block()
    if os.path.exists(os.path.join(args.model, "model.safetensors")):
        test_attention_forms(args.model)
    if args.mtp_model:
        test_mtp(args.mtp_model)
    if args.engram_model:
        test_engram_model(args.engram_model)
    print(f"test_reference: {len(FAILURES)} failed" + (f": {', '.join(FAILURES)}" if FAILURES else ""))
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
