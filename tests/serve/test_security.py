"""What a served index exposes, reviewed one guarantee at a time, each on a live loopback server:

- the bearer token is compared in constant time (hmac.compare_digest, on /v1/* and on /mcp
  alike), and any other header value, of any length or bytes, is refused with 401, never 500;
- a server without a token answers only its own (loopback) Host names and Origins: a page whose
  DNS name is rebound to 127.0.0.1 gets 421 / 403 (DNS rebinding);
- `--index NAME=DIR`: a NAME is 1-64 letters, digits, "_", "-", "." starting with a letter or
  digit, never a path; names and directories are never given twice (writable: one directory
  under two names is refused);
- `passage://KEY` is a lookup in the served tables: no path is read, unknown keys are errors;
- the write routes' limits (passages, characters, keys, body bytes, writes per second) are in
  the OpenAPI document and enforced with 422 / 413 / 429;
- files a build, a commit, the embedding cache and a batch job create get the umask's
  permissions (none group- or world-writable under 022);
- the token is never echoed: not in responses, logs, /v1/stats, the OpenAPI document or errors.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hippo_gpu import Searcher, build_index, load_index  # noqa: E402
from hippo_gpu.sample import paths  # noqa: E402
from hippo_gpu.serve.config import ServerConfig, WriteLimits  # noqa: E402
from hippo_gpu.serve.guards import WriteRate  # noqa: E402
from hippo_gpu.serve.server import create_app  # noqa: E402
from hippo_gpu.serve.service import (  # noqa: E402
    DEFAULT_INDEX,
    INDEX_NAME,
    parse_index_spec,
    parse_index_specs,
)
from hippo_gpu.serve.writes import WritableHolder  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.loopback import serve_asgi  # noqa: E402

TOKEN = "sec-Token_0123456789abcdef"
MCP_ACCEPT = {"accept": "application/json, text/event-stream",
              "content-type": "application/json"}
TOOLS_LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())[:10]
    out = tmp_path_factory.mktemp("security") / "idx"
    build_index(corpus, files["openie"], out, encoder="hash:16", device="cpu",
                ppr_basis=False, allow_missing_openie=True)
    return out


@pytest.fixture(scope="module")
def searcher(index_dir: Path) -> Searcher:
    return Searcher(load_index(index_dir, device="cpu"))


@pytest.fixture(scope="module")
def locked(searcher: Searcher) -> Iterator[str]:
    """A server with the token (read-only)."""
    with serve_asgi(create_app(searcher, ServerConfig(token=TOKEN))) as (url, _):
        yield url


def stats_and_mcp(url: str, headers: dict[str, Any]) -> tuple[int, int]:
    a = httpx.get(url + "/v1/stats", headers=headers, timeout=30)
    b = httpx.post(url + "/mcp", content=TOOLS_LIST, headers={**MCP_ACCEPT, **headers},
                   timeout=30)
    for r in (a, b):
        assert TOKEN not in r.text and TOKEN not in str(r.headers)
    return a.status_code, b.status_code


# ---------------------------------------------------------------------------------------------
# the token


def test_the_token_is_compared_with_compare_digest(locked: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mcp")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    guess = TOKEN[:-1] + "X"
    assert stats_and_mcp(locked, {"Authorization": f"Bearer {guess}"}) == (401, 401)
    assert calls == [(guess.encode(), TOKEN.encode())] * 2  # /v1/stats, then /mcp
    calls.clear()
    assert stats_and_mcp(locked, {"Authorization": f"Bearer {TOKEN}"}) == (200, 200)
    assert calls == [(TOKEN.encode(), TOKEN.encode())] * 2


REFUSED = [b"", b"Bearer", b"Basic " + TOKEN.encode(), TOKEN.encode(),
           b"Bearer " + TOKEN[:-1].encode(), b"Bearer " + TOKEN.encode() + b"x",
           b"Bearer " + TOKEN.upper().encode(), b"Bearer " + TOKEN.encode() * 200,
           b"Bearer \xff\xfe\x80", b"Bearer " +
           TOKEN.encode().replace(b"0", b"\xd8"), b"Token " + TOKEN.encode()]


def test_other_tokens_are_refused_without_error(locked: str) -> None:
    pytest.importorskip("mcp")
    for value in REFUSED:
        assert stats_and_mcp(locked, {"Authorization": value}) == (401, 401), value
    assert stats_and_mcp(locked, {}) == (401, 401)
    for scheme in (b"bearer ", b"BEARER ", b"BeArEr ", b"Bearer   "):  # any case, 1*SP
        assert stats_and_mcp(locked, {"Authorization": scheme + TOKEN.encode()}) == (200, 200)


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF,
                                    exclude_characters="\x7f"), max_size=40)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]) | header_text,
       credential=st.sampled_from([TOKEN, TOKEN[1:], TOKEN + " "]) | header_text)
def test_both_guards_decide_alike_on_any_header(locked: str, scheme: str,
                                                credential: str) -> None:
    pytest.importorskip("mcp")
    value = (scheme + credential).strip(" \t").encode("latin-1")  # h11 drops the outer spaces
    got = stats_and_mcp(locked, {"Authorization": value})
    head, _, rest = value.partition(b" ")  # RFC 6750: "Bearer" 1*SP token
    accepted = head.lower() == b"bearer" and rest.lstrip(b" ") == TOKEN.encode()
    assert got == ((200, 200) if accepted else (401, 401)), value


def test_a_token_outside_visible_ascii_is_refused_by_the_config() -> None:
    for bad in ["", " ", "has space", "tök\u00e9n", "tab\there", "new\nline"]:
        with pytest.raises(ValueError) as e:
            ServerConfig(token=bad)
        assert (bad not in str(e.value)) or not bad.strip()
    assert TOKEN not in repr(ServerConfig(token=TOKEN))


# ---------------------------------------------------------------------------------------------
# DNS rebinding: a server without a token answers only its own host names


def test_foreign_host_and_origin_are_refused_without_a_token(searcher: Searcher) -> None:
    pytest.importorskip("mcp")
    with serve_asgi(create_app(searcher, ServerConfig())) as (url, _):
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert stats_and_mcp(url, {"host": host}) == (200, 200), host
            assert stats_and_mcp(url, {"host": host, "origin": f"http://localhost:{port}"}) \
                == (200, 200)
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example",
                     "localhost.evil.example:80", "", "[::2]:1", "user@evil.example"):
            assert stats_and_mcp(url, {"host": host}) == (421, 421), host
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                       "http://127.0.0.1.evil.example", "file://"):
            assert stats_and_mcp(url, {"origin": origin}) == (403, 403), origin
    # bound elsewhere (the CLI's choice off loopback) it answers any name; with a token too
    anywhere = ServerConfig(allowed_hosts=("*",), mcp=False)
    with serve_asgi(create_app(searcher, anywhere)) as (url, _):
        assert httpx.get(url + "/v1/stats", headers={"host": "box.lan"}).status_code == 200


def test_with_a_token_any_host_is_answered(locked: str) -> None:
    pytest.importorskip("mcp")
    auth = {"Authorization": f"Bearer {TOKEN}", "host": "box.lan",
            "origin": "http://elsewhere.example"}
    assert stats_and_mcp(locked, auth) == (200, 200)


# ---------------------------------------------------------------------------------------------
# --index NAME=DIR and passage://


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.text(max_size=70) | st.sampled_from(
    ["..", ".", "../x", "a/../b", "~", "/abs", "a\\b", ".hidden", "a..b", "x" * 65, "é", "a b"]))
def test_an_index_name_is_never_a_path(tmp_path_factory: Any, name: str) -> None:
    directory = "some-dir"
    got_name, got_dir = parse_index_spec(f"{name}={directory}")
    if got_name == DEFAULT_INDEX and got_dir != Path(directory):
        assert got_dir == Path(f"{name}={directory}")  # the whole value is a directory
        return
    assert got_dir == Path(directory) and got_name == name
    assert INDEX_NAME.fullmatch(name) and len(name) <= 64
    assert "/" not in name and "\\" not in name and not name.startswith(".") and name.isascii()


def test_index_names_and_directories_given_twice(index_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    with pytest.raises(ValueError, match="is not a directory"):
        parse_index_specs([f"../{index_dir.name}={index_dir}"])  # not a name: a missing path
    with pytest.raises(ValueError, match="given twice"):
        parse_index_specs([f"a={index_dir}", f"a={tmp_path}"])
    same = [f"a={index_dir}", f"b={index_dir.parent / '.' / index_dir.name}"]
    res = CliRunner().invoke(app, ["serve", "--writable", "--index", same[0], "--index",
                                   same[1]], env={"HIPPO_GPU_TOKEN": TOKEN})
    assert res.exit_code == 2 and "under two names" in " ".join(res.output.split()), res.output
    assert TOKEN not in res.output


def test_passage_resources_are_lookups_not_paths(locked: str, searcher: Searcher) -> None:
    pytest.importorskip("mcp")
    headers = {**MCP_ACCEPT, "Authorization": f"Bearer {TOKEN}"}

    def read(uri: str) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": uri}}
        r = httpx.post(locked + "/mcp", content=json.dumps(body), headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    index = searcher.index
    key = index.passage_keys[3]
    (content,) = read(f"passage://{key}")["result"]["contents"]
    assert json.loads(content["text"]) == {"key": key, "title": index.passage_titles[3],
                                           "text": index.passage_texts[3],
                                           "indexes": ["default"]}
    for uri in ["passage://../../../../etc/passwd", "passage://..%2f..%2fetc%2fpasswd",
                "passage://manifest.json", "passage://v000001", "passage://" + "0" * 38,
                "passage://" + key.upper(), "passage://" + key + "/..", "passage://",
                "passage://" + "x" * 5_000]:
        answer = read(uri)
        assert "error" in answer and "result" not in answer, (uri, answer)
        assert "root:" not in json.dumps(answer)
        assert len(answer["error"]["message"]) < 200 + len(uri)


# ---------------------------------------------------------------------------------------------
# the write routes' limits


@pytest.fixture
def writable(index_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """A factory: a writable server over a copy of the index with the given write limits."""
    import shutil

    def make(limits: WriteLimits) -> Any:
        copy = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
        shutil.copytree(index_dir, copy)
        holder = WritableHolder(Searcher(load_index(copy, device="cpu")), copy, device="cpu",
                                compact_quiet=None)
        app = create_app(holder, ServerConfig(token=TOKEN, writes=limits, mcp=False))
        return serve_asgi(app), app.openapi()

    yield make


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_write_limits_are_documented_and_enforced(writable: Any) -> None:
    limits = WriteLimits(max_passages_per_request=2, max_text_chars=50, max_title_chars=20,
                         max_keys_per_request=3, max_body_bytes=4_096,
                         writes_per_second=1_000.0, write_burst=1_000)
    served, spec = writable(limits)
    schemas = spec["components"]["schemas"]
    insert, passage = schemas["InsertRequest"]["properties"], schemas["PassageIn"]["properties"]
    assert insert["passages"]["maxItems"] == 2 and passage["text"]["maxLength"] == 50
    assert passage["title"]["maxLength"] == 20
    for field in ("keys", "ids"):  # each an array or null (exactly one given)
        (array,) = [t for t in schemas["DeleteRequest"]["properties"][field]["anyOf"]
                    if t["type"] == "array"]
        assert array["maxItems"] == 3
    for method in ("post", "delete"):
        responses = spec["paths"]["/v1/passages"][method]["responses"]
        assert {"401", "404", "409", "413", "422", "429"} <= set(responses)
        assert "4096 bytes" in responses["413"]["description"]
        assert responses["429"]["headers"]["Retry-After"]["required"] is True

    def p(text: str = "fine", title: str = "T") -> dict[str, Any]:
        return {"title": title, "text": text, "triples": [["a", "b", "c"]]}

    with served as (url, _):
        post = lambda body: httpx.post(url + "/v1/passages", json=body, headers=AUTH)  # noqa: E731
        delete = lambda body: httpx.request("DELETE", url + "/v1/passages", json=body,  # noqa: E731
                                            headers=AUTH)
        assert post({"passages": [p("x1"), p("x2"), p("x3")]}).status_code == 422
        assert post({"passages": [p("y" * 51)]}).status_code == 422
        assert post({"passages": [p(title="t" * 21)]}).status_code == 422
        assert delete({"keys": ["chunk-a", "chunk-b", "chunk-c", "chunk-d"]}).status_code == 422
        assert delete({"keys": ["k" * 65]}).status_code == 422
        assert delete({"ids": ["a", "b", "c", "d"]}).status_code == 422
        big = json.dumps({"passages": [p()], "pad": "z" * 5_000}).encode()
        assert httpx.post(url + "/v1/passages", content=big,
                          headers={**AUTH, "content-type": "application/json"}).status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: cut off as it streams
            yield b'{"passages": [{"title": "T", "text": "'
            for _ in range(10):
                yield b"z" * 1_000
            yield b'"}]}'

        r = httpx.post(url + "/v1/passages", content=chunks(),
                       headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 413
        # a query body of the same size is the query routes' business (their own limit)
        r = post({"passages": [p("a new passage about lighthouses")]})
        assert r.status_code == 200 and r.json()["passages_added"] == 1


def test_writes_beyond_the_rate_get_429_and_the_token_comes_first(writable: Any) -> None:
    served, _ = writable(WriteLimits(writes_per_second=0.2, write_burst=2))
    unknown = {"keys": ["chunk-" + "0" * 32]}
    with served as (url, _):
        for _ in range(5):  # without the token: 401, and no write budget used up
            r = httpx.request("DELETE", url + "/v1/passages", json=unknown)
            assert r.status_code == 401
        codes = [httpx.request("DELETE", url + "/v1/passages", json=unknown,
                               headers=AUTH) for _ in range(3)]
        assert [r.status_code for r in codes] == [404, 404, 429]
        assert 1 <= int(codes[2].headers["retry-after"]) <= 5
        # queries are not writes: they keep being answered
        r = httpx.post(url + "/v1/retrieve", json={"queries": ["q"]}, headers=AUTH)
        assert r.status_code == 200


def test_the_write_rate_is_a_token_bucket() -> None:
    now = [0.0]
    rate = WriteRate(per_second=2.0, burst=3, clock=lambda: now[0])
    assert [rate.take() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    now[0] = 0.5  # one token back
    assert rate.take() == 0.0 and rate.take() == pytest.approx(0.5)
    now[0] = 100.0  # never more than the burst
    assert [rate.take() == 0.0 for _ in range(4)] == [True, True, True, False]
    with pytest.raises(ValueError):
        WriteLimits(writes_per_second=0)
    with pytest.raises(ValueError):
        WriteLimits(write_burst=0)


# ---------------------------------------------------------------------------------------------
# permissions of what is written


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_files_written_get_the_umask_permissions(tmp_path: Path, searcher: Searcher,
                                                 umask: int) -> None:
    import numpy as np

    from hippo_gpu.data import OpenIEDoc, Passage
    from hippo_gpu.embed.encoder import EmbeddingCache
    from hippo_gpu.retrieval.batch import retrieve_file
    from hippo_gpu.versions.writer import IndexWriter

    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())[:6]
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": 1, "query": "lighthouse"}\n')
    old = os.umask(umask)
    try:
        out = tmp_path / "w" / "idx"
        build_index(corpus, files["openie"], out, encoder="hash:16", device="cpu",
                    allow_missing_openie=True)
        with IndexWriter(out, device="cpu") as w:
            w.insert_docs([Passage("New", "a new passage")],
                          [OpenIEDoc(("a",), (("a", "b", "c"),))])
            w.commit()
        EmbeddingCache(tmp_path / "w" / "cache", {"model": "x"}).put(
            [b"0" * 16], np.zeros((1, 4), dtype=np.float32))
        retrieve_file(searcher, queries, tmp_path / "w" / "answers.jsonl", show_progress=False)
    finally:
        os.umask(old)
    found = modes(tmp_path / "w")
    assert len(found) > 15 and any(name.endswith(".safetensors") for name in found)
    for name, mode in found.items():
        is_dir = (tmp_path / "w" / name).is_dir()
        assert mode == (0o777 if is_dir else 0o666) & ~umask, (name, oct(mode), oct(umask))
        if umask & 0o022 == 0o022:
            assert not mode & 0o022, name  # neither group- nor world-writable


# ---------------------------------------------------------------------------------------------
# the token is never echoed


def test_a_token_from_a_file_is_never_echoed(index_dir: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\nsecond line ignored\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("HIPPO_GPU_TOKEN", None)
    cmd = [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(index_dir),
           "--port", str(port), "--device", "cpu", "--token-file", str(token_file),
           "--no-warmup", "--log-level", "info"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url, seen = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        good, bad = {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": "Bearer nope"}
        for path in ("/v1/stats", "/v1/indexes", "/metrics", "/openapi.json", "/nope"):
            for headers in (good, bad):
                seen.append(httpx.get(url + path, headers=headers, timeout=30))
        seen.append(httpx.post(url + "/v1/retrieve", json={"queries": [""]}, headers=good))
        seen.append(httpx.post(url + "/mcp", content=TOOLS_LIST, headers={**MCP_ACCEPT, **bad}))
        assert seen[0].status_code == 200 and seen[1].status_code == 401
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0].decode()
    for r in seen:
        assert TOKEN not in r.text and TOKEN not in str(r.headers), r.url
    assert TOKEN not in out and "second line" not in out and "GET /v1/stats" in out


def test_a_token_file_that_cannot_be_used_is_named_not_shown(index_dir: Path,
                                                             tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    token_file = tmp_path / "token"
    for content, why in [(b"\xff" + TOKEN.encode(), "not UTF-8"), (b"  \n" + TOKEN.encode(),
                                                                   "the first line is blank")]:
        token_file.write_bytes(content)
        res = CliRunner().invoke(app, ["serve", "--index", str(index_dir), "--token-file",
                                       str(token_file)])
        out = " ".join(res.output.replace("│", " ").split())  # rich boxes and wraps it
        assert res.exit_code == 2 and why in out and TOKEN not in res.output, out
    res = CliRunner().invoke(app, ["serve", "--index", str(index_dir), "--token-file",
                                   str(tmp_path / "missing")])
    # the path may wrap anywhere inside rich's box (a long tmp path under pytest-xdist)
    assert res.exit_code == 2 and "missing" in "".join(res.output.replace("│", "").split())
