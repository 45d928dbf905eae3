"""The soak of a writable server: concurrent clients query while a writer inserts and deletes.

What benchmarks/bench_soak.py measures and tests/serve/test_soak.py asserts, in one place:

* `WritableServer`: `hippo-gpu serve --writable` on loopback (a subprocess, token set), its RSS
  read from /proc (bench_writable.py starts its server with it too);
* `write_plan`: a seeded stream of single-passage inserts and deletes over a synthetic corpus,
  with the corpus each write leaves (`Corpus`: passages in the writer's order, the order a fresh
  build of the final corpus takes them in);
* `soak`: `clients` asyncio clients sending one-query retrieve requests (at least `requests`,
  and until the last write is done), while the writer applies the plan through POST / DELETE
  /v1/passages and, after each write's 200, sends a probe: a dense query for the written
  passage's own text. Every request is logged: when it was sent and answered, its status, the
  version its response names and the keys it returned; every write: its version and when its
  200 came;
* the checks, each a list of violations (empty: the guarantee held): `server_errors` (5xx),
  `version_violations` (a response names no version, or returns a passage its version lacks,
  or, when top_k covers the corpus, misses one its version holds: answered from one version,
  the one it names), `visibility_violations` (a request sent after a write's 200 names an older
  version; a probe misses the passage just inserted);
* the final version against a fresh build of the final corpus, by what a user sees (bench_soak,
  tests/serve/test_soak.py and benchmarks/continual_synthetic.py use them): `index_differences`
  (counts, edges and weights by name — phrase text or passage key, never a row number — synonym
  pairs by name, through tests/versions/index_checks.py's comparison) and `ranking_differences` (two
  rankings of the same query up to certified ties: how many positions differ, and how many
  differences no pair of solutions within their bounds can explain, which must be 0).

Content of a version: the corpus its write left; a compaction's version (a new base) holds the
content of the last write before it (the server serves it only when no write came meanwhile).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import subprocess_env

__all__ = ["UNCERTIFIED_TIE", "Corpus", "QueryRecord", "SoakLog", "WritableServer", "WriteOp",
           "WriteRecord", "index_differences", "ranking_differences", "server_errors", "soak",
           "version_violations", "versions_in_memory", "visibility_violations", "write_plan",
           "rss_mb"]

# Scores with no certificate (dense's min-max cosines, hybrid's rank fusion) tie within this:
# float32 GEMMs round differently with a batch's shape (padding, blocking), by ~1e-7..1e-6.
UNCERTIFIED_TIE = 1e-6


def rss_mb(pid: int) -> float:
    """VmRSS of process `pid`, in MiB (nan once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return float("nan")


class WritableServer:
    """`python -m hippo_gpu.cli serve --index DIR --writable` on 127.0.0.1, a free port, with
    the token in its environment and its log in `log_path`. The writer of a soak is its load,
    so the server's write-rate limit (10 per second by default, 429 beyond) is set to
    `writes_per_second` (default 1,000: effectively off)."""

    def __init__(self, index_dir: Path, log_path: Path, *, token: str, threads: int,
                 extra: list[str] | None = None,
                 writes_per_second: float = 1_000.0) -> None:
        from benchmarks.bench_server import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.auth = {"Authorization": f"Bearer {token}"}
        self.log_path = log_path
        env = {**subprocess_env(threads), "HIPPO_GPU_TOKEN": token}
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(index_dir),
                 "--writable", "--host", "127.0.0.1", "--port", str(self.port), "--device",
                 "cpu", "--threads", str(threads), "--log-level", "warning", "--no-ui",
                 "--writes-per-second", str(writes_per_second), *(extra or [])],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.tail()}")

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> int:
        from benchmarks.bench_server import stop_process

        return stop_process(self.proc)

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def __enter__(self) -> WritableServer:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Corpus:
    """Passages (title, text, triples) in the writer's order, by key."""

    rows: dict[str, dict[str, Any]]

    def keys(self) -> frozenset[str]:
        return frozenset(self.rows)


@dataclass(frozen=True)
class WriteOp:
    kind: str  # "insert" | "delete"
    key: str
    passage: dict[str, Any] | None = None  # insert: {"title", "text", "triples"}


def write_plan(base: list[dict[str, Any]], pool: list[dict[str, Any]], writes: int, *,
               seed: int = 0, delete_every: int = 3) -> tuple[list[WriteOp], Corpus]:
    """`writes` single-passage writes: every `delete_every`-th one deletes a passage present
    then (a base one or one inserted earlier), the others insert the next passage of `pool`.
    Rows are {"key", "title", "text", "triples"}. Returns (the writes, the final corpus)."""
    rng = random.Random(seed)
    corpus = Corpus({r["key"]: r for r in base})
    fresh = iter(pool)
    ops: list[WriteOp] = []
    for i in range(writes):
        if (i + 1) % delete_every == 0:
            key = rng.choice(sorted(corpus.rows))
            del corpus.rows[key]
            ops.append(WriteOp("delete", key))
        else:
            row = next(fresh)
            corpus.rows[row["key"]] = row
            ops.append(WriteOp("insert", row["key"], {k: row[k] for k in
                                                      ("title", "text", "triples")}))
    return ops, corpus


@dataclass
class WriteRecord:
    op: WriteOp
    sent: float
    done: float
    status: int
    version: int | None
    keys_after: frozenset[str]  # the corpus this write left (as planned)


@dataclass
class QueryRecord:
    sent: float
    done: float
    status: int
    mode: str
    version: int | None = None
    keys: list[str] = field(default_factory=list)
    probe: WriteRecord | None = None  # the write this probe follows
    hits: list[dict[str, Any]] | None = None  # kept for the final queries only
    error: str | None = None  # a transport error (no HTTP status)


@dataclass
class SoakLog:
    start_version: int
    start_keys: frozenset[str]
    writes: list[WriteRecord] = field(default_factory=list)
    queries: list[QueryRecord] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (time, MiB)
    wall_s: float = 0.0

    def content(self, version: int) -> frozenset[str] | None:
        """The passage keys of `version`: those of the last write at or before it (module
        docstring); None for a version older than the start."""
        done = sorted((w.version, w.keys_after) for w in self.writes if w.version is not None)
        if version < self.start_version:
            return None
        i = bisect.bisect_right([v for v, _ in done], version)
        return done[i - 1][1] if i else self.start_keys


async def _retrieve(client: Any, auth: dict[str, str], query: str, mode: str,
                    top_k: int, *, keep_hits: bool = False) -> QueryRecord:
    import httpx

    sent = time.monotonic()
    try:
        r = await client.post("/v1/retrieve", headers=auth,
                              json={"queries": [query], "top_k": top_k, "mode": mode})
    except httpx.HTTPError as e:
        return QueryRecord(sent, time.monotonic(), 0, mode, error=type(e).__name__)
    rec = QueryRecord(sent, time.monotonic(), r.status_code, mode)
    if r.status_code == 200:
        body = r.json()
        rec.version = body.get("version")
        rec.keys = [h["key"] for h in body["results"][0]]
        if keep_hits:
            rec.hits = body["results"][0]
    else:
        rec.error = r.text[:200]
    return rec


async def _write(client: Any, auth: dict[str, str], op: WriteOp,
                 keys_after: frozenset[str]) -> WriteRecord:
    sent = time.monotonic()
    if op.kind == "insert":
        r = await client.post("/v1/passages", headers=auth, json={"passages": [op.passage]})
    else:
        r = await client.request("DELETE", "/v1/passages", headers=auth,
                                 json={"keys": [op.key]})
    version = r.json().get("version") if r.status_code == 200 else None
    return WriteRecord(op, sent, time.monotonic(), r.status_code, version, keys_after)


async def soak(server: WritableServer, ops: list[WriteOp], start: Corpus, queries: list[str],
               *, clients: int, requests: int, top_k: int, modes: tuple[str, ...],
               probe_top_k: int = 10) -> SoakLog:
    """Run the soak (module docstring); returns its log. The writes are spread over the
    requests (write k waits until k/(len(ops)+1) of them are sent) and the clients go on until
    the last write is done, so every write commits under load: `requests` is a minimum. The
    start version is read from the server (/v1/indexes) before any write."""
    import httpx

    # idle connections expire before uvicorn's keep-alive timeout (5 s) closes them: a request
    # sent on a connection the server is closing would fail in transport, not in the server
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2,
                          keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=server.url, limits=limits,
                                 timeout=httpx.Timeout(300.0)) as client:
        r = await client.get("/v1/indexes", headers=server.auth)
        r.raise_for_status()
        log = SoakLog(int(r.json()["indexes"][0]["version"]), start.keys())
        sent = 0
        stop, writer_done = asyncio.Event(), asyncio.Event()

        async def query_client(c: int) -> None:
            nonlocal sent
            while sent < requests or not writer_done.is_set():
                i = sent
                sent += 1
                log.queries.append(await _retrieve(client, server.auth,
                                                   queries[(i * 7 + c) % len(queries)],
                                                   modes[i % len(modes)], top_k))

        async def writer() -> None:
            keys = set(start.keys())
            for k, op in enumerate(ops):
                # spread the writes over the requests: write k once k/(n+1) of them are sent
                while sent < (k + 1) * requests // (len(ops) + 1):
                    await asyncio.sleep(0.005)
                keys.symmetric_difference_update({op.key})
                w = await _write(client, server.auth, op, frozenset(keys))
                log.writes.append(w)
                if w.status != 200:
                    keys.symmetric_difference_update({op.key})  # not applied
                    continue
                text = op.passage
                if text is not None:
                    probe = await _retrieve(client, server.auth,
                                            f"{text['title']}\n{text['text']}", "dense",
                                            probe_top_k)
                    probe.probe = w
                    log.queries.append(probe)

        async def sample_rss() -> None:
            while not stop.is_set():
                log.rss.append((time.monotonic(), server.rss_mb()))
                await asyncio.sleep(0.25)

        t0 = time.monotonic()
        sampler = asyncio.create_task(sample_rss())
        writing = asyncio.create_task(writer())
        writing.add_done_callback(lambda _: writer_done.set())
        await asyncio.gather(*(query_client(c) for c in range(clients)))
        await writing
        log.wall_s = time.monotonic() - t0
        stop.set()
        await sampler
    return log


async def final_queries(server: WritableServer, queries: list[str], *, top_k: int,
                        modes: tuple[str, ...]) -> list[QueryRecord]:
    """One request per (query, mode), hits kept: what the final version answers."""
    import httpx

    async with httpx.AsyncClient(base_url=server.url, timeout=300.0) as client:
        return [await _retrieve(client, server.auth, q, m, top_k, keep_hits=True)
                for q in queries for m in modes]


def versions_in_memory(server: WritableServer) -> int:
    """The server's hippo_index_versions_in_memory gauge (its default index)."""
    import httpx

    text = httpx.get(server.url + "/metrics", headers=server.auth, timeout=60).text
    for line in text.splitlines():
        if line.startswith("hippo_index_versions_in_memory{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise ValueError("/metrics has no hippo_index_versions_in_memory")


def wait_until_served(index_dir: Path, after_version: int, timeout_s: float = 120.0) -> int:
    """Wait until the server caught up with the writes: the manifest names a version at or
    after `after_version` that is a compacted base (no segments) or whose last segment stores
    its updated basis (versions/live_basis.py: the server stores it right after serving it);
    returns that version."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = json.loads((index_dir / "manifest.json").read_text())
        segments = m.get("segments") or []
        if int(m["version"]) >= after_version and (
                not segments or (index_dir / segments[-1]["name"] / "basis.json").exists()):
            return int(m["version"])
        time.sleep(0.2)
    raise TimeoutError(f"{index_dir}: the server did not serve a basis at or after version "
                       f"{after_version} in {timeout_s} s")


# -- the checks: each returns its violations (empty: the guarantee held) ---------------------


def server_errors(log: SoakLog) -> Counter[str]:
    """Requests and writes answered with a 5xx or not answered (a transport error), by status."""
    out: Counter[str] = Counter()
    for q in log.queries:
        if q.status == 0 or q.status >= 500:
            out[str(q.status or q.error)] += 1
    for w in log.writes:
        if w.status >= 500:
            out[f"write {w.status}"] += 1
    return out


def statuses(log: SoakLog) -> dict[str, int]:
    """Requests by status (writes apart, as "write STATUS")."""
    out = Counter(str(q.status or q.error) for q in log.queries)
    out.update(f"write {w.status}" for w in log.writes)
    return dict(sorted(out.items()))


def version_violations(log: SoakLog, *, exhaustive: bool) -> list[str]:
    """Answered from one version, the one named: every 200 names an int version whose content
    holds every returned key (with `exhaustive`, top_k covers the corpus: the returned keys are
    exactly that content)."""
    bad = []
    for i, q in enumerate(log.queries):
        if q.status != 200:
            continue
        if not isinstance(q.version, int):
            bad.append(f"request {i}: names no version ({q.version!r})")
            continue
        content = log.content(q.version)
        if content is None:
            bad.append(f"request {i}: names version {q.version}, older than the start")
            continue
        stray = set(q.keys) - content
        if stray:
            bad.append(f"request {i} (version {q.version}): {len(stray)} key(s) its version "
                       f"lacks, e.g. {sorted(stray)[0]}")
        if exhaustive and q.probe is None and set(q.keys) != content:
            bad.append(f"request {i} (version {q.version}): returned {len(q.keys)} keys, its "
                       f"version holds {len(content)}")
    return bad


def visibility_violations(log: SoakLog) -> list[str]:
    """Every committed write visible to the next request: a request sent after a write's 200
    names that write's version or a later one; a probe after an insert finds the passage."""
    done = sorted((w.done, w.version) for w in log.writes if w.status == 200)
    times = [t for t, _ in done]
    bad = []
    for i, q in enumerate(log.queries):
        if q.status != 200 or not isinstance(q.version, int):
            continue
        j = bisect.bisect_left(times, q.sent)  # writes answered before this request was sent
        if j and max(v for _, v in done[:j] if v is not None) > q.version:
            newest = max(v for _, v in done[:j] if v is not None)
            bad.append(f"request {i}: sent after version {newest}'s 200, answered from "
                       f"version {q.version}")
        if q.probe is not None and q.probe.op.kind == "insert" and q.probe.op.key not in q.keys:
            bad.append(f"probe {i}: version {q.version} does not return the passage inserted "
                       f"by version {q.probe.version}")
    return bad


def latency_ms(log: SoakLog) -> dict[str, float | None]:
    from benchmarks.common import quantile

    xs = [q.done - q.sent for q in log.queries if q.status == 200 and q.probe is None]
    return {"p50": round(quantile(xs, 0.5) * 1e3, 1) if xs else None,
            "p99": round(quantile(xs, 0.99) * 1e3, 1) if xs else None, "n": len(xs)}


def rss_summary(log: SoakLog, end_mb: float) -> dict[str, float]:
    """RSS (MiB) at the start, at its peak during the soak, at the end (after the final
    compaction), and the growth from the start to the end."""
    values = [v for _, v in log.rss if v == v]
    start = values[0] if values else float("nan")
    return {"start": round(start, 1), "peak": round(max(values, default=float("nan")), 1),
            "end": round(end_mb, 1), "growth": round(end_mb - start, 1)}


# -- the final version against a fresh build, by what a user sees -------------------------------


def index_differences(got: Any, want: Any) -> dict[str, Any]:
    """Two indexes compared by name (module docstring): `equal` is tests/versions/index_checks.py's
    assert_same_index (passages in order, phrases, facts, counts, vectors, edges and weights and
    synonym pairs by name, the basis within its bounds) holding, `first_difference` its message
    if not; the rest are the figures behind it: counts equal, edges by name (how many, only on
    either side, the largest weight difference of the shared ones), synonym pairs likewise."""
    from tests.versions.index_checks import (
        assert_same_index,
        content_stats,
        edge_weights,
        synonym_pairs,
    )

    try:
        assert_same_index(got, want)
        equal, first = True, None
    except AssertionError as e:
        equal, first = False, str(e).splitlines()[0][:300] if str(e) else "assertion failed"
    out: dict[str, Any] = {"equal": equal, "first_difference": first,
                           "counts_equal": content_stats(got) == content_stats(want)}
    for name, of in (("edges", edge_weights), ("synonym_pairs", synonym_pairs)):
        a, b = of(got), of(want)
        shared = a.keys() & b.keys()
        out[name] = {"build": len(b), "only_final": len(a.keys() - b.keys()),
                     "only_build": len(b.keys() - a.keys()),
                     "max_weight_diff": max((abs(a[k] - b[k]) for k in shared), default=0.0)}
    return out


def ranking_differences(got: list[tuple[str, float]], want: list[tuple[str, float]],
                        bound: float) -> tuple[int, int]:
    """(positions whose keys differ, differences beyond the bounds) of two top-k lists of
    (passage key, score), best first, each from a solve within its L1 bound of the same exact
    scores x* (``bound``: the two bounds summed).

    An L1 bound β bounds |e_a| + |e_b| for any two entries, so a list within β of x* and one
    within β' order two passages a, b differently only if x* can tie them: with a before b in
    ``got`` and b before a in ``want``, x*_a − x*_b ≥ (g_a − g_b) − β and x*_b − x*_a ≥
    (w_b − w_a) − β', which contradict when (g_a − g_b) + (w_b − w_a) > β + β'. A passage a list
    does not hold scores at most that list's last score, which stands in for it. Beyond the
    bounds: each such contradicting pair, each passage both hold whose two scores differ by
    more than the bound, and each passage one list holds that outscores the other's last by
    more than the bound. Two exact methods may legitimately differ where scores lie within
    their bounds; the first count says how often they did.
    """
    differ = sum(1 for i in range(max(len(got), len(want)))
                 if i >= len(got) or i >= len(want) or got[i][0] != want[i][0])
    g, w = dict(got), dict(want)
    g_last = got[-1][1] if got else 0.0
    w_last = want[-1][1] if want else 0.0
    beyond = sum(1 for k in g.keys() & w.keys() if abs(g[k] - w[k]) > bound)
    beyond += sum(1 for k in g.keys() - w.keys() if g[k] - w_last > bound)  # dropped there
    beyond += sum(1 for k in w.keys() - g.keys() if w[k] - g_last > bound)
    g_pos = {k: i for i, (k, _) in enumerate(got)}
    w_pos = {k: i for i, (k, _) in enumerate(want)}
    keys = list(g.keys() | w.keys())
    for a in keys:  # a before b in got, b before a in want: top-k lists, so k² pairs at most
        for b in keys:
            in_got = a in g_pos and (b not in g_pos or g_pos[a] < g_pos[b])
            in_want = b in w_pos and (a not in w_pos or w_pos[b] < w_pos[a])
            if a != b and in_got and in_want:
                gap = (g[a] - g.get(b, g_last)) + (w[b] - w.get(a, w_last))
                beyond += gap > bound
    return differ, beyond
