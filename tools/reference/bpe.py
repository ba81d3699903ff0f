"""Byte-level BPE as HuggingFace tokenizers runs it, written independently (Python `regex` module
for the Unicode classes). Reads a tokenizer.json: BPE model (vocab + merges), the DeepSeek-V3
pre-tokenizer (three Split(Regex, Isolated) steps, then ByteLevel without its own regex),
ByteLevel decoder, added tokens.

    tok = Tokenizer.load("models/tiny/tokenizer.json")
    ids = tok.encode("Hello", add_bos=True); text = tok.decode(ids)
"""

import json

import regex

# DeepSeek-V3's pre-tokenizer splits, exactly as its tokenizer.json spells them (the third has
# literal CR and LF characters inside the character classes).
SPLIT_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT]  # ids 0..3


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def split_isolated(pieces, pattern):
    """HF Split(behavior=Isolated): every match is its own piece, and so is every gap between."""
    out = []
    for piece in pieces:
        pos = 0
        for m in pattern.finditer(piece):
            if m.start() > pos:
                out.append(piece[pos : m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = m.end()
        if pos < len(piece):
            out.append(piece[pos:])
    return out


class PreTokenizer:
    def __init__(self, patterns=SPLIT_PATTERNS):
        self.patterns = [regex.compile(p) for p in patterns]

    def __call__(self, text):
        """text -> list of byte-level pieces (each a str of BYTE_TO_CHAR characters)."""
        pieces = [text]
        for p in self.patterns:
            pieces = split_isolated(pieces, p)
        return ["".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8")) for piece in pieces]


def bpe_merge(word, ranks):
    """Classic GPT-2 loop: repeatedly merge every occurrence of the adjacent pair with the lowest
    merge rank, left to right. word: str of byte characters -> list of symbols."""
    symbols = list(word)
    while len(symbols) > 1:
        best, best_rank = None, None
        for a, b in zip(symbols, symbols[1:]):
            r = ranks.get((a, b))
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = (a, b), r
        if best is None:
            break
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


class Tokenizer:
    def __init__(self, vocab, merges, added_tokens, patterns=SPLIT_PATTERNS):
        self.vocab = vocab  # token str -> id
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.added = dict(added_tokens)  # content -> id
        for content, i in self.added.items():
            self.id_to_token[i] = content
        self.pretok = PreTokenizer(patterns)
        # longest first, so a special token that is a prefix of another never wins
        alts = sorted(self.added, key=len, reverse=True)
        self.added_re = regex.compile("|".join(regex.escape(a) for a in alts)) if alts else None
        self._cache = {}

    @staticmethod
    def load(path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"{path}: model.type is {model.get('type')}, expected BPE")
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        patterns = [p["pattern"]["Regex"] for p in tj["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
        added = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
        return Tokenizer(model["vocab"], merges, added, patterns)

    def _encode_plain(self, text):
        ids = []
        for piece in self.pretok(text):
            syms = self._cache.get(piece)
            if syms is None:
                syms = [self.vocab[s] for s in bpe_merge(piece, self.ranks)]
                self._cache[piece] = syms
            ids.extend(syms)
        return ids

    def encode(self, text, add_bos=False):
        """Added tokens are matched first (exact text); the spans between go through the
        pre-tokenizer and BPE. add_bos prepends the BOS id (tokenizer_config add_bos_token)."""
        ids = [self.added[BOS]] if add_bos else []
        pos = 0
        if self.added_re is not None:
            for m in self.added_re.finditer(text):
                if m.start() > pos:
                    ids.extend(self._encode_plain(text[pos : m.start()]))
                ids.append(self.added[m.group()])
                pos = m.end()
        if pos < len(text):
            ids.extend(self._encode_plain(text[pos:]))
        return ids

    def decode(self, ids, skip_special=False):
        out, buf = [], bytearray()
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in self.added:
                if not skip_special:
                    out.append(buf.decode("utf-8", errors="replace"))
                    buf = bytearray()
                    out.append(tok)
                continue
            buf.extend(CHAR_TO_BYTE[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
