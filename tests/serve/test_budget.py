"""The work budget (serve/budget.py): the estimate is its docstring's formula, a request over the
budget is refused at once with 413 naming the estimate and the limit, the server keeps serving,
the refusal is counted apart from an oversized body, and the limit is configurable and reported.
(The MCP tools' refusal: tests/serve/test_mcp.py; schemathesis meets the 413: test_openapi.py.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from hippo_gpu.retrieval.modes import DENSE, HIPPORAG1, HIPPORAG2, HYBRID  # noqa: E402
from hippo_gpu.serve.budget import OverBudgetError, request_cost  # noqa: E402
from hippo_gpu.serve.config import CostLimits, QueryLimits  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from tests.helpers import QUERIES  # noqa: E402
from tests.serve.helpers import serving  # noqa: E402
from tests.serve.prometheus_samples import delta, scrape  # noqa: E402

# The issue's request: the schema's largest batch at its largest top_k, explained.
WIDEST = [f"{QUERIES[i % 3]} ({i})" for i in range(64)]


# ---------------------------------------------------------------------------------------------
# the estimate


@pytest.mark.parametrize(("args", "want"), [
    # 0.22 x 4 tokens + 5 + 4.0 x 10 hits = 45.88
    (dict(queries=["abcd"], entities=None, top_k=10, mode=HIPPORAG2, explain=True), 46),
    # a text counts at most 256 tokens: 0.22 x 256 + 5 + 0.015 x 10 = 61.47
    (dict(queries=["x" * 1000], entities=None, top_k=10, mode=HIPPORAG2, explain=False), 62),
    # hybrid encodes the entities: 0.22 x (2 + 3 + 2) + 5 + 0.015 = 6.555
    (dict(queries=["ab"], entities=[["abc", "de"]], top_k=1, mode=HYBRID, explain=False), 7),
    # hipporag2 ignores them: 0.22 x 2 + 5 + 0.015 = 5.455
    (dict(queries=["ab"], entities=[["abc", "de"]], top_k=1, mode=HIPPORAG2, explain=False),
     6),
    # at most P = 30 hits: 0.22 + 5 + 0.25 x 30 = 12.72
    (dict(queries=["a"], entities=None, top_k=999, mode=DENSE, explain=True), 13),
    # hipporag1 explained, two queries: 2 x (0.22 x 1 + 5 + 2.2 x 30) + 0.22 x 3 = 143.10
    (dict(queries=["a", "b"], entities=[["abc"], []], top_k=40, mode=HIPPORAG1,
          explain=True), 144),
    # three IRCoT steps: 3 x (0.22 x 2 + 5 + 0.015 x 5) = 16.545
    (dict(queries=["ab"], entities=None, top_k=5, mode=HIPPORAG2, explain=False, steps=3),
     17),
])
def test_the_estimate_is_the_formula(args: dict[str, Any], want: int) -> None:
    assert request_cost(**args, passages=30) == want


def test_the_issues_request_is_far_over_the_default_budget() -> None:
    limit = CostLimits().max_request_cost
    # on musique (1,890 passages) every query asks 999 explained hits: 64 x 999 x 4 units
    assert request_cost(WIDEST, None, top_k=999, mode=HIPPORAG2, explain=True,
                        passages=1_890) > 64 * 999 * 4 > 50 * limit
    # one such query, or 64 retrieved at top_k 999, fit (3.9 s and 1.2 s measured)
    assert request_cost(WIDEST[:1], None, top_k=999, mode=HIPPORAG2, explain=True,
                        passages=1_890) <= limit
    assert request_cost(WIDEST, None, top_k=999, mode=HIPPORAG2, explain=False,
                        passages=1_890) <= limit


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_request_cost must be >= 1"):
        CostLimits(max_request_cost=0)
    assert ServerConfig().cost == CostLimits()


def test_the_message_names_the_numbers_only() -> None:
    e = OverBudgetError(12_345, 5_000)
    assert "12345" in str(e) and "5000" in str(e)
    assert isinstance(e, ValueError)


# ---------------------------------------------------------------------------------------------
# served


def test_an_over_budget_explain_gets_413_at_once_and_the_server_keeps_serving(
        sample_searcher: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """"At once" is checked as what it means, not by a clock on a shared machine: the refused
    request encodes no query and reaches neither the batcher nor the Searcher."""
    config = ServerConfig(mcp=False)
    limit = config.cost.max_request_cost
    passages = len(sample_searcher.index.passage_keys)
    encoded: list[int] = []
    real_encode = sample_searcher.encoder.encode_queries
    monkeypatch.setattr(sample_searcher.encoder, "encode_queries",
                        lambda queries, purpose: encoded.append(len(queries))
                        or real_encode(queries, purpose))
    with serving(sample_searcher, config) as (url, _), httpx.Client(base_url=url,
                                                                    timeout=120) as c:
        before = scrape(c)
        r = c.post("/v1/explain", json={"queries": WIDEST, "top_k": 999})
        assert r.status_code == 413, r.text[:500]
        assert encoded == []  # the estimate reads the request alone: no model call
        body = r.json()
        assert set(body) == {"detail", "estimate", "limit"}
        assert body["estimate"] == request_cost(WIDEST, None, top_k=999, mode=HIPPORAG2,
                                                explain=True, passages=passages)
        assert body["limit"] == limit < body["estimate"]
        assert f"estimated {body['estimate']} work units" in body["detail"]
        assert not any(q in body["detail"] for q in QUERIES)  # never the request's text

        # the server keeps serving: an explain within the budget, and the widest retrieve
        r = c.post("/v1/explain", json={"queries": QUERIES, "top_k": 4})
        assert r.status_code == 200, r.text[:500]
        assert len(r.json()["explanations"]) == 3 and "errors" not in r.json()
        assert encoded  # the spy sees the queries the server does encode
        r = c.post("/v1/retrieve", json={"queries": WIDEST, "top_k": 999})
        assert r.status_code == 200, r.text[:500]
        assert all(len(hits) == passages for hits in r.json()["results"])
        after = scrape(c)
        stats = c.get("/v1/stats").json()
    assert stats["limits"]["max_request_cost"] == limit
    assert delta(before, after, "hippo_rejected_requests_total", reason="over_budget") == 1
    assert delta(before, after, "hippo_rejected_requests_total", reason="body_too_large") == 0
    http = "hippo_http_requests_total"
    assert delta(before, after, http, route="/v1/explain", method="POST", status="413") == 1
    # refused before the batcher: no explain call counted for it
    assert delta(before, after, "hippo_queries_total", index="default", mode="hipporag2",
                 transport="http", status="ok") == 3 + 64


def test_the_budget_is_configurable_and_counts_every_factor(sample_searcher: Any) -> None:
    budget = 40
    config = ServerConfig(mcp=False, cost=CostLimits(max_request_cost=budget),
                          limits=QueryLimits(max_top_k=40))
    with serving(sample_searcher, config) as (url, _):
        def post(path: str, body: dict[str, Any]) -> Any:
            return httpx.post(url + path, json=body, timeout=60)

        one = {"queries": [QUERIES[0]], "top_k": 3, "mode": "hipporag2"}
        assert post("/v1/retrieve", one).status_code == 200
        assert post("/v1/explain", one).status_code == 200  # 0.22 x 76 + 5 + 12 = 33.7
        r = post("/v1/explain", {**one, "top_k": 9})  # + 24
        assert r.status_code == 413 and r.json()["limit"] == budget
        r = post("/v1/retrieve", {**one, "queries": QUERIES * 2})  # 6 x (5 + ...) > 40
        assert r.status_code == 413
        # entities count where the mode encodes them
        ents = [["Marta Quill " * 8]]
        assert post("/v1/retrieve", {**one, "entities": ents}).status_code == 200
        r = post("/v1/retrieve", {**one, "mode": "hybrid", "entities": ents})
        assert r.status_code == 413 and r.json()["estimate"] > budget
        assert post("/v1/retrieve", one).status_code == 200


def test_the_413_is_in_the_contract(sample_searcher: Any) -> None:
    config = ServerConfig(cost=CostLimits(max_request_cost=1234))
    spec = create_app(sample_searcher, config).openapi()
    schemas = spec["components"]["schemas"]
    for path in ("/v1/retrieve", "/v1/explain"):
        doc = spec["paths"][path]["post"]["responses"]["413"]
        assert "1234 units" in doc["description"]
        content = doc["content"]["application/json"]
        refs = [s["$ref"].rsplit("/", 1)[1] for s in content["schema"]["anyOf"]]
        assert refs == ["ErrorBody", "OverBudgetBody"]
        over = {**schemas["OverBudgetBody"], "components": spec["components"]}
        jsonschema.Draft202012Validator(over).validate(content["example"])
        assert content["example"]["limit"] == 1234
    assert set(schemas["OverBudgetBody"]["required"]) == {"detail", "estimate", "limit"}
    assert "max_request_cost" in schemas["Limits"]["properties"]


# ---------------------------------------------------------------------------------------------
# musique: the issue's index


@pytest.mark.slow  # builds the musique index (minutes)
def test_the_issues_explain_on_musique_gets_413_before_any_work(
        musique_searcher: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import MUSIQUE

    questions = [q["question"] for q in
                 json.loads((MUSIQUE / "questions.json").read_text())][:64]
    encoded: list[int] = []
    real_encode = musique_searcher.encoder.encode_queries
    monkeypatch.setattr(musique_searcher.encoder, "encode_queries",
                        lambda queries, purpose: encoded.append(len(queries))
                        or real_encode(queries, purpose))
    with serving(musique_searcher, ServerConfig(mcp=False)) as (url, _):
        r = httpx.post(url + "/v1/explain", json={"queries": questions, "top_k": 999},
                       timeout=60)
        assert r.status_code == 413 and encoded == [], (r.status_code, encoded)
        assert r.json()["estimate"] > r.json()["limit"] == CostLimits().max_request_cost
        r = httpx.post(url + "/v1/explain", json={"queries": questions[:4], "top_k": 10},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["explanations"]) == 4
        assert encoded  # the spy sees the queries the server does encode
