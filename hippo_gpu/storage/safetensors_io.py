"""safetensors files written tensor by tensor and read as memory maps (the index's tensor files,
storage/directory.py). Format: u64 header length N, N bytes of JSON {name: {dtype, shape,
data_offsets}}, then the tensors' bytes; both functions agree with safetensors' own reader and
writer (tests/storage/test_store.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from hippo_gpu.tables import write_array

__all__ = ["load_safetensors_mmap", "save_safetensors_stream"]

_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
                       "U8": np.uint8, "BOOL": np.bool_}


def load_safetensors_mmap(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors as copy-on-write memory maps (pages are read on first touch;
    writing to a tensor copies the page privately and never changes the file).

    Format: u64 header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, data.
    Dtypes numpy cannot map (bfloat16) are read with safetensors' own loader.
    """
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    base = 8 + n
    out: dict[str, torch.Tensor] = {}
    if any(meta["dtype"] not in _SAFETENSORS_DTYPES for k, meta in header.items()
           if k != "__metadata__"):
        return load_file(str(path))
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = np.dtype(_SAFETENSORS_DTYPES[meta["dtype"]])
        shape = tuple(meta["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - start != count * dtype.itemsize:
            raise ValueError(f"tensor {name}: {end - start} bytes for shape {shape}")
        if count == 0:
            out[name] = torch.from_numpy(np.zeros(shape, dtype=dtype))
            continue
        arr = np.memmap(path, dtype=dtype, mode="c", offset=base + start, shape=shape)
        out[name] = torch.from_numpy(arr)
    return out


_NUMPY_TO_SAFETENSORS = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}


def save_safetensors_stream(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write a safetensors file tensor by tensor (safetensors' save_file first builds every
    tensor's bytes in memory: 4.8 GB more at 1M passages). Tensors in name order, each
    8-byte aligned as the header is. Every byte goes through the Python file object
    (tables.write_array), so a full disk raises OSError(ENOSPC) here; bfloat16, which numpy
    cannot hold, is written as its raw 16-bit words.
    """
    arrays, dtypes = {}, {}
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            arrays[name], dtypes[name] = t.view(torch.int16).numpy(), "BF16"
        else:
            arrays[name] = t.numpy()
            dtypes[name] = _NUMPY_TO_SAFETENSORS[arrays[name].dtype]
    header: dict[str, Any] = {}
    offset = 0
    for name, a in arrays.items():
        header[name] = {"dtype": dtypes[name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in arrays.values():
            write_array(f, a)
