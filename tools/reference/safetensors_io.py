"""Reads and writes the safetensors format by hand (no `safetensors` package).

Layout: an 8-byte little-endian header length N, N bytes of JSON, then the raw data buffer.
The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the start of the data buffer) and may hold "__metadata__" (a str -> str map).

Supported dtypes: F32, BF16, F8_E4M3 (torch 1.13 has no float8: such tensors are returned as
uint8 codes; decode them with numerics.e4m3_decode), I32, I64, U8.
"""

import json
import struct

import numpy as np
import torch

# safetensors dtype name -> (bytes per element, numpy dtype of the raw storage)
_DTYPES = {
    "F32": (4, np.dtype("<f4")),
    "BF16": (2, np.dtype("<u2")),
    "F8_E4M3": (1, np.dtype("u1")),
    "U8": (1, np.dtype("u1")),
    "I32": (4, np.dtype("<i4")),
    "I64": (8, np.dtype("<i8")),
}


class SafetensorsError(ValueError):
    pass


def _to_torch(dtype, raw):
    if dtype == "BF16":
        return torch.from_numpy(raw.astype(np.int16, copy=False).copy()).view(torch.bfloat16)
    return torch.from_numpy(raw.copy())


def read_safetensors(path):
    """Returns (tensors, metadata): tensors maps name -> (dtype name, torch tensor).

    BF16 comes back as torch.bfloat16, F8_E4M3 as torch.uint8 codes, others as themselves.
    """
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise SafetensorsError(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n :]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        size, npdt = _DTYPES[dtype]
        shape = [int(d) for d in info["shape"]]
        begin, end = info["data_offsets"]
        numel = int(np.prod(shape)) if shape else 1
        if end - begin != numel * size or end > len(data) or begin < 0:
            raise SafetensorsError(
                f"{path}: tensor {name} {dtype}{shape} has data_offsets [{begin},{end}] "
                f"(need {numel * size} bytes inside a {len(data)}-byte buffer)")
        raw = np.frombuffer(data[begin:end], dtype=npdt).reshape(shape)
        tensors[name] = (dtype, _to_torch(dtype, raw))
    return tensors, metadata


def _raw_bytes(dtype, t):
    t = t.detach().contiguous().cpu()
    if dtype == "BF16":
        if t.dtype != torch.bfloat16:
            raise SafetensorsError("BF16 tensors must be torch.bfloat16 (round explicitly first)")
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype in ("F8_E4M3", "U8"):
        if t.dtype != torch.uint8:
            raise SafetensorsError(f"{dtype} tensors must be torch.uint8 codes")
        return t.numpy().tobytes()
    if dtype == "I32":
        return t.to(torch.int32).numpy().astype("<i4").tobytes()
    if dtype == "I64":
        return t.to(torch.int64).numpy().astype("<i8").tobytes()
    raise SafetensorsError(f"unsupported dtype {dtype}")


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype name, torch tensor). Names are written in sorted order."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        dtype, t = tensors[name]
        raw = _raw_bytes(dtype, t)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 8)  # pad so the data buffer starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for c in chunks:
            f.write(c)
