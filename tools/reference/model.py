"""The DeepSeek-V3 forward pass, written from the architecture, following docs/numerics.md.

This is the spec the C++ engine is checked against: read it with NUMERICS.md beside it.
It reads a HuggingFace checkpoint folder (config.json + model.safetensors or a sharded index)
and runs whole sequences from position 0 (prefill; greedy decoding recomputes the full sequence).

    model = Model.load("models/tiny")
    logits, trace = model.forward([0, 17, 42])   # logits [T, V] fp32; trace: routing per MoE layer

A checkpoint with an MTP module (num_nextn_predict_layers 1) also drafts: Model.mtp (one module
over a sequence), mtp_chain (k drafts) and speculative_greedy (greedy self-speculative decoding).
"""

import json
import math
import os

import torch

from numerics import Fp8Weight, bf16, bf16_linear, dot_f32, fp8_linear, quantize_weight
from safetensors_io import read_safetensors


class ConfigError(ValueError):
    pass


class Config:
    """The config.json fields the architecture uses (HF names), checked on load."""

    def __init__(self, raw):
        def need(key, kind=int):
            if key not in raw or raw[key] is None:
                raise ConfigError(f"config.json: missing field '{key}'")
            return kind(raw[key])

        self.vocab_size = need("vocab_size")
        self.hidden_size = need("hidden_size")
        self.intermediate_size = need("intermediate_size")
        self.moe_intermediate_size = need("moe_intermediate_size")
        self.num_hidden_layers = need("num_hidden_layers")
        self.num_attention_heads = need("num_attention_heads")
        self.first_k_dense_replace = need("first_k_dense_replace")
        self.moe_layer_freq = int(raw.get("moe_layer_freq", 1))
        self.n_routed_experts = need("n_routed_experts")
        self.n_shared_experts = int(raw.get("n_shared_experts") or 0)
        self.num_experts_per_tok = need("num_experts_per_tok")
        self.n_group = need("n_group")
        self.topk_group = need("topk_group")
        self.topk_method = need("topk_method", str)
        self.scoring_func = need("scoring_func", str)
        self.norm_topk_prob = bool(raw.get("norm_topk_prob", True))
        self.routed_scaling_factor = need("routed_scaling_factor", float)
        self.q_lora_rank = raw.get("q_lora_rank") or 0
        self.kv_lora_rank = need("kv_lora_rank")
        self.qk_nope_head_dim = need("qk_nope_head_dim")
        self.qk_rope_head_dim = need("qk_rope_head_dim")
        self.v_head_dim = need("v_head_dim")
        self.rms_norm_eps = need("rms_norm_eps", float)
        self.rope_theta = need("rope_theta", float)
        self.rope_scaling = raw.get("rope_scaling")
        self.hidden_act = raw.get("hidden_act", "silu")
        self.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))
        self.num_nextn_predict_layers = int(raw.get("num_nextn_predict_layers") or 0)
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.topk_method != "noaux_tc" or self.scoring_func != "sigmoid":
            raise ConfigError(f"config.json: this reference runs topk_method noaux_tc with sigmoid scoring "
                              f"(got {self.topk_method}/{self.scoring_func})")
        if self.n_routed_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ConfigError("config.json: n_routed_experts must split evenly into n_group groups and "
                              "0 < topk_group <= n_group")
        if self.hidden_act != "silu":
            raise ConfigError(f"config.json: hidden_act '{self.hidden_act}' is not silu")
        if self.qk_rope_head_dim % 2:
            raise ConfigError("config.json: qk_rope_head_dim must be even")

    def is_moe_layer(self, i):
        # HF remote-code / vLLM rule.
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0


# ---- RoPE with YaRN ----

def yarn_get_mscale(factor, mscale):
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def rope_inv_freq(cfg):
    """[d/2] fp32: f_i = theta^(-2i/d) (computed in float64, rounded to fp32), blended under YaRN as
    the official precompute_freqs_cis does: f*(1-ramp) ... written as f/factor*(1-keep) + f*keep
    with keep = 1 - ramp, in fp32."""
    d = cfg.qk_rope_head_dim
    f = torch.tensor([cfg.rope_theta ** (-(2.0 * i) / d) for i in range(d // 2)], dtype=torch.float64)
    f = f.to(torch.float32)
    rs = cfg.rope_scaling
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        factor = float(rs["factor"])
        l0 = float(rs["original_max_position_embeddings"])
        beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))

        def corr_dim(n):
            return d * math.log(l0 / (n * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        lo = max(math.floor(corr_dim(beta_fast)), 0)
        hi = min(math.ceil(corr_dim(beta_slow)), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
        keep = 1 - ramp
        f = f / factor * (1 - keep) + f * keep
    return f


def rope_attention_factor(cfg):
    rs = cfg.rope_scaling
    if not rs or rs.get("type", rs.get("rope_type")) != "yarn":
        return 1.0
    factor = float(rs["factor"])
    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    if m is not None and m_all is not None:
        return yarn_get_mscale(factor, m) / yarn_get_mscale(factor, m_all)
    return yarn_get_mscale(factor, 1.0)


def softmax_scale(cfg):
    """qk_head_dim^-0.5 * m^2, m = yarn mscale(factor, mscale_all_dim) (never 576^-0.5)."""
    s = cfg.qk_head_dim ** -0.5
    rs = cfg.rope_scaling
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        m = yarn_get_mscale(float(rs["factor"]), float(rs.get("mscale_all_dim") or 0.0))
        s = s * m * m
    return s


def apply_rope(x, positions, inv_freq, attn_factor):
    """x [T, ..., d] bf16 values; interleaved pairs (x[2i], x[2i+1]) rotated by phi = p*f_i (fp32
    multiply, fp32 cos/sin), rotation in fp32, rounded once to bf16."""
    t, d = x.shape[0], x.shape[-1]
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2] fp32
    cos, sin = torch.cos(ang) * attn_factor, torch.sin(ang) * attn_factor
    shape = [t] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xe * sin + xo * cos
    return bf16(out)


# ---- ops ----

def rms_norm(x, w, eps):
    """x [T, C] bf16 values, w [C] bf16 values: bf16(x * rsqrt(mean(x^2) + eps) * w), computed in
    float64, one rounding (docs/numerics.md §4; not the official double rounding)."""
    xd = x.double()
    r = torch.rsqrt((xd * xd).mean(dim=-1, keepdim=True) + eps)
    return bf16(xd * r * w.double())


def swiglu(g, u):
    """bf16(silu(g) * u), silu(g) = g * sigmoid(g), in float64, one rounding."""
    gd = g.double()
    return bf16(gd * torch.sigmoid(gd) * u.double())


class Model:
    """Weights of one checkpoint plus the forward pass. mode: "fp8" (docs/numerics.md §3 default:
    activations quantized 1x128, block-scaled fp8 GEMM) or "bf16" (weights dequantized to bf16 once)."""

    def __init__(self, cfg, tensors, mode="fp8"):
        if mode not in ("fp8", "bf16"):
            raise ValueError(f"mode must be fp8 or bf16, got {mode}")
        self.cfg, self.mode = cfg, mode
        self.t = tensors  # name -> (dtype, tensor)
        self.inv_freq = rope_inv_freq(cfg)
        self.attn_factor = rope_attention_factor(cfg)
        self.scale = softmax_scale(cfg)
        self._linears = {}
        self._dense = {}

    @staticmethod
    def load(folder, mode="fp8"):
        with open(os.path.join(folder, "config.json")) as f:
            cfg = Config(json.load(f))
        tensors = {}
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            t, _ = read_safetensors(os.path.join(folder, fn))
            tensors.update(t)
        return Model(cfg, tensors, mode)

    # -- weight access --
    def _get(self, name):
        if name not in self.t:
            raise KeyError(f"checkpoint has no tensor '{name}'")
        return self.t[name]

    def vec(self, name):
        """A BF16/F32 tensor as fp32 values (norm weights, embeddings, router)."""
        dtype, t = self._get(name)
        if dtype not in ("BF16", "F32"):
            raise ValueError(f"tensor {name} is {dtype}, expected BF16 or F32")
        return t.to(torch.float32)

    def linear(self, prefix, x):
        """y = x W^T for the weight `prefix`.weight, in this model's mode. x [M, K] bf16 values."""
        w = self._linears.get(prefix)
        if w is None:
            dtype, t = self._get(prefix + ".weight")
            if dtype == "F8_E4M3":
                w = Fp8Weight(t, self._get(prefix + ".weight_scale_inv")[1])
            elif self.mode == "fp8":
                w = quantize_weight(t.to(torch.float32))  # a BF16 checkpoint, quantized at load
            else:
                w = t.to(torch.float32)
            if self.mode == "bf16" and isinstance(w, Fp8Weight):
                w = w.dequant_bf16()
            self._linears[prefix] = w
        if isinstance(w, Fp8Weight):
            return fp8_linear(x, w)
        return bf16_linear(x, w)

    def dense_weight(self, prefix):
        """A linear weight as bf16 values (fp8: the official weight_dequant, bf16(q * S))."""
        w = self._dense.get(prefix)
        if w is None:
            dtype, t = self._get(prefix + ".weight")
            if dtype == "F8_E4M3":
                w = Fp8Weight(t, self._get(prefix + ".weight_scale_inv")[1]).dequant_bf16()
            else:
                w = bf16(t.to(torch.float32))
            self._dense[prefix] = w
        return w

    # -- blocks --
    def attention(self, i, x, positions):
        """MLA. x [T, D] bf16 -> [T, D] bf16."""
        o = self.mla_heads(i, x, positions)  # [T, H*dv] bf16
        return self.linear(f"model.layers.{i}.self_attn.o_proj", o)

    def mla_heads(self, i, x, positions):
        """MLA up to o_proj, absorbed form (what FlashMLA computes). x [T, D] bf16 -> [T, H*dv] bf16."""
        c = self.cfg
        p = f"model.layers.{i}.self_attn."
        t_len, nh = x.shape[0], c.num_attention_heads
        dn, dr, dv, r = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        if c.q_lora_rank:
            qa = self.linear(p + "q_a_proj", x)  # [T, q_lora]
            qa = rms_norm(qa, self.vec(p + "q_a_layernorm.weight"), c.rms_norm_eps)
            q = self.linear(p + "q_b_proj", qa)  # [T, H*(dn+dr)]
        else:
            q = self.linear(p + "q_proj", x)
        q = q.reshape(t_len, nh, dn + dr)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        q_pe = apply_rope(q_pe, positions, self.inv_freq, self.attn_factor)  # [T, H, dr]

        kv = self.linear(p + "kv_a_proj_with_mqa", x)  # [T, r + dr]
        c_n = rms_norm(kv[:, :r], self.vec(p + "kv_a_layernorm.weight"), c.rms_norm_eps)  # [T, r]
        k_pe = apply_rope(kv[:, r:], positions, self.inv_freq, self.attn_factor)  # [T, dr], one shared head

        wkv_b = self.dense_weight(p + "kv_b_proj").reshape(nh, dn + dv, r)  # bf16 values
        w_uk, w_uv = wkv_b[:, :dn, :], wkv_b[:, dn:, :]  # [H, dn, r], [H, dv, r]
        # q~_h = W_UK,h^T q_nope_h: [T, H, r], fp32 accumulation (float64 here), rounded to bf16
        q_lat = bf16(torch.einsum("thd,hdr->thr", q_nope.double(), w_uk.double()))
        # scores [H, T, T]: one fp32 dot over the latent and the rope channels, then * scale
        s_lat = torch.einsum("thr,sr->hts", q_lat.double(), c_n.double())
        s_pe = torch.einsum("thd,sd->hts", q_pe.double(), k_pe.double())
        scores = (s_lat + s_pe).to(torch.float32) * self.scale
        mask = torch.ones(t_len, t_len, dtype=torch.bool).triu(1)  # key t visible iff t <= p
        scores = scores.masked_fill(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # fp32
        o_lat = bf16(torch.einsum("hts,sr->thr", probs.double(), c_n.double()))  # [T, H, r]
        o = bf16(torch.einsum("thr,hvr->thv", o_lat.double(), w_uv.double()))  # [T, H, dv]
        return o.reshape(t_len, nh * dv)

    def mlp(self, prefix, x):
        """SwiGLU: down(bf16(silu(gate x) * up x)). x [T, D] bf16 -> [T, D] bf16."""
        g = self.linear(prefix + "gate_proj", x)
        u = self.linear(prefix + "up_proj", x)
        return self.linear(prefix + "down_proj", swiglu(g, u))

    def route(self, i, x):
        """noaux_tc router. x [T, D] bf16 -> (idx [T, K] in slot order, weights [T, K] fp32,
        margin [T] fp32: the smallest selection margin of each token, see router_margin)."""
        c = self.cfg
        p = f"model.layers.{i}.mlp.gate."
        logits = dot_f32(x, self.vec(p + "weight"))  # [T, E] fp32
        scores = torch.sigmoid(logits)
        biased = scores + self.vec(p + "e_score_correction_bias")[None, :]  # selection only
        t_len, e = biased.shape
        per = e // c.n_group
        grouped = biased.reshape(t_len, c.n_group, per)
        top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2]
        group_scores = top2[..., 0] + top2[..., 1]  # [T, G] fp32
        g_order = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices  # ties -> lower id
        keep = torch.zeros(t_len, c.n_group, dtype=torch.bool)
        keep.scatter_(1, g_order[:, : c.topk_group], True)
        masked = biased.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
        order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
        idx = order[:, : c.num_experts_per_tok]  # slot order: biased score descending, ties -> lower id
        w = torch.gather(scores, 1, idx)
        if c.norm_topk_prob:
            denom = torch.zeros(t_len, dtype=torch.float32)
            for k in range(idx.shape[1]):
                denom = denom + w[:, k]
            w = w / denom[:, None]
        w = w * torch.tensor(c.routed_scaling_factor, dtype=torch.float32)
        margin = router_margin(biased, group_scores, keep, idx, c.topk_group)
        return idx, w, margin

    def moe(self, i, x):
        """Routed experts + shared expert. x [T, D] bf16 -> ([T, D] bf16, routing trace)."""
        c = self.cfg
        p = f"model.layers.{i}.mlp."
        idx, w, margin = self.route(i, x)
        acc = torch.zeros_like(x)  # fp32 combine accumulator
        for k in range(idx.shape[1]):  # top-k slot order, one fp32 multiply and add per slot
            y = torch.zeros_like(x)
            for e in idx[:, k].unique().tolist():
                rows = (idx[:, k] == e).nonzero().flatten()
                y[rows] = self.mlp(f"{p}experts.{e}.", x[rows])  # bf16 expert outputs
            acc = acc + w[:, k : k + 1] * y
        routed = bf16(acc)
        if c.n_shared_experts:
            routed = bf16(routed + self.mlp(p + "shared_experts.", x))
        return routed, {"experts": idx, "weights": w, "margin": margin}

    def layer(self, i, h, positions, trace):
        """Decoder block i (attention + dense MLP or MoE) on the residual stream h [T, D] bf16, causal
        over positions 0..T-1 of this call. Records layer i's routing in trace if it is MoE."""
        c = self.cfg
        lp = f"model.layers.{i}."
        x = rms_norm(h, self.vec(lp + "input_layernorm.weight"), c.rms_norm_eps)
        h = bf16(h + self.attention(i, x, positions))
        x = rms_norm(h, self.vec(lp + "post_attention_layernorm.weight"), c.rms_norm_eps)
        if c.is_moe_layer(i):
            f, trace[i] = self.moe(i, x)
        else:
            f = self.mlp(lp + "mlp.", x)
        return bf16(h + f)

    def head(self, h, norm, head):
        """Logits [T, V] fp32 = exact dot of RMSNorm_norm(h) (bf16) and the BF16 head weight."""
        h = rms_norm(h, self.vec(norm), self.cfg.rms_norm_eps)
        return dot_f32(h, self.vec(head))  # fp32, never rounded to bf16

    def _lm_head_name(self):
        return "model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"

    def hidden(self, ids):
        """ids: a sequence from position 0 -> (h [T, D] bf16: the last layer's output BEFORE the final
        norm, the h_t the MTP module takes; routing trace per MoE layer)."""
        c = self.cfg
        ids_t = torch.tensor(ids, dtype=torch.long)
        positions = torch.arange(len(ids), dtype=torch.long)
        h = bf16(self.vec("model.embed_tokens.weight")[ids_t])  # [T, D]
        trace = {}
        for i in range(c.num_hidden_layers):
            h = self.layer(i, h, positions, trace)
        return h, trace

    def forward(self, ids, return_hidden=False):
        """ids: list of token ids (a sequence from position 0) -> (logits [T, V] fp32, trace), plus the
        pre-norm hidden states [T, D] when return_hidden."""
        h, trace = self.hidden(ids)
        logits = self.head(h, "model.norm.weight", self._lm_head_name())
        return (logits, trace, h) if return_hidden else (logits, trace)

    # -- multi-token prediction (NUMERICS.md "MTP module") --
    def mtp(self, h_prev, next_ids, module=0):
        """MTP module `module` (checkpoint layer num_hidden_layers + module) over the MTP positions
        0..N-1 of one call. MTP position t takes h_prev[t] (the main model's pre-norm hidden state at
        position t, or a chain step's block output) and next_ids[t] (token t+1), has RoPE position t
        and attends causally to MTP positions 0..t of this call.
        -> (g [N, D] bf16: the block output before shared_head.norm, logits [N, V] fp32: the
        prediction of token t+2, routing trace of the block or None)."""
        c = self.cfg
        if not 0 <= module < c.num_nextn_predict_layers:
            raise ValueError(f"MTP module {module} does not exist: config.json has num_nextn_predict_layers "
                             f"{c.num_nextn_predict_layers}")
        if h_prev.shape[0] != len(next_ids):
            raise ValueError(f"mtp: {h_prev.shape[0]} hidden states but {len(next_ids)} tokens")
        i = c.num_hidden_layers + module
        p = f"model.layers.{i}."
        emb = p + "embed_tokens.weight" if p + "embed_tokens.weight" in self.t else "model.embed_tokens.weight"
        e = bf16(self.vec(emb)[torch.tensor(next_ids, dtype=torch.long)])
        x = torch.cat([rms_norm(e, self.vec(p + "enorm.weight"), c.rms_norm_eps),  # embedding first
                       rms_norm(h_prev, self.vec(p + "hnorm.weight"), c.rms_norm_eps)], dim=1)  # [N, 2D]
        h = self.linear(p + "eh_proj", x)  # [N, D] bf16
        trace = {}
        g = self.layer(i, h, torch.arange(len(next_ids), dtype=torch.long), trace)
        head = p + "shared_head.head.weight" if p + "shared_head.head.weight" in self.t else self._lm_head_name()
        return g, self.head(g, p + "shared_head.norm.weight", head), trace.get(i)


def router_margin(biased, group_scores, keep, idx, topk_group):
    """Per token, the smallest gap that decides the selection: between the k-th and (k+1)-th biased
    scores among the kept groups' experts, and between the topk_group-th and next group score.
    A margin below the noise of two correct implementations means they may pick different experts."""
    t_len, e = biased.shape
    g = group_scores.shape[1]
    per = e // g
    kept = biased.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    chosen = torch.zeros_like(biased, dtype=torch.bool).scatter_(1, idx, True)
    kth = torch.gather(biased, 1, idx).min(dim=1).values
    runner = kept.masked_fill(chosen, float("-inf")).max(dim=1).values
    m = kth - runner
    if topk_group < g:
        gs = torch.sort(group_scores, dim=1, descending=True).values
        m = torch.minimum(m, gs[:, topk_group - 1] - gs[:, topk_group])
    return m


def greedy(model, ids, n_new, return_hidden=False):
    """Greedy continuation by full recompute each step: returns (new ids, logits of the final pass
    [len(ids)+n_new-1, V], trace of the final pass), plus the final pass's pre-norm hidden states
    when return_hidden."""
    seq = list(ids)
    for _ in range(n_new):
        logits, trace, h = model.forward(seq, return_hidden=True)
        seq.append(int(torch.argmax(logits[-1])))
    return (seq[len(ids):], logits, trace) + ((h,) if return_hidden else ())


def mtp_chain(model, h, next_ids, k):
    """Drafts k tokens with MTP module 0 applied as a chain (NUMERICS.md "MTP chain").

    h [N, D]: the main model's pre-norm hidden states at positions 0..N-1; next_ids [N]: tokens
    1..N, so next_ids[-1] is the newest token (not yet run through the main model). Step j = 1..k
    runs the module over MTP positions 0..N-2+j: the N real positions, then chain positions N-1+i
    (i = 1..j-1) whose input is (g_i, d_i): step i's block output at its last position and its
    draft. d_j = argmax of step j's logits at its last position (ties -> lower id).
    Returns (drafts [k], logits [k, V] fp32: each step's last row)."""
    if model.cfg.num_nextn_predict_layers != 1:
        raise ValueError("mtp_chain: the chain is defined for exactly one MTP module (num_nextn_predict_layers 1)")
    hs, toks = h, list(next_ids)
    drafts, rows = [], []
    for _ in range(k):
        g, logits, _ = model.mtp(hs, toks)
        drafts.append(int(torch.argmax(logits[-1])))
        rows.append(logits[-1])
        hs = torch.cat([hs, g[-1:]])
        toks.append(drafts[-1])
    return drafts, torch.stack(rows)


def speculative_greedy(model, ids, n_new, k):
    """Greedy self-speculative decoding with the MTP chain (NUMERICS.md "Speculative decoding").

    The prefill's argmax is the first token. Each step then drafts k tokens with mtp_chain from the
    hidden states of every position before the newest token, runs the main model over the sequence
    plus the k drafts, accepts drafts while they equal the main model's argmax and emits the accepted
    drafts plus the main model's next token (the correction, or the bonus after k accepted). Full
    recompute each step. Returns (new ids [n_new], steps): each step {"position": the newest token's
    position, "drafts", "draft_margins" (top-1 minus top-2 of each draft's logits), "accepted",
    "emitted"}; the emitted tokens of the last step are cut at n_new."""
    seq = list(ids)
    logits, _, h = model.forward(seq, return_hidden=True)
    seq.append(int(torch.argmax(logits[-1])))
    steps = []
    while len(seq) - len(ids) < n_new:
        n = len(seq) - 1  # position of the newest token
        drafts, rows = mtp_chain(model, h[:n], seq[1:], k)
        top2 = torch.topk(rows, 2, dim=-1).values
        logits, _, h = model.forward(seq + drafts, return_hidden=True)
        main = [int(t) for t in torch.argmax(logits[n:], dim=-1)]  # k + 1 verdicts
        a = 0
        while a < k and drafts[a] == main[a]:
            a += 1
        emitted = (drafts[:a] + [main[a]])[: n_new - (len(seq) - len(ids))]
        steps.append({"position": n, "drafts": drafts, "draft_margins": [float(m) for m in top2[:, 0] - top2[:, 1]],
                      "accepted": a, "emitted": emitted})
        seq += emitted
    return seq[len(ids):], steps
