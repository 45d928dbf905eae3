"""OpenAI-compatible embeddings over HTTP: texts -> L2-normalised float32 rows from a server.

One request is POST {base_url}/embeddings with {"model": M, "input": [texts], "encoding_format":
"float"}, answered {"data": [{"index": i, "embedding": [floats]}, ...]}: the API of OpenAI,
vLLM (`vllm serve M --task embed`), Hugging Face TEI, Ollama and others. The bearer token is
`api_key`, else $OPENAI_API_KEY read when the client is made (never written anywhere; none is
sent when both are empty, as local servers want). A base64 `embedding` (little-endian float32,
OpenAI's other encoding) is read too.

Batching: the texts of a call, in the order given (the Encoder sorts them by length, so a
request's texts pad alike on the server), are cut into requests of at most `max_batch_texts`
inputs and `max_batch_tokens` estimated tokens (`estimate_tokens`); a text over the budget alone
goes alone. At most `concurrency` requests are in flight, on one asyncio loop the client owns (a
daemon thread) with one httpx.AsyncClient kept open, so connections are reused from call to call
and a served query batch pays no connect. A call of a few short queries is one request.

What each fault gives (RemoteEncoderConfig sets the numbers):
    HTTP 408, 429, 500, 502, 503, 504, retry, at most `max_retries` times, then
    a timeout, a refused or dropped    EmbeddingServerError; each wait is the response's
    connection                         Retry-After (seconds or an HTTP date; one over
                                       `max_backoff` fails the call at once), else
                                       backoff * 2**try (capped at max_backoff) * U(0.5, 1)
    any other HTTP status              EmbeddingServerError at once, with the server's message and
                                       the length of the request's longest text (a too-long input
                                       is the usual 400/413: see truncate_chars)
    a body that is not the schema      EmbeddingResponseError at once (not JSON, no `data`, a row
                                       count, index or value that is wrong or not finite)
    a dimension other than the first   EmbeddingDimensionError at once: rows of one call, and of
    response's (or the expected one)   every call of the client, have one dimension
Every error names the endpoint and model. After the first failure no new request starts; those
in flight finish, and the error carries every row received (`received_rows`, `received`), so
the Encoder caches them before it re-raises: nothing the server sent is lost.

The dimension is `dim` when the caller knows it (an index's), else the first response's.
`stats` counts calls, texts, HTTP requests (tries included), retries, failed calls and the wall
seconds of calls, for the server's /metrics.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import os
import random
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from hippo_gpu.config import RemoteEncoderConfig
from hippo_gpu.embed.rows import l2_normalize
from hippo_gpu.errors import HippoGpuError

DEFAULT_BASE_URL = "https://api.openai.com/v1"  # the openai SDK's, for "openai:MODEL" unset
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_MESSAGE_CHARS = 200  # of a server's error body quoted in an error

T = TypeVar("T")


class EmbeddingServerError(HippoGpuError, RuntimeError):
    """An embeddings call failed; the message names the endpoint and says why.

    Attributes:
        received_rows: positions (in the call's texts) of the rows received before it failed.
        received: those rows, [len(received_rows), D] float32 (D = 0 when none came).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.received_rows = np.zeros(0, dtype=np.int64)
        self.received = np.zeros((0, 0), dtype=np.float32)

    def with_message(self, message: str) -> EmbeddingServerError:
        """The same kind of error with another message and the same received rows."""
        out = type(self)(message)
        out.received_rows, out.received = self.received_rows, self.received
        return out


class EmbeddingResponseError(EmbeddingServerError):
    """The server answered 200 with a body that is not an embeddings response."""


class EmbeddingDimensionError(EmbeddingServerError):
    """The server's vectors do not have the dimension of its first answer (or the expected)."""


@dataclass
class RemoteStats:
    """Cumulative counts of one client (thread-safe; read `snapshot()`)."""

    calls: int = 0
    texts: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {"calls": self.calls, "texts": self.texts, "requests": self.requests,
                    "retries": self.retries, "failures": self.failures, "seconds": self.seconds}


def estimate_tokens(text: str) -> int:
    """A text's tokens as the batch budget counts them: ceil(UTF-8 bytes / 4) + 2.

    About what BPE and WordPiece vocabularies give for English prose (~4 bytes per token) plus
    the two special tokens; it only sizes requests, the server's tokenizer is the truth.
    """
    return -(-len(text.encode("utf-8")) // 4) + 2


def plan_batches(texts: Sequence[str], max_texts: int, max_tokens: int) -> list[list[int]]:
    """Consecutive runs of text positions, each at most `max_texts` texts and `max_tokens`
    estimated tokens (a text over the budget alone makes a run of one)."""
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, text in enumerate(texts):
        k = estimate_tokens(text)
        if current and (len(current) >= max_texts or tokens + k > max_tokens):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += k
    if current:
        batches.append(current)
    return batches


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header in seconds (delta-seconds or an HTTP date), None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class OpenAIEmbeddings:
    """Embeddings from an OpenAI-compatible server (see the module docstring).

    Args:
        model: the model name the server knows (no "openai:" prefix).
        base_url: e.g. "http://127.0.0.1:8000/v1"; None: $OPENAI_BASE_URL, else OpenAI's API.
        config: batching, concurrency, timeouts, retries and truncation.
        dim: the dimension the caller expects (None: the first response's).
        api_key: bearer token (None: $OPENAI_API_KEY, if set).
        seed: seed of the backoff jitter (tests).
    """

    def __init__(self, model: str, base_url: str | None, config: RemoteEncoderConfig, *,
                 dim: int | None = None, api_key: str | None = None,
                 seed: int | None = None) -> None:
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        self.base_url = self.base_url.rstrip("/")
        self.config = config
        self.dim = dim
        self.stats = RemoteStats()
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None  # httpx.AsyncClient, made on the loop
        self._pid = 0

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/embeddings"

    def _where(self) -> str:
        return f"embedding server {self.endpoint} (model {self.model!r})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[n] texts -> [n, D] float32 rows, L2-normalised (a zero row stays zero).

        Raises:
            EmbeddingServerError (or its subclasses): the call failed; see the module docstring.
        """
        if len(texts) == 0:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        cut = self.config.truncate_chars
        sent = [t[:cut] for t in texts] if cut is not None else list(texts)
        started = time.perf_counter()
        try:
            return self._run(self._embed_all(sent))
        finally:
            self.stats.add(calls=1, seconds=time.perf_counter() - started)

    def probe_dim(self) -> int:
        """Ask the server for the vector of one short text and return (and keep) its dimension."""
        if self.dim is None:
            self.embed(["dimension probe"])
        assert self.dim is not None  # set by the first answer
        return self.dim

    def close(self) -> None:
        """Close the connections and stop the loop thread (a later call starts them again)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or self._pid != os.getpid():
            return
        client, self._client = self._client, None
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop thread and wait for it (from any other thread)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # none yet, or a forked child
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="hippo-gpu-embeddings",
                                 daemon=True).start()
                self._loop, self._client, self._pid = loop, None, os.getpid()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def _embed_all(self, texts: list[str]) -> np.ndarray:
        httpx = _httpx()
        if self._client is None:
            limits = httpx.Limits(max_connections=self.config.concurrency,
                                  max_keepalive_connections=self.config.concurrency)
            self._client = httpx.AsyncClient(timeout=self.config.timeout, limits=limits)
        n = len(texts)
        out: np.ndarray | None = None  # [n, D], made when D is known
        done = np.zeros(n, dtype=bool)
        failures: list[EmbeddingServerError] = []
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(rows: list[int]) -> None:
            nonlocal out
            async with gate:
                if failures:  # no new request after a failure
                    return
                try:
                    vectors = await self._request([texts[i] for i in rows])
                    self._check_dim(vectors.shape[1])
                except EmbeddingServerError as e:
                    failures.append(e)
                    return
            if out is None:
                out = np.zeros((n, vectors.shape[1]), dtype=np.float32)
            out[rows] = vectors
            done[rows] = True

        batches = plan_batches(texts, self.config.max_batch_texts, self.config.max_batch_tokens)
        await asyncio.gather(*(one(rows) for rows in batches))
        if failures:
            self.stats.add(failures=1)
            error = failures[0]
            error.received_rows = np.flatnonzero(done)
            if out is not None:
                error.received = out[done]
            raise error
        assert out is not None  # every batch answered
        self.stats.add(texts=n)
        return out

    def _check_dim(self, dim: int) -> None:
        if self.dim is None:
            self.dim = dim
        elif dim != self.dim:
            raise EmbeddingDimensionError(
                f"{self._where()} returned vectors of dimension {dim}, expected {self.dim}: "
                "the server serves another model under this name, or changed it mid-build")

    async def _request(self, inputs: list[str]) -> np.ndarray:
        """One request with its retries -> [len(inputs), D] float32 rows, L2-normalised."""
        httpx = _httpx()
        body = {"model": self.model, "input": inputs, "encoding_format": "float"}
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        cfg = self.config
        for attempt in range(cfg.max_retries + 1):
            wait: float | None = None
            self.stats.add(requests=1)
            try:
                response = await self._client.post(self.endpoint, json=body, headers=headers)
            except httpx.TimeoutException:
                reason = f"no answer within {cfg.timeout:g} s"
            except httpx.TransportError as e:
                reason = f"connection failed ({type(e).__name__}: {_short(str(e))})"
            except AttributeError as e:
                # httpcore reads the peer address of a socket a dying server already closed
                # ('NoneType' object has no attribute 'getpeername'): a failed connection.
                if "getpeername" not in str(e):
                    raise
                reason = "connection failed (closed while opening)"
            else:
                if response.status_code == 200:
                    return self._parse(response.content, len(inputs))
                reason = f"HTTP {response.status_code}: {_short(response.text)}"
                if response.status_code not in _RETRY_STATUS:
                    longest = max(inputs, key=len)
                    raise EmbeddingServerError(
                        f"{self._where()} refused a request of {len(inputs)} texts: {reason}. "
                        f"Its longest text has {len(longest)} characters (~"
                        f"{estimate_tokens(longest)} tokens); if that is over the model's input "
                        "limit, set truncate_chars (an explicit truncation) or shorten the texts")
                wait = retry_after_seconds(response.headers.get("retry-after"))
            if attempt == cfg.max_retries:
                raise EmbeddingServerError(
                    f"{self._where()}: {reason}, after {attempt + 1} tries")
            if wait is not None and wait > cfg.max_backoff:
                raise EmbeddingServerError(
                    f"{self._where()}: {reason}; it asks to retry after {wait:g} s, over "
                    f"max_backoff ({cfg.max_backoff:g} s)")
            if wait is None:
                wait = min(cfg.max_backoff, cfg.backoff * 2 ** attempt) * self._rng.uniform(0.5, 1)
            self.stats.add(retries=1)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last try returns or raises")

    def _parse(self, content: bytes, count: int) -> np.ndarray:
        """An embeddings response body -> [count, D] float32 rows in input order, normalised."""
        def bad(why: str) -> EmbeddingResponseError:
            return EmbeddingResponseError(f"{self._where()} sent a malformed response: {why}")

        try:
            payload = json.loads(content)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"not JSON ({_short(str(e))})") from e
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise bad("no 'data' list")
        if len(data) != count:
            raise bad(f"{len(data)} embeddings for {count} inputs")
        rows: list[Any] = [None] * count
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise bad(f"item {pos} has no 'embedding'")
            i = item.get("index", pos)
            if not isinstance(i, int) or not 0 <= i < count or rows[i] is not None:
                raise bad(f"item {pos} has index {_short(repr(i))}, not a new one in "
                          f"[0, {count})")
            rows[i] = self._vector(item["embedding"], pos, bad)
        dims = {len(r) for r in rows}
        if len(dims) != 1:
            raise EmbeddingDimensionError(
                f"{self._where()} returned vectors of dimensions {sorted(dims)} in one response")
        out = np.stack(rows).astype(np.float32)
        if out.shape[1] == 0 or not np.isfinite(out).all():
            raise bad("empty or non-finite vectors")
        return l2_normalize(out)

    @staticmethod
    def _vector(value: Any, pos: int, bad: Any) -> np.ndarray:
        if isinstance(value, str):  # encoding_format "base64": little-endian float32
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError as e:
                raise bad(f"item {pos}: bad base64") from e
            if len(raw) % 4:
                raise bad(f"item {pos}: base64 of {len(raw)} bytes is not float32")
            return np.frombuffer(raw, dtype="<f4")
        try:
            v = np.array(value) if isinstance(value, list) else None
        except ValueError:  # ragged nesting
            v = None
        if v is None or v.ndim != 1 or v.dtype.kind not in "iuf":
            raise bad(f"item {pos}: 'embedding' is not a list of numbers")
        return v


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as e:
        raise ImportError("a server encoder (openai:MODEL) needs httpx: "
                          "pip install 'hippo-gpu[remote]'") from e
    return httpx


def _short(text: str) -> str:
    """At most _MESSAGE_CHARS characters of a server's text, on one line."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= _MESSAGE_CHARS else one_line[:_MESSAGE_CHARS] + "..."
