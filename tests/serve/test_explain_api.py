"""POST /v1/explain and the /ui files on a real uvicorn over the sample index: the served
explanations equal the offline `Searcher.explain`, the token guards the endpoint (and only the
data, never the page's static files), a failing query fails alone, and `ui=False` drops /ui.
(tests/serve/test_openapi.py checks the schema; tests/serve/test_ui_browser.py the page.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from hippo_gpu.config import RetrievalConfig  # noqa: E402
from hippo_gpu.retrieval.explanation import explanation_dict  # noqa: E402
from hippo_gpu.serve.server import ServerConfig  # noqa: E402
from tests.helpers import QUERIES  # noqa: E402
from tests.serve.helpers import serving  # noqa: E402

TOKEN = "explain-token-7a9e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UI_DIR = Path(__file__).resolve().parents[2] / "hippo_gpu" / "serve" / "ui"


def _offline(searcher: Any, queries: list[str], top_k: int, mode: str,
             entities: list[list[str]] | None) -> list[dict[str, Any]]:
    index = searcher.index
    return [explanation_dict(e, index.passage_keys, index.passage_titles, index.passage_texts)
            for e in searcher.explain(queries, top_k=top_k, mode=mode,
                                      query_entities=entities)]


def _assert_same(served: dict[str, Any], offline: dict[str, Any]) -> None:
    # float32 rankings: the query encoder rounds differently with the batch's shape, by ~1e-6
    assert [(h["key"], h["title"], h["text"], h["rank"]) for h in served["hits"]] == \
        [(h["key"], h["title"], h["text"], h["rank"]) for h in offline["hits"]]
    assert [s["phrase"] for s in served["seeds"]] == [s["phrase"] for s in offline["seeds"]]
    for got, want in zip(served["hits"], offline["hits"], strict=True):
        assert [s["phrase"] for s in got["seeds"]] == [s["phrase"] for s in want["seeds"]]
        assert [s["contribution"] for s in got["seeds"]] == pytest.approx(
            [s["contribution"] for s in want["seeds"]], rel=1e-4, abs=1e-7)
        assert abs(got["total"] - got["value"]) <= got["bound"]
    assert {p["phrase"] for p in served["phrases"]} == {p["phrase"] for p in offline["phrases"]}


@pytest.mark.parametrize("mode", ["hipporag2", "hybrid", "hipporag1", "dense"])
def test_served_explanations_equal_offline(sample_searcher: Any, mode: str) -> None:
    entities = [["Marta Quill"], ["Lumen Museum"], ["Skerrow"]] if mode == "hipporag1" else None
    body: dict[str, Any] = {"queries": QUERIES, "top_k": 4, "mode": mode}
    if entities is not None:
        body["entities"] = entities
    with serving(sample_searcher, ServerConfig(token=TOKEN)) as (url, _):
        r = httpx.post(url + "/v1/explain", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    served = r.json()
    assert "errors" not in served
    offline = _offline(sample_searcher, QUERIES, 4, mode, entities)
    for got, want in zip(served["explanations"], offline, strict=True):
        _assert_same(got, want)


def test_explain_is_behind_the_token_and_checks_its_request(sample_searcher: Any) -> None:
    body = {"queries": [QUERIES[0]], "top_k": 2}
    with serving(sample_searcher, ServerConfig(token=TOKEN)) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = c.post("/v1/explain", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert TOKEN not in r.text
        assert c.post("/v1/explain", json=body, headers=AUTH).status_code == 200
        for bad in ({"queries": [" "]}, {"queries": ["q"], "return_seeds": True},
                    {"queries": ["q"], "top_k": 1001}, {"queries": ["q"], "mode": "bm25"},
                    {"queries": ["q"], "index": "other"}):
            r = c.post("/v1/explain", json=bad, headers=AUTH)
            assert r.status_code == 422, (bad, r.text)
            assert "Traceback" not in r.text


def test_a_query_whose_ppr_cannot_converge_fails_alone(sample_index: Any) -> None:
    from hippo_gpu import Searcher

    # ppr_max_iter=2 certifies no column: every graph query fails; a dense one is answered
    searcher = Searcher(sample_index, RetrievalConfig(ppr_max_iter=2, ppr_method="chebyshev"))
    with serving(searcher, ServerConfig(token=TOKEN)) as (url, _):
        r = httpx.post(url + "/v1/explain", json={"queries": QUERIES[:2], "top_k": 3},
                       headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["explanations"] == [None, None]
        assert all("did not converge" in e for e in body["errors"])
        one = httpx.post(url + "/v1/explain", json={"queries": QUERIES[:1]}, headers=AUTH,
                         timeout=60)
        assert one.status_code == 500 and "did not converge" in one.json()["detail"]
        dense = httpx.post(url + "/v1/explain", json={"queries": QUERIES[:1], "mode": "dense"},
                           headers=AUTH, timeout=60)
        assert dense.status_code == 200 and dense.json()["explanations"][0]["dense_answer"]


def test_ui_files_are_served_open_and_only_from_the_package(sample_searcher: Any) -> None:
    with serving(sample_searcher, ServerConfig(token=TOKEN)) as (url, _), \
            httpx.Client(base_url=url, timeout=30) as c:
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code in (302, 307) and r.headers["location"] == "/ui/"
        page = c.get("/ui/")  # no token: the page holds no data, its requests carry the token
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp
        for name, kind in (("explorer.js", "text/javascript"), ("explorer.css", "text/css")):
            r = c.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
            assert r.content == (UI_DIR / name).read_bytes()
        assert c.get("/ui/../server.py").status_code == 404
        assert c.get("/ui/nothing.js").status_code == 404
    # no CDN, no network: every URL in the files is this server's, or the SVG namespace
    for path in UI_DIR.iterdir():
        urls = set(re.findall(r"https?://[^\s\"'`)]+", path.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)
    assert "innerHTML" not in (UI_DIR / "explorer.js").read_text()


def test_no_ui_serves_no_page(sample_searcher: Any) -> None:
    with serving(sample_searcher, ServerConfig(ui=False)) as (url, _):
        assert httpx.get(url + "/ui/", timeout=30).status_code == 404
        home = httpx.get(url + "/", timeout=30, follow_redirects=True)  # leads to /docs instead
        assert home.status_code == 200 and home.url.path == "/docs"
        assert httpx.post(url + "/v1/explain", json={"queries": ["q"], "mode": "dense"},
                          timeout=30).status_code == 200
