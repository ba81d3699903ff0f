"""The rounding rules of docs/numerics.md, written out in PyTorch (CPU, torch 1.13, no float8 dtype).

Conventions: every activation is held as a torch.float32 tensor whose values are exactly
representable in bf16 (`bf16()` rounds to nearest even and widens back). FP8 e4m3fn values are
held either as uint8 codes (what the checkpoint stores) or as their exact float values.
See NUMERICS.md beside this file for the full list of rounding points.
"""

import torch

E4M3_MAX = 448.0
ACT_BLOCK = 128  # activation scale group (1 x 128)
WEIGHT_BLOCK = 128  # weight scale block (128 x 128)
ACT_AMAX_MIN = 1e-4  # amax clamp before the activation scale is taken


def bf16(x):
    """Rounds fp32 (or fp64: first to fp32) values to bf16, round-to-nearest-even, back to fp32."""
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float32)


# ---- e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 = NaN; max 448 ----

def _e4m3_value(code):
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m * 2.0**-9  # subnormal
    return sign * (8 + m) * 2.0 ** (e - 10)


# 256-entry decode table, computed from the bit formula (exact in fp32).
E4M3_TABLE = torch.tensor([_e4m3_value(c) for c in range(256)], dtype=torch.float32)
# Non-negative finite values by code 0..126; they increase with the code.
_POS_VALUES = E4M3_TABLE[:127].clone()
# Midpoints between neighbours (exact in fp32: one more mantissa bit than e4m3 has).
_MIDPOINTS = (_POS_VALUES[:-1] + _POS_VALUES[1:]) / 2


def e4m3_decode(codes):
    """uint8 codes -> exact fp32 values."""
    return E4M3_TABLE[codes.to(torch.long)]


def e4m3_encode(x):
    """fp32 -> uint8 e4m3fn codes: round to nearest, ties to even code (= even mantissa),
    saturating to +-448 (inf included), NaN -> 0x7f|sign."""
    x = x.to(torch.float32)
    ax = x.abs()
    # idx = number of midpoints strictly below |x|: the nearest value's code, ties low.
    idx = torch.bucketize(ax, _MIDPOINTS, right=False)
    tie = (idx < _MIDPOINTS.numel()) & (ax == _MIDPOINTS[idx.clamp(max=_MIDPOINTS.numel() - 1)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)  # a tie goes to the even code
    idx = torch.where(ax >= E4M3_MAX, torch.full_like(idx, 126), idx)  # saturate (inf too)
    sign = (torch.signbit(x)).to(torch.long) * 0x80
    codes = idx | sign
    codes = torch.where(torch.isnan(x), 0x7F | sign, codes)
    return codes.to(torch.uint8)


def e4m3_round(x):
    """fp32 -> nearest e4m3fn value (saturating), as fp32."""
    return e4m3_decode(e4m3_encode(x))


# ---- per-token activation quantization (1 x 128) ----

def act_quant(x):
    """x [M, K] bf16 values (fp32 tensor), K % 128 == 0 ->
    (q [M, K/128, 128] exact e4m3 values as fp32, s [M, K/128] fp32).
    s = max(amax, 1e-4) / 448 (fp32), q = e4m3(x / s) with an fp32 division."""
    m, k = x.shape
    if k % ACT_BLOCK:
        raise ValueError(f"fp8 activation cast needs K % {ACT_BLOCK} == 0, got K = {k}")
    xb = x.to(torch.float32).reshape(m, k // ACT_BLOCK, ACT_BLOCK)
    amax = xb.abs().amax(dim=2)
    s = torch.clamp(amax, min=ACT_AMAX_MIN) / torch.tensor(E4M3_MAX, dtype=torch.float32)
    q = e4m3_round(xb / s[:, :, None])
    return q, s


# ---- block-scaled weights (128 x 128) ----

class Fp8Weight:
    """An FP8 weight as stored: codes [N, K] uint8 e4m3fn and scale_inv [ceil(N/128), ceil(K/128)]
    fp32, with W = q * S (weight_scale_inv is a multiplier)."""

    def __init__(self, codes, scale_inv):
        n, k = codes.shape
        nb, kb = -(-n // WEIGHT_BLOCK), -(-k // WEIGHT_BLOCK)
        if tuple(scale_inv.shape) != (nb, kb):
            raise ValueError(f"weight [{n}, {k}] needs scale_inv [{nb}, {kb}], got {list(scale_inv.shape)}")
        self.codes = codes
        self.scale_inv = scale_inv.to(torch.float32)
        self.shape = (n, k)

    def values(self):
        """[N, K] exact e4m3 values (fp32)."""
        return e4m3_decode(self.codes)

    def row_col_scales(self):
        """S broadcast to every element: [N, K] fp32."""
        n, k = self.shape
        s = self.scale_inv.repeat_interleave(WEIGHT_BLOCK, 0)[:n]
        return s.repeat_interleave(WEIGHT_BLOCK, 1)[:, :k]

    def dequant_fp32(self):
        """W = q * S, one fp32 multiply per element."""
        return self.values() * self.row_col_scales()

    def dequant_bf16(self):
        """The official weight_dequant: fp32 q * S, stored bf16."""
        return bf16(self.dequant_fp32())


def quantize_weight(w):
    """fp32/bf16 [N, K] -> Fp8Weight with one scale per 128 x 128 block (edge blocks partial;
    zero padding does not change the amax). scale = amax / 448 (fp32); q = e4m3(w / scale) with an
    fp32 division; an all-zero block gets scale 0 and codes 0."""
    w = w.to(torch.float32)
    n, k = w.shape
    nb, kb = -(-n // WEIGHT_BLOCK), -(-k // WEIGHT_BLOCK)
    pad = torch.zeros(nb * WEIGHT_BLOCK, kb * WEIGHT_BLOCK, dtype=torch.float32)
    pad[:n, :k] = w
    blocks = pad.reshape(nb, WEIGHT_BLOCK, kb, WEIGHT_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = amax / torch.tensor(E4M3_MAX, dtype=torch.float32)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = blocks / safe[:, None, :, None]
    codes = e4m3_encode(q).reshape(nb * WEIGHT_BLOCK, kb * WEIGHT_BLOCK)[:n, :k].contiguous()
    return Fp8Weight(codes, scale)


# ---- linears ----

def fp8_linear(x, w):
    """docs/numerics.md §3 "fp8" mode. x [M, K] bf16 values, w Fp8Weight [N, K] -> [M, N] bf16 values.

    Per 128-wide K block kb: P = sum_k qa[m,k] * qw[n,k]. Each product of two e4m3 values is a
    multiple of 2^-18 below 2^18, so a 128-term sum is exact in float64 whatever the order; P is
    that exact sum rounded once to fp32. Then acc += P * (s_a[m,kb] * s_w[n/128,kb]), all fp32
    (the scale product first, then the multiply, then the add), kb ascending from acc = 0.
    The output is rounded once to bf16."""
    m, k = x.shape
    n, kw = w.shape
    if k != kw:
        raise ValueError(f"fp8_linear: x has K = {k}, weight has K = {kw}")
    qa, sa = act_quant(x)  # [M, KB, 128], [M, KB]
    kbn = k // ACT_BLOCK
    qw = w.values().reshape(n, kbn, ACT_BLOCK)
    # [KB, M, N] exact block sums, rounded once to fp32
    blocks = torch.einsum("mbk,nbk->bmn", qa.double(), qw.double()).to(torch.float32)
    sw = w.scale_inv.repeat_interleave(WEIGHT_BLOCK, 0)[:n]  # [N, KB]
    acc = torch.zeros(m, n, dtype=torch.float32)
    for kb in range(kbn):
        scale = sa[:, kb, None] * sw[None, :, kb]  # [M, N] fp32
        acc = acc + blocks[kb] * scale
    return bf16(acc)


def dot_f32(x, w):
    """x [M, K] @ w[N, K]^T accumulated in float64, rounded once to fp32 (the fp32-accumulated GEMM
    of the spec; fp64 makes the reference independent of summation order)."""
    return (x.double() @ w.double().t()).to(torch.float32)


def bf16_linear(x, w):
    """bf16 x bf16 with fp32 accumulation, output rounded to bf16. w [N, K] bf16 values."""
    return bf16(dot_f32(x, w))
