"""Minimal safetensors reader/writer (no `safetensors` package needed).

Format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets relative to the end of the header).

Tensors come back as torch tensors in their stored dtype (BF16 as torch.bfloat16).
"""

import json
import os
import struct

import numpy as np
import torch

# safetensors dtype name -> (numpy dtype used for the raw bytes, torch dtype)
_DTYPES = {
    "F64": (np.float64, torch.float64),
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.int16, torch.bfloat16),  # raw 16-bit patterns, reinterpreted by torch
    "I64": (np.int64, torch.int64),
    "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16),
    "I8": (np.int8, torch.int8),
    "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
}
_TORCH_TO_NAME = {t: name for name, (_, t) in _DTYPES.items()}


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header, 8 + n


def load_file(path):
    """{name: torch.Tensor} of one .safetensors file (stored dtypes)."""
    header, base = read_header(path)
    with open(path, "rb") as f:
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        np_dtype, t_dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        arr = np.frombuffer(blob, dtype=np_dtype, count=(end - begin) // np.dtype(np_dtype).itemsize,
                            offset=base + begin).copy()
        t = torch.from_numpy(arr)
        if info["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(info["shape"])
    return out


def load(path):
    """A .safetensors file, or a checkpoint directory (single file or sharded by its index)."""
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            out = {}
            for shard in sorted(set(weight_map.values())):
                tensors = load_file(os.path.join(path, shard))
                for name, t in tensors.items():
                    if weight_map.get(name) == shard:
                        out[name] = t
            missing = set(weight_map) - set(out)
            if missing:
                raise ValueError(f"{path}: tensors in the index but not in their shard: {sorted(missing)[:5]}")
            return out
        path = os.path.join(path, "model.safetensors")
    return load_file(path)


def _to_bytes(t):
    """(dtype name, shape, bytes) of a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    t = t.detach().cpu().contiguous()
    name = _TORCH_TO_NAME.get(t.dtype)
    if name is None:
        raise ValueError(f"dtype {t.dtype} not supported")
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy()
    else:
        raw = t.numpy()
    return name, list(t.shape), raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()


def save_file(tensors, path, metadata=None):
    """Write {name: tensor} (torch or numpy) as one .safetensors file, names sorted."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = _to_bytes(tensors[name])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)
