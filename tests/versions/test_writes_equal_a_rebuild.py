"""IndexWriter (hippo_gpu/versions/writer.py) against its claim: after any inserts and deletes, the
index equals a fresh `build_index` of the final corpus in the writer's order (kept passages in their
order, then inserted ones). The reference is always an independent fresh build; both sides read
their vectors through one embedding cache, so equal texts have bit-identical vectors and every
difference is the writer's (tests/versions/index_checks.py compares them).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hippo_gpu import build_index, load_index
from hippo_gpu.config import EncoderConfig, GraphConfig, RetrievalConfig
from hippo_gpu.data import read_questions
from hippo_gpu.embed import Encoder
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.versions.writer import IndexWriter
from tests.helpers import musique_or_skip, transition_gap
from tests.versions.index_checks import (
    assert_same_basis,
    assert_same_index,
    assert_same_rankings,
    build,
    content_stats,
    copy_index,
    docs_for,
    leftovers,
    manifest_version,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# the parity graph (2 synonym pairs on the sample) and one with many synonym edges and a binding
# max-neighbours cut (63 pairs), so the incremental synonym update is exercised for real
GRAPHS = {
    "parity": GraphConfig(),
    "dense_synonyms": GraphConfig(synonym_threshold=0.5, synonym_max_neighbors=2,
                                  knn_backend="torch"),
}


@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_random_changes_equal_a_fresh_build(graph_name, enc, sample):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    graph = GRAPHS[graph_name]
    corpus = sample["corpus"]

    @hypothesis.settings(max_examples=30, derandomize=True, database=None, deadline=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(data=st.data())
    def run(data):
        initial = data.draw(st.lists(st.sampled_from(range(len(corpus))), min_size=2,
                                     max_size=20, unique=True), label="initial")
        model = [corpus[i] for i in initial]  # the expected order
        committed = list(model)
        with tempfile.TemporaryDirectory() as tmp:
            index_dir = Path(tmp) / "index"
            build(enc, sample, model, index_dir, graph)
            version = manifest_version(index_dir)
            w = IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None).open()
            try:
                for _ in range(data.draw(st.integers(1, 6), label="ops")):
                    op = data.draw(st.sampled_from(["insert", "delete", "insert_present",
                                                    "reopen", "compact"]), label="op")
                    if op == "insert":  # may include present passages: those are skipped
                        rows = data.draw(st.lists(st.sampled_from(range(len(corpus))),
                                                  min_size=1, max_size=5, unique=True))
                        batch = [corpus[i] for i in rows]
                        new = [p for p in batch if p not in model]
                        whole_file = data.draw(st.booleans(), label="whole OpenIE file")
                        openie = sample["openie_path"] if whole_file else docs_for(sample, new)
                        assert w.insert(batch, openie) == len(new)
                        model += new
                    elif op == "insert_present":
                        batch = data.draw(st.lists(st.sampled_from(model), min_size=1,
                                                   max_size=3, unique=True))
                        assert w.insert(batch, {"docs": []}) == 0  # no OpenIE needed
                    elif op == "delete" and len(model) > 1:
                        gone = data.draw(st.lists(st.sampled_from(model), min_size=1,
                                                  max_size=len(model) - 1, unique=True))
                        assert w.delete([p.key for p in gone]) == len(gone)
                        model = [p for p in model if p not in gone]
                    elif op == "reopen":
                        w.close()  # uncommitted changes are discarded
                        model = list(committed)
                        w = IndexWriter(index_dir, device="cpu", encoder=enc,
                                        compact_after=None).open()
                        assert not w.pending
                    elif op == "compact" and not w.pending:
                        w.compact()  # a new base of the same content, basis solved
                        version += 1
                        assert w.index.basis is not None
                        assert manifest_version(index_dir) == version
                    if w.pending and data.draw(st.booleans(), label="commit"):
                        w.commit()
                        report = w.last_change
                        version += 1
                        committed = list(model)
                        assert report.version == version == manifest_version(index_dir)
                        assert w.index.passage_keys == [p.key for p in model]
                if w.pending:
                    w.commit()
            finally:
                w.close()
            got = load_index(index_dir, device="cpu")
            assert leftovers(index_dir) == []
        want = build(enc, sample, model, graph=graph)
        assert_same_index(got, want)
        assert_same_rankings(got, want, enc, sample["questions"])

    run()


def test_insert_then_delete_restores_the_build(enc, sample, base_dir, tmp_path):
    """Inserting passages and deleting them again gives the original index (order included)."""
    index_dir = copy_index(base_dir, tmp_path / "index")
    added = sample["corpus"][20:]
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
        assert w.insert(added, sample["openie_path"]) == 10
        w.commit()
        report = w.last_change
        assert (report.passages_added, report.passages_removed) == (10, 0)
        assert report.phrases_added > 0 and report.facts_added > 0
        assert_same_index(w.index, build(enc, sample, sample["corpus"]))
        assert w.delete([p.key for p in added]) == 10
    got = load_index(index_dir, device="cpu")
    want = load_index(base_dir, device="cpu")
    assert_same_index(got, want)
    assert_same_rankings(got, want, enc, sample["questions"])


def test_malformed_triples_and_errors_are_counted_as_a_build_counts_them(enc, sample, tmp_path):
    """The report's triple counts follow each commit from the last version's (removed passages'
    malformed counts and error flags taken out, added ones' put in): equal to a fresh build's
    where passages carry malformed triples and OpenIE errors."""
    corpus = sample["corpus"]
    docs = json.loads(json.dumps(sample["openie"]))
    for i, doc in enumerate(docs["docs"]):
        if i % 3 == 0:
            doc["extracted_triples"] = doc["extracted_triples"] + [["only", "two"], [1, 2, 3]]
        if i % 4 == 1:
            doc["error"] = "timeout"
    dirty = dict(sample, openie=docs)
    index_dir = tmp_path / "index"
    build(enc, dirty, corpus[:12], index_dir)
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        w.insert(corpus[12:18], docs)
        w.delete([corpus[0].key, corpus[3].key, corpus[5].key])
        got = w.commit()
    final = [p for p in corpus[:18] if p not in (corpus[0], corpus[3], corpus[5])]
    want = build(enc, dirty, final)
    assert want.report["malformed_triples"] > 0 and want.report["passages_with_error"] > 0
    assert_same_index(got, want)
    assert_same_index(load_index(index_dir, device="cpu"), want)  # the replayed version too


def test_commit_returns_the_committed_version(enc, sample, base_dir, tmp_path, monkeypatch):
    """commit() returns the Index it committed, equal to load_index of the new version (counts,
    report, keys, tables, adjacency, synonyms); the writer builds on it when reopened, reading
    the index from disk again only after another writer changed it."""
    import hippo_gpu.versions.writer as writer_module
    from hippo_gpu.data import OpenIEDoc, read_openie

    index_dir = copy_index(base_dir, tmp_path / "index")
    corpus = sample["corpus"]
    reads: list[Path] = []
    real_load = writer_module.load_with_anchor
    monkeypatch.setattr(writer_module, "load_with_anchor",
                        lambda path, **kw: reads.append(path) or real_load(path, **kw))
    w = IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None)
    with w:
        w.insert(corpus[20:23], sample["openie_path"])
        w.delete([corpus[3].key])
        got = w.commit()
        assert got is w.index and w.last_change.version == got.version == 2
    want = load_index(index_dir, device="cpu")
    assert (got.version, got.path, got.precision) == (want.version, want.path, want.precision)
    assert got.counts == want.counts and got.report == want.report
    assert got.config == want.config and got.predicates == want.predicates
    assert got.passage_titles == want.passage_titles
    assert got.passage_malformed == want.passage_malformed
    assert got.passage_error == want.passage_error
    assert_same_index(got, want)
    for part in ("crow_indices", "col_indices", "values"):
        assert torch.equal(getattr(got.adjacency, part)(), getattr(want.adjacency, part)()), part
    for name in ("passage_nodes", "incidence_phrase", "incidence_passage", "synonym_src",
                 "synonym_dst", "synonym_score"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert reads == [index_dir]  # the first open only

    # reopened: builds on the committed Index (no read); structured docs insert as a file does
    new = corpus[23:26]
    docs, _ = read_openie(docs_for(sample, new), new)
    raw = {d["idx"]: d for d in sample["openie"]["docs"]}
    assert docs == [OpenIEDoc.from_raw(raw[p.key]["extracted_entities"],
                                       raw[p.key]["extracted_triples"]) for p in new]
    with w:
        assert w.insert_docs(new + corpus[:1], docs + docs[:1]) == 3  # corpus[0] is present
        assert w.commit() is w.index
    assert reads == [index_dir]
    order = [p for p in corpus[:23] if p != corpus[3]] + new
    assert_same_index(load_index(index_dir, device="cpu"), build(enc, sample, order))

    with IndexWriter(index_dir, device="cpu", encoder=enc,
                     compact_after=None) as other:  # another writer commits a segment
        other.delete([corpus[4].key])
    before = len(reads)
    with w:
        assert w.index.version == 4 and corpus[4].key not in w.index.passage_keys
    assert len(reads) == before  # not read again: the other writer's segment was replayed
    assert_same_index(w.index, load_index(index_dir, device="cpu"))


@pytest.mark.slow
def test_musique_insert_and_delete_equal_full_builds(tmp_path):
    from hippo_gpu.evaluate import evaluate_mode

    data = musique_or_skip()
    corpus = json.loads((data / "corpus.json").read_text(encoding="utf-8"))
    openie = data / "openie_gpt-3.5-turbo-1106.json"
    questions = read_questions(data / "questions.json")[:100]
    cut = int(0.9 * len(corpus))
    cache = Path(os.environ.get("HIPPO_GPU_CACHE", Path.home() / ".cache" / "hippo_gpu"))
    encoder = Encoder(EncoderConfig(), torch.device("cpu"), cache_dir=cache / "embeddings")

    def run(index: Index):
        return evaluate_mode(Searcher(index, encoder=encoder), questions, "hipporag2", top_k=200)

    full = build_index(corpus, openie, encoder=encoder, device="cpu")
    head = build_index(corpus[:cut], openie, tmp_path / "index", encoder=encoder, device="cpu")
    full_res, head_res = run(full), run(head)

    with IndexWriter(tmp_path / "index", device="cpu", encoder=encoder) as w:
        assert w.insert(corpus[cut:], openie) == len(corpus) - cut
        w.commit()
        assert content_stats(w.index) == content_stats(full)
        grown = w.compact()  # the basis of the grown graph
        assert content_stats(grown) == content_stats(full)
        assert_same_basis(grown, full)
        assert grown.passage_keys == full.passage_keys
        grown_res = run(grown)
        assert grown_res.recall == full_res.recall
        assert_same_rankings_up_to_certified_ties(grown, full, encoder, questions)
        w.delete(grown.passage_keys[cut:])
        w.commit()
        assert content_stats(load_index(tmp_path / "index", device="cpu")) == \
            content_stats(head)  # the segment replayed
        w.compact()
    shrunk = load_index(tmp_path / "index", device="cpu")
    assert content_stats(shrunk) == content_stats(head)
    assert_same_basis(shrunk, head)
    shrunk_res = run(shrunk)
    assert shrunk_res.recall == head_res.recall
    assert_same_rankings_up_to_certified_ties(shrunk, head, encoder, questions)


def assert_same_rankings_up_to_certified_ties(got: Index, want: Index, encoder: Encoder,
                                              questions: list) -> None:
    """The HippoRAG 2 top-10 of every question agree up to certified ties
    (benchmarks.soak.ranking_differences: 0 differences beyond the bounds). A question's bound
    is the two solves' certified L1 bounds plus what the two graphs' own difference can move an
    exact solution: d/(1 − d)·‖M_got − M_want‖₁ for a reset vector of mass 1 (the argument of
    tests/helpers.assert_basis_close). A question answered densely (no PPR) has the same bits
    on both sides: the same vectors through the same fixed-shape products, bound 0."""
    from benchmarks.soak import ranking_differences

    texts = [q.question for q in questions]
    damping = RetrievalConfig().damping
    widen = damping / (1.0 - damping) * transition_gap(got.adjacency, want.adjacency)
    query_emb = encoder.encode_queries(texts, "query_to_passage")
    sides = []
    for index in (got, want):
        searcher = Searcher(index, encoder=encoder)
        ranked = searcher.rank(texts, top_k=10, mode="hipporag2", query_emb=query_emb)
        bound = ranked.ppr_bound if ranked.ppr_bound is not None else torch.zeros(len(texts))
        sides.append((searcher.to_hits(ranked), ranked.dense_fallback.cpu(), bound.cpu()))
    (hits_g, dense_g, bound_g), (hits_w, dense_w, bound_w) = sides
    assert torch.equal(dense_g, dense_w)
    differ = beyond = 0
    for q in range(len(texts)):
        bound = 0.0 if bool(dense_g[q]) else float(bound_g[q]) + float(bound_w[q]) + widen
        d, b = ranking_differences([(h.key, h.score) for h in hits_g[q]],
                                   [(h.key, h.score) for h in hits_w[q]], bound)
        differ, beyond = differ + d, beyond + b
    assert beyond == 0, f"{beyond} differences beyond the certified bounds ({differ} within)"
    print(f"top-10 vs the fresh build: {differ} positions differ within their bounds")


@pytest.mark.parametrize(("deleted", "repeat"), [((), "first"), ((3, 7, 11), "first"),
                                                ((3, 7, 11), "all kept")],
                         ids=["kept", "revived", "dead parts"])
def test_repeated_facts_at_the_first_rows_are_found_not_duplicated(enc, sample, base_dir,
                                                                  tmp_path, deleted, repeat):
    """A passage whose triples repeat stored facts is linked to those facts, not given copies:
    here facts whose subject, predicate or object is the first row of its table (the edge of
    the write plan's search; a first commit stores them) and ("revived") the facts of passages
    deleted in the same commit, whose phrases may die with them; or ("dead parts") every kept
    passage's facts while the deleted passages' phrases die, so stored facts with a dead part
    lie between the ones searched for. Equal to a fresh build."""
    from hippo_gpu.data import Passage

    def doc_of(passage: Passage, triples: list[list[str]]) -> dict:
        return {"idx": passage.key, "passage": passage.content, "extracted_triples": triples,
                "extracted_entities": sorted({x for s, _, o in triples for x in (s, o)})}

    zero = Passage("Zero", "A passage whose names sort first.")
    zero_doc = doc_of(zero, [["0000 alpha", "000 relates to", "Harrowgate"],
                             ["Harrowgate", "000 relates to", "0000 alpha"],
                             ["Harrowgate", "is near", "0000 alpha"]])
    index_dir = copy_index(base_dir, tmp_path / "index")
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
        assert w.insert([zero], {"docs": [zero_doc]}) == 1
        w.commit()
        base = w.index
        spo = base.facts.spo.reshape(-1, 3).tolist()
        firsts = [{j for j, t in enumerate(spo) if t[k] == 0} for k in range(3)]
        assert all(firsts), "no fact starts a table: the case is not exercised"
        occ, ptr = base.passage_triples.rows, base.passage_triples.ptr
        owners = {p for p in range(len(base.passage_keys))
                  if set.union(*firsts) & set(occ[ptr[p]:ptr[p + 1]].tolist())}
        by_key = {d["idx"]: d for d in [*sample["openie"]["docs"], zero_doc]}
        gone = {sample["corpus"][i].key for i in deleted}
        keys = [base.passage_keys[p] for p in sorted(owners)] + sorted(gone) \
            if repeat == "first" else [k for k in base.passage_keys if k not in gone]
        echo = Passage("Echo", "A passage that repeats what others say.")
        echo_doc = doc_of(echo, [t for k in keys for t in by_key[k]["extracted_triples"]])
        if deleted:
            w.delete([sample["corpus"][i].key for i in deleted])
        assert w.insert([echo], {"docs": [echo_doc]}) == 1
        w.commit()
        report = w.last_change
    kept = [p for i, p in enumerate(sample["corpus"][:20]) if i not in deleted]
    openie = {"docs": [*sample["openie"]["docs"], zero_doc, echo_doc]}
    want = build_index([*kept, zero, echo], openie, None, encoder=enc, device="cpu")
    got = load_index(index_dir, device="cpu")
    assert len(got.facts) == len(want.facts)
    assert_same_index(got, want)
    if repeat == "all kept" or not deleted:  # every triple repeats a live fact: none is new
        assert report.facts_added == 0


def test_plan_change_refuses_an_index_without_row_tables(enc, sample, base_dir):
    """plan_change names what it needs when the index holds its facts as a plain list."""
    import dataclasses

    from hippo_gpu.versions.delta import Change, plan_change

    base = load_index(base_dir, device="cpu")
    listed = dataclasses.replace(base, facts=list(base.facts))
    with pytest.raises(TypeError, match="facts and passage triples are row tables"):
        plan_change(listed, Change(passages=[], triples=[], removed=np.zeros(0, np.int64)))


def _doc_of(passage, triples: list[list[str]]) -> dict:
    return {"idx": passage.key, "passage": passage.content, "extracted_triples": triples,
            "extracted_entities": sorted({x for s, _, o in triples for x in (s, o)})}


@pytest.mark.parametrize("case", ["replace everything", "dead subject mid-table"])
def test_changes_at_the_plan_search_edges_equal_a_fresh_build(enc, sample, base_dir, tmp_path,
                                                             case):
    """Two edges of the write plan's fact search. "replace everything": one commit deletes every
    passage and inserts a new one, so no stored fact can be reused (no candidate at all).
    "dead subject mid-table": a deleted passage's fact keeps its predicate and object but loses
    its subject, whose name sorts mid-table, while a new passage repeats every kept fact, so
    the stored facts searched lie on both sides of the dead one."""
    from hippo_gpu.data import Passage

    zero = Passage("Zero", "A passage whose names sort first.")
    zero_doc = _doc_of(zero, [["0000 alpha", "000 relates to", "Harrowgate"],
                              ["Harrowgate", "is near", "0000 alpha"]])
    doomed = Passage("Doomed", "A passage deleted later.")
    doomed_doc = _doc_of(doomed, [["mmmm doomed", "is near", "Harrowgate"]])
    index_dir = copy_index(base_dir, tmp_path / "index")
    base_keys = [p.key for p in sample["corpus"][:20]]
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
        if case == "replace everything":
            w.delete(base_keys)
            w.insert([zero], {"docs": [zero_doc]})
            w.commit()
            final, docs = [zero], [zero_doc]
        else:
            w.insert([zero, doomed], {"docs": [zero_doc, doomed_doc]})
            w.commit()
            by_key = {d["idx"]: d for d in [*sample["openie"]["docs"], zero_doc]}
            echo = Passage("Echo", "A passage that repeats what others say.")
            echo_doc = _doc_of(echo, [t for k in [*base_keys, zero.key]
                                      for t in by_key[k]["extracted_triples"]])
            w.delete([doomed.key])
            w.insert([echo], {"docs": [echo_doc]})
            w.commit()
            assert w.last_change.facts_added == 0 and w.last_change.phrases_removed == 1
            final, docs = [*sample["corpus"][:20], zero, echo], [zero_doc, echo_doc]
    want = build_index(final, {"docs": [*sample["openie"]["docs"], *docs]}, None, encoder=enc,
                       device="cpu")
    assert_same_index(load_index(index_dir, device="cpu"), want)


def test_an_index_of_one_fact_takes_a_fact_that_sorts_after_it(enc, tmp_path):
    """The plan's search over exactly one stored fact, for a new fact beyond it."""
    from hippo_gpu.data import Passage

    one = Passage("One", "The only passage.")
    two = Passage("Two", "The next passage.")
    docs = [_doc_of(one, [["Anna", "knows", "Bert"]]), _doc_of(two, [["Zora", "knows", "Bert"]])]
    build_index([one], {"docs": docs[:1]}, tmp_path / "index", encoder=enc, device="cpu")
    with IndexWriter(tmp_path / "index", device="cpu", encoder=enc) as w:
        w.insert([two], {"docs": docs[1:]})
        w.commit()
    want = build_index([one, two], {"docs": docs}, None, encoder=enc, device="cpu")
    assert_same_index(load_index(tmp_path / "index", device="cpu"), want)
