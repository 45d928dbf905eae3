"""The IRCoT reasoning-step prompts: one per dataset (musique, 2wikimultihopqa, hotpotqa) and a
generic one, and the reader of a prompt file (`--ircot-prompt FILE`).

Every prompt asks for ONE thought per reply, given the retrieved passages, the question and the
thoughts so far, and for the stop phrase "So the answer is:" (hippo_gpu.retrieval.ircot.STOP_PHRASE)
in the thought that gives the answer. Each has a worked example as two demo turns: the first step of
a chain and its last step, so the model sees both a continuation and the stop. The wording and the
examples are our own; upstream's prompts (ircot_musique etc.) share the task, the stop phrase and
the layout (passages as "Wikipedia Title: ..." blocks, then "Question:", then "Thought:" with the
thoughts so far).
"""

from __future__ import annotations

import json
from pathlib import Path

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.llm.prompts import PromptTemplate

__all__ = ["IRCOT_PROMPTS", "IRCoTPromptError", "ircot_prompt", "prompt_dataset",
           "read_ircot_prompt"]

# {context}: "Wikipedia Title: {passage}\n\n" per passage; {thoughts}: the thoughts so far,
# joined by spaces (empty at the first step)
USER = "{context}Question: {question}\nThought: {thoughts}"

_TASK = (
    "You answer a multi-hop question by reasoning over the Wikipedia passages given, one step "
    "per reply. The thoughts written so far follow \"Thought:\"; write only the NEXT thought: "
    "one or two sentences stating the one fact, taken from the passages, that the next link of "
    "the chain needs. Never write the whole chain in one reply. When your thought reaches the "
    "answer, end it with \"So the answer is:\" and the answer as a short phrase."
)


def _demo(passages: list[tuple[str, str]], question: str, chain: list[str]
          ) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two demo turns of one worked example: its first thought, and its last one after the
    others."""
    context = "".join(f"Wikipedia Title: {t}\n{body}\n\n" for t, body in passages)
    first = (USER.format(context=context, question=question, thoughts=""), chain[0])
    last = (USER.format(context=context, question=question, thoughts=" ".join(chain[:-1])),
            chain[-1])
    return first, last


_MUSIQUE = _demo(
    [("Key West", "Key West is an island city in Monroe County, Florida. Ernest Hemingway "
                  "lived and wrote there during the 1930s."),
     ("The Old Man and the Sea", "The Old Man and the Sea is a short novel by Ernest "
                                 "Hemingway, published in 1952, about an ageing Cuban "
                                 "fisherman."),
     ("Ernest Hemingway", "Ernest Miller Hemingway (1899-1961) was an American novelist. He "
                          "was born in Oak Park, Illinois."),
     ("Oak Park, Illinois", "Oak Park is a village in Cook County, Illinois, on the western "
                            "edge of Chicago.")],
    "In which county was the author of The Old Man and the Sea born?",
    ["The Old Man and the Sea was written by Ernest Hemingway.",
     "Ernest Hemingway was born in Oak Park, Illinois.",
     "Oak Park is in Cook County. So the answer is: Cook County."],
)

_TWOWIKI = _demo(
    [("Casablanca", "Casablanca is the largest city of Morocco and its chief port."),
     ("Casablanca (film)", "Casablanca is a 1942 American romantic drama film directed by "
                           "Michael Curtiz."),
     ("Citizen Kane", "Citizen Kane is a 1941 American drama film produced and directed by "
                      "Orson Welles, who also plays its lead.")],
    "Which film came out first, Casablanca or Citizen Kane?",
    ["Casablanca, the film, came out in 1942.",
     "Citizen Kane came out in 1941, a year before Casablanca. So the answer is: Citizen Kane."],
)

_HOTPOT = _demo(
    [("Dom Luis I Bridge", "The Dom Luis I Bridge is a double-deck iron arch bridge over the "
                           "Douro in Porto, opened in 1886."),
     ("Maria Pia Bridge", "The Maria Pia Bridge is a railway arch bridge in Porto, Portugal, "
                          "completed in 1877 by the company of Gustave Eiffel."),
     ("Gustave Eiffel", "Gustave Eiffel (1832-1923) was a French civil engineer whose company "
                        "also built the Eiffel Tower in Paris.")],
    "What nationality was the engineer whose company built the Maria Pia Bridge?",
    ["The Maria Pia Bridge was built by the company of Gustave Eiffel.",
     "Gustave Eiffel was a French civil engineer. So the answer is: French."],
)

_GENERIC = _demo(
    [("Rhine Falls", "The Rhine Falls is a waterfall on the Rhine in northern Switzerland, "
                     "near the town of Schaffhausen."),
     ("Switzerland", "Switzerland is a landlocked country in central Europe. Its federal city, "
                     "the seat of its government, is Bern.")],
    "Which city is the seat of government of the country where the Rhine Falls are?",
    ["The Rhine Falls are in Switzerland.",
     "The seat of government of Switzerland is Bern. So the answer is: Bern."],
)


def _template(name: str, hint: str, demos: tuple[tuple[str, str], ...]) -> PromptTemplate:
    return PromptTemplate(name=f"ircot-{name}", version="1", system=f"{_TASK} {hint}".strip(),
                          user=USER, demos=demos)


IRCOT_PROMPTS: dict[str, PromptTemplate] = {
    "musique": _template(
        "musique", "Questions here chain two to four facts, each from its own passage: settle "
        "one link per step, and name the entity it leads to.", _MUSIQUE),
    "2wikimultihopqa": _template(
        "2wikimultihopqa", "Questions here compare two entities or follow a relation (a film's "
        "director, a person's parent): state each entity's fact in its own step before the "
        "comparison.", _TWOWIKI),
    "hotpotqa": _template(
        "hotpotqa", "Questions here bridge two passages through an entity, or compare two "
        "entities.", _HOTPOT),
    "generic": _template("generic", "", _GENERIC),
}


class IRCoTPromptError(HippoGpuError, ValueError):
    """An IRCoT prompt file that cannot be used."""


def prompt_dataset(name: str | None) -> str:
    """The prompt a dataset name picks: the IRCOT_PROMPTS key its name starts with ("musique"
    for "musique_train", "2wikimultihopqa" also for "2wiki..."), else "generic"."""
    lowered = (name or "").lower()
    for key in ("musique", "hotpotqa"):
        if lowered.startswith(key):
            return key
    if lowered.startswith("2wiki"):
        return "2wikimultihopqa"
    return "generic"


def ircot_prompt(dataset: str | None = None) -> PromptTemplate:
    """The IRCoT prompt of a dataset (see `prompt_dataset`)."""
    return IRCOT_PROMPTS[prompt_dataset(dataset)]


def read_ircot_prompt(path: str | Path) -> PromptTemplate:
    """A prompt from a file: a .json object {"system": str, "demos": [[user, assistant], ...]}
    (demos optional), or any other file's text as the system prompt without demos. The user
    message keeps the fixed layout (USER), which the loop fills in.

    Raises:
        IRCoTPromptError: unreadable, empty, or not of that shape (naming the file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise IRCoTPromptError(f"{path}: cannot read the IRCoT prompt ({e})") from e
    demos: tuple[tuple[str, str], ...] = ()
    if path.suffix == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise IRCoTPromptError(f"{path}: not JSON ({e.msg})") from e
        if not isinstance(raw, dict) or set(raw) - {"system", "demos"}:
            raise IRCoTPromptError(f'{path}: expected {{"system": str, "demos": [[user, '
                                   'assistant], ...]}}')
        system, pairs = raw.get("system"), raw.get("demos", [])
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
                for p in pairs):
            raise IRCoTPromptError(f"{path}: 'demos' must be a list of [user, assistant] "
                                   "string pairs")
        demos = tuple((u, a) for u, a in pairs)
    else:
        system = text
    if not isinstance(system, str) or not system.strip():
        raise IRCoTPromptError(f"{path}: the system prompt is empty")
    return PromptTemplate(name=f"ircot-file-{path.stem}", version="1", system=system.strip(),
                          user=USER, demos=demos)
