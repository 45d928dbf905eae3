"""serve/service.py: named indexes behind one micro-batcher each, without HTTP. Answers equal
offline `Searcher.retrieve`; a query whose PPR cannot be certified gets its own error and the
rest of its batch is answered; an unknown index name is refused."""

from __future__ import annotations

import asyncio

import pytest

from hippo_gpu import Searcher
from hippo_gpu.config import RetrievalConfig
from hippo_gpu.serve.batcher import BatcherConfig
from hippo_gpu.serve.service import RetrievalService, UnknownIndexError
from tests.helpers import QUERIES


def _serve(searchers, queries, **kw):
    async def main():
        async with RetrievalService(searchers, BatcherConfig()) as service:
            return await service.retrieve(queries, **kw)
    return asyncio.run(main())


def test_answers_equal_offline_retrieve(sample_searcher) -> None:
    answers = _serve({"default": sample_searcher}, QUERIES, top_k=5, mode="hipporag2")
    offline = sample_searcher.retrieve(QUERIES, top_k=5, mode="hipporag2")
    assert [[h["key"] for h in a.hits] for a in answers] == \
        [[h.key for h in hits] for hits in offline]
    assert all(a.error is None for a in answers)


def test_a_failed_query_carries_its_error_and_the_dense_one_answers(sample_index) -> None:
    capped = Searcher(sample_index, RetrievalConfig(ppr_max_iter=2))
    answers = _serve({"default": capped}, QUERIES, top_k=5, mode="hybrid")
    assert all(a.hits == [] and "did not converge" in (a.error or "") for a in answers)
    dense = _serve({"default": capped}, QUERIES, top_k=5, mode="dense")
    assert all(len(a.hits) == 5 and a.error is None for a in dense)


def test_unknown_index_is_refused(sample_searcher) -> None:
    with pytest.raises(UnknownIndexError):
        _serve({"default": sample_searcher}, QUERIES[:1], top_k=5, mode="dense", index="other")
