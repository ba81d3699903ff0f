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
import unicodedata

import regex
import torch

from bpe import Tokenizer
from numerics import Fp8Weight, bf16, bf16_linear, dot_f32, fp8_linear, quantize_weight
from numpy_rng_values import engram_params
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
        # mHC (NUMERICS.md "mHC"): hc_mult residual branches; 1 = the plain residual stream
        self.hc_mult = int(raw.get("hc_mult") or 1)
        if self.hc_mult not in (1, 4):
            raise ConfigError(f"config.json: hc_mult must be 1 (plain residual) or 4 (mHC), got {self.hc_mult}")
        self.hc_sinkhorn_repeat = int(raw.get("hc_sinkhorn_repeat", 10))
        self.hc_eps = float(raw.get("hc_eps", 1e-6))
        self.hc_post_mult = float(raw.get("hc_post_mult", 2.0))
        if self.hc_sinkhorn_repeat < 1 or not self.hc_eps > 0 or not self.hc_post_mult > 0:
            raise ConfigError("config.json: hc_sinkhorn_repeat must be >= 1 and hc_eps, hc_post_mult > 0 (got "
                              f"{self.hc_sinkhorn_repeat}, {self.hc_eps}, {self.hc_post_mult})")
        if self.hc_mult > 1 and self.num_nextn_predict_layers:
            raise ConfigError("config.json: MTP modules (num_nextn_predict_layers) with hc_mult > 1 are not "
                              "defined by this reference: use hc_mult 1 or no MTP module")
        self.engram = EngramConfig(raw["engram"], self) if raw.get("engram") is not None else None

    def is_moe_layer(self, i):
        # HF remote-code / vLLM rule.
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0


class EngramConfig:
    """The config.json "engram" object (NUMERICS.md "Engram"), checked on load."""

    KEYS = ("layer_ids", "max_ngram_size", "n_head_per_ngram", "n_embed_per_ngram", "engram_vocab_size",
            "kernel_size", "pad_id", "seed")

    def __init__(self, raw, cfg):
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json: 'engram' must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(self.KEYS))
        if unknown:
            raise ConfigError(f"config.json: unknown key(s) {unknown} in 'engram' (known: {', '.join(self.KEYS)})")
        missing = [k for k in self.KEYS if raw.get(k) is None]
        if missing:
            raise ConfigError(f"config.json: 'engram' is missing {missing}")

        def integer(key, lo):
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"config.json: engram.{key} must be an integer >= {lo}, got {v!r}")
            return v

        def int_list(key, lo):
            v = raw[key]
            if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < lo
                                                       for x in v):
                raise ConfigError(f"config.json: engram.{key} must be a non-empty list of integers >= {lo}, got {v!r}")
            return list(v)

        self.max_ngram_size = integer("max_ngram_size", 2)
        self.n_head_per_ngram = integer("n_head_per_ngram", 1)
        self.n_embed_per_ngram = integer("n_embed_per_ngram", 1)
        self.kernel_size = integer("kernel_size", 1)
        self.pad_id = integer("pad_id", 0)
        self.seed = integer("seed", 0)
        self.layer_ids = int_list("layer_ids", 0)
        self.engram_vocab_size = int_list("engram_vocab_size", 2)
        if any(b <= a for a, b in zip(self.layer_ids, self.layer_ids[1:])) or \
                self.layer_ids[-1] >= cfg.num_hidden_layers:
            raise ConfigError(f"config.json: engram.layer_ids {self.layer_ids} must be strictly increasing block "
                              f"indices below num_hidden_layers {cfg.num_hidden_layers}")
        if len(self.engram_vocab_size) != self.max_ngram_size - 1:
            raise ConfigError(f"config.json: engram.engram_vocab_size needs max_ngram_size - 1 = "
                              f"{self.max_ngram_size - 1} entries (orders 2..{self.max_ngram_size}), got "
                              f"{len(self.engram_vocab_size)}")
        if self.n_embed_per_ngram % self.n_head_per_ngram:
            raise ConfigError(f"config.json: engram.n_embed_per_ngram {self.n_embed_per_ngram} is not a multiple of "
                              f"n_head_per_ngram {self.n_head_per_ngram} (a head row has n_embed / n_head values)")
        self.head_dim = self.n_embed_per_ngram // self.n_head_per_ngram  # D
        self.num_heads = (self.max_ngram_size - 1) * self.n_head_per_ngram  # heads per layer
        self.embed_dim = (self.max_ngram_size - 1) * self.n_embed_per_ngram  # E
        self.dilation = self.max_ngram_size


# ---- Engram: tokenizer compression and n-gram hash (NUMERICS.md "Engram") ----

_SENTINEL = "\ue000"  # protects a lone-space key from the strip, as the demo's normalizer does
_WS_RUN = regex.compile(r"[ \t\r\n]+")
_STRIP = regex.compile(r"^\p{White_Space}+|\p{White_Space}+$")


def compression_normalize(text):
    """The demo's key normalizer (HF tokenizers' chain): NFKC, NFD, drop every mark (general category
    M: Mn, Mc, Me, as HF's StripAccents does), lowercase (per character), every run of space/tab/CR/LF -> one space, a string that is exactly one space is
    protected, strip Unicode White_Space at both ends, un-protect."""
    s = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    s = "".join(ch.lower() for ch in s if not unicodedata.category(ch).startswith("M"))
    s = _WS_RUN.sub(" ", s)
    if s == " ":
        s = _SENTINEL
    return _STRIP.sub("", s).replace(_SENTINEL, " ")


def compression_table(tok):
    """raw id -> canonical id over every id of the tokenizer (bpe.Tokenizer), and V'.
    Key: decode([id]) (special tokens kept); if it contains U+FFFD (an incomplete UTF-8 piece) the
    raw token string instead; else its normalized form, or the text itself if that is empty.
    Canonical ids number the keys in order of first appearance, scanning ids ascending."""
    n = max(tok.id_to_token) + 1
    keys, table = {}, []
    for tid in range(n):
        if tid not in tok.id_to_token:
            raise ValueError(f"tokenizer: id {tid} has no token (ids must be dense 0..{n - 1})")
        text = tok.decode([tid])
        key = tok.id_to_token[tid] if "\ufffd" in text else (compression_normalize(text) or text)
        table.append(keys.setdefault(key, len(keys)))
    return table, len(keys)


def engram_indices(canon, pad, multipliers, table_sizes, n_head):
    """canon [..., T] canonical ids (int64) -> [..., T, H] global table rows of one Engram layer.
    Position t-k before the sequence start is the canonical pad id. Order n = 2..len(multipliers):
    mix_n = XOR_{k<n} canon[t-k] * m_k (int64, never overflows: ids < V', m_k < INT64_MAX / V');
    head j of order n: mix_n mod p + offset (offset = sum of the sizes of the heads before it, head
    order: order 2's n_head heads, then order 3's, ...)."""
    t_len = canon.shape[-1]
    g = len(multipliers)
    if len(table_sizes) != (g - 1) * n_head:
        raise ValueError(f"engram_indices: {len(table_sizes)} table sizes for {g - 1} orders x {n_head} heads")
    padded = torch.cat([torch.full(canon.shape[:-1] + (g - 1,), pad, dtype=torch.long), canon.long()], -1)
    mix = padded[..., g - 1:] * multipliers[0]
    out, offset, h = [], 0, 0
    for n in range(2, g + 1):
        k = n - 1
        mix = torch.bitwise_xor(mix, padded[..., g - 1 - k: g - 1 - k + t_len] * multipliers[k])
        for _ in range(n_head):
            out.append(torch.remainder(mix, table_sizes[h]) + offset)
            offset += table_sizes[h]
            h += 1
    return torch.stack(out, -1)


def engram_hash_params(ecfg, vocab_compressed):
    """Per Engram layer: (multipliers [max_ngram_size] ints, table sizes [(max_ngram_size-1)*n_head]
    primes) from NumPy's default_rng (numpy_rng_values.engram_params)."""
    p = engram_params(vocab_compressed, ecfg.layer_ids, ecfg.max_ngram_size, ecfg.n_head_per_ngram,
                      ecfg.engram_vocab_size, ecfg.seed)
    return {layer: ([int(m) for m in p["multipliers"][i]], [q for order in p["primes"][i] for q in order])
            for i, layer in enumerate(ecfg.layer_ids)}


# ---- mHC (NUMERICS.md "mHC"); these run on autograd tensors too (train_tiny.py) ----

def f32(v):
    """A Python float rounded to the fp32 value the engine holds (eps, multipliers), as a float."""
    return float(torch.tensor(v, dtype=torch.float32))


def sigmoid64(a):
    """fp32 sigmoid of fp32 a, computed in float64 and rounded once."""
    return torch.sigmoid(a.double()).float()


def sinkhorn(c, repeat, eps):
    """c [..., n, n] -> near doubly stochastic: softmax over the last dim (j) + eps, columns divided
    by (column sum + eps), then repeat-1 times rows, then columns, divided by (sum + eps)."""
    c = torch.softmax(c, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def mhc_coefficients(mixes, scale, base, hc, eps, post_mult, repeat):
    """mixes [..., hc(hc+2)] -> pre [..., hc], post [..., hc], comb [..., hc, hc] (comb[m, j]: the
    weight of old branch m in new branch j). The arguments of the sigmoids and of Sinkhorn are fp32;
    the sigmoids, post's multiply and the whole of Sinkhorn run in float64 and round once to fp32
    (NUMERICS.md "mHC"), so an engine matches them bit for bit whatever its exp."""
    eps32, mult32 = f32(eps), f32(post_mult)
    pre = sigmoid64(mixes[..., :hc] * scale[0] + base[:hc]) + eps32
    post = (torch.sigmoid((mixes[..., hc: 2 * hc] * scale[1] + base[hc: 2 * hc]).double()) * mult32).float()
    comb = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).double()
    comb = sinkhorn(comb.reshape(comb.shape[:-1] + (hc, hc)), repeat, eps32).float()
    return pre, post, comb


def weighted_branch_sum(w, r, out=None):
    """bf16(out + sum_m w[:, m] * r[:, m]) in fp32, m ascending (one multiply, one add per term)."""
    acc = out
    for m in range(r.shape[1]):
        term = w[:, m: m + 1] * r[:, m]
        acc = term if acc is None else acc + term
    return bf16(acc)


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
    multiply; cos/sin of the fp32 phi in float64, rounded once to fp32, so they do not depend on a
    libm's fp32 cos: torch's differs from the rounded value on ~8% of the angles), rotation in float64
    (the bf16 x fp32 products are exact there), rounded once to bf16."""
    t, d = x.shape[0], x.shape[-1]
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2] fp32
    cos = torch.cos(ang.double()).float() * attn_factor
    sin = torch.sin(ang.double()).float() * attn_factor
    shape = [t] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    xe, xo, cos, sin = xe.double(), xo.double(), cos.double(), sin.double()
    out[..., 0::2] = bf16(xe * cos - xo * sin)
    out[..., 1::2] = bf16(xe * sin + xo * cos)
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

    def __init__(self, cfg, tensors, mode="fp8", compression=None):
        """compression: (raw -> canonical id list, V') from compression_table; needed with Engram."""
        if mode not in ("fp8", "bf16"):
            raise ValueError(f"mode must be fp8 or bf16, got {mode}")
        self.cfg, self.mode = cfg, mode
        self.t = tensors  # name -> (dtype, tensor)
        self.inv_freq = rope_inv_freq(cfg)
        self.attn_factor = rope_attention_factor(cfg)
        self.scale = softmax_scale(cfg)
        self._linears = {}
        self._dense = {}
        self.identity_comb = False  # ablation: every mHC comb replaced by the identity matrix
        self.compression = compression
        self.engram_hash = {}  # layer -> (multipliers, table sizes)
        if cfg.engram is not None:
            if compression is None:
                raise ValueError("a model with Engram needs the tokenizer's compression table (Model.load reads "
                                 "tokenizer.json from the checkpoint folder)")
            self.engram_hash = engram_hash_params(cfg.engram, compression[1])
            for layer in cfg.engram.layer_ids:
                self._check_engram_tensors(layer)
        if cfg.hc_mult > 1:
            hc = cfg.hc_mult
            for i in range(cfg.num_hidden_layers):
                for sub in ("attn_hc", "ffn_hc"):
                    self._check_hc(f"model.layers.{i}.{sub}", hc * (hc + 2), 3)
            self._check_hc("model.hc_head", hc, 1)

    def _check(self, name, shape, dtypes):
        dtype, t = self._get(name)
        if dtype not in dtypes or list(t.shape) != list(shape):
            raise ValueError(f"tensor {name} is {dtype} {list(t.shape)}, expected {'/'.join(dtypes)} {list(shape)}")
        return t

    def _check_hc(self, prefix, mixes, scales):
        d = self.cfg.hc_mult * self.cfg.hidden_size
        self._check(prefix + ".fn", [mixes, d], ("F32",))
        self._check(prefix + ".scale", [scales], ("F32",))
        self._check(prefix + ".base", [mixes], ("F32",))

    def _check_engram_tensors(self, layer):
        """Shapes of block `layer`'s Engram tensors; the optional I64 multipliers / table_sizes
        replace the derived hash parameters (multipliers must be odd)."""
        e, c = self.cfg.engram, self.cfg
        p = f"model.layers.{layer}.engram."
        mult, sizes = self.engram_hash[layer]
        if p + "multipliers" in self.t:
            mult = [int(v) for v in self._check(p + "multipliers", [e.max_ngram_size], ("I64",))]
            if any(m % 2 == 0 or m <= 0 for m in mult):
                raise ValueError(f"tensor {p}multipliers must hold positive odd values, got {mult}")
        if p + "table_sizes" in self.t:
            sizes = [int(v) for v in self._check(p + "table_sizes", [e.num_heads], ("I64",))]
            if any(q <= 0 for q in sizes):
                raise ValueError(f"tensor {p}table_sizes must be positive, got {sizes}")
        self.engram_hash[layer] = (mult, sizes)
        d, hc, bf = c.hidden_size, c.hc_mult, ("BF16",)
        self._check(p + "embedding.weight", [sum(sizes), e.head_dim], bf)
        self._check(p + "value_proj.weight", [d, e.embed_dim], bf)
        self._check(p + "value_proj.bias", [d], bf)
        for i in range(hc):
            self._check(f"{p}key_projs.{i}.weight", [d, e.embed_dim], bf)
            self._check(f"{p}key_projs.{i}.bias", [d], bf)
            for n in (f"norm1.{i}", f"norm2.{i}", f"short_conv.norms.{i}"):
                self._check(f"{p}{n}.weight", [d], bf)
        self._check(p + "short_conv.conv.weight", [hc * d, 1, e.kernel_size], bf)

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
        compression = None
        if cfg.engram is not None:
            compression = compression_table(Tokenizer.load(os.path.join(folder, "tokenizer.json")))
        return Model(cfg, tensors, mode, compression)

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
        # scores [H, T, T]: one exact dot over the latent and the rope channels times the fp32 scale,
        # and the softmax, in float64 (not rounded: NUMERICS.md "Attention"); the fp32 softmax of
        # FlashMLA differs from it by fp32 rounding only
        s_lat = torch.einsum("thr,sr->hts", q_lat.double(), c_n.double())
        s_pe = torch.einsum("thd,sd->hts", q_pe.double(), k_pe.double())
        scores = (s_lat + s_pe) * f32(self.scale)
        mask = torch.ones(t_len, t_len, dtype=torch.bool).triu(1)  # key t visible iff t <= p
        scores = scores.masked_fill(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # float64
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
        # weights in float64 from the fp32 scores, one rounding (NUMERICS.md "Router")
        w = torch.gather(scores, 1, idx).double()
        if c.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        w = (w * f32(c.routed_scaling_factor)).float()
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

    def attn_sublayer(self, i, x, positions):
        """input_layernorm + attention of block i: x [T, D] bf16 -> [T, D] bf16."""
        x = rms_norm(x, self.vec(f"model.layers.{i}.input_layernorm.weight"), self.cfg.rms_norm_eps)
        return self.attention(i, x, positions)

    def ffn_sublayer(self, i, x, trace):
        """post_attention_layernorm + dense MLP or MoE of block i (routing recorded in trace)."""
        lp = f"model.layers.{i}."
        x = rms_norm(x, self.vec(lp + "post_attention_layernorm.weight"), self.cfg.rms_norm_eps)
        if self.cfg.is_moe_layer(i):
            f, trace[i] = self.moe(i, x)
            return f
        return self.mlp(lp + "mlp.", x)

    def layer(self, i, h, positions, trace):
        """Decoder block i (attention + dense MLP or MoE) on the residual stream h [T, D] bf16, causal
        over positions 0..T-1 of this call. Records layer i's routing in trace if it is MoE."""
        h = bf16(h + self.attn_sublayer(i, h, positions))
        return bf16(h + self.ffn_sublayer(i, h, trace))

    # -- mHC (hc_mult > 1) --
    def _mixes(self, r, prefix):
        """r [T, hc, d] bf16 -> mixes [T, M] fp32 = fp32(R_flat . fn^T) * rstd, rstd = 1/sqrt(fp32(sum R_flat^2) / (hc d)
        + eps) in float64, rounded once to fp32."""
        c = self.cfg
        flat = r.reshape(r.shape[0], -1)
        dots = dot_f32(flat, self.vec(prefix + ".fn"))
        sumsq = (flat.double() ** 2).sum(-1).to(torch.float32)
        rstd = (1.0 / torch.sqrt(sumsq.double() / flat.shape[1] + f32(c.hc_eps))).float()
        return dots * rstd[:, None]

    def mhc_pre(self, r, prefix):
        """-> x [T, d] bf16 (the sub-layer input), post [T, hc], comb [T, hc, hc] fp32."""
        c = self.cfg
        pre, post, comb = mhc_coefficients(self._mixes(r, prefix), self.vec(prefix + ".scale"),
                                           self.vec(prefix + ".base"), c.hc_mult, c.hc_eps, c.hc_post_mult,
                                           c.hc_sinkhorn_repeat)
        if self.identity_comb:
            comb = torch.eye(c.hc_mult, dtype=torch.float32).expand_as(comb)
        return weighted_branch_sum(pre, r), post, comb

    @staticmethod
    def mhc_post(y, r, post, comb):
        """R'[:, j] = bf16(post_j y + sum_m comb[m, j] R[:, m]) (fp32, m ascending)."""
        return torch.stack([weighted_branch_sum(comb[:, :, j], r, post[:, j: j + 1] * y)
                            for j in range(r.shape[1])], dim=1)

    def mhc_head(self, r):
        """out = bf16(sum_m (sigmoid(mix_m s + b_m) + eps) R_m) -> [T, d]."""
        p = "model.hc_head"
        w = sigmoid64(self._mixes(r, p) * self.vec(p + ".scale")[0] + self.vec(p + ".base")) + f32(self.cfg.hc_eps)
        return weighted_branch_sum(w, r)

    def hc_layer(self, i, r, positions, trace):
        """Decoder block i on the hc residual branches r [T, hc, d] (mhc_pre -> sub-layer -> mhc_post)."""
        lp = f"model.layers.{i}."
        x, post, comb = self.mhc_pre(r, lp + "attn_hc")
        r = self.mhc_post(self.attn_sublayer(i, x, positions), r, post, comb)
        x, post, comb = self.mhc_pre(r, lp + "ffn_hc")
        return self.mhc_post(self.ffn_sublayer(i, x, trace), r, post, comb)

    # -- Engram --
    def canonical_ids(self, ids):
        table = self.compression[0]
        bad = [i for i in ids if not 0 <= i < len(table)]
        if bad:
            raise ValueError(f"token id(s) {bad[:5]} outside the tokenizer's {len(table)} ids (compression table)")
        return torch.tensor([table[i] for i in ids], dtype=torch.long)

    def engram_rows(self, layer, ids):
        """Global table rows [T, H] of Engram block `layer` for the raw ids of a sequence."""
        e = self.cfg.engram
        mult, sizes = self.engram_hash[layer]
        pad = self.canonical_ids([e.pad_id])[0]
        return engram_indices(self.canonical_ids(ids), pad, mult, sizes, e.n_head_per_ngram)

    def engram(self, layer, r, ids):
        """Engram block of `layer` on r [T, hc, d] bf16 (NUMERICS.md "Engram") -> new r."""
        c, e = self.cfg, self.cfg.engram
        p = f"model.layers.{layer}.engram."
        t_len, hc, d = r.shape
        rows = self.engram_rows(layer, ids)  # [T, H]
        emb = self.vec(p + "embedding.weight")[rows].reshape(t_len, e.embed_dim)  # exact bf16 rows
        v = bf16(dot_f32(emb, self.vec(p + "value_proj.weight")) + self.vec(p + "value_proj.bias"))
        eps, clamp = f32(c.rms_norm_eps), f32(1e-6)
        w_conv = self.vec(p + "short_conv.conv.weight").double()  # [hc d, 1, K]
        out = []
        for i in range(hc):
            k = bf16(dot_f32(emb, self.vec(f"{p}key_projs.{i}.weight")) + self.vec(f"{p}key_projs.{i}.bias"))
            x = r[:, i]
            w = self.vec(f"{p}norm1.{i}.weight") * self.vec(f"{p}norm2.{i}.weight")  # exact in fp32
            # raw and the two rstd are fp32 (one rounding each); the gate runs in float64 from them.
            raw = (x.double() * k.double() * w.double()).sum(-1).to(torch.float32)
            rstd_x = (1.0 / torch.sqrt((x.double() ** 2).mean(-1) + eps)).float()
            rstd_k = (1.0 / torch.sqrt((k.double() ** 2).mean(-1) + eps)).float()
            dot = raw.double() * rstd_x.double() * rstd_k.double() / math.sqrt(d)
            g = sigmoid64(torch.sign(dot) * torch.sqrt(torch.clamp(dot.abs(), min=clamp)))
            gv = g[:, None] * v  # fp32
            gated = bf16(x + gv)
            n = rms_norm(bf16(gv), self.vec(f"{p}short_conv.norms.{i}.weight"), 1e-5)
            # causal dilated depthwise conv over time, channels i*d .. i*d+d-1 (exact, rounded to fp32)
            conv = torch.zeros(t_len, d, dtype=torch.float64)
            kk = e.kernel_size
            for j in range(kk):
                shift = (kk - 1 - j) * e.dilation
                if shift < t_len:
                    conv[shift:] += w_conv[i * d: (i + 1) * d, 0, j] * n[: t_len - shift].double()
            conv = conv.to(torch.float32).double()
            s = bf16(conv * torch.sigmoid(conv))  # SiLU in float64 from the fp32 conv, one rounding
            out.append(bf16(gated + s))
        return torch.stack(out, dim=1)

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
        if c.hc_mult == 1 and c.engram is None:
            for i in range(c.num_hidden_layers):
                h = self.layer(i, h, positions, trace)
            return h, trace
        r = h[:, None, :].repeat(1, c.hc_mult, 1)  # [T, hc, D]: hc copies of the embedding
        engram_layers = c.engram.layer_ids if c.engram is not None else []
        for i in range(c.num_hidden_layers):
            if i in engram_layers:
                r = self.engram(i, r, ids)
            if c.hc_mult > 1:
                r = self.hc_layer(i, r, positions, trace)
            else:
                r = self.layer(i, r[:, 0], positions, trace)[:, None]
        return (self.mhc_head(r) if c.hc_mult > 1 else r[:, 0]), trace

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
