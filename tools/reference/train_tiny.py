"""Trains the tiny DeepSeek-V3-architecture model on the corpus (corpus.py) and exports it in the
official HF checkpoint layout: FP8 e4m3 linear weights with 128x128 block scales, BF16 embeddings,
lm_head, norms and router weight, F32 router bias.

Training is plain fp32 PyTorch (naive MLA, a differentiable MoE). Routing follows noaux_tc; the
router bias is learned the DeepSeek-V3 way (aux-loss-free: after each step the bias of an
overloaded expert moves down by gamma, an underloaded one up), and a hinge loss keeps the
top-k/top-(k+1) and group selection margins apart so the exported model routes decisively.

    /usr/bin/python3 tools/reference/train_tiny.py --out models/tiny [--steps 500]
    /usr/bin/python3 tools/reference/train_tiny.py --init-from models/tiny --out models/tiny --qat ...
(run train_tokenizer.py first: it writes models/tiny/tokenizer.json. models/tiny/README.md has the
exact commands that made the committed checkpoint: a plain phase, then a quantization-aware
fine-tune (--qat: the forward sees the exported FP8/BF16 weights through a straight-through
estimator) with a strong margin hinge, so the exported model's routing margins are real.)

--arch tiny-engram trains models/tiny-engram: the same backbone with mHC (hc_mult 4: residual
branches mixed by pre/post/comb, comb by Sinkhorn) and an Engram block before block 1 (hashed
n-gram table lookups, per-branch gate, causal dilated short conv), exported with F32 mHC tensors
and BF16 Engram tensors (models/tiny-engram/README.md has its commands; --steps 0 exports the
random init, tools/reference/make_untrained_engram.sh).
"""

import argparse
import json
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: spinning OpenMP threads crawl on a shared machine

import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bpe import BOS, EOS, Tokenizer  # noqa: E402
from corpus import CORPUS_DIR, CORPUS_PACKAGE, MODEL_TRAIN_FILES, corpus_documents  # noqa: E402
from model import (Config, compression_table, engram_hash_params, engram_indices, mhc_coefficients,  # noqa: E402
                   rope_inv_freq, softmax_scale)
from numerics import quantize_weight  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

TINY_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "first_k_dense_replace": 2,
    "moe_layer_freq": 1,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 128,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_interleave": True,
    "max_position_embeddings": 4096,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "ep_size": 1,
    "aux_loss_alpha": 0.0,
    "seq_aux": True,
    "pretraining_tp": 1,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                            "activation_scheme": "dynamic"},
}

# models/tiny-engram: models/tiny plus mHC (4 residual branches) and an Engram block before block 1
# (tables of ~1 k rows per hash head: 8 heads x 32 values, 0.5 MB in BF16).
ENGRAM_CONFIG = dict(TINY_CONFIG, hc_mult=4, hc_sinkhorn_repeat=10, hc_eps=1e-6, hc_post_mult=2.0,
                     engram={"layer_ids": [1], "max_ngram_size": 3, "n_head_per_ngram": 4, "n_embed_per_ngram": 128,
                             "engram_vocab_size": [1024, 1024], "kernel_size": 4, "pad_id": 2, "seed": 0})
ARCHS = {"tiny": TINY_CONFIG, "tiny-engram": ENGRAM_CONFIG}

# mHC initialisation (models/tiny-engram/README.md): small fn, unit scales, and bases that make the
# block start as a plain residual per branch: pre = sigmoid(-ln 3) = 1/4 (x = the branch mean),
# post = 2 sigmoid(0) = 1, comb = Sinkhorn of a diagonal bias (about 0.71 on the diagonal), head
# weights 1/4.
HC_FN_STD = 1e-3
HC_COMB_DIAG = 2.0
ENGRAM_CONV_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


QAT = {"on": False}  # quantization-aware fine-tuning: train through the exported weight rounding


def fake_quant(w, fn):
    """Straight-through estimator: the forward sees fn(w), the gradient flows to w."""
    if not QAT["on"]:
        return w
    return w + (fn(w.detach()) - w).detach()


class Fp8Linear(nn.Linear):
    """nn.Linear whose forward (under --qat) uses the 128x128 block FP8 weight that export writes."""

    def forward(self, x):
        return F.linear(x, fake_quant(self.weight, lambda w: quantize_weight(w).dequant_fp32()))


def lin(i, o):
    return Fp8Linear(i, o, bias=False)


class Bf16Linear(nn.Linear):
    """nn.Linear with a bias whose forward (under --qat) uses the BF16 weight and bias export writes."""

    def forward(self, x):
        rnd = lambda w: w.to(torch.bfloat16).float()  # noqa: E731
        return F.linear(x, fake_quant(self.weight, rnd), fake_quant(self.bias, rnd))


class HyperConnection(nn.Module):
    """mHC coefficients of one sub-layer (n_out = hc(hc+2), 3 scales) or of the head (hc, 1)."""

    def __init__(self, hc, d, n_out, n_scale):
        super().__init__()
        self.hc = hc
        self.fn = nn.Parameter(torch.zeros(n_out, hc * d))
        self.scale = nn.Parameter(torch.ones(n_scale))
        base = torch.zeros(n_out)
        base[:hc] = -math.log(hc - 1)  # pre (or head) weights sigmoid(b) = 1/hc
        if n_out > hc:
            base[2 * hc:] = (torch.eye(hc) * HC_COMB_DIAG).flatten()
        self.base = nn.Parameter(base)

    def mixes(self, r, eps):
        flat = r.flatten(-2)  # [B, T, hc d]
        return (flat @ self.fn.t()) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)

    def pre(self, r, c):
        """r [B, T, hc, d] -> x [B, T, d], post [B, T, hc], comb [B, T, hc, hc]."""
        pre, post, comb = mhc_coefficients(self.mixes(r, c.hc_eps), self.scale, self.base, self.hc, c.hc_eps,
                                           c.hc_post_mult, c.hc_sinkhorn_repeat)
        return torch.einsum("btm,btmd->btd", pre, r), post, comb

    @staticmethod
    def post(y, r, post, comb):
        return post[..., None] * y[:, :, None] + torch.einsum("btmj,btmd->btjd", comb, r)

    def head(self, r, c):
        w = torch.sigmoid(self.mixes(r, c.hc_eps) * self.scale[0] + self.base) + c.hc_eps
        return torch.einsum("btm,btmd->btd", w, r)


class Engram(nn.Module):
    """The Engram block (NUMERICS.md "Engram") on the hc branches, given the hashed table rows."""

    def __init__(self, c, rows):
        super().__init__()
        e, d, hc = c.engram, c.hidden_size, c.hc_mult
        self.c = c
        self.embedding = nn.Embedding(rows, e.head_dim)
        self.value_proj = Bf16Linear(e.embed_dim, d)
        self.key_projs = nn.ModuleList(Bf16Linear(e.embed_dim, d) for _ in range(hc))
        self.norm1 = nn.ModuleList(RMSNorm(d, c.rms_norm_eps) for _ in range(hc))
        self.norm2 = nn.ModuleList(RMSNorm(d, c.rms_norm_eps) for _ in range(hc))
        self.short_conv = nn.Module()
        self.short_conv.norms = nn.ModuleList(RMSNorm(d, 1e-5) for _ in range(hc))
        self.short_conv.conv = nn.Conv1d(hc * d, hc * d, e.kernel_size, groups=hc * d, bias=False,
                                         dilation=e.dilation)

    def forward(self, r, rows):
        """r [B, T, hc, d], rows [B, T, H] -> r + u + SiLU(conv(norm(u))), u = gate * value."""
        b, t, hc, d = r.shape
        e = self.c.engram
        emb = self.embedding(rows).flatten(-2)  # [B, T, E]
        v = self.value_proj(emb)
        u = []
        for i in range(hc):
            dot = (self.norm1[i](self.key_projs[i](emb)) * self.norm2[i](r[:, :, i])).sum(-1) / math.sqrt(d)
            g = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp(min=1e-6)))
            u.append(g[..., None] * v)
        u = torch.stack(u, 2)  # [B, T, hc, d]
        n = torch.cat([self.short_conv.norms[i](u[:, :, i]) for i in range(hc)], -1).transpose(1, 2)
        n = F.pad(n, ((e.kernel_size - 1) * e.dilation, 0))  # causal: zeros before the sequence start
        s = F.silu(self.short_conv.conv(n)).transpose(1, 2).reshape(b, t, hc, d)
        return r + u + s


def rope(x, cos, sin):
    """Interleaved pairs; x [B, T, ..., d], cos/sin [T, d/2] broadcast."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        h, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.q_a_proj = lin(c.hidden_size, c.q_lora_rank)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = lin(c.q_lora_rank, h * (dn + dr))
        self.kv_a_proj_with_mqa = lin(c.hidden_size, c.kv_lora_rank + dr)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = lin(c.kv_lora_rank, h * (dn + dv))
        self.o_proj = lin(h * dv, c.hidden_size)

    def _kv(self, x, cos, sin):
        """-> k_nope [B, T, H, dn], v [B, T, H, dv], k_pe [B, T, dr] (one rope head shared by all)."""
        c = self.c
        b, t, _ = x.shape
        h, dn, dv = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim
        kv = self.kv_a_proj_with_mqa(x)
        c_n = self.kv_a_layernorm(kv[..., : c.kv_lora_rank])
        k_pe = rope(kv[..., c.kv_lora_rank :], cos, sin)
        kvb = self.kv_b_proj(c_n).view(b, t, h, dn + dv)
        return kvb[..., :dn], kvb[..., dn:], k_pe

    def forward(self, x, cos, sin, ctx=None):
        """Causal MLA over x [B, T, D]. With ctx [B, T, D] (an MTP chain step, NUMERICS.md), query t
        attends to ctx's keys/values at positions < t and to its own (x's) at t."""
        c = self.c
        b, t, _ = x.shape
        h, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, h, dn + dr)
        q_nope, q_pe = q[..., :dn], rope(q[..., dn:], cos[:, None], sin[:, None])
        k_nope, v, k_pe = self._kv(x, cos, sin)
        if ctx is None:
            scores = torch.einsum("bqhd,bkhd->bhqk", q_nope, k_nope) + torch.einsum("bqhd,bkd->bhqk", q_pe, k_pe)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            probs = (scores * softmax_scale(c)).masked_fill(mask, float("-inf")).softmax(-1)
            o = torch.einsum("bhqk,bkhd->bqhd", probs, v)
        else:
            ck_nope, cv, ck_pe = self._kv(ctx, cos, sin)
            s_ctx = torch.einsum("bqhd,bkhd->bhqk", q_nope, ck_nope) + torch.einsum("bqhd,bkd->bhqk", q_pe, ck_pe)
            s_ctx = s_ctx.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(0), float("-inf"))
            s_self = ((q_nope * k_nope).sum(-1) + (q_pe * k_pe[:, :, None]).sum(-1)).permute(0, 2, 1)  # [B, H, T]
            probs = (torch.cat([s_ctx, s_self[..., None]], -1) * softmax_scale(c)).softmax(-1)
            o = torch.einsum("bhqk,bkhd->bqhd", probs[..., :t], cv) + probs[..., t].permute(0, 2, 1)[..., None] * v
        return self.o_proj(o.reshape(b, t, h * dv))


class MLP(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = lin(d, inter), lin(d, inter), lin(inter, d)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.randn(c.n_routed_experts, c.hidden_size) * 0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(c.n_routed_experts))
        self.margin = 0.05  # hinge target for the selection gaps (train_tiny --hinge-margin)

    def forward(self, x):
        """x [N, D] -> idx [N, K], weights [N, K], per-expert load [E], margin hinge loss."""
        c = self.c
        scores = torch.sigmoid(x @ fake_quant(self.weight, lambda w: w.to(torch.bfloat16).float()).t())
        biased = scores + self.e_score_correction_bias
        n, e = biased.shape
        per = e // c.n_group
        gs = biased.view(n, c.n_group, per).topk(2, dim=-1).values.sum(-1)  # [N, G]
        g_sorted, g_idx = gs.sort(dim=-1, descending=True)
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, g_idx[:, : c.topk_group], True)
        masked = biased.masked_fill(~keep.repeat_interleave(per, 1), float("-inf"))
        srt, order = masked.sort(dim=-1, descending=True)
        k = c.num_experts_per_tok
        idx = order[:, :k]
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * c.routed_scaling_factor
        # margins that decide the selection: k-th vs (k+1)-th expert, topk_group-th vs next group
        m_exp = srt[:, k - 1] - srt[:, k]
        m_grp = g_sorted[:, c.topk_group - 1] - g_sorted[:, c.topk_group]
        hinge = F.relu(self.margin - m_exp).mean() + F.relu(self.margin - m_grp).mean()
        load = torch.bincount(idx.flatten(), minlength=e).float()
        return idx, w, load, hinge


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = Gate(c)
        self.experts = nn.ModuleList(MLP(c.hidden_size, c.moe_intermediate_size) for _ in range(c.n_routed_experts))
        self.shared_experts = MLP(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts)
        self.last_load = None
        self.last_hinge = torch.zeros(())

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w, load, hinge = self.gate(x)
        self.last_load, self.last_hinge = load, hinge
        y = torch.zeros_like(x)
        for e in range(self.c.n_routed_experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                y = y.index_add(0, tok, self.experts[e](x[tok]) * w[tok, slot, None])
        return (y + self.shared_experts(x)).view(shape)


class Layer(nn.Module):
    def __init__(self, c, i, engram_rows=0):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c) if c.is_moe_layer(i) else MLP(c.hidden_size, c.intermediate_size)
        if engram_rows:
            self.engram = Engram(c, engram_rows)
        if c.hc_mult > 1:
            n = c.hc_mult * (c.hc_mult + 2)
            self.attn_hc = HyperConnection(c.hc_mult, c.hidden_size, n, 3)
            self.ffn_hc = HyperConnection(c.hc_mult, c.hidden_size, n, 3)

    def forward(self, h, cos, sin, ctx=None):
        ctx = None if ctx is None else self.input_layernorm(ctx)
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_branches(self, r, cos, sin, rows):
        """The block on the residual branches r [B, T, hc, d] (Engram first when it has one)."""
        if hasattr(self, "engram"):
            r = self.engram(r, rows)
        if self.c.hc_mult == 1:
            return self.forward(r[:, :, 0], cos, sin)[:, :, None]
        x, post, comb = self.attn_hc.pre(r, self.c)
        r = HyperConnection.post(self.self_attn(self.input_layernorm(x), cos, sin), r, post, comb)
        x, post, comb = self.ffn_hc.pre(r, self.c)
        return HyperConnection.post(self.mlp(self.post_attention_layernorm(x)), r, post, comb)


class TinyDeepseek(nn.Module):
    def __init__(self, c, compression=None):
        """compression: (raw -> canonical ids, V') of the tokenizer; needed with Engram."""
        super().__init__()
        self.c = c
        self.engram_hash = engram_hash_params(c.engram, compression[1]) if c.engram else {}
        if c.engram:
            self.register_buffer("canonical", torch.tensor(compression[0], dtype=torch.long), persistent=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c, i, sum(self.engram_hash[i][1]) if i in self.engram_hash else 0)
                                    for i in range(c.num_hidden_layers))
        if c.hc_mult > 1:
            self.hc_head = HyperConnection(c.hc_mult, c.hidden_size, c.hc_mult, 1)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)  # exported BF16, not FP8
        for name, p in self.named_parameters():
            if name.endswith(".fn"):
                nn.init.normal_(p, std=HC_FN_STD)
            elif name.endswith("short_conv.conv.weight"):
                nn.init.normal_(p, std=ENGRAM_CONV_STD)
            elif ".engram." in name and name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, std=std)
        self.register_buffer("inv_freq", rope_inv_freq(c))

    def engram_rows(self, ids, layer):
        """[B, T, H] table rows of Engram block `layer` for raw ids [B, T] (model.engram_indices)."""
        e = self.c.engram
        mult, sizes = self.engram_hash[layer]
        pad = int(self.canonical[e.pad_id])
        return engram_indices(self.canonical[ids], pad, mult, sizes, e.n_head_per_ngram)

    def forward(self, ids):
        t = ids.shape[1]
        ang = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None]
        cos, sin = ang.cos(), ang.sin()
        h = self.embed_tokens(ids)
        if self.c.hc_mult == 1 and not self.c.engram:
            for layer in self.layers:
                h = layer(h, cos, sin)
            return self.lm_head(self.norm(h))
        r = h[:, :, None].expand(-1, -1, self.c.hc_mult, -1)  # hc copies of the embedding
        for i, layer in enumerate(self.layers):
            rows = self.engram_rows(ids, i) if i in self.engram_hash else None
            r = layer.forward_branches(r, cos, sin, rows)
        h = self.hc_head.head(r, self.c) if self.c.hc_mult > 1 else r[:, :, 0]
        return self.lm_head(self.norm(h))

    def moe_layers(self):
        return [l.mlp for l in self.layers if isinstance(l.mlp, MoE)]


NOT_EXPORTED = ("inv_freq", "canonical")  # buffers derived from the config and the tokenizer


def export_tensors(model):
    """The model's parameters as checkpoint tensors in the official layout: name -> (dtype, tensor)."""
    bf = torch.bfloat16
    tensors = {}
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if name in NOT_EXPORTED:
            continue
        p = p.detach().float()
        hf = name if name == "lm_head.weight" else "model." + name
        if name.endswith("e_score_correction_bias") or "_hc." in name or name.startswith("hc_head."):
            tensors[hf] = ("F32", p)  # router bias, mHC fn / scale / base
        elif ".engram." in name:
            tensors[hf] = ("BF16", p.to(bf))  # Engram table, projections, norms, conv: BF16 (no FP8)
        elif "norm" in name or name in ("embed_tokens.weight", "lm_head.weight") or name.endswith("mlp.gate.weight"):
            tensors[hf] = ("BF16", p.to(bf))
        else:
            q = quantize_weight(p)
            tensors[hf] = ("F8_E4M3", q.codes)
            tensors[hf + "_scale_inv"] = ("F32", q.scale_inv)
    return tensors


def write_checkpoint(tensors, cfg_raw, out_dir):
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_raw, f, indent=2)
        f.write("\n")


def export(model, cfg_raw, out_dir):
    """Writes config.json and model.safetensors in the official layout."""
    tensors = export_tensors(model)
    write_checkpoint(tensors, cfg_raw, out_dir)
    return tensors


def load_exported(model, folder, optional=()):
    """Initialises the training model from an exported checkpoint (FP8 weights dequantized q*S).
    Parameters whose names start with a prefix in `optional` may be absent (they keep their init)."""
    from numerics import Fp8Weight
    from safetensors_io import read_safetensors
    t, _ = read_safetensors(os.path.join(folder, "model.safetensors"))
    state = {}
    for name in list(dict(model.named_parameters())) + [n for n, _ in model.named_buffers() if n not in NOT_EXPORTED]:
        hf = name if name == "lm_head.weight" else "model." + name
        if hf not in t and name.startswith(tuple(optional)):
            continue
        dtype, v = t[hf]
        state[name] = Fp8Weight(v, t[hf + "_scale_inv"][1]).dequant_fp32() if dtype == "F8_E4M3" else v.float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m not in NOT_EXPORTED and not m.startswith(tuple(optional))]:
        sys.exit(f"train_tiny: --init-from {folder}: missing {missing}, unexpected {unexpected}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="tiny", choices=sorted(ARCHS),
                    help="tiny (models/tiny) or tiny-engram (models/tiny plus mHC and Engram)")
    ap.add_argument("--tokenizer-from", help="copy tokenizer.json and tokenizer_config.json from this folder to --out")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3, help="router bias update speed (DeepSeek-V3: 0.001)")
    ap.add_argument("--hinge-weight", type=float, default=0.1, help="weight of the router margin hinge loss")
    ap.add_argument("--hinge-margin", type=float, default=0.05, help="target selection gap of the hinge")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--hinge-trains-bias", action="store_true",
                    help="the margin hinge also trains the router bias (a tie between two saturated sigmoid "
                         "scores has no gradient through the scores; models/tiny-engram/README.md)")
    ap.add_argument("--init-from", help="start from an exported checkpoint folder (fine-tuning)")
    ap.add_argument("--qat", action="store_true", help="train through the FP8/BF16 rounding of the export")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    cfg_raw = ARCHS[args.arch]
    cfg = Config(cfg_raw)
    if args.tokenizer_from:
        os.makedirs(args.out, exist_ok=True)
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(args.tokenizer_from, fn), os.path.join(args.out, fn))
    tok = Tokenizer.load(os.path.join(args.out, "tokenizer.json"))
    stream = []
    for _, text in corpus_documents(MODEL_TRAIN_FILES):
        stream += tok.encode(text) + [tok.added[EOS]]
    stream = torch.tensor(stream, dtype=torch.long)
    bos = tok.added[BOS]
    print(f"train_tiny: corpus {len(stream)} tokens: {', '.join(MODEL_TRAIN_FILES)} from {CORPUS_DIR} ({CORPUS_PACKAGE})")

    model = TinyDeepseek(cfg, compression_table(tok) if cfg.engram else None)
    if args.init_from:
        load_exported(model, args.init_from)
        print(f"train_tiny: initialised from {args.init_from}")
    for m in model.moe_layers():
        m.gate.margin = args.hinge_margin
        if args.hinge_trains_bias:  # the buffer becomes a parameter of the same name (same export)
            bias = nn.Parameter(m.gate.e_score_correction_bias.clone())
            del m.gate._buffers["e_score_correction_bias"]
            m.gate.e_score_correction_bias = bias
    QAT["on"] = args.qat
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train_tiny: {n_params / 1e6:.2f} M parameters, {args.steps} steps of {args.batch}x{args.seq} tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = args.warmup
    t0, c0 = time.time(), time.process_time()
    curve = []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = [rng.randrange(0, len(stream) - args.seq) for _ in range(args.batch)]
        win = torch.stack([stream[s : s + args.seq] for s in starts])  # [B, seq]
        ids = torch.cat([torch.full((args.batch, 1), bos), win[:, :-1]], dim=1)  # every window starts with BOS
        logits = model(ids)
        lm_loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), win.reshape(-1))
        hinge = sum(m.last_hinge for m in model.moe_layers())
        loss = lm_loss + args.hinge_weight * hinge
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free load balancing (DeepSeek-V3 §2.1.2)
            for m in model.moe_layers():
                load = m.last_load
                m.gate.e_score_correction_bias += args.bias_gamma * torch.sign(load.mean() - load)
        curve.append(lm_loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            loads = [m.last_load for m in model.moe_layers()]
            imb = max((l.max() / l.mean()).item() for l in loads)
            print(f"step {step:4d}  loss {lm_loss.item():.3f}  hinge {hinge.item():.3f}  max/mean load {imb:.2f}  "
                  f"lr {lr:.2e}  {time.time() - t0:.0f}s wall {time.process_time() - c0:.0f}s cpu", flush=True)
    model.eval()
    QAT["on"] = False
    tensors = export(model, cfg_raw, args.out)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    n = max(1, min(20, len(curve)))
    first, last = sum(curve[:n]) / n, sum(curve[-n:]) / n
    print(f"train_tiny: loss {first:.3f} (first 20 steps) -> {last:.3f} (last 20), {time.time() - t0:.0f}s wall, {time.process_time() - c0:.0f}s cpu; "
          f"exported {len(tensors)} tensors, {size / 1e6:.2f} MB")
    biases = [m.gate.e_score_correction_bias for m in model.moe_layers()]
    print("train_tiny: router bias |max| per MoE layer:", [round(b.abs().max().item(), 4) for b in biases])


if __name__ == "__main__":
    main()
