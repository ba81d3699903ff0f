"""Trains one DeepSeek-V3 MTP module on top of the frozen tiny model and exports models/tiny-mtp.

The main model is models/tiny's, frozen: its tensors are copied byte for byte into the new
checkpoint, so tiny-mtp's main model (and its main golden) is exactly tiny's. The MTP module
(checkpoint layer num_hidden_layers = 4: enorm, hnorm, eh_proj, one MoE decoder block,
shared_head.norm; embedding and lm_head are the main model's) is trained with the MTP loss: the
cross-entropy of its logits at position t (from the main model's pre-norm hidden state h_t and
token t+1) against token t+2. A second chain term (--chain-weight) trains the module applied to its
own block output g_t and token t+2 against token t+3, with the attention window of the
reference's chain (keys of positions < t+1 from the first application), so k = 2 drafts well.

    /usr/bin/python3 tools/reference/train_mtp.py --init-from models/tiny --out models/tiny-mtp
    /usr/bin/python3 tools/reference/train_mtp.py --init-from models/tiny-mtp --out models/tiny-mtp --qat ...
models/tiny-mtp/README.md has the exact commands that made the committed checkpoint. Routing and
quantization-aware training work as in train_tiny.py (aux-loss-free router bias, margin hinge,
--qat through the exported FP8/BF16 rounding); they act on the MTP module only.
"""

import argparse
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: spinning OpenMP threads crawl on a shared machine

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_tiny as tt  # noqa: E402
from bpe import BOS, EOS, Tokenizer  # noqa: E402
from corpus import MODEL_TRAIN_FILES, corpus_documents  # noqa: E402
from model import Config  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

MTP_CONFIG = dict(tt.TINY_CONFIG, num_nextn_predict_layers=1)


class MTPLayer(tt.Layer):
    """An MTP module: enorm, hnorm, eh_proj, one decoder block (this Layer), shared_head.norm."""

    def __init__(self, c, i):
        super().__init__(c, i)
        d = c.hidden_size
        self.enorm = tt.RMSNorm(d, c.rms_norm_eps)
        self.hnorm = tt.RMSNorm(d, c.rms_norm_eps)
        self.eh_proj = tt.lin(2 * d, d)
        self.shared_head = nn.Module()
        self.shared_head.norm = tt.RMSNorm(d, c.rms_norm_eps)

    def step(self, emb, h_prev, cos, sin, ctx=None):
        """-> (block input x = eh_proj([enorm(emb), hnorm(h_prev)]), block output g)."""
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], -1))
        return x, tt.Layer.forward(self, x, cos, sin, ctx)


class TinyDeepseekMTP(tt.TinyDeepseek):
    def __init__(self, c):
        super().__init__(c)
        mtp = MTPLayer(c, c.num_hidden_layers)
        for name, p in mtp.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02)
        self.layers.append(mtp)

    def mtp(self):
        return self.layers[self.c.num_hidden_layers]

    def rope(self, t):
        ang = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None]
        return ang.cos(), ang.sin()

    def main_hidden(self, ids):
        """The main model's hidden states before the final norm, [B, T, D]."""
        cos, sin = self.rope(ids.shape[1])
        h = self.embed_tokens(ids)
        for layer in self.layers[: self.c.num_hidden_layers]:
            h = layer(h, cos, sin)
        return h

    def mtp_logits(self, g):
        return self.lm_head(self.mtp().shared_head.norm(g))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init-from", required=True, help="checkpoint folder with the main model (and maybe an MTP module)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--chain-weight", type=float, default=0.5, help="weight of the second (chained) application's loss")
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--hinge-weight", type=float, default=0.1)
    ap.add_argument("--hinge-margin", type=float, default=0.05)
    ap.add_argument("--qat", action="store_true", help="train the MTP module through the FP8/BF16 rounding of the export")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    cfg = Config(MTP_CONFIG)
    L = cfg.num_hidden_layers
    tok = Tokenizer.load(os.path.join(args.init_from, "tokenizer.json"))
    stream = []
    for _, text in corpus_documents(MODEL_TRAIN_FILES):
        stream += tok.encode(text) + [tok.added[EOS]]
    stream = torch.tensor(stream, dtype=torch.long)
    bos = tok.added[BOS]

    model = TinyDeepseekMTP(cfg)
    tt.load_exported(model, args.init_from, optional=(f"layers.{L}.",))
    mtp = model.mtp()
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(f"layers.{L}."))
    params = [p for p in model.parameters() if p.requires_grad]
    mtp.mlp.gate.margin = args.hinge_margin
    print(f"train_mtp: main model from {args.init_from} (frozen), MTP module {sum(p.numel() for p in params) / 1e6:.2f} M "
          f"parameters, {args.steps} steps of {args.batch}x{args.seq} tokens, corpus {len(stream)} tokens", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    n = args.seq - 1  # MTP positions 0..n-1 of a window
    cos, sin = model.rope(n)
    t0, c0 = time.time(), time.process_time()
    curve, acc_curve = [], []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = [rng.randrange(0, len(stream) - args.seq) for _ in range(args.batch)]
        full = torch.cat([torch.full((args.batch, 1), bos), torch.stack([stream[s : s + args.seq] for s in starts])], 1)
        with torch.no_grad():  # the frozen main model: exported weights, no fake quantization
            tt.QAT["on"] = False
            h = model.main_hidden(full[:, : args.seq])
            emb = model.embed_tokens(full[:, 1 : n + 1])  # token t+1 at MTP position t
        tt.QAT["on"] = args.qat
        x1, g1 = mtp.step(emb, h[:, :n], cos, sin)
        load, hinge = mtp.mlp.last_load, mtp.mlp.last_hinge
        logits1 = model.mtp_logits(g1)
        loss1 = F.cross_entropy(logits1.reshape(-1, cfg.vocab_size), full[:, 2 : n + 2].reshape(-1))
        loss = loss1 + args.hinge_weight * hinge
        loss2 = torch.zeros(())
        if args.chain_weight:
            # chain position p takes (g_{p-1}, token p+1) and predicts token p+2; keys < p from step 1
            g_prev = torch.cat([torch.zeros_like(g1[:, :1]), g1[:, :-1]], 1)
            _, g2 = mtp.step(emb, g_prev, cos, sin, ctx=x1)
            logits2 = model.mtp_logits(g2[:, 1:])
            loss2 = F.cross_entropy(logits2.reshape(-1, cfg.vocab_size), full[:, 3 : n + 2].reshape(-1))
            loss = loss + args.chain_weight * (loss2 + args.hinge_weight * mtp.mlp.last_hinge)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free load balancing of the MTP module's router
            mtp.mlp.gate.e_score_correction_bias += args.bias_gamma * torch.sign(load.mean() - load)
            acc = (logits1.argmax(-1) == full[:, 2 : n + 2]).float().mean().item()
        curve.append((loss1.item(), loss2.item()))
        acc_curve.append(acc)
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  mtp loss {loss1.item():.3f}  chain loss {loss2.item():.3f}  top1 acc {acc:.3f}  "
                  f"hinge {hinge.item():.3f}  max/mean load {(load.max() / load.mean()).item():.2f}  lr {lr:.2e}  "
                  f"{time.time() - t0:.0f}s wall {time.process_time() - c0:.0f}s cpu", flush=True)
    tt.QAT["on"] = False
    # The main tensors byte for byte from the source checkpoint, the MTP module's from training.
    src, _ = read_safetensors(os.path.join(args.init_from, "model.safetensors"))
    tensors = {k: v for k, v in src.items() if not k.startswith(f"model.layers.{L}.")}
    mtp_tensors = {k: v for k, v in tt.export_tensors(model).items() if k.startswith(f"model.layers.{L}.")}
    tensors.update(mtp_tensors)
    os.makedirs(args.out, exist_ok=True)
    tt.write_checkpoint(tensors, MTP_CONFIG, args.out)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(os.path.join(args.init_from, fn)) != os.path.abspath(os.path.join(args.out, fn)):
            shutil.copyfile(os.path.join(args.init_from, fn), os.path.join(args.out, fn))
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    k = min(20, len(curve))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"train_mtp: mtp loss {mean([a for a, _ in curve[:k]]):.3f} (first 20 steps) -> {mean([a for a, _ in curve[-k:]]):.3f} "
          f"(last 20), chain loss {mean([b for _, b in curve[:k]]):.3f} -> {mean([b for _, b in curve[-k:]]):.3f}, "
          f"top1 acc (last 20) {mean(acc_curve[-k:]):.3f}; {time.time() - t0:.0f}s wall, {time.process_time() - c0:.0f}s cpu; "
          f"{len(mtp_tensors)} MTP tensors, {size / 1e6:.2f} MB")
    print("train_mtp: MTP router bias |max|:", round(mtp.mlp.gate.e_score_correction_bias.abs().max().item(), 4))


if __name__ == "__main__":
    main()
