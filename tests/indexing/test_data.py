import hashlib
import json

import pytest

from hippo_gpu.data import (
    CoverageError,
    DataFormatError,
    Passage,
    passage_key,
    read_corpus,
    read_openie,
    read_questions,
)

CORPUS = [{"title": "A", "text": "Alpha text."}, {"title": "B", "text": "Beta text."},
          {"title": "C", "text": "Gamma text."}]


def test_passage_key_matches_official_chunk_id():
    content = "A\nAlpha text."
    assert passage_key(content) == "chunk-" + hashlib.md5(content.encode()).hexdigest()
    assert Passage("A", "Alpha text.").key == passage_key(content)


def test_corpus_rejects_duplicates_and_bad_items():
    with pytest.raises(DataFormatError, match="duplicates"):
        read_corpus(CORPUS + [CORPUS[0]])
    with pytest.raises(DataFormatError, match="title"):
        read_corpus([{"title": 3, "text": "x"}])
    with pytest.raises(DataFormatError, match="list"):
        read_corpus({"title": "x"})  # type: ignore[arg-type]


def test_openie_v1_and_v2_formats_align_to_corpus_and_count_defects():
    corpus = read_corpus(CORPUS)
    v1 = {"docs": [
        {"passage": "B\nBeta text.", "extracted_entities": ["B"],
         "extracted_triples": [["b", "r", "c"], ["b", "r", "c"], ["x", "y"], [1, "r", "z"],
                               ["", "r", "z"], "not a list"]},
        {"title": "A", "text": "Alpha text.", "extracted_entities": [],
         "extracted_triples": [["a", "r", "b"]]},
        {"title": "C", "text": "Gamma text.", "extracted_entities": [], "extracted_triples": []},
        {"passage": "Z\nnot in corpus", "extracted_triples": [["p", "q", "r"]]},
    ]}
    docs, report = read_openie(v1, corpus)
    assert [d.triples for d in docs] == [(("a", "r", "b"),), (("b", "r", "c"),), ()]
    assert report.malformed_triples == {"wrong_arity": 1, "non_string": 1, "empty_string": 1,
                                        "not_a_list": 1}
    assert report.triples_read == 7 and report.triples_kept == 2
    assert report.passages_without_triples == 1 and report.extra_passages == 1

    v2 = {"docs": [{"idx": p.key, "passage": p.content, "extracted_entities": [],
                    "extracted_triples": [["s", "p", "o"]]} for p in corpus]}
    v2["docs"][2]["error"] = "timeout"
    docs2, report2 = read_openie(v2, corpus)
    assert all(d.triples == (("s", "p", "o"),) for d in docs2)
    assert docs2[2].error == "timeout" and report2.passages_with_error == 1


def test_openie_that_misses_passages_is_an_error_naming_them(tmp_path):
    corpus = read_corpus(CORPUS)
    partial = {"docs": [{"passage": "A\nAlpha text.", "extracted_triples": []}]}
    with pytest.raises(CoverageError, match="2 corpus passage") as e:
        read_openie(partial, corpus)
    assert "B\\nBeta text." in str(e.value) or "Beta text" in str(e.value)
    # the hint names options that exist: the CLI flag on index and insert, build_index's keyword
    import inspect

    import typer

    from hippo_gpu import build_index
    from hippo_gpu.cli import app

    assert "allow_missing_openie=True (build_index)" in str(e.value)
    assert "allow_missing_openie" in inspect.signature(build_index).parameters
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for command in ("index", "insert"):
        assert "--allow-missing-openie" in {o for p in commands[command].params for o in p.opts}
    docs, report = read_openie(partial, corpus, allow_missing=True)
    assert len(docs) == 3 and report.missing_passages == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataFormatError, match="bad.json"):
        read_openie(bad, corpus)


def test_questions_musique_and_2wiki_styles(tmp_path):
    musique = [{"id": "q1", "question": "Who?", "answer": "X", "answer_aliases": ["Y"],
                "paragraphs": [{"title": "A", "paragraph_text": "Alpha text.",
                                "is_supporting": True},
                               {"title": "B", "paragraph_text": "Beta text.",
                                "is_supporting": False}]}]
    wiki = [{"_id": "w1", "question": "Where?", "answer": "Z",
             "supporting_facts": [["C", 0]],
             "context": [["C", ["Gamma ", "text."]], ["A", ["Alpha text."]]]}]
    path = tmp_path / "q.json"
    path.write_text(json.dumps(musique + wiki))
    qs = read_questions(path)
    assert qs[0].answers == ("X", "Y") and [p.title for p in qs[0].gold] == ["A"]
    assert qs[0].gold[0].key == passage_key("A\nAlpha text.")
    assert qs[1].id == "w1" and qs[1].gold[0].content == "C\nGamma text."
    with pytest.raises(DataFormatError, match="paragraphs"):
        read_questions([{"question": "no context"}])
