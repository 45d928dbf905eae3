"""The index directory: versioned, atomic, checksummed (safetensors + JSON; nothing executable).

Layout of an index directory DIR:

    DIR/manifest.json     the commit point: names the current version, its base directory and
                          the segments after it, every file's sha256 and size, the config,
                          encoder identity, counts and basis summary (of the current version;
                          the base's own counts as base_counts once segments follow it): what
                          `hippo-gpu stats` prints without reading a tensor (manifest_stats)
    DIR/v000007/          a base: one version's full files: graph.safetensors,
                          embeddings.safetensors, basis.safetensors (the passage basis, when
                          the index has one: a version without it loads with none),
                          tables.json, one NAME.strings per string table (and .readers, the
                          readers' lock file)
    DIR/s000008/          a segment: what one commit changed since the version before it
                          (change.safetensors, change.json; hippo_gpu.versions.load), replayed on
                          the base by a load; later perhaps basis.safetensors + basis.json, the
                          passage basis of that version brought current by a low-rank update
                          (hippo_gpu.versions.live_basis), written after the commit by whoever
                          computed it (`write_segment_basis`)
    DIR/.writer.lock      the single-writer lock (flock; the OS releases it if a writer dies;
                          this and .server.lock: storage/locks.py)
    DIR/.server.lock      held shared by every server that writes DIR (`serve --writable`) for its
                          life (`claim_for_serving`): a new base replacing DIR's content (a
                          build's save, `hippo-gpu index --replace`) is refused while one runs

Loading is lazy: safetensors files are memory-mapped (copy-on-write: a tensor is writable in the
reader's process without touching the file) and a `.strings` file (int64 n, int64 offsets[n + 1],
UTF-8 blob: tables.StringTable) is memory-mapped and decoded row by row on access, so a 1M-passage
base loads in the time of its checksums (storage/durable.py's sha256_files: up to 4 at a time).
Format 4 (this one) added segments; format 3 (one full version per commit) reads as a base
without segments, format 2 is refused with the command that rebuilds it.

A commit (`write_segment`) or a new base (`prepare_base` + `install_base`: a compaction, or
`write_version`: a build's save) writes its directory under a temporary name, fsyncs every file,
renames it to sNNNNNN or vNNNNNN, fsyncs DIR, then replaces manifest.json atomically (write a
temporary file, fsync, rename, fsync DIR) and returns the manifest it wrote, which the writer
keeps (nothing reads it back). A writer killed at any point therefore leaves manifest.json
naming either the old version or the new one, each complete and verifiable; leftovers of a
killed writer (temporary directories, directories no manifest names) are removed by the next
writer or by `collect_garbage`. A reader reads manifest.json once and then only the files of the
directories it names, holding a shared lock on each one's `.readers` file while it reads, so
garbage collection (which needs the exclusive lock) never deletes files under a reader. Files
and directories get the user's umask permissions.

A full disk (ENOSPC, or EDQUOT for a spent quota) at any write of a commit raises DiskFullError
naming the file, and means the same as a kill before the manifest's rename: the manifest names
the old version, and the version directory of the failed commit is removed at once (its space
freed) since nothing names it. The manifest's rename is the commit point in both directions:
a step before it that fails raises, and nothing after it raises (a failed fsync of DIR is
logged, garbage collection is best effort), so an exception always means "not committed" and
a retry cannot commit the same change twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.storage.durable import (
    fsync_path,
    naming_full_disk,
    sha256_file,
    sha256_files,
    umask,
    write_atomic,
)
from hippo_gpu.storage.locks import WRITER_LOCK

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

FORMAT = "hippo-gpu-index"
FORMAT_VERSION = 4
READABLE_VERSIONS = (3, 4)  # 3: one full version per commit (no segments); reads as 4's base
MANIFEST = "manifest.json"
READERS_LOCK = ".readers"
_VERSION = re.compile(r"^[vs](\d{6})$")  # a base (vNNNNNN) or a segment (sNNNNNN)

# A commit's steps in order; `on_step(name)` is called before each (fault-injection tests kill
# the writer there).
COMMIT_STEPS = ("write_files", "fsync_files", "rename_version", "write_manifest",
                "rename_manifest", "collect_garbage")


class IndexFormatError(HippoGpuError, ValueError):
    """An index directory is missing, corrupt, of another format version or incompatible."""


def is_index_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def _versions(root: Path) -> list[int]:
    out = []
    for p in root.iterdir() if root.is_dir() else []:
        m = _VERSION.match(p.name)
        if m and p.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def _write_dir(root: Path, name: str, tensors: dict[str, dict[str, torch.Tensor]],
               tables: dict[str, Any], strings: dict[str, Sequence[str]],
               step: Callable[[str], None],
               hold: contextlib.ExitStack | None = None) -> dict[str, dict[str, Any]]:
    """Write one version directory root/name (a base or a segment): files under a temporary
    name, fsync each, rename the directory, fsync root. Returns the manifest's file entries.

    With `hold`, a shared lock on the directory's `.readers` is taken before anything is
    written and kept in `hold` (the lock follows the file through the rename), so no garbage
    collection removes the directory before a manifest names it (a background compaction)."""
    # numpy and torch are imported here and in _read_files, not with the module: what reads
    # only the manifest (`hippo-gpu stats`, `manifest_stats`) imports neither
    from hippo_gpu.storage.safetensors_io import save_safetensors_stream
    from hippo_gpu.tables import StringTable

    tmp = root / f".tmp-{name}-{os.getpid()}"
    final = root / name
    if tmp.exists():
        shutil.rmtree(tmp)
    renamed = False
    try:
        with naming_full_disk(tmp):
            tmp.mkdir()
            if hold is not None:
                lock_file = hold.enter_context((tmp / READERS_LOCK).open("a"))
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_SH)
        step("write_files")
        files: dict[str, dict[str, Any]] = {}
        written: list[Path] = []
        for group, group_tensors in tensors.items():
            path = tmp / f"{group}.safetensors"
            with naming_full_disk(path):
                save_safetensors_stream(group_tensors, path)
            written.append(path)
        for group, table in tables.items():
            path = tmp / f"{group}.json"
            with naming_full_disk(path), path.open("w", encoding="utf-8") as f:
                f.write(json.dumps(table, ensure_ascii=False))
            written.append(path)
        for name_, texts in strings.items():
            path = tmp / f"{name_}.strings"
            with naming_full_disk(path):
                (texts if isinstance(texts, StringTable) else StringTable.from_strings(texts)) \
                    .write(path)
            written.append(path)
        with naming_full_disk(tmp / READERS_LOCK):
            (tmp / READERS_LOCK).touch()
        step("fsync_files")
        mode = 0o666 & ~umask()  # safetensors writes 0600: give files the user's permissions
        for path in written:
            os.chmod(path, mode)
            with naming_full_disk(path):
                fsync_path(path)
            files[f"{name}/{path.name}"] = {"sha256": sha256_file(path),
                                            "bytes": path.stat().st_size}
        with naming_full_disk(final):
            fsync_path(tmp)
            step("rename_version")
            os.rename(tmp, final)
            renamed = True
            fsync_path(root)
    except BaseException:
        # no manifest names the directory yet: remove it whole, which also frees what it took
        # on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:
            shutil.rmtree(final, ignore_errors=True)
        raise
    return files


def _next_version(root: Path, current: dict[str, Any]) -> int:
    """The number of the next version directory: above every one on disk and above the
    current manifest's version (`current`: {} for a directory without a manifest)."""
    existing = _versions(root)
    return max(existing[-1] if existing else 0, int(current.get("version", 0))) + 1


def _commit_manifest(root: Path, full: dict[str, Any],
                     step: Callable[[str], None]) -> dict[str, Any]:
    """Replace the manifest with `full`: the rename is the commit point, and this raises only
    when it did not happen (write_atomic); removing old versions after it is best effort (what
    it leaves, the next collection removes). Returns the manifest as `read_manifest` would read
    it now (JSON's types: parsed from the text written, not from the disk)."""
    step("write_manifest")
    text = json.dumps(full, indent=2, sort_keys=True)
    write_atomic(root / MANIFEST, text, before_replace=lambda: step("rename_manifest"))
    written: dict[str, Any] = json.loads(text)
    step("collect_garbage")
    try:
        collect_garbage(root, written)
    except OSError as e:
        log.warning("%s: committed version %s; removing old versions failed (%s), the next "
                    "commit removes them", root, full.get("version"), e)
    return written


def discard_version(index_dir: str | Path, name: str) -> None:
    """Remove a version directory whose commit failed (a segment whose manifest was not
    written, a prepared base that `install_base` did not make current): no manifest names it,
    and on a full disk removing it frees what it took. A directory the manifest names is
    kept."""
    root = Path(index_dir).resolve()
    named = False
    if is_index_dir(root):
        manifest = read_manifest(root)
        named = name in {base_name(manifest), *(s["name"] for s in manifest.get("segments", []))}
    if not named and _VERSION.match(name):
        shutil.rmtree(root / name, ignore_errors=True)


def prepare_base(
    index_dir: str | Path,
    tensors: dict[str, dict[str, torch.Tensor]],
    tables: dict[str, dict[str, Any]],
    strings: dict[str, Sequence[str]] | None,
    *,
    hold: contextlib.ExitStack,
    on_step: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, dict[str, Any]]]:
    """Write a base directory vNNNNNN that no manifest names yet (`install_base` makes it
    current); `hold` keeps it safe from garbage collection until then. It needs no writer lock:
    a compaction writes its base while commits go on. Returns (name, file entries)."""
    step = on_step or (lambda name: None)
    root = Path(index_dir).resolve()
    name = f"v{_next_version(root, read_manifest(root) if is_index_dir(root) else {}):06d}"
    return name, _write_dir(root, name, tensors, tables, strings or {}, step, hold)


def install_base(index_dir: str | Path, name: str, files: dict[str, dict[str, Any]],
                 manifest: dict[str, Any], base_from: int | None, *,
                 on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Make a prepared base current (the caller holds the writer lock). `manifest`: the base's
    own fields (config, encoder, counts, report); `base_from`: the version it copies.

    The segments committed after `base_from` stay in the chain (they apply to that version's
    content, which the base holds), so a compaction loses no commit made while it ran; if there
    are none, the base is the new current version (its number). Returns the manifest written
    (its "version": the current version)."""
    step = on_step or (lambda name: None)
    root = Path(index_dir).resolve()
    current = read_manifest(root) if is_index_dir(root) else {}
    later = [s for s in current.get("segments", [])
             if base_from is not None and int(s["version"]) > base_from]
    version = int(current["version"]) if later else int(name[1:])
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "version": version,
            "base": name, "files": files, "segments": later,
            "base_from": version if base_from is None else int(base_from)}
    if later:  # the top level describes the current version; the base's own fields apart
        full.update({"counts": current.get("counts"),
                     "openie_report": current.get("openie_report"),
                     "basis": None,  # a replayed version has none (versions/load.py)
                     "base_counts": manifest.get("counts"),
                     "base_openie_report": manifest.get("openie_report")})
    return _commit_manifest(root, full, step)


def write_version(
    index_dir: str | Path,
    manifest: dict[str, Any],
    tensors: dict[str, dict[str, torch.Tensor]],
    tables: dict[str, dict[str, Any]],
    strings: dict[str, Sequence[str]] | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
    base_from: int | None = None,
) -> dict[str, Any]:
    """Commit a new base version of the index at `index_dir` (the caller holds the writer lock):
    a full copy, with no segments after it (`prepare_base` then `install_base`).

    Writes `{name}.safetensors` per tensor group, `{name}.json` per table and `{name}.strings`
    per string table (tables.StringTable's file) into a new version directory vNNNNNN, then
    makes it current by replacing manifest.json (see the module docstring). Refuses a non-empty
    directory that is not an index. Returns the manifest written.

    `base_from`: the version whose content this base holds (a compaction copies the current
    version; default: the new version itself), so a reader holding it needs no reload.
    """
    root = Path(index_dir).resolve()
    if root.exists() and any(p for p in root.iterdir() if p.name != WRITER_LOCK) \
            and not is_index_dir(root):
        raise IndexFormatError(
            f"{root} exists, is not empty and is not a hippo-gpu index; refusing to write there")
    with naming_full_disk(root):
        root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as hold:
        name, files = prepare_base(root, tensors, tables, strings, hold=hold, on_step=on_step)
        try:
            return install_base(root, name, files, manifest, base_from, on_step=on_step)
        except BaseException:
            discard_version(root, name)
            raise


def write_segment(
    index_dir: str | Path,
    manifest: dict[str, Any],
    tensors: dict[str, dict[str, torch.Tensor]],
    tables: dict[str, dict[str, Any]],
    *,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Commit a new version as a segment (sNNNNNN: what changed since the current version)
    appended to the current manifest's chain; `manifest` updates its top-level fields (counts,
    report). The caller holds the writer lock. Returns the manifest written (its "version":
    the new version's number)."""
    step = on_step or (lambda name: None)
    root = Path(index_dir).resolve()
    current = read_manifest(root)
    version = _next_version(root, current)
    name = f"s{version:06d}"
    files = _write_dir(root, name, tensors, tables, {}, step)
    segments = [*current.get("segments", []), {"name": name, "version": version,
                                                "files": files}]
    # the base's own counts and report stay readable: the top level describes the new version
    kept = {k: current[f"base_{k}"] if f"base_{k}" in current else current.get(k)
            for k in ("counts", "openie_report")}
    full = {**current, **manifest, "format_version": FORMAT_VERSION, "version": version,
            "base": base_name(current), "segments": segments,
            "base_counts": kept["counts"], "base_openie_report": kept["openie_report"],
            "base_from": current.get("base_from", current.get("version")),
            "basis": None}  # a replayed version carries no basis (versions/load.py)
    try:
        return _commit_manifest(root, full, step)
    except BaseException:
        discard_version(root, name)
        raise


def base_name(manifest: dict[str, Any]) -> str:
    """The base version directory a manifest names (format 3: the version itself)."""
    return str(manifest.get("base") or f"v{int(manifest.get('version', 0)):06d}")


def collect_garbage(index_dir: str | Path,
                    manifest: dict[str, Any] | None = None) -> list[str]:
    """Remove what no manifest names: older versions no reader holds, and a killed writer's
    temporary files. Call with the writer lock held. `manifest`: the current one when the
    caller has it (it just wrote it), else it is read. Returns the removed names."""
    root = Path(index_dir)
    named: set[str] | None = None
    if manifest is None and is_index_dir(root):
        manifest = read_manifest(root)
    if manifest is not None:
        named = {base_name(manifest), *(seg["name"] for seg in manifest.get("segments", []))}
    removed = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-") or p.name.startswith(f".{MANIFEST}.tmp-"):
            if p.is_dir():
                if not _remove_unheld(p):
                    continue  # a background compaction is writing it
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
            continue
        m = _VERSION.match(p.name)
        # without a manifest no version is known to be garbage: keep them all
        if not m or not p.is_dir() or named is None or p.name in named:
            continue
        if _remove_unheld(p):
            removed.append(p.name)
    return removed


def _remove_unheld(path: Path) -> bool:
    """Remove a version directory unless a reader (or a compaction writing it) holds its
    `.readers` lock; whether it was removed."""
    lock = path / READERS_LOCK
    if not lock.exists():
        shutil.rmtree(path, ignore_errors=True)
        return True
    try:  # flock takes an exclusive lock on a read-only descriptor: nothing is written
        with lock.open("r") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        return True
    except OSError:  # held: the next collection removes it
        return False


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise IndexFormatError(f"{path}: missing; {index_dir} is not a hippo-gpu index")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{path}: corrupt JSON ({e})") from e
    if manifest.get("format") != FORMAT:
        raise IndexFormatError(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise IndexFormatError(
            f"{path}: format version {version}, this hippo-gpu reads version {FORMAT_VERSION}; "
            f"rebuild the index from its corpus and OpenIE files: hippo-gpu index --corpus "
            f"CORPUS.json --openie OPENIE.json --out {Path(index_dir)} (or build_index(...) in "
            "Python)")
    return manifest


def basis_stats(summary: dict[str, Any] | None) -> dict[str, Any]:
    """The basis_* entries of Index.stats of a basis summary (indexing/index.py's
    basis_summary: the manifest's "basis"; None: no basis)."""
    if summary is None:
        return {"basis_bytes": 0, "basis_seconds": 0.0, "basis_steps": 0, "basis_damping": None}
    return {"basis_bytes": int(summary["bytes"]), "basis_seconds": round(summary["seconds"], 4),
            "basis_steps": int(summary["steps"]), "basis_damping": summary["damping"]}


def manifest_stats(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """`Index.stats()` of the version a manifest names, from the manifest alone (no tensor is
    read, nothing but this module and the config is imported): its counts and OpenIE report,
    its embedding dimension and encoder, the precision a CPU load has (float32) and its basis
    summary. Every one is what `load_index(dir, device="cpu").stats()` gives, since a commit
    writes the manifest from the very Index it computed: the top-level counts, report and
    "basis" describe the current version (a version with segments has no basis: it is a
    replay), the same numbers a load's replay arrives at. The counts come in the manifest's
    key order.

    Returns None for a manifest that lacks one of them (written before the "basis" summary
    was recorded, or format 3): the caller loads the index instead.
    """
    from hippo_gpu.config import IndexConfig

    try:
        if "basis" not in manifest:
            return None
        out: dict[str, Any] = {k: int(v) for k, v in manifest["counts"].items()}
        report = manifest.get("openie_report") or {}
        out["malformed_triples"] = int(report.get("malformed_triples", 0))
        out["passages_without_triples"] = int(report.get("passages_without_triples", 0))
        out["embedding_dim"] = int(manifest["encoder"]["dim"])
        out["encoder"] = IndexConfig.from_dict(manifest["config"]).encoder.model
        out["precision"] = "float32"
        # a version with segments is a replay, which has no basis (whatever an older writer
        # left in "basis")
        out.update(basis_stats(None if manifest.get("segments") else manifest["basis"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return out


Files = tuple[dict[str, dict[str, "torch.Tensor"]], dict[str, Any]]  # (tensor groups, tables)

SEGMENT_BASIS = "basis.safetensors"  # a segment's updated passage basis (optional)
SEGMENT_BASIS_RECORD = "basis.json"  # its checksum and size: written last, the file's commit


def write_segment_basis(index_dir: str | Path, version: int,
                        tensors: dict[str, torch.Tensor]) -> bool:
    """Store the passage basis of segment version `version` beside its change (once: a
    segment that has one keeps it). The tensor file and then its record are each replaced
    atomically (durable.write_atomic), so a reader sees no record, or a record and the file it
    describes. The manifest does not name the file: a segment stays valid without it, and a
    reader that finds the record checks the file against it (`read_index_dir`). Needs no writer
    lock (whoever computed the basis may store it). Returns False when the segment directory is
    gone (a compaction replaced the chain) or already has a basis."""
    from hippo_gpu.storage.safetensors_io import save_safetensors_stream

    seg = Path(index_dir) / f"s{int(version):06d}"
    record = seg / SEGMENT_BASIS_RECORD
    if not (seg / READERS_LOCK).exists() or record.exists():
        return False
    path = seg / SEGMENT_BASIS
    write_atomic(path, lambda tmp: save_safetensors_stream(tensors, tmp))
    write_atomic(record, json.dumps({"version": int(version), "sha256": sha256_file(path),
                                     "bytes": path.stat().st_size}))
    return True


def _segment_basis(root: Path, name: str, version: int,
                   verify: bool) -> dict[str, torch.Tensor] | None:
    """A segment's stored basis (`write_segment_basis`), or None when it has none or the file
    does not match its record (logged: the version loads without it, as before it existed)."""
    from hippo_gpu.storage.safetensors_io import load_safetensors_mmap

    record_path = root / name / SEGMENT_BASIS_RECORD
    if not record_path.exists():
        return None
    path = root / name / SEGMENT_BASIS
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        ok = int(record["version"]) == version and path.stat().st_size == record["bytes"] and \
            (not verify or sha256_file(path) == record["sha256"])
        if ok:
            return load_safetensors_mmap(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable stored basis, loading without it (%s)", path, e)
        return None
    log.warning("%s: does not match %s, loading without it", path, record_path.name)
    return None


def read_index_dir(
    index_dir: str | Path, *, verify: bool = True, after: int | None = None,
) -> tuple[dict[str, Any], Files | None, list[tuple[int, Files]]]:
    """Read and verify the current version of an index dir: (manifest, base files, segments).

    The manifest is read once; the files of the base and of every segment it names are read
    under their directories' shared readers locks, so a concurrent commit or garbage collection
    cannot change what is read. With `after` (a version the caller holds, whose base is the
    manifest's too) the base is not read (None) and only the segments of later versions are:
    what a reader needs to move to the current version. Segments come as (version, files);
    the newest segment that stores a basis (`write_segment_basis`) has it as tensor group
    "basis".
    """
    root = Path(index_dir)
    for _attempt in range(3):
        manifest = read_manifest(root)
        names = [] if after is not None else [base_name(manifest)]
        segs = [s for s in manifest.get("segments", [])
                if after is None or int(s["version"]) > after]
        names += [s["name"] for s in segs]
        with contextlib.ExitStack() as stack:
            retry = False
            for name in names:
                try:
                    lock_file = stack.enter_context((root / name / READERS_LOCK).open("r"))
                except FileNotFoundError:
                    if is_index_dir(root) and read_manifest(root).get("version") != \
                            manifest.get("version"):
                        retry = True  # a commit and a collection ran between the reads
                        break
                    raise IndexFormatError(f"{root / name}: missing (named by {MANIFEST})") \
                        from None
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_SH)
                if os.fstat(lock_file.fileno()).st_nlink == 0:
                    retry = True  # a collection removed it between open() and flock()
                    break
            if retry:
                continue
            files = manifest.get("files", {})
            base = _read_files(root, files, verify) if after is None else None
            segments = [(int(s["version"]), _read_files(root, s["files"], verify))
                        for s in segs]
            # the newest stored basis only (an older one would only be replaced by it),
            # read under its segment's readers lock like the change
            for (version, (tensors, _)), seg in reversed(list(zip(segments, segs))):
                basis = _segment_basis(root, seg["name"], version, verify)
                if basis is not None:
                    tensors[SEGMENT_BASIS.removesuffix(".safetensors")] = basis
                    break
            return manifest, base, segments
    raise IndexFormatError(f"{root}: the index changed three times while being read")


def _read_files(root: Path, files: dict[str, Any], verify: bool) -> Files:
    from hippo_gpu.storage.safetensors_io import load_safetensors_mmap
    from hippo_gpu.tables import StringTable

    tensors: dict[str, dict[str, torch.Tensor]] = {}
    tables: dict[str, Any] = {}
    paths = [root / name for name in files]
    if missing := [p for p in paths if not p.exists()]:
        raise IndexFormatError(f"{missing[0]}: missing (listed in {MANIFEST})")
    if verify:
        digests = sha256_files(paths)
        if bad := [p for p, d, m in zip(paths, digests, files.values()) if d != m.get("sha256")]:
            raise IndexFormatError(f"{bad[0]}: checksum mismatch, the file is corrupt or was "
                                   "modified; rebuild the index")
    else:  # the check that costs a stat: a truncated, grown or replaced file
        for path, meta in zip(paths, files.values()):
            if meta.get("bytes") is not None and path.stat().st_size != meta["bytes"]:
                raise IndexFormatError(f"{path}: not the size {MANIFEST} records, the file is "
                                       "corrupt or was modified; rebuild the index")
    for name, path in zip(files, paths):
        key = Path(name).name
        try:
            if key.endswith(".safetensors"):
                tensors[key.removesuffix(".safetensors")] = load_safetensors_mmap(path)
            elif key.endswith(".json"):
                tables[key.removesuffix(".json")] = json.loads(path.read_text(encoding="utf-8"))
            elif key.endswith(".strings"):
                tables[key.removesuffix(".strings")] = StringTable.open(path)
        except Exception as e:  # noqa: BLE001 - re-raised with the file named
            raise IndexFormatError(f"{path}: unreadable ({e})") from e
    return tensors, tables
