"""The IRCoT prompts: one per dataset, what a request renders to, and prompt files."""

from __future__ import annotations

import json

import pytest

from hippo_gpu.llm.ircot_prompts import (
    IRCOT_PROMPTS,
    IRCoTPromptError,
    ircot_prompt,
    prompt_dataset,
    read_ircot_prompt,
)
from hippo_gpu.retrieval.ircot import STOP_PHRASE, ThoughtRequest


def test_the_dataset_picks_the_prompt() -> None:
    assert set(IRCOT_PROMPTS) == {"musique", "2wikimultihopqa", "hotpotqa", "generic"}
    assert prompt_dataset("musique_train") == "musique"
    assert prompt_dataset("2WikiMultihopQA") == prompt_dataset("2wiki_dev") == "2wikimultihopqa"
    assert prompt_dataset("hotpotqa_1000") == "hotpotqa"
    assert prompt_dataset("sample") == prompt_dataset(None) == "generic"
    assert len({p.key for p in IRCOT_PROMPTS.values()}) == 4


@pytest.mark.parametrize("name", sorted(IRCOT_PROMPTS))
def test_each_prompt_asks_for_one_thought_and_shows_the_stop(name: str) -> None:
    from hippo_gpu.llm.backends import Backend
    from hippo_gpu.llm.ircot import IRCoTReasoner

    class Offline(Backend):
        model = "offline"

        def generate(self, requests, on_result=None):  # type: ignore[no-untyped-def]
            raise AssertionError("not called")

    prompt = ircot_prompt(name)
    assert STOP_PHRASE in prompt.system and "one step per reply" in prompt.system
    (u1, a1), (u2, a2) = prompt.demos
    assert u1.endswith("\nThought: ") and STOP_PHRASE not in a1  # the first step
    assert u2.startswith(u1[: u1.index("Question:")]) and STOP_PHRASE in a2  # the last
    request = IRCoTReasoner(Offline(), prompt=prompt).request(
        ThoughtRequest("Who?", ("T1\nbody one", "T2\nbody two"), ("A.", "B.")))
    messages = request.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user",
                                             "assistant", "user"]
    assert messages[-1]["content"] == ("Wikipedia Title: T1\nbody one\n\nWikipedia Title: "
                                       "T2\nbody two\n\nQuestion: Who?\nThought: A. B.")
    capped = IRCoTReasoner(Offline(), prompt=prompt, max_passages=1).request(
        ThoughtRequest("Who?", ("T1\nx", "T2\ny"), ()))
    assert capped.messages[-1]["content"] == "Wikipedia Title: T1\nx\n\nQuestion: Who?\nThought: "


def test_prompt_files(tmp_path) -> None:
    text = tmp_path / "mine.txt"
    text.write_text("  Think one step at a time.\n")
    p = read_ircot_prompt(text)
    assert (p.system, p.demos, p.name) == ("Think one step at a time.", (), "ircot-file-mine")
    js = tmp_path / "mine.json"
    js.write_text(json.dumps({"system": "S", "demos": [["u", "a"]]}))
    assert read_ircot_prompt(js).demos == (("u", "a"),)
    assert read_ircot_prompt(js).key != read_ircot_prompt(text).key
    for bad, why in [({"system": ""}, "empty"), ({"system": "S", "demos": [["u"]]}, "pairs"),
                     ({"system": "S", "extra": 1}, "expected"), ([1], "expected")]:
        js.write_text(json.dumps(bad))
        with pytest.raises(IRCoTPromptError, match=why):
            read_ircot_prompt(js)
    js.write_text("{not json")
    with pytest.raises(IRCoTPromptError, match="not JSON"):
        read_ircot_prompt(js)
    with pytest.raises(IRCoTPromptError, match="cannot read"):
        read_ircot_prompt(tmp_path / "absent.txt")
