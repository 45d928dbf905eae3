"""SearcherSpec: what opens a Searcher (index directory, device, precisions, query encoder,
threads, warm-up), as one frozen, picklable value.

Every command that serves or answers queries from an index directory (`serve`, `mcp`,
`retrieve`, `eval`, and their Ray replicas and actors) opens its searcher with
`SearcherSpec(...).open()`, so the recipe (threads, `load_index`, `Searcher`, warm-up) is written
once, and a Ray replica receives one small value that it opens itself instead of a list of
settings handed on from call to call.

    spec = SearcherSpec(Path("my_index"), device="cuda", precision="bfloat16", warm_up=True)
    searcher = spec.open()  # == Searcher(load_index(...), ...) warmed up on "dense", "hipporag2"

The spec checks its own fields (ValueError naming the field) when it is made, on the machine
that makes it; whether its device exists is checked where it is opened (a driver without a GPU
may send a spec with device "cuda" to a GPU replica).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from hippo_gpu.config import MODES, PRECISIONS, EncoderConfig, RetrievalConfig
from hippo_gpu.device import check_device, resolve_device, set_threads
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.modes import mode_of
from hippo_gpu.retrieval.options import SearcherOptions
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.versions.load import load_index

__all__ = ["DEFAULT_WARM_UP", "SearcherSpec"]

DEFAULT_WARM_UP = ("dense", "hipporag2")  # Searcher.warm_up's modes; `warm_up=True` means these


@dataclass(frozen=True)
class SearcherSpec:
    """How to open a `Searcher` on an index directory.

    Attributes:
        index: the index directory (a str is taken as a path). A spec sent to other machines
            (Ray) needs a path that every node reads at the same place.
        device: "auto", "cpu", "cuda" or e.g. "cuda:1" (resolved by hippo_gpu.device at open).
        precision: dtype of the index's embeddings on the device, hence of its cosines
            (hippo_gpu.config.PRECISIONS; load_index(precision=...)).
        options: how the searcher runs its queries: query encoder precision, batch size,
            backend and cache (hippo_gpu.retrieval.options.SearcherOptions; its server URL is
            `encoder_model`'s, below).
        threads: torch CPU threads, set when the spec is opened (None keeps torch's).
        warm_up: modes ranked once at open so the first query does not pay for loading the
            encoder and building the solvers: True for DEFAULT_WARM_UP, False (or ()) for none,
            or a sequence of MODES (kept as a tuple; "hipporag1" has nothing to warm up).
        config: the searcher's default retrieval settings (Searcher(config=...)).
        encoder_model: the encoder the caller means to query with, spelt as the command line
            spells it; opening an index built with another raises IndexFormatError
            (load_index(encoder=...)). A server encoder "openai:MODEL@URL" must name the index's
            MODEL and queries go to URL (SearcherOptions.query_base_url).
    """

    index: Path
    device: str = "auto"
    precision: str = "float32"
    options: SearcherOptions = field(default_factory=SearcherOptions)
    threads: int | None = None
    warm_up: bool | Sequence[str] = False
    config: RetrievalConfig = field(default_factory=RetrievalConfig)
    encoder_model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.index, (str, Path)) or not str(self.index):
            raise ValueError(f"index must be an index directory path, got {self.index!r}")
        object.__setattr__(self, "index", Path(self.index))
        check_device(self.device)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.options, SearcherOptions):
            raise ValueError(f"options must be a SearcherOptions, "
                             f"got {type(self.options).__name__}")
        if self.options.query_base_url is not None:
            raise ValueError("options.query_base_url: name the server in encoder_model "
                             "('openai:MODEL@URL')")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be None or >= 1, got {self.threads!r}")
        if not isinstance(self.config, RetrievalConfig):
            raise ValueError(f"config must be a RetrievalConfig, got {type(self.config).__name__}")
        if self.encoder_model is not None:
            if not self.encoder_model:
                raise ValueError("encoder_model must be None or a non-empty model name")
            EncoderConfig(model=self.encoder_model)  # a malformed "openai:" spec fails here
        if isinstance(self.warm_up, bool):
            modes: tuple[str, ...] = DEFAULT_WARM_UP if self.warm_up else ()
        elif isinstance(self.warm_up, str):  # a str is a Sequence[str] of its letters
            raise ValueError(f"warm_up must be a bool or a sequence of modes, got {self.warm_up!r}"
                             f" (write ({self.warm_up!r},))")
        else:
            modes = tuple(self.warm_up)
        bad = [m for m in modes if _unknown_mode(m)]
        if bad:
            raise ValueError(f"warm_up modes must be among {MODES}, got {bad}")
        object.__setattr__(self, "warm_up", modes)

    @property
    def warm_up_modes(self) -> tuple[str, ...]:
        """The modes `open` warms up (`warm_up` as normalised by the constructor)."""
        return cast(tuple[str, ...], self.warm_up)  # __post_init__ made it a tuple

    def open(self, index: Index | None = None) -> Searcher:
        """Set the threads, load the index, make the Searcher and warm it up.

        Args:
            index: this spec's index already in memory (just built from the same directory):
                searched instead of loading it again. It must be on the spec's device at the
                spec's precision (ValueError otherwise).

        Raises:
            FileNotFoundError, IndexFormatError: the directory is missing or not a (compatible)
                index (load_index).
            ValueError: the device is not available here, or `index` does not match the spec.
        """
        set_threads(self.threads)
        model, url = self._encoder()
        if index is None:
            index = load_index(self.index, device=self.device, precision=self.precision,
                               encoder=model)
        else:
            self._check_loaded(index)
        searcher = Searcher(index, self.config, replace(self.options, query_base_url=url))
        if self.warm_up_modes:
            searcher.warm_up(self.warm_up_modes)
        return searcher

    def _encoder(self) -> tuple[str | None, str | None]:
        """(the model an index must be built with, the server URL to query) of encoder_model."""
        if self.encoder_model is None:
            return None, None
        config = EncoderConfig(model=self.encoder_model)
        return config.model, config.base_url

    def _check_loaded(self, index: Index) -> None:
        want = resolve_device(self.device)
        same_device = index.device.type == want.type and \
            (want.index is None or index.device.index == want.index)
        if not same_device or index.precision != self.precision:
            raise ValueError(f"the given index is on {index.device} at {index.precision}; the "
                             f"spec asks for {self.device} at {self.precision}")
        model = self._encoder()[0]
        if model is not None and index.config.encoder.model != model:
            raise ValueError(f"the given index was built with encoder "
                             f"{index.config.encoder.model!r}, the spec names "
                             f"{self.encoder_model!r}")


def _unknown_mode(name: str) -> bool:
    """Whether `name` names no mode (retrieval.modes.mode_of refuses it)."""
    try:
        mode_of(name)
    except ValueError:
        return True
    return False
