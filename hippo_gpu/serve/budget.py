"""The work budget of a request: estimate what a retrieve or explain request asks for before it
is queued, and refuse it at once when the estimate is over `CostLimits.max_request_cost`.

The schema bounds each factor of a request (queries, characters, entities, top_k, IRCoT steps) but
not their product: 64 explained queries at top_k 999 are schema-valid and ran past 10 s on musique
(8 of them take 28 s here, so 64 about four minutes), long enough to time out a client and to hold
the index's batcher from everyone else. `request_cost` is the one estimate, used by HTTP
(serve/server.py) and MCP (serve/mcp.py) alike, through `RetrievalService.admit`
(serve/service.py).

**The estimate**, in work units (one unit: about a millisecond of the calibration machine, so
the default budget of 5,000 is about 5 s there), for Q queries q with entities E_q, top_k k, an
index of P passages and S IRCoT steps (1 without IRCoT):

    cost = S · Σ_q [ W_TOKEN · (t(q) + Σ_{e ∈ E_q} t(e)) + W_QUERY + W_HIT[kind, mode] · min(k, P) ]
    t(x) = min(len(x), MAX_TEXT_TOKENS)

- Encoding: the default encoder (a WordPiece BERT) reads at most one token per character and at
  most MAX_TEXT_TOKENS tokens of a text, so t(x) bounds a text's tokens; English runs at ~4
  characters a token, so an English text is charged up to 4x its time, CJK or symbols (a token
  each, what a fuzzer sends) about their time. E_q counts only where the mode encodes entities
  (hybrid, hipporag1); hybrid's capitalised spans of the query are not counted (at most the
  query's own characters again, and English: charged 4x already).
- W_QUERY: a query's seeds, PPR solve and ranking.
- W_HIT: per hit returned. retrieve: building and serialising the passage; explain: the hit's
  float64 PPR column, one term and its bridges per seed, the phrases named
  (hippo_gpu.retrieval.explain), serialised. Explain's time per hit grows with top_k (1.8 ms a hit
  at top_k 100, 3.9 at 999: hippo_gpu.retrieval.explain._phrases scans the selected incidences and
  synonyms once per named phrase, 3.2 of 5.3 s in a profile of one query at top_k 999, 4,010
  phrases), so W_HIT is its rate at the largest top_k and smaller requests are overestimated (64 x
  10 explained hybrid: 4,432 units, answered in 1.6 s).
- S: each IRCoT step retrieves each query again (and a query's merged hits grow to k x S);
  the LLM's time for the thoughts is not estimated.

**Calibration.** Each request timed end to end over HTTP (uvicorn on loopback, after one
warm-up request per route and mode), CPU, 1 torch thread, the default encoder, on this
repository's 2-core Intel Xeon VM (shared with other jobs); musique_train: N = 18,125 nodes,
P = 1,890 passages; the 64 first questions (90 characters on average) unless said. Seconds ->
estimated units:

    explain hipporag2   1x10 0.05 -> 67       1x100 0.18 -> 427      1x999 3.87 -> 4,023
      (Q x top_k)       8x10 0.22 -> 540      8x100 1.22 -> 3,420    8x999 28.2 -> 32,188
                        64x10 1.81 -> 4,152   64x100 9.01 -> 27,192  64x999 (~225) -> 257,336
    explain hybrid      1x100 0.21 -> 435     1x999 3.92 -> 4,031    64x10 1.64 -> 4,432
                        8x100 1.29 -> 3,453
    explain hipporag1   1x100 0.07 -> 255     1x999 2.10 -> 2,233    64x10 0.43 -> 3,280
                        8x100 0.35 -> 2,013
    explain dense       1x999 0.23 -> 277     64x100 0.44 -> 3,192
    retrieve            1x10 0.03 -> 28       64x10 0.32 -> 1,602    64x100 0.38 -> 1,688
                        64x999 0.92-1.22 -> 2,551-2,831 (dense ... hybrid)
    64 queries of 2,000 characters, top_k 10: retrieve 3.3-3.7 -> 3,935-4,214;
                        explain hipporag2 5.53 -> 6,485
    16 entities of 200 characters a query, top_k 10, hybrid retrieve: English 16 queries
                        2.29 -> 11,534, 64 queries 8.32 -> 45,342; CJK 8 queries 5.38 -> 5,853,
                        16 queries 9.91 -> 11,689 (hipporag1: English 8 queries 1.12 -> 5,853)

Every estimate is at or above its time in milliseconds (by 3% to 7.6x), so the default budget of
5,000 admits what answers within ~5 s there (the VM is shared: a repeated timing can be ~40%
slower, as one query explained at top_k 999 once took 5.3 s). A schemathesis run of all its checks
against `hippo-gpu serve` on that index with the CLI's defaults (64 queries, top_k 1,000;
/v1/retrieve and /v1/explain, 25 examples, 2,923 cases) found no issue: 129 explains refused with
413, every request answered within 5 s. Both PPR terms grow with the graph (N and its edges): on a
larger index set `--max-request-cost` lower, on a faster machine higher.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.retrieval.modes import DENSE, HIPPORAG1, HIPPORAG2, HYBRID, MODE_LIST, Mode

__all__ = ["MAX_TEXT_TOKENS", "W_HIT", "W_QUERY", "W_TOKEN", "OverBudgetError", "request_cost"]

MAX_TEXT_TOKENS = 256  # the default encoder's max_seq_length: longer texts are truncated
W_TOKEN = 0.22  # units per encoded token (measured 0.16-0.19 ms a token)
W_QUERY = 5.0  # units per query: seeds, PPR, ranking (64 x 10 retrieve: 0.32 s with encoding)
W_HIT: dict[tuple[bool, Mode], float] = {  # (explain, mode) -> units per hit
    **{(False, mode): 0.015 for mode in MODE_LIST},  # 64 x 999: 0.92-1.22 s
    (True, HIPPORAG2): 4.0,  # measured 3.9 ms a hit at top_k 999
    (True, HYBRID): 4.0,  # 3.9
    (True, HIPPORAG1): 2.2,  # 2.1: the phrase graph's columns, no dense term
    (True, DENSE): 0.25,  # 0.23: one dense term a hit, no PPR column
}


class OverBudgetError(HippoGpuError, ValueError):
    """A request's estimated work is over the server's budget (HTTP 413, an MCP tool error).

    The message names the two numbers only, never the request's text."""

    def __init__(self, estimate: int, limit: int) -> None:
        self.estimate = estimate
        self.limit = limit
        super().__init__(
            f"request too costly: estimated {estimate} work units, over this server's limit of "
            f"{limit} per request; send fewer queries, a smaller top_k or shorter texts (or "
            "split the request)")


def request_cost(queries: Sequence[str], entities: Sequence[Sequence[str]] | None, *,
                 top_k: int, mode: Mode, explain: bool, passages: int, steps: int = 1) -> int:
    """The estimated work of one request, in units (module docstring: the formula, the weights
    and their calibration), rounded up.

    Args:
        queries: the request's Q query strings.
        entities: one list per query, or None; counted only for the modes that encode them.
        top_k: hits asked per query; at most `passages` are returned.
        mode: the retrieval mode (parsed by the transport: retrieval.modes.mode_of).
        explain: the request is an explain (each hit decomposed) rather than a retrieve.
        passages: P, the passages of the index the request asks.
        steps: IRCoT steps per query (1 without IRCoT).
    """
    tokens = sum(min(len(q), MAX_TEXT_TOKENS) for q in queries)
    if entities is not None and mode.reads_entities:
        tokens += sum(min(len(e), MAX_TEXT_TOKENS) for per_query in entities for e in per_query)
    hits = min(top_k, passages)
    per_request = W_TOKEN * tokens + len(queries) * (W_QUERY + W_HIT[explain, mode] * hits)
    return math.ceil(steps * per_request)
