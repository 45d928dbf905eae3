"""Save/load an index directory: safetensors + JSON, atomic, checksummed; nothing executable.

Layout:
    manifest.json          format + version, config, encoder identity, counts, per-file sha256
    graph.safetensors      adjacency CSR parts and integer tables
    embeddings.safetensors passage / phrase / fact embedding matrices (float32)
    tables.json            key <-> row tables and texts
A directory is written under a temporary name beside the target and renamed into place, so a
crash never leaves a half-written index where a complete one is expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FORMAT = "hippo-gpu-index"
FORMAT_VERSION = 1


class IndexFormatError(ValueError):
    """An index directory is missing, corrupt, of another format version or incompatible."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_index_dir(
    out_dir: str | Path,
    manifest: dict[str, Any],
    tensors: dict[str, dict[str, torch.Tensor]],
    tables: dict[str, dict[str, Any]],
) -> Path:
    """Write `{name}.safetensors` for each tensor group, `{name}.json` for each table, and the
    manifest with their sha256, into a temp dir that is then swapped into `out_dir`."""
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        files: dict[str, dict[str, Any]] = {}
        for name, group in tensors.items():
            path = tmp / f"{name}.safetensors"
            save_file({k: v.detach().cpu().contiguous() for k, v in group.items()}, str(path))
            files[path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        for name, table in tables.items():
            path = tmp / f"{name}.json"
            with path.open("w", encoding="utf-8") as f:
                json.dump(table, f, ensure_ascii=False)
            files[path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest,
                    "files": files}
        with (tmp / "manifest.json").open("w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise IndexFormatError(
            f"{out} exists, is not empty and is not a hippo-gpu index; refusing to replace it")
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    path = Path(index_dir) / "manifest.json"
    if not path.exists():
        raise IndexFormatError(f"{path}: missing; {index_dir} is not a hippo-gpu index")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{path}: corrupt JSON ({e})") from e
    if manifest.get("format") != FORMAT:
        raise IndexFormatError(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: format version {version}, this hippo-gpu reads version {FORMAT_VERSION}; "
            "rebuild the index")
    return manifest


def read_index_dir(
    index_dir: str | Path, *, verify: bool = True
) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """Read and verify an index dir: (manifest, tensor groups, tables)."""
    root = Path(index_dir)
    manifest = read_manifest(root)
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    tables: dict[str, Any] = {}
    for name, meta in manifest.get("files", {}).items():
        path = root / name
        if not path.exists():
            raise IndexFormatError(f"{path}: missing (listed in manifest.json)")
        if verify and sha256_file(path) != meta.get("sha256"):
            raise IndexFormatError(
                f"{path}: checksum mismatch, the file is corrupt or was modified; "
                "rebuild the index")
        try:
            if name.endswith(".safetensors"):
                tensors[name.removesuffix(".safetensors")] = load_file(str(path))
            elif name.endswith(".json"):
                tables[name.removesuffix(".json")] = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # noqa: BLE001 - re-raised with the file named
            raise IndexFormatError(f"{path}: unreadable ({e})") from e
    return manifest, tensors, tables
