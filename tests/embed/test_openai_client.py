"""The server encoder ("openai:" models) against a real FastAPI server on loopback serving
HashEncoder vectors: batching, concurrency, the documented outcome of each fault, and that a
failed call loses nothing it received (a second run sends only the rest).

The reference is HashEncoder itself, run in this process: a vector that came over HTTP must equal
it to float32 round-off (the client L2-normalises an already unit row once more).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from hippo_gpu.config import EncoderConfig, IndexConfig, RemoteEncoderConfig  # noqa: E402
from hippo_gpu.embed import (  # noqa: E402
    EmbeddingDimensionError,
    EmbeddingResponseError,
    EmbeddingServerError,
    Encoder,
    HashEncoder,
    estimate_tokens,
)
from hippo_gpu.embed.openai_client import plan_batches, retry_after_seconds  # noqa: E402
from tests.embed.embedding_server import EmbeddingState, serving  # noqa: E402

CPU = torch.device("cpu")
HASH = HashEncoder(64)
TEXTS = [f"passage {i}: " + "the kafo river runs north " * (i % 5 + 1) for i in range(12)]
FAST = RemoteEncoderConfig(backoff=0.01, max_backoff=2.0, timeout=5.0, max_batch_texts=4,
                           concurrency=1)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[EmbeddingState, str]]:
    state = EmbeddingState(HASH)
    with serving(state) as url:
        yield state, url


@pytest.fixture
def srv(server: tuple[EmbeddingState, str]) -> Iterator[tuple[EmbeddingState, str]]:
    """The module's server with its script and records cleared for one test."""
    state, url = server
    with state.lock:
        state.script.clear()
        state.requests.clear()
        state.answered.clear()
        state.max_in_flight = 0
    yield state, url
    assert not state.script, f"script not spent: {state.script}"


def encoder(url: str, cache: Path | None = None, dim: int | None = None,
            **remote: object) -> Encoder:
    cfg = dataclasses.replace(FAST, **remote)
    return Encoder(EncoderConfig(model=f"openai:hash-64@{url}", remote=cfg), CPU,
                   cache_dir=cache, dim=dim)


def check_vectors(got: torch.Tensor, texts: list[str]) -> None:
    np.testing.assert_allclose(got.numpy(), HASH(texts), rtol=0, atol=1e-6)


def test_spec_parsing_and_identity() -> None:
    cfg = EncoderConfig(model="openai:intfloat/e5@v2@http://127.0.0.1:9/v1/")
    assert (cfg.model, cfg.base_url) == ("openai:intfloat/e5@v2", "http://127.0.0.1:9/v1")
    assert cfg.spec == "openai:intfloat/e5@v2@http://127.0.0.1:9/v1"
    elsewhere = EncoderConfig(model="openai:intfloat/e5@v2@https://gpu-box:8000/v1")
    assert cfg.identity() == elsewhere.identity()  # the URL is not the model
    cut = EncoderConfig(model="openai:m", remote=RemoteEncoderConfig(truncate_chars=100))
    assert cut.identity() != EncoderConfig(model="openai:m").identity()
    assert EncoderConfig(model="openai:m").base_url is None  # $OPENAI_BASE_URL when used
    round_trip = IndexConfig.from_dict(IndexConfig(encoder=cut).as_dict())
    assert round_trip.encoder == cut
    for bad, why in [("openai:", "names no model"), ("openai:m@localhost:8000", "http://"),
                     ("openai:@http://x/v1", "names no model")]:
        with pytest.raises(ValueError, match=why):
            EncoderConfig(model=bad)
    with pytest.raises(ValueError, match="float32"):
        EncoderConfig(model="openai:m@http://x/v1", precision="bfloat16")
    with pytest.raises(ValueError, match="ONNX"):
        EncoderConfig(model="openai:m@http://x/v1", backend="onnx")
    with pytest.raises(ValueError, match="server encoders"):
        EncoderConfig(model="hash:64", base_url="http://x/v1")
    with pytest.raises(ValueError, match="two URLs"):
        EncoderConfig(model="openai:m@http://x/v1", base_url="http://y/v1")


def test_batches_by_token_budget_and_bounded_in_flight(srv) -> None:
    state, url = srv
    texts = [("w" * n) for n in (4, 400, 8, 90, 3, 7, 200, 1, 1, 1, 1, 1, 1, 1)]
    # estimated tokens (ceil(bytes / 4) + 2): 3, 102, 4, 25, 3, 4, 52, then 3 each
    groups = [[0], [1], [2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13]]
    assert [sum(estimate_tokens(texts[i]) for i in g) for g in groups] == [3, 102, 36, 58, 15]
    assert plan_batches(texts, 5, 60) == groups
    state.script = [("delay", 0.05)] * len(groups)
    enc = encoder(url, max_batch_texts=5, max_batch_tokens=60, concurrency=2)
    check_vectors(torch.from_numpy(enc.remote.embed(texts)), texts)
    sent = sorted(tuple(r["inputs"]) for r in state.requests)
    assert sent == sorted(tuple(texts[i] for i in g) for g in groups)
    assert state.max_in_flight == 2


def test_429_waits_what_retry_after_says(srv) -> None:
    state, url = srv
    state.script = [("status", 429, {"Retry-After": "1"})]
    enc = encoder(url)
    check_vectors(enc.encode(TEXTS[:3]), TEXTS[:3])
    first, second = state.requests
    assert (first["action"], second["action"]) == ("status", "ok")
    assert second["arrived"] - first["arrived"] >= 0.95  # not the 0.01 s backoff
    assert enc.remote.stats.snapshot()["retries"] == 1
    # a wait over max_backoff fails the call at once instead of sleeping
    state.script = [("status", 429, {"Retry-After": "30"})]
    with pytest.raises(EmbeddingServerError, match="retry after 30 s, over max_backoff"):
        encoder(url).encode(TEXTS[:1])
    assert len(state.requests) == 3
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0


def test_5xx_is_retried_then_fails_naming_the_endpoint(srv) -> None:
    state, url = srv
    state.script = [("status", 500, {}), ("status", 503, {})]
    enc = encoder(url)
    check_vectors(enc.encode(TEXTS[:2]), TEXTS[:2])
    assert enc.remote.stats.snapshot()["retries"] == 2
    state.script = [("status", 502, {})] * 3
    with pytest.raises(EmbeddingServerError) as e:
        encoder(url, max_retries=2).encode(TEXTS[2:4])
    assert f"{url}/embeddings" in str(e.value) and "HTTP 502" in str(e.value)
    assert "after 3 tries" in str(e.value)
    assert len(state.requests) == 3 + 3


def test_timeout_is_retried(srv) -> None:
    state, url = srv
    state.script = [("delay", 1.0)]
    enc = encoder(url, timeout=0.25)
    check_vectors(enc.encode(TEXTS[:2]), TEXTS[:2])
    assert [r["action"] for r in state.requests] == ["delay", "ok"]
    state.script = [("delay", 1.0)]
    with pytest.raises(EmbeddingServerError, match=r"no answer within 0.25 s, after 1 tries"):
        encoder(url, timeout=0.25, max_retries=0).encode(TEXTS[:1])


def test_dropped_connection_is_retried(srv) -> None:
    state, url = srv
    state.script = [("ok",), ("drop",)]
    enc = encoder(url)
    check_vectors(enc.encode(TEXTS[:8]), TEXTS[:8])
    assert [r["action"] for r in state.requests] == ["ok", "drop", "ok"]
    snap = enc.remote.stats.snapshot()
    assert (snap["requests"], snap["retries"], snap["texts"], snap["failures"]) == (3, 1, 8, 0)


def test_wrong_dimension_mid_build_keeps_what_came(srv, tmp_path: Path) -> None:
    """Rows of the first two answers are cached before the error; the re-run sends only the
    four texts that never came back, and the result is whole."""
    state, url = srv
    state.script = [("ok",), ("ok",), ("dim", 32)]
    with pytest.raises(EmbeddingDimensionError) as e:
        encoder(url, tmp_path).encode(TEXTS, desc=None)
    msg = str(e.value)
    assert "dimension 32, expected 64" in msg and url in msg
    assert "8 of the 12 texts to send were received and cached" in msg
    received = {t for r in state.requests[:2] for t in r["inputs"]}
    state.requests.clear()
    again = encoder(url, tmp_path)
    assert again.remote.dim == 64  # read from the cache's record, before any request
    check_vectors(again.encode(TEXTS), TEXTS)
    sent = [t for r in state.requests for t in r["inputs"]]
    assert sorted(sent) == sorted(set(TEXTS) - received) and len(sent) == 4
    # an expected dimension (an index's) is checked on the first answer too
    with pytest.raises(EmbeddingDimensionError, match="dimension 64, expected 384"):
        encoder(url, dim=384).encode(["new text"])


def test_malformed_json_fails_at_once(srv, tmp_path: Path) -> None:
    state, url = srv
    state.script = [("malformed",)]
    with pytest.raises(EmbeddingResponseError, match="malformed response: not JSON"):
        encoder(url, tmp_path).encode(TEXTS[:3])
    assert len(state.requests) == 1  # not retried
    assert not list(tmp_path.glob("*/shard-*"))  # nothing cached from it


def test_refused_request_names_its_longest_text_and_truncation_is_explicit(srv) -> None:
    state, url = srv
    state.script = [("status", 400, {})]
    with pytest.raises(EmbeddingServerError, match=r"longest text has 6000 characters .* "
                                                   "truncate_chars"):
        encoder(url).encode(["short", "x" * 6000])
    assert len(state.requests) == 1
    enc = encoder(url, truncate_chars=10)
    got = enc.encode(["a" * 50, "tiny"])
    assert state.requests[-1]["inputs"] == ["tiny", "a" * 10]  # sorted by length, then cut
    check_vectors(got, ["a" * 10, "tiny"])


def test_key_and_url_from_the_environment(srv, monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = srv
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-77")
    enc = Encoder(EncoderConfig(model="openai:hash-64", remote=FAST), CPU)
    check_vectors(enc.encode(TEXTS[:1]), TEXTS[:1])
    assert state.requests[-1]["authorization"] == "Bearer sk-test-77"
    assert state.requests[-1]["model"] == "hash-64"
    monkeypatch.delenv("OPENAI_API_KEY")
    encoder(url).encode(TEXTS[1:2])
    assert state.requests[-1]["authorization"] is None  # no key: no header


def test_dead_server_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    started = time.monotonic()
    with pytest.raises(EmbeddingServerError, match=rf"127.0.0.1:{port}/v1/embeddings .*"
                                                   r"connection failed.*after 3 tries"):
        encoder(f"http://127.0.0.1:{port}/v1", tmp_path, max_retries=2).encode(TEXTS[:2])
    assert time.monotonic() - started < 5
