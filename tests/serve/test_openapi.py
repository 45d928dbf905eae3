"""The served OpenAPI document tells the truth: a schema-valid request is answered, an invalid one
gets 422, security is declared exactly when it is enforced.

schemathesis (an off-the-shelf OpenAPI fuzzer, through its pytest plugin) runs with all its checks
against a live uvicorn on 127.0.0.1 serving the bundled sample index, once without and once with
a token. The live runs use small limits (the schema is built from `ServerConfig`, so the same code
paths run) to keep generated requests cheap; the by-hand run with the CLI's defaults is in the
issue report. A schema-valid request may get the documented 413 when its estimated work is over
the budget (serve/budget.py: JSON Schema cannot state a product of fields), so positive data is
accepted with 413 too; the server with a token has a small budget, so the fuzzer meets it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hippo_gpu.config import MODES  # noqa: E402
from hippo_gpu.serve.config import CostLimits, QueryLimits  # noqa: E402
from hippo_gpu.serve.schema import NONBLANK, WHITESPACE, request_model  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from tests.serve.helpers import serving  # noqa: E402

TOKEN = "openapi-token-5d2e"
SEED = 20240610
# Small limits keep each generated request cheap (hybrid/hipporag1 encode every entity).
LIMITS: dict[str, Any] = {
    "max_queries_per_request": 4,
    "limits": QueryLimits(max_query_chars=64, max_entities_per_query=3, max_entity_chars=24,
                          max_top_k=40),
}
# The token server's budget: one explained query always fits (at most 0.22 x (64 + 3 x 24) + 5
# + 4.0 x 30 = 155 units), four at a large top_k do not; every retrieve fits.
FUZZ_BUDGET = CostLimits(max_request_cost=200)
# schemathesis' default statuses for schema-valid data, and the budget's 413
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
OPERATIONS = {
    ("/v1/retrieve", "post"): "retrieve",
    ("/v1/explain", "post"): "explain",
    ("/v1/stats", "get"): "stats",
    ("/v1/indexes", "get"): "indexes",
    ("/metrics", "get"): "metrics",
    ("/healthz", "get"): "healthz",
    ("/readyz", "get"): "readyz",
}


def _spec(searcher: Any, token: str | None = None, **limits: Any) -> dict[str, Any]:
    return create_app(searcher, ServerConfig(token=token, **limits)).openapi()


def _request_schema(spec: dict[str, Any], path: str = "/v1/retrieve") -> dict[str, Any]:
    body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"]
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]


# ---------------------------------------------------------------------------------------------
# the document


def test_whitespace_is_python_isspace_and_the_pattern_means_it() -> None:
    assert set(WHITESPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}
    pattern = re.compile(NONBLANK)
    samples = ["", " ", "\t\n", "\u3000", "\x1c\x85", " a ", "\ufeff", "\x00", "\u200b", "é"]
    for s in [*samples, *WHITESPACE, "".join(WHITESPACE)]:
        assert bool(pattern.search(s)) == bool(s.strip()), repr(s)


def test_security_is_declared_only_with_a_token(sample_searcher: Any) -> None:
    plain = _spec(sample_searcher)
    assert "securitySchemes" not in plain.get("components", {})
    for (path, method), _ in OPERATIONS.items():
        op = plain["paths"][path][method]
        assert "security" not in op and "401" not in op["responses"]

    locked = _spec(sample_searcher, token=TOKEN)
    assert locked["components"]["securitySchemes"] == {
        "HTTPBearer": {"type": "http", "scheme": "bearer", "description": "the server's token"}
    }
    for (path, method), op_id in OPERATIONS.items():
        op = locked["paths"][path][method]
        if op_id in ("healthz", "readyz"):
            assert "security" not in op and "401" not in op["responses"]
        else:
            assert op["security"] == [{"HTTPBearer": []}]
            assert op["responses"]["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert TOKEN not in str(locked)


def test_operation_ids_are_stable(sample_searcher: Any) -> None:
    spec = _spec(sample_searcher)
    found = {(p, m): op["operationId"] for p, ops in spec["paths"].items() for m, op in ops.items()}
    assert found == OPERATIONS


def test_request_limits_are_in_the_schema(sample_searcher: Any) -> None:
    schema = _request_schema(_spec(sample_searcher, **LIMITS))
    props = schema["properties"]
    assert schema["additionalProperties"] is False and schema["required"] == ["queries"]
    assert (props["queries"]["minItems"], props["queries"]["maxItems"]) == (1, 4)
    assert props["queries"]["items"] == {"type": "string", "minLength": 1, "maxLength": 64,
                                         "pattern": NONBLANK}  # fmt: skip
    entity_lists = props["entities"]["anyOf"][0]
    assert entity_lists["maxItems"] == 4 and entity_lists["items"]["maxItems"] == 3
    assert entity_lists["items"]["items"]["maxLength"] == 24
    assert (props["top_k"]["minimum"], props["top_k"]["maximum"]) == (1, 40)
    assert props["mode"]["enum"] == list(MODES)
    # One branch without entities, one per allowed number of queries with them.
    assert len(schema["anyOf"]) == 1 + 4
    # Every example validates, and there is one per mode family.
    assert {e["mode"] for e in schema["examples"]} == {"hipporag2", "hybrid", "hipporag1"}
    for example in schema["examples"]:
        jsonschema.Draft202012Validator(schema).validate(example)


def test_explain_takes_retrieves_request_and_limits(sample_searcher: Any) -> None:
    spec = _spec(sample_searcher, **LIMITS)
    retrieve, explain = _request_schema(spec), _request_schema(spec, "/v1/explain")
    assert spec["paths"]["/v1/explain"]["post"]["requestBody"]["content"]["application/json"][
        "schema"] == {"$ref": "#/components/schemas/ExplainRequest"}
    # explain explains one-step retrieval: no seeds to return, no IRCoT loop
    assert set(retrieve["properties"]) - set(explain["properties"]) == {"return_seeds", "ircot"}
    for name, prop in explain["properties"].items():
        assert prop == retrieve["properties"][name], name
    assert explain["anyOf"] == retrieve["anyOf"] and explain["required"] == ["queries"]
    assert explain["additionalProperties"] is False
    assert {e["mode"] for e in explain["examples"]} == {"hipporag2", "hybrid", "hipporag1"}
    for example in explain["examples"]:
        jsonschema.Draft202012Validator(explain).validate(example)
    ok = spec["paths"]["/v1/explain"]["post"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"] == {"$ref": "#/components/schemas/ExplainResponse"}
    assert not any(path.startswith("/ui") for path in spec["paths"])


def test_index_names_are_in_the_schema(sample_searcher: Any) -> None:
    spec = create_app({"main": sample_searcher, "aux": sample_searcher}, ServerConfig()).openapi()
    index = _request_schema(spec)["properties"]["index"]
    assert index["anyOf"] == [{"type": "string", "enum": ["main", "aux"]}, {"type": "null"}]
    (param,) = spec["paths"]["/v1/stats"]["get"]["parameters"]
    assert param["name"] == "index" and param["in"] == "query" and not param["required"]
    assert param["schema"]["anyOf"][0]["enum"] == ["main", "aux"]
    indexes = spec["paths"]["/v1/indexes"]["get"]["responses"]["200"]["content"]
    assert indexes["application/json"]["schema"] == {"$ref": "#/components/schemas/IndexesResponse"}
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain; version=0.0.4; charset=utf-8"]
    # the single-index form: one name, "default"
    one = _request_schema(_spec(sample_searcher))["properties"]["index"]
    assert one["anyOf"] == [{"type": "string", "const": "default"}, {"type": "null"}]


def test_body_limit_admits_every_schema_valid_request() -> None:
    config = ServerConfig(**LIMITS)
    widest = {"queries": ["\U0001d11e" * 64] * 4, "entities": [["\U0001d11e" * 24] * 3] * 4,
              "top_k": 40, "mode": "hybrid", "return_seeds": False}  # fmt: skip
    request_model(config).model_validate(widest)
    assert len(json.dumps(widest, ensure_ascii=True)) <= config.max_body_bytes


# Bodies whose fate the schema decides; the server must agree with it on every one.
CONSISTENCY_CASES: list[dict[str, Any]] = [
    {"queries": [""]},
    {"queries": [" \t"]},
    {"queries": ["\u3000"]},
    {"queries": ["\x1c"]},
    {"queries": [" ok "]},
    {"queries": ["\ufeff"]},  # BOM: not whitespace to Python (nor to the schema's pattern)
    {"queries": ["q"] * 5},
    {"queries": ["x" * 65]},
    {"queries": ["q"], "top_k": 41},
    {"queries": ["q"], "top_k": 40.0},
    {"queries": ["q"], "top_k": True},
    {"queries": ["q"], "mode": "hipporag1"},
    {"queries": ["q"], "mode": "hipporag1", "entities": None},
    {"queries": ["q"], "mode": "hipporag1", "entities": [[]]},
    {"queries": ["q"], "mode": "hybrid", "entities": None},
    {"queries": ["q", "r"], "mode": "hybrid", "entities": [["Q"]]},
    {"queries": ["q", "r"], "mode": "hybrid", "entities": [["Q"], ["R", "S"]]},
    {"queries": ["q"], "entities": [["a", "b", "c", "d"]]},
    {"queries": ["q"], "entities": [[""]]},
    {"queries": ["q"], "entities": [["y" * 25]]},
    {"queries": ["q"], "extra": 1},
]


def test_schema_and_server_agree_on_each_body(sample_searcher: Any) -> None:
    spec = _spec(sample_searcher, **LIMITS)
    schema = _request_schema(spec)
    validator = jsonschema.Draft202012Validator(schema)
    explain = jsonschema.Draft202012Validator(_request_schema(spec, "/v1/explain"))
    with serving(sample_searcher, ServerConfig(**LIMITS)) as (url, _):
        for body in CONSISTENCY_CASES:
            r = httpx.post(url + "/v1/retrieve", json=body, timeout=60)
            expected = 200 if validator.is_valid(body) else 422
            assert r.status_code == expected, (body, r.text)
        for body in [*CONSISTENCY_CASES, {"queries": ["q"], "return_seeds": True}]:
            r = httpx.post(url + "/v1/explain", json=body, timeout=60)
            assert r.status_code == (200 if explain.is_valid(body) else 422), (body, r.text)
    # The case from the issue: an empty query is invalid for both.
    assert not validator.is_valid({"queries": [""]})


# ---------------------------------------------------------------------------------------------
# schemathesis against a live server


@pytest.fixture(scope="module", params=[None, TOKEN, "two-indexes"],
                ids=["no-token", "token", "two-indexes"])
def live_server(request: pytest.FixtureRequest, sample_searcher: Any) -> Iterator[tuple[str, Any]]:
    # Two names over one searcher: schemathesis sends one request at a time, so the two batcher
    # threads never run the shared query encoder at once.
    served = ({"a": sample_searcher, "b": sample_searcher} if request.param == "two-indexes"
              else sample_searcher)  # fmt: skip
    token = TOKEN if request.param == TOKEN else None
    cost = FUZZ_BUDGET if token is not None else CostLimits()
    with serving(served, ServerConfig(token=token, cost=cost, **LIMITS)) as (url, _):
        yield url, token


@pytest.fixture
def api_schema(live_server: tuple[str, str | None]) -> Any:
    url, token = live_server
    config: dict[str, Any] = {
        "seed": SEED,
        # every check, as `--checks all`
        "checks": {"enabled": True,
                   "positive_data_acceptance": {"expected-statuses": ACCEPTED}},
        "generation": {"mode": "all", "max-examples": 25},
        "cache": {"enabled": False},  # no state carried between runs, no folder in the repo
    }
    if token is not None:
        config["headers"] = {"Authorization": f"Bearer {token}"}
    else:
        # /v1/explain takes retrieve's request (the same builder: test_explain_takes_...) and
        # answers through the same batcher: fuzzed once, behind the token, to keep the run short
        config["operations"] = [{"include-path": "/v1/explain", "enabled": False}]
    return schemathesis.openapi.from_url(
        url + "/openapi.json", config=schemathesis.Config.from_dict(config)
    )


fuzzed = schemathesis.pytest.from_fixture("api_schema")


@fuzzed.parametrize()
@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_schemathesis_finds_no_failure(case: Any) -> None:
    case.call_and_validate()


def test_the_fuzzer_met_the_budget(live_server: tuple[str, str | None]) -> None:
    """After the run above, the token server (FUZZ_BUDGET) has refused some explain as over
    budget: the 413 with its body was met, and accepted, by every check."""
    from tests.serve.prometheus_samples import value

    url, token = live_server
    if token is None:
        pytest.skip("only the server with a token has a small budget")
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    samples = {(s.name, frozenset(s.labels.items())): s.value for family in
               text_string_to_metric_families(r.text) for s in family.samples}
    explained = value(samples, "hippo_http_requests_total", route="/v1/explain", method="POST",
                      status="200")
    if not explained:
        pytest.skip("runs after test_schemathesis_finds_no_failure on the same server")
    assert value(samples, "hippo_rejected_requests_total", reason="over_budget") > 0
    assert value(samples, "hippo_http_requests_total", route="/v1/explain", method="POST",
                 status="413") > 0
