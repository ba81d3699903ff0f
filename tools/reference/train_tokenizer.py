"""Trains a byte-level BPE on the corpus and writes a HuggingFace tokenizer.json (+ tokenizer_config.json).

Vocabulary layout: ids 0..3 are DeepSeek-V3's special tokens (also listed as added tokens), ids
4..259 the 256 byte symbols (GPT-2 bytes_to_unicode, in byte order), then one token per merge.

    /usr/bin/python3 tools/reference/train_tokenizer.py --vocab-size 2048 --out models/tiny
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bpe import BOS, BYTE_TO_CHAR, EOS, SPECIAL_TOKENS, SPLIT_PATTERNS, PreTokenizer  # noqa: E402
from corpus import corpus_documents  # noqa: E402


def train_bpe(word_counts, n_merges):
    """word_counts: {piece (str of byte chars): count}. Greedy BPE: merge the most frequent adjacent
    pair (ties -> lexicographically smallest pair), n_merges times. Returns the merge list."""
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> indices of words containing it
    for wi, (w, c) in enumerate(zip(words, counts)):
        for p in zip(w, w[1:]):
            pairs[p] += c
            where[p].add(wi)
    merges = []
    for _ in range(n_merges):
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        a, b = best
        for wi in list(where[best]):
            w, c = words[wi], counts[wi]
            for p in zip(w, w[1:]):  # remove this word's old pairs
                pairs[p] -= c
                if pairs[p] <= 0:
                    del pairs[p]
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pairs[p] += c
                where[p].add(wi)
        del where[best]
    return merges


def build_tokenizer_json(merges):
    vocab = {}
    for s in SPECIAL_TOKENS:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[BYTE_TO_CHAR[b]] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in SPECIAL_TOKENS]
    splits = [{"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
              for p in SPLIT_PATTERNS]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits + [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pretok = PreTokenizer()
    word_counts = collections.Counter()
    for _, text in corpus_documents():
        word_counts.update(pretok(text))
    n_merges = args.vocab_size - len(SPECIAL_TOKENS) - 256
    merges = train_bpe(word_counts, n_merges)
    if len(merges) != n_merges:
        sys.exit(f"train_tokenizer: only {len(merges)} merges possible, wanted {n_merges}; lower --vocab-size")
    tj = build_tokenizer_json(merges)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
           "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 4096,
           "pad_token": EOS, "tokenizer_class": "LlamaTokenizerFast", "unk_token": None,
           "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                            "{{ '<｜User｜>' + m['content'] }}{% else %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}"
                            "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"}
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"train_tokenizer: {len(tj['model']['vocab'])} tokens ({len(merges)} merges) from "
          f"{sum(word_counts.values())} pre-tokens -> {args.out}/tokenizer.json")


if __name__ == "__main__":
    main()
