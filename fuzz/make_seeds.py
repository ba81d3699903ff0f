#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ from the repository's real files (models/tiny):
small files only, so the targets start from real shapes without slowing every execution.
Run from the repository root: python3 fuzz/make_seeds.py (the output is checked in)."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "tiny")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> a file's bytes (as write_safetensors lays it)."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


# safetensors_header: tiny's real header (its data left out, so its offsets run past the end),
# and small complete files with tiny's names and dtypes.
with open(os.path.join(TINY, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    raw_header = f.read(n)
tiny = json.loads(raw_header)
# Its first entries only, as tiny's writer laid them out: the whole 33 KB header would make every
# execution parse 33 KB of JSON.
head = dict(list(tiny.items())[:16])
h = json.dumps(head).encode()
write("safetensors_header", "tiny_header_start", struct.pack("<Q", len(h)) + h)
names = [k for k in tiny if k != "__metadata__"]
size = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
small = []
for name in names[:6]:
    dt = tiny[name]["dtype"]
    shape = [min(d, 3) for d in tiny[name]["shape"]]
    count = 1
    for d in shape:
        count *= d
    small.append((name, dt, shape, bytes(range(count * size[dt]))))
write("safetensors_header", "small_valid", safetensors(small, {"format": "pt"}))
every = [("a", "F64", [1], bytes(8)), ("b", "I8", [2], b"\x01\x02"), ("c", "U8", [0], b""),
         ("d", "I32", [1, 1], bytes(4)), ("e", "I64", [], bytes(8)), ("f", "F8_E5M2", [2], b"\x00\x7f")]
write("safetensors_header", "every_dtype", safetensors(every))

# safetensors_index: a two-shard index over tiny's first names, as HF writes it.
wm = {name: "model-0000%d-of-00002.safetensors" % (1 + i % 2) for i, name in enumerate(names[:12])}
write("safetensors_index", "two_shards", json.dumps({"metadata": {"total_size": 7102480}, "weight_map": wm}, indent=2))
write("safetensors_index", "one_shard", json.dumps({"weight_map": {"lm_head.weight": "model.safetensors"}}))

# config: tiny's, and a V2-Lite shape (no q_lora, no fp8, greedy softmax, no yarn).
with open(os.path.join(TINY, "config.json")) as f:
    config_text = f.read()
write("config", "tiny", config_text)
c = json.loads(config_text)
c.update(model_type="deepseek_v2", q_lora_rank=None, topk_method="greedy", scoring_func="softmax",
         n_group=1, topk_group=1, rope_scaling=None)
del c["quantization_config"]
write("config", "v2_lite_shape", json.dumps(c))
c = json.loads(config_text)
c["n_routed_experts"] = 0
c["quantization_config"]["scale_fmt"] = "ue8m0"
write("config", "dense_ue8m0", json.dumps(c))

# tokenizer_json: tiny's tokenizer.json cut to a small vocabulary (the pre-tokenizer, added
# tokens and decoder unchanged), alone and with tokenizer_config.json after a NUL byte.
with open(os.path.join(TINY, "tokenizer.json")) as f:
    tj = json.load(f)
vocab = {k: v for k, v in tj["model"]["vocab"].items() if v < 300}
merges = []
for m in tj["model"]["merges"]:
    a, b = m.split(" ") if isinstance(m, str) else m
    if a in vocab and b in vocab and a + b in vocab:
        merges.append(m)
tj["model"]["vocab"] = vocab
tj["model"]["merges"] = merges
small_tok = json.dumps(tj, ensure_ascii=False)
with open(os.path.join(TINY, "tokenizer_config.json")) as f:
    tok_cfg = f.read()
write("tokenizer_json", "tiny_small_vocab", small_tok)
write("tokenizer_json", "tiny_small_vocab_with_config", small_tok + "\0" + tok_cfg)

# tokenizer_encode: an options byte (1 add_special_tokens, 2 split_special_tokens, 4 invalid
# UTF-8 is an error, 8 skip special tokens when decoding) then the text.
for i, (flags, text) in enumerate([
        (0, "Hello, world! The quick brown fox."),
        (3, "<｜begin▁of▁sentence｜><｜User｜>What is 12345 + 678?<｜Assistant｜>"),
        (0, "  leading spaces\n\nnew lines\ttabs 你好世界 こんにちは カタカナ ñandú"),
        (2, "code: def f(x):\n    return x**2  # comment"),
        (0, b"invalid \xff\xfe utf-8 \xe4\xbd and a cut \xf0\x9f\x98"),
        (8, "emoji 😀👍 and digits 3.14159")]):
    write("tokenizer_encode", "text%d" % i, bytes([flags]) + (text if isinstance(text, bytes) else text.encode()))

# capabilities: as `deepinfer check collectives --save-capabilities` writes them.
write("capabilities", "local", json.dumps({"all_to_all": True, "all_to_all_v": True, "ordered_reduce": True, "backend": "local"}, indent=2) + "\n")
write("capabilities", "faulty_mpi", json.dumps({"all_to_all": True, "all_to_all_v": False, "ordered_reduce": False, "backend": "faulty(a2av-hang)/mpi"}, indent=2) + "\n")
write("capabilities", "partial", '{"all_to_all_v": false}')

# openai_request: request bodies of both endpoints (each input is parsed as both).
for i, body in enumerate([
        {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0},
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": None}], "stream": True, "stream_options": {"include_usage": True}},
        {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "stop": ["\n", "."], "seed": 7, "top_p": 0.9, "top_k": 40},
        {"prompt": [0, 5, 17, 2047], "max_completion_tokens": 4, "n": 1, "ignore_eos": True, "stop": "END"},
        {"prompt": ["one string"], "temperature": 1.5, "top_k": -1, "stream": False}]):
    write("openai_request", "body%d" % i, json.dumps(body, ensure_ascii=False))

# chat_template: a mode byte (even: the rest is a conversation rendered by template number
# byte >> 1, bit 7 add_generation_prompt; odd: the rest is template text), then the bytes.
# Conversations: those of tests/serve/data/contexts.json, over several templates; templates:
# tiny's and every one of tests/serve/data/templates/.
SERVE_DATA = os.path.join(ROOT, "tests", "serve", "data")
with open(os.path.join(SERVE_DATA, "contexts.json")) as f:
    conversations = json.load(f)["conversations"]
for i, (name, conv) in enumerate(sorted(conversations.items())):
    mode = ((i % 9) << 1) | (0x80 if conv.get("add_generation_prompt") else 0)
    body = {k: v for k, v in conv.items() if k != "add_generation_prompt"}
    write("chat_template", "conv_" + name, bytes([mode]) + json.dumps(body, ensure_ascii=False).encode())
write("chat_template", "conv_bare_list", bytes([0]) + json.dumps(conversations["basic"]["messages"]).encode())
with open(os.path.join(TINY, "tokenizer_config.json")) as f:
    write("chat_template", "tmpl_tiny", b"\x01" + json.load(f)["chat_template"].encode())
for name in sorted(os.listdir(os.path.join(SERVE_DATA, "templates"))):
    with open(os.path.join(SERVE_DATA, "templates", name), "rb") as f:
        write("chat_template", "tmpl_" + name.rsplit(".", 1)[0], b"\x01" + f.read())
