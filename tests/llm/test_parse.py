"""Parser of LLM output: repairs, rejections by reason, and a fuzz test (no exception escapes)."""

from __future__ import annotations

import json
import random

import pytest

from hippo_gpu.llm.parse import (
    REJECT_REASONS,
    Limits,
    OutputRejected,
    ParseStats,
    load_json,
    match_facts,
    parse_answer,
    parse_entities,
    parse_triples,
)

ENTS = {"named_entities": ["Lake Tekapo", "New Zealand", "1935"]}
TRIPLES = {
    "triples": [["Lake Tekapo", "located in", "New Zealand"], ["Church", "built in", "1935"]]
}


@pytest.mark.parametrize(
    ("text", "repair"),
    [
        ("```json\n" + json.dumps(ENTS) + "\n```", "code_fence"),
        ("```\n" + json.dumps(ENTS), "code_fence"),  # fence never closed
        ("Sure! Here are the entities: " + json.dumps(ENTS), "leading_text"),
        (json.dumps(ENTS) + "\nI hope this helps. {not json}", "trailing_text"),
        ('I found [some] entities: ' + json.dumps(ENTS), "leading_text"),
    ],
)
def test_entity_repairs(text: str, repair: str) -> None:
    stats = ParseStats()
    assert parse_entities(text, stats=stats) == ENTS["named_entities"]
    assert stats.repairs[repair] == 1
    assert stats.accepted == 1 and not stats.rejected


def test_truncated_list_keeps_complete_items() -> None:
    stats = ParseStats()
    text = '{"named_entities": ["Lake Tekapo", "New Zealand", "Mackenz'
    assert parse_entities(text, stats=stats) == ["Lake Tekapo", "New Zealand"]
    assert stats.repairs["truncated"] == 1
    text = '{"triples": [["A", "b", "C"], ["D", "e", "F"], ["G", "h'
    assert parse_triples(text) == [["A", "b", "C"], ["D", "e", "F"]]
    # truncated right after a complete element, before the comma
    assert parse_triples('{"triples": [["A", "b", "C"]') == [["A", "b", "C"]]


def test_items_cleaned_and_counted() -> None:
    stats = ParseStats()
    text = json.dumps({"named_entities": [" Paris ", "Paris", 1889, None, ["x"], "", "France"]})
    assert parse_entities(text, stats=stats) == ["Paris", "1889", "France"]
    assert stats.repairs["duplicate"] == 1
    assert stats.repairs["non_string"] == 1
    assert stats.repairs["dropped_item"] == 2
    assert stats.repairs["empty_item"] == 1


def test_triples_arity_duplicates_and_objects() -> None:
    stats = ParseStats()
    text = json.dumps({"triples": [
        ["A", "b", "C"], ["A", "b", "C"], ["A", "b"], ["A", "b", "C", "D"], ["A", 2, "C"],
        {"subject": "X", "predicate": "y", "object": "Z"}, ["A", "", "C"], "A b C",
    ]})
    assert parse_triples(text, stats=stats) == [["A", "b", "C"], ["A", "2", "C"], ["X", "y", "Z"]]
    assert stats.repairs["duplicate"] == 1
    assert stats.repairs["wrong_arity"] == 2
    assert stats.repairs["object_triple"] == 1
    assert stats.repairs["bad_triple"] == 1


def test_bare_list_accepted() -> None:
    stats = ParseStats()
    assert parse_entities('["A", "B"]', stats=stats) == ["A", "B"]
    assert stats.repairs["bare_list"] == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (None, "empty"),
        ("   ", "empty"),
        ("no json at all", "no_json"),
        ("{" * 100, "too_deep"),
        ('{"named_', "invalid_json"),
        ("x" * 70_000, "too_large"),
        ('"just a string"', "no_json"),
        ('{"other": ["A"]}', "missing_field"),
        ('{"named_entities": "A"}', "wrong_type"),
        ("42 [1, 2", "wrong_type"),  # repaired to [1, 2]... a list of numbers is fine: see below
    ],
)
def test_rejections_counted(text: str | None, reason: str) -> None:
    stats = ParseStats()
    if reason == "wrong_type":
        with pytest.raises(OutputRejected) as err:
            parse_triples('{"triples": {"a": 1}}', stats=stats)
    else:
        with pytest.raises(OutputRejected) as err:
            parse_entities(text, stats=stats)
    assert err.value.reason == reason
    assert stats.rejected == {reason: 1} and stats.accepted == 0


def test_limits() -> None:
    limits = Limits(max_items=2, max_item_chars=5)
    stats = ParseStats()
    assert parse_entities('["abc", "abcdefgh", "de", "fg"]', limits=limits, stats=stats) == [
        "abc", "de"]
    assert stats.repairs["too_long"] == 1 and stats.repairs["too_many"] == 1


def test_no_eval_of_python_literals() -> None:
    # A Python-literal reply is not JSON: it is rejected, never evaluated.
    with pytest.raises(OutputRejected) as err:
        parse_entities("{'named_entities': ['A']}")
    assert err.value.reason == "invalid_json"
    with pytest.raises(OutputRejected):
        parse_entities("__import__('os').system('true')")


def test_match_facts_exact_fuzzy_and_order() -> None:
    cands = [("a", "b", "c"), ("Lake Tekapo", "located in", "Mackenzie Basin"), ("x", "y", "z")]
    written = [["lake  tekapo", "Located in", "mackenzie basin"], ["x", "y", "zz"], ["x", "y", "z"]]
    assert match_facts(written, cands) == [1, 2]  # fuzzy match of the 2nd maps to 2; no repeat
    assert match_facts([["q", "r", "s"]], cands, cutoff=0.9) == []
    assert match_facts([], cands) == []


def test_parse_answer() -> None:
    assert parse_answer("Thought: it is X.\nAnswer: Paris ") == "Paris"
    assert parse_answer("Paris") == "Paris"
    assert parse_answer(None) == ""


def _mutations(rng: random.Random, base: str) -> str:
    kind = rng.randrange(12)
    if kind == 0:
        return base[: rng.randrange(len(base) + 1)]  # truncation anywhere
    if kind == 1:
        i = rng.randrange(len(base) + 1)
        return base[:i] + rng.choice(['"', "]", "[", "{", "}", ",", ":", "\\", "\n"]) + base[i:]
    if kind == 2:
        return f"```json\n{base}\n```" + rng.choice(["", "\nDone."])
    if kind == 3:
        return rng.choice(["Here you go: ", "Output:\n", "[note] "]) + base + " trailing }"
    if kind == 4:
        return "".join(rng.choice('{}[]",:ab1 \\') for _ in range(rng.randrange(1, 80)))
    if kind == 5:
        return base.replace('"', "'")
    if kind == 6:
        return "[" * rng.randrange(1, 60) + base
    if kind == 7:
        junk = [rng.choice([1, 2.5, None, True, [], {}, "", "x" * 300, ["a"], {"k": "v"}])
                for _ in range(rng.randrange(1, 6))]
        return json.dumps({"named_entities": junk, "triples": [junk, ["a", "b"], junk[:3]]})
    if kind == 8:
        return base * rng.randrange(2, 4)
    if kind == 9:
        return json.dumps(rng.choice([None, 1, "s", [], {}, [[[]]], {"triples": None}]))
    if kind == 10:
        b = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
        return b.decode("latin-1")
    return base.replace(",", "", rng.randrange(1, 3))


def test_fuzz_no_exception_escapes_and_all_counted() -> None:
    rng = random.Random(1234)
    bases = [json.dumps(ENTS), json.dumps(TRIPLES), json.dumps(TRIPLES, indent=2),
             json.dumps({"named_entities": ["A" * 40] * 30})]
    n = 4000
    for parser in (parse_entities, parse_triples):
        stats = ParseStats()
        rejected = 0
        for _ in range(n):
            text = _mutations(rng, rng.choice(bases))
            try:
                out = parser(text, stats=stats)
            except OutputRejected as e:
                assert e.reason in REJECT_REASONS
                rejected += 1
                continue
            assert isinstance(out, list) and len(out) <= Limits().max_items
            if parser is parse_entities:
                assert all(isinstance(x, str) and x and len(x) <= 256 for x in out)
                assert len(set(out)) == len(out)
            else:
                assert all(len(t) == 3 and all(isinstance(x, str) and x for x in t) for t in out)
                assert len({tuple(t) for t in out}) == len(out)
        assert stats.total == n
        assert sum(stats.rejected.values()) == rejected
        assert set(stats.rejected) <= set(REJECT_REASONS)
        assert 0 < rejected < n  # the mutations produce both outcomes


def test_load_json_reports_repairs() -> None:
    value, repairs = load_json('```json\n{"a": [1, 2\n```')
    assert value == {"a": [1, 2]}
    assert repairs == ["code_fence", "truncated"]
