"""No page cites a path, a name or a results line that does not exist.

The pages (README.md, docs/*.md, kernels/README.md) and the benchmarks' docstrings are scanned
for repository paths (``hippo_gpu/ppr/basis.py``, ``tests/...py::test_name``,
``benchmarks/bench_scale.py``, a ``*`` glob), ``python -m benchmarks.NAME`` modules, dotted
names (``hippo_gpu.versions.load.refresh_index``, and ``versions.load.refresh_index`` or
``placed_rows.PendingRows`` in backticks, which name a module of the package by its path or its
file name) and results lines (``bench_scale.jsonl:16``). Names are resolved in the sources'
syntax trees, not by importing: a module that needs an optional extra (Ray, vLLM, Triton) is
checked the same way as the others.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "hippo_gpu"
# the kernels folder is shipped as hippo_gpu.kernels (pyproject's package-dir)
PACKAGE_DIRS = {("hippo_gpu", "kernels"): REPO / "kernels" / "src"}

PATH = re.compile(r"(?<![\w./-])((?:hippo_gpu|tests|benchmarks|kernels|docs)/[\w./*-]*\w"
                  r"\.(?:py|md|sh|jsonl|json|png|txt))(?![\w-])(?:::(\w+))?")
RUN_MODULE = re.compile(r"python -m (benchmarks\.[a-z0-9_]+)")
DOTTED = re.compile(r"(?<![\w./-])(hippo_gpu(?:\.\w+)+)")
BACKTICKED = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)+)(?:\(\))?`")
CITE = re.compile(r"\b([A-Za-z0-9_]+\.jsonl):(\d+)\b")
# backticked names whose first part is a module's name but, in the pages, as often a variable
# (`index.adjacency`, `ranking.stage_seconds`, `config.query_backend`), or a file's name
VARIABLE_LIKE = {"index", "ranking", "config", "results"}
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "safetensors", "sh", "txt", "toml", "png"}


@cache
def pages() -> dict[str, str]:
    """Name -> text of every page and benchmark docstring that the test reads."""
    out = {"README.md": (REPO / "README.md").read_text(encoding="utf-8"),
           "kernels/README.md": (REPO / "kernels" / "README.md").read_text(encoding="utf-8")}
    for path in sorted((REPO / "docs").glob("*.md")):
        out[f"docs/{path.name}"] = path.read_text(encoding="utf-8")
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = [ast.get_docstring(node) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))]
        out[f"benchmarks/{path.name}"] = "\n".join(d for d in docs if d)
    return out


@cache
def module_file(parts: tuple[str, ...]) -> Path | None:
    """The source of module `parts` (("hippo_gpu", "ppr", "basis")), None if there is none."""
    for prefix, folder in PACKAGE_DIRS.items():
        if parts[:len(prefix)] == prefix:
            base = folder.joinpath(*parts[len(prefix):])
            break
    else:
        base = REPO.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names bound at the level of `body` (defs, classes, assignments, imports, fields)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # TYPE_CHECKING, optional imports
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *[s for h in getattr(node, "handlers", []) for s in h.body]]
            names.update(_defined(inner))
    return names


@cache
def module_names(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _defined(tree.body)
    # lazy attributes of a package: {"build_index": "hippo_gpu.indexing.build", ...}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    names.setdefault(key.value, node)
    return names


def resolves(dotted: str) -> bool:
    """Whether `dotted` (hippo_gpu.a.b.Name.attr) names a module, or a name in one."""
    parts = tuple(dotted.split("."))
    for cut in range(len(parts), 0, -1):
        path = module_file(parts[:cut])
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if path.name == "__init__.py" and module_file(parts[:cut + 1]) is not None:
            continue  # a submodule: handled by a longer cut (never reached)
        names = module_names(path)
        node = names.get(rest[0])
        if node is None:
            return False
        if len(rest) > 1 and isinstance(node, ast.ClassDef):
            members = _defined(node.body)
            init = members.get("__init__")
            if isinstance(init, ast.FunctionDef):  # self.x = ... in __init__
                members |= {t.attr: t for t in ast.walk(init)
                            if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)}
            return rest[1] in members
        return True
    return False


@cache
def module_stems() -> dict[str, list[tuple[str, ...]]]:
    """File or folder name -> the module paths with that name (`placed_rows` -> versions...)."""
    stems: dict[str, list[tuple[str, ...]]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        stems.setdefault(parts[-1], []).append(parts)
    return stems


def backticked_resolves(name: str) -> bool | None:
    """A backticked `a.b.c` whose first part is a module of the package: does it resolve?
    None when the first part names no module (another library, an attribute path, a file)."""
    first, *rest = name.split(".")
    if first in VARIABLE_LIKE or rest[-1] in FILE_SUFFIXES:
        return None
    candidates = [*module_stems().get(first, [])]
    if (PACKAGE / first).is_dir() or (PACKAGE / f"{first}.py").is_file():
        candidates.append(("hippo_gpu", first))
    if not candidates:
        return None
    return any(resolves(".".join((*c, *rest))) for c in candidates)


def test_the_scan_finds_the_kinds_of_reference_it_checks() -> None:
    text = "\n".join(pages().values())
    assert len(PATH.findall(text)) > 50 and len(DOTTED.findall(text)) > 5
    assert resolves("hippo_gpu.versions.load.refresh_index")
    assert resolves("hippo_gpu.retrieval.searcher.Searcher.warm_up")
    assert resolves("hippo_gpu.load_index") and resolves("hippo_gpu.kernels.ppr_cpu")
    assert not resolves("hippo_gpu.ppr._pick_backend")
    assert backticked_resolves("placed_rows.PendingRows") is True
    assert backticked_resolves("versions.load.no_such_name") is False
    assert backticked_resolves("torch.topk") is None


@pytest.mark.parametrize("name", sorted(pages()))
def test_every_cited_path_and_name_exists(name: str) -> None:
    text = pages()[name]
    missing = []
    for m in PATH.finditer(text):
        path, test = m[1], m[2]
        found = sorted(REPO.glob(path)) if "*" in path else [REPO / path]
        if not found or not all(p.exists() for p in found):
            # a benchmark's docstring names its results file before its first run
            if not (name.startswith("benchmarks/") and path.startswith("benchmarks/results/")):
                missing.append(path)
        elif test and not any(f"def {test}(" in p.read_text(encoding="utf-8") for p in found):
            missing.append(f"{path}::{test}")
    for m in RUN_MODULE.finditer(text):
        if module_file(tuple(m[1].split("."))) is None:
            missing.append(f"python -m {m[1]}")
    for m in DOTTED.finditer(text):
        if not resolves(m[1].rstrip(".")):
            missing.append(m[1])
    for m in BACKTICKED.finditer(text):
        if not m[1].startswith("hippo_gpu.") and backticked_resolves(m[1]) is False:
            missing.append(f"`{m[1]}`")
    assert not missing, f"{name} cites what does not exist: {sorted(set(missing))}"


def test_every_cited_results_line_exists() -> None:
    results = REPO / "benchmarks" / "results"
    missing = []
    for name, text in pages().items():
        for m in CITE.finditer(text):
            path = results / m[1]
            count = len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0
            if not 1 <= int(m[2]) <= count:
                missing.append(f"{name}: {m[1]}:{m[2]}")
    assert not missing, f"cites of results lines that do not exist: {missing}"
