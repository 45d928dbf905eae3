"""Versioned prompt templates and the JSON schemas that bound their outputs.

A template's `key` (name, version and a hash of its full text and schema) is part of every cache
key, so editing a prompt can never serve stale answers: bump `version` when the intent changes; the
hash catches edits that forgot to.

OpenIE follows the two-step recipe of HippoRAG: one-shot NER on the passage, then triple extraction
conditioned on those entities. The wording and demos here are our own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class PromptTemplate:
    """A chat prompt: system text, few-shot (user, assistant) demos, and a user format string.

    Only `user` is formatted (`str.format` with the caller's fields); system text and demos are
    sent verbatim, so they may contain JSON braces.
    """

    name: str
    version: str
    system: str
    user: str
    demos: tuple[tuple[str, str], ...] = ()
    schema: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """`name/version/hash12`: identifies the exact text sent, for cache keys."""
        blob = json.dumps(
            [self.system, self.user, list(self.demos), self.schema], sort_keys=True
        ).encode()
        return f"{self.name}/{self.version}/{hashlib.sha256(blob).hexdigest()[:12]}"

    def render(self, **fields: str) -> tuple[Message, ...]:
        """Build the message list for one request."""
        messages: list[Message] = [{"role": "system", "content": self.system}]
        for demo_user, demo_assistant in self.demos:
            messages.append({"role": "user", "content": demo_user})
            messages.append({"role": "assistant", "content": demo_assistant})
        messages.append({"role": "user", "content": self.user.format(**fields)})
        return tuple(messages)


def entity_schema(max_items: int, max_chars: int) -> dict[str, Any]:
    """`{"named_entities": [str, ...]}` with at most `max_items` strings of `max_chars`."""
    return {
        "type": "object",
        "properties": {
            "named_entities": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": max_chars},
                "maxItems": max_items,
            }
        },
        "required": ["named_entities"],
        "additionalProperties": False,
    }


def triple_schema(max_items: int, max_chars: int, key: str = "triples") -> dict[str, Any]:
    """`{key: [[subject, relation, object], ...]}`: exactly 3 bounded strings per triple."""
    item = {"type": "string", "minLength": 1, "maxLength": max_chars}
    return {
        "type": "object",
        "properties": {
            key: {
                "type": "array",
                "items": {"type": "array", "items": item, "minItems": 3, "maxItems": 3},
                "maxItems": max_items,
            }
        },
        "required": [key],
        "additionalProperties": False,
    }


_DEMO_PASSAGE = (
    "Lake Tekapo\n"
    "Lake Tekapo is the second-largest of three roughly parallel lakes in the Mackenzie Basin of "
    "New Zealand's South Island. The Church of the Good Shepherd was built on its shore in 1935 "
    "and was designed by the architect R. S. D. Harman."
)
_DEMO_ENTITIES = [
    "Lake Tekapo",
    "Mackenzie Basin",
    "New Zealand",
    "South Island",
    "Church of the Good Shepherd",
    "1935",
    "R. S. D. Harman",
]
_DEMO_TRIPLES = [
    ["Lake Tekapo", "located in", "Mackenzie Basin"],
    ["Mackenzie Basin", "part of", "South Island"],
    ["South Island", "part of", "New Zealand"],
    ["Church of the Good Shepherd", "built on the shore of", "Lake Tekapo"],
    ["Church of the Good Shepherd", "built in", "1935"],
    ["Church of the Good Shepherd", "designed by", "R. S. D. Harman"],
]

OPENIE_NER = PromptTemplate(
    name="openie-ner",
    version="1",
    system=(
        "You extract named entities from a passage for a knowledge graph. List every person, "
        "place, organisation, work, event, date and number the passage mentions, each once, "
        "spelled as in the passage. Reply with JSON only: "
        '{"named_entities": ["...", "..."]}.'
    ),
    user="Passage:\n{passage}",
    demos=(
        (f"Passage:\n{_DEMO_PASSAGE}", json.dumps({"named_entities": _DEMO_ENTITIES})),
    ),
)

OPENIE_TRIPLES = PromptTemplate(
    name="openie-triples",
    version="1",
    system=(
        "You build a knowledge graph from a passage. Write facts as [subject, relation, object] "
        "triples. Each triple should contain at least one, preferably two, of the given named "
        "entities. Replace pronouns by the names they refer to. Keep relations short. Reply with "
        'JSON only: {"triples": [["subject", "relation", "object"], ...]}.'
    ),
    user="Passage:\n{passage}\n\nNamed entities: {entities}",
    demos=(
        (
            f"Passage:\n{_DEMO_PASSAGE}\n\nNamed entities: {json.dumps(_DEMO_ENTITIES)}",
            json.dumps({"triples": _DEMO_TRIPLES}),
        ),
    ),
)

QUERY_NER = PromptTemplate(
    name="query-ner",
    version="1",
    system=(
        "You extract the named entities a question mentions (people, places, organisations, "
        "works, events, dates, numbers), each once, spelled as in the question. Reply with JSON "
        'only: {"named_entities": ["...", "..."]}.'
    ),
    user="Question: {question}",
    demos=(
        (
            "Question: Which river flows through the city where the author of The Tin Drum "
            "was born?",
            json.dumps({"named_entities": ["The Tin Drum"]}),
        ),
    ),
)

RECOGNITION_FILTER = PromptTemplate(
    name="recognition-filter",
    version="1",
    system=(
        "You are given a question and candidate facts [subject, relation, object] retrieved from "
        "a knowledge graph. Keep only the facts that help answer the question, directly or as a "
        "step of a multi-hop chain. Copy kept facts exactly as given, most useful first. Keep "
        'none if none helps. Reply with JSON only: {"fact": [["subject", "relation", '
        '"object"], ...]}.'
    ),
    user="Question: {question}\nCandidate facts: {facts}",
    demos=(
        (
            "Question: In which country is the lake beside the Church of the Good Shepherd?\n"
            "Candidate facts: "
            + json.dumps(
                {
                    "fact": [
                        ["Church of the Good Shepherd", "built on the shore of", "Lake Tekapo"],
                        ["Church of the Good Shepherd", "built in", "1935"],
                        ["Lake Tekapo", "located in", "Mackenzie Basin"],
                        ["Good Shepherd", "parable in", "Gospel of John"],
                    ]
                }
            ),
            json.dumps(
                {
                    "fact": [
                        ["Church of the Good Shepherd", "built on the shore of", "Lake Tekapo"],
                        ["Lake Tekapo", "located in", "Mackenzie Basin"],
                    ]
                }
            ),
        ),
    ),
)

QA_READER = PromptTemplate(
    name="qa-reader",
    version="1",
    system=(
        "Answer the question using the Wikipedia passages given. Reason briefly after "
        '"Thought:", then give the answer after "Answer:" as a short phrase (a name, place, '
        "date or number), not a sentence."
    ),
    user="{context}Question: {question}\nThought: ",
    demos=(
        (
            "Wikipedia Title: Lake Tekapo\nLake Tekapo is a lake in the Mackenzie Basin of New "
            "Zealand's South Island. The Church of the Good Shepherd stands on its shore.\n\n"
            "Wikipedia Title: Church of the Good Shepherd\nThe church was built in 1935 and "
            "designed by R. S. D. Harman.\n\n"
            "Question: Who designed the church on the shore of Lake Tekapo?\nThought: ",
            "The Church of the Good Shepherd stands on the shore of Lake Tekapo, and it was "
            "designed by R. S. D. Harman.\nAnswer: R. S. D. Harman",
        ),
    ),
)
