"""Resumable parts: the crash-safe protocol of the batch jobs (hippo_gpu.retrieval.batch on this
machine, hippo_gpu.distributed.ray_batch on Ray).

A job that writes one large output OUT keeps its progress in a folder beside it:

    OUT.parts/RUN_FILE        {"identity": {...}, ...}: what makes two runs the same run (the
                              arguments, the input file's size and mtime, the index version),
                              and what the job saved when it started (the Ray job's chunk plan)
    OUT.parts/PART(n)         committed part n, in the job's own format (JSON Lines, Parquet)
    OUT.parts/.NAME.tmp-*     a file whose writer died before its rename (write_atomic)

The rules, which together give every input row exactly once in OUT, in input order, however
often a run is killed and rerun:
- Part n holds exactly the rows that n stands for in this run (fixed by the identity and what
  was saved with it) and is written by durable.write_atomic, so it is complete or absent, and
  committing it twice writes the same rows under the same name.
- A rerun with the same identity removes the temporary files and skips the committed numbers;
  one with another identity is refused, naming the keys that differ, as is a folder that holds
  another job's run file or anything else without this job's run file. Parts of two runs are
  never mixed.
- The join reads parts 0..n-1 in order, after checking that none is missing, writes OUT
  atomically, and then the folder is removed.
A full disk at any of these writes raises DiskFullError naming the file and leaves what a kill
there would (less the temporary file): the rerun, once there is space, resumes.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hippo_gpu.data import DataFormatError
from hippo_gpu.storage.durable import naming_full_disk, write_atomic

__all__ = ["RunParts"]

_TEMP = ".*.tmp-*"  # durable.write_atomic's temporary names


class RunParts:
    """The parts folder of one resumable run (see the module docstring).

    Args:
        folder: the parts folder (`RunParts.beside(out, ...)` names it OUT.parts).
        run_file: the job's run file name ("run.json", "ray-run.json"): a folder holding another
            job's `*run.json` is refused.
        part: the part file name pattern, with one integer field: "part-{:06d}.jsonl".
    """

    def __init__(self, folder: str | Path, *, run_file: str, part: str) -> None:
        self.dir = Path(folder)
        self.run_file = run_file
        self.part = part
        head, _, tail = part.partition("{")
        self._number = re.compile(
            rf"^{re.escape(head)}(\d+){re.escape(tail.partition('}')[2])}$")

    @classmethod
    def beside(cls, out: str | Path, *, run_file: str, part: str) -> RunParts:
        """The parts folder of output `out`: OUT.parts, in the same folder."""
        out = Path(out)
        return cls(out.with_name(out.name + ".parts"), run_file=run_file, part=part)

    def path(self, n: int) -> Path:
        """Part n's file."""
        return self.dir / self.part.format(n)

    def resume(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The run file's content when the folder holds this run (its temporary files are
        removed), else None (no run started yet). Raises DataFormatError for parts of another
        run, or a folder this job did not make."""
        run = self.dir / self.run_file
        if run.exists():
            saved = json.loads(run.read_text(encoding="utf-8"))
            before = saved.get("identity", {}) if isinstance(saved, dict) else {}
            diff = sorted(k for k in identity if before.get(k) != identity[k])
            if diff:
                raise DataFormatError(
                    f"{self.dir} holds parts of another run (differs in {', '.join(diff)}); "
                    "rerun that command, or remove it to start over")
            self._remove_temporary()
            return saved
        if self.dir.exists():
            found = sorted(p.name for p in self.dir.iterdir() if not p.match(_TEMP))
            runs = [name for name in found if name.endswith("run.json")]
            if runs:
                raise DataFormatError(
                    f"{self.dir} holds parts of another kind of run ({runs[0]}); finish it "
                    "with the command that started it, or remove it")
            if found:
                raise DataFormatError(f"{self.dir} exists but holds no {self.run_file}; "
                                      "remove it")
        return None

    def start(self, identity: dict[str, Any], **saved: Any) -> dict[str, Any]:
        """Create the folder and commit the run file {"identity": identity, **saved} (call
        after `resume` returned None). Returns that content."""
        with naming_full_disk(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        self._remove_temporary()
        content = {"identity": identity, **saved}
        write_atomic(self.dir / self.run_file, json.dumps(content))
        return content

    def commit(self, n: int, data: str | bytes | Callable[[Path], None]) -> None:
        """Commit part n (write_atomic: text, bytes or a function writing the file)."""
        write_atomic(self.path(n), data)

    def committed(self) -> frozenset[int]:
        """The numbers of the committed parts."""
        return frozenset(int(m.group(1)) for p in self.dir.iterdir()
                         if (m := self._number.match(p.name)))

    def in_order(self, n: int) -> list[Path]:
        """Parts 0..n-1 in order, for the join; RuntimeError when one is missing."""
        paths = [self.path(i) for i in range(n)]
        missing = [i for i, p in enumerate(paths) if not p.exists()]
        if missing:
            raise RuntimeError(f"{self.dir}: parts {missing[:5]} are not committed")
        return paths

    def remove(self) -> None:
        """Remove the folder (after the join committed OUT)."""
        shutil.rmtree(self.dir)

    def _remove_temporary(self) -> None:
        for tmp in self.dir.glob(_TEMP):
            tmp.unlink(missing_ok=True)
