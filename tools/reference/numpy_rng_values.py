"""Prints what NumPy's default_rng draws, as JSON, for the C++ port's test (tests/core).

The Engram hash parameters (docs/kernels.md, Engram hash) are derived from `seed` through
`numpy.random.default_rng(seed + 10007 * layer).integers(0, half, size=max_ngram_size)`.
deepinfer re-implements SeedSequence, PCG64 and NumPy's bounded-integer sampling in C++; this
script records NumPy's own answers so the C++ test needs no NumPy:

    /usr/bin/python3 tools/reference/numpy_rng_values.py > tests/core/data/numpy_rng.json
"""

import json

import numpy as np


def u64(x):
    return str(int(x))  # JSON numbers lose precision above 2**53: strings


def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def engram_params(vocab, layer_ids, max_ngram, n_head, budgets, seed):
    """The Engram demo's NgramHashMapping parameters, written out from its description."""
    m_max = np.iinfo(np.int64).max // vocab
    half = max(1, m_max // 2)
    mult = {}
    for layer in layer_ids:
        g = np.random.default_rng(int(seed + 10007 * layer))
        r = g.integers(low=0, high=half, size=(max_ngram,), dtype=np.int64)
        mult[layer] = [u64(v) for v in (r * 2 + 1)]
    seen = set()
    primes = {}
    for layer in layer_ids:
        per_order = []
        for n in range(2, max_ngram + 1):
            start = budgets[n - 2] - 1
            heads = []
            for _ in range(n_head):
                c = start + 1
                while not (is_prime(c) and c not in seen):
                    c += 1
                seen.add(c)
                heads.append(c)
                start = c
            per_order.append(heads)
        primes[layer] = per_order
    return {"vocab": vocab, "layer_ids": layer_ids, "max_ngram_size": max_ngram,
            "n_head_per_ngram": n_head, "engram_vocab_size": budgets, "seed": seed,
            "multipliers": [mult[l] for l in layer_ids],
            "primes": [primes[l] for l in layer_ids]}


def main():
    out = {"numpy_version": np.__version__}
    # Raw 64-bit outputs of PCG64 seeded through SeedSequence (also big seeds: several words).
    out["next_uint64"] = []
    for seed in [0, 1, 10007, 150105, 2**32 + 5, 2**64 + 3]:
        bg = np.random.PCG64(seed)
        out["next_uint64"].append({"seed": u64(seed),
                                   "values": [u64(v) for v in bg.random_raw(6)]})
    # Bounded int64 draws: ranges below 2**32 (the 32-bit Lemire path, two draws per 64-bit
    # output) and above (the 64-bit path), including the edge ranges.
    out["integers"] = []
    for seed, high, n in [(0, 10, 9), (7, 1000003, 7), (3, 2**32 - 1, 5), (3, 2**32, 5),
                          (11, 2**32 + 1, 5), (5, 3 * 2**40 + 17, 6), (9, 2**63 - 1, 4),
                          (0, 1, 3), (20014, 35675887451290, 3)]:
        g = np.random.default_rng(seed)
        vals = g.integers(low=0, high=high, size=(n,), dtype=np.int64)
        out["integers"].append({"seed": seed, "high": u64(high), "values": [u64(v) for v in vals]})
    # The Engram demo config (layers 1 and 15, orders 2..3, 8 heads, budgets 5 x 129280) at a few
    # compressed vocabulary sizes (the multipliers depend on it; the primes do not).
    out["engram"] = [engram_params(v, [1, 15], 3, 8, [646400, 646400], 0)
                     for v in [129280, 99000, 1000]]
    out["engram"].append(engram_params(300, [0, 2], 4, 3, [101, 211, 307], 42))
    # The demo's hash of a short batch (vocab 99000, pad id 2 already canonical), written out
    # from the description: ids [B, T] -> per layer [B*T, 16] row ids with the head offsets.
    e = out["engram"][1]
    ids = np.array([[5, 98999, 17, 17, 40000, 3], [2, 0, 1, 77777, 12, 98998]], dtype=np.int64)
    B, T = ids.shape
    shifts = [np.pad(ids, ((0, 0), (k, 0)), constant_values=2)[:, :T] for k in range(3)]
    layers = []
    for li in range(2):
        m = [int(v) for v in e["multipliers"][li]]
        heads = []
        offset = 0
        for n in range(2, 4):
            mix = shifts[0] * m[0]
            for k in range(1, n):
                mix = np.bitwise_xor(mix, shifts[k] * m[k])
            for p in e["primes"][li][n - 2]:
                heads.append(mix % p + offset)
                offset += p
        layers.append(np.stack(heads, axis=-1).reshape(B * T, -1).tolist())
    out["hash_example"] = {"engram": 1, "ids": ids.tolist(), "pad_id": 2,
                           "ngram_ids": np.stack(shifts, axis=-1).reshape(B * T, 3).tolist(),
                           "rows": layers}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
