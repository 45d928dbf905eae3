"""Readers for HippoRAG-format data: corpus, questions and OpenIE JSON, and the text
normalisation and passage keys they share (the columnar tables are tables.py).

Everything users bring arrives here first, so every defect in it is counted, never fatal:
malformed triples (wrong arity, non-strings, empty strings) and passages without triples are
reported in an `OpenIEReport`. The one fatal case is an OpenIE file that does not cover the
corpus, because indexing it silently would drop passages from the graph.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hippo_gpu.errors import HippoGpuError

Triple = tuple[str, str, str]


class DataFormatError(HippoGpuError, ValueError):
    """A data file does not have the shape its reader expects."""


class CoverageError(DataFormatError):
    """The OpenIE file lacks passages of the corpus."""

    def __init__(self, missing: list[str], source: str = "the OpenIE file") -> None:
        shown = ", ".join(short(m, 60) for m in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        super().__init__(
            f"{source} does not cover {len(missing)} corpus passage(s): {shown}{more}; "
            "extract them first, or index them without triples: --allow-missing-openie (index, "
            "insert), allow_missing_openie=True (build_index)"
        )
        self.missing = missing


_NORMALISE = re.compile(r"[^A-Za-z0-9 ]")


def normalize_text(s: str) -> str:
    """Upstream's text_processing: lower-case, non-alphanumerics (except space) -> space, strip.

    Internal runs of spaces are kept, as upstream keeps them.
    """
    return _NORMALISE.sub(" ", s.lower()).strip()


def memoised_normalize() -> Callable[[str], str]:
    """normalize_text with a memo of its own: each distinct string is normalised once and the
    result shared, so a phrase in a thousand triples is one string object, not a thousand."""
    memo: dict[str, str] = {}

    def norm(s: str) -> str:
        out = memo.get(s)
        if out is None:
            out = memo[s] = normalize_text(s)
        return out

    return norm


def passage_key(content: str) -> str:
    """Official HippoRAG chunk id: "chunk-" + md5 of the passage text (title + "\\n" + text)."""
    return "chunk-" + hashlib.md5(content.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Passage:
    """One corpus passage. Its identity is its content (`key`); `id` and `metadata` are the
    user's own label of it (a corpus item's optional "id" and "metadata"), carried to every hit
    and through every write (indexing/labels.py), and not part of its identity: two passages
    of the same title and text are the same passage whatever their labels."""

    title: str
    text: str
    id: str | None = field(default=None, compare=False)
    metadata: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def content(self) -> str:
        """The text HippoRAG indexes and embeds: title, newline, body."""
        return f"{self.title}\n{self.text}"

    @property
    def key(self) -> str:
        return passage_key(self.content)


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]  # gold answer first, then aliases
    gold: tuple[Passage, ...]  # supporting passages


@dataclass
class OpenIEReport:
    """What the OpenIE reader found wrong with its input (all counts, never a crash)."""

    passages: int = 0
    triples_read: int = 0
    triples_kept: int = 0
    malformed_triples: Counter[str] = field(default_factory=Counter)  # reason -> count
    passages_without_triples: int = 0
    passages_with_error: int = 0
    missing_passages: int = 0  # corpus passages the file lacks (only with allow_missing)
    extra_passages: int = 0  # passages in the file that are not in the corpus (ignored)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passages": self.passages,
            "triples_read": self.triples_read,
            "triples_kept": self.triples_kept,
            "malformed_triples": sum(self.malformed_triples.values()),
            "malformed_by_reason": dict(sorted(self.malformed_triples.items())),
            "passages_without_triples": self.passages_without_triples,
            "passages_with_error": self.passages_with_error,
            "missing_passages": self.missing_passages,
            "extra_passages": self.extra_passages,
        }


def describe_source(source: Any, what: str) -> str:
    """How an error names its input: a path as given (cut to 200 characters), an in-memory
    object by what it is and its size ("in-memory corpus (list of 3)"), never by its repr,
    which may be megabytes of passages."""
    if isinstance(source, (str, Path)):
        return short(str(source), 200, quote=False)
    try:
        size = f" of {len(source)}"
    except TypeError:
        size = ""
    return f"in-memory {what} ({type(source).__name__}{size})"


def short(text: str, limit: int = 60, *, quote: bool = True) -> str:
    """`text` cut to `limit` characters for an error message (repr-quoted unless `quote` is
    False): a title or a name from the input, never the whole of it."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut) if quote else cut


def _load_json(path: str | Path) -> Any:
    path = Path(path)
    where = describe_source(path, "file")
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise DataFormatError(f"{where}: no such file") from e
    except OSError as e:  # a directory, no permission, a name too long
        raise DataFormatError(f"{where}: cannot read it ({e.strerror or type(e).__name__})") \
            from e
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{where}: not UTF-8 text ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column "
                              f"{e.colno})") from e
    except (ValueError, RecursionError) as e:  # an integer of 4301+ digits; nesting too deep
        raise DataFormatError(f"{where}: not readable JSON ({type(e).__name__})") from e


def _passage_from(item: Any, where: str) -> Passage:
    if not isinstance(item, dict):
        raise DataFormatError(f"{where}: expected an object with title and text")
    text = item.get("text", item.get("paragraph_text"))
    title = item.get("title", "")
    if not isinstance(text, str) or not isinstance(title, str):
        raise DataFormatError(f"{where}: 'title' and 'text' must be strings")
    return Passage(title=title, text=text, id=_label_id(item.get("id"), where),
                   metadata=_label_metadata(item.get("metadata"), where))


def _label_id(value: Any, where: str) -> str | None:
    """A passage's own id: a non-blank string or an integer (kept as its decimal string)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(f"{where}: 'id' must be a non-blank string or an integer")
    return value


def _label_metadata(value: Any, where: str) -> dict[str, Any] | None:
    """A passage's metadata: a JSON object (string keys, JSON values), stored as given."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise DataFormatError(f"{where}: 'metadata' must be an object with string keys")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DataFormatError(f"{where}: 'metadata' must hold JSON values only "
                              f"({type(e).__name__})") from e
    return value


def read_corpus(source: str | Path | Sequence[dict[str, Any]]) -> list[Passage]:
    """Read a corpus JSON: a list of {"title", "text"} objects, each with an optional "id"
    (a string or an integer) and "metadata" (a JSON object); other keys are ignored.

    Duplicate passages (same title and text) are an error: they would share one chunk key; so
    are two passages with one id.
    """
    items = _load_json(source) if isinstance(source, (str, Path)) else source
    src = describe_source(source, "corpus")
    if not isinstance(items, list):
        raise DataFormatError(f"{src}: a corpus is a JSON list of {{title, text}} objects")
    passages = [_passage_from(item, f"{src}: corpus[{i}]") for i, item in enumerate(items)]
    _check_unique(passages, src)
    return passages


def as_passages(corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]]) -> list[Passage]:
    """The one corpus reader: a corpus JSON path, or passages ({title, text} dicts or Passage
    objects, mixed), checked as `read_corpus` checks a file (duplicates are an error)."""
    if isinstance(corpus, (str, Path)):
        return read_corpus(corpus)
    if isinstance(corpus, (dict, bytes)):
        raise DataFormatError("a corpus is a list of passages or a path, not a single "
                              f"{type(corpus).__name__}")
    items = list(corpus)
    if all(isinstance(p, Passage) for p in items):
        passages: list[Passage] = items  # type: ignore[assignment]
        _check_unique(passages, describe_source(items, "corpus"))
        return passages
    dicts: list[dict[str, Any]] = [
        {"title": p.title, "text": p.text, "id": p.id, "metadata": p.metadata}
        if isinstance(p, Passage) else p  # type: ignore[misc]
        for p in items
    ]
    return read_corpus(dicts)


def _check_unique(passages: Sequence[Passage], src: str) -> None:
    seen: dict[str, int] = {}
    ids: dict[str, int] = {}
    for i, p in enumerate(passages):
        if p.key in seen:
            raise DataFormatError(
                f"{src}: corpus[{i}] duplicates corpus[{seen[p.key]}] (title "
                f"{short(p.title)}); remove duplicates, they would share one passage node"
            )
        seen[p.key] = i
        if p.id is not None:
            if p.id in ids:
                raise DataFormatError(f"{src}: corpus[{i}] has the id {short(p.id)} of "
                                      f"corpus[{ids[p.id]}]; ids name one passage each")
            ids[p.id] = i


def read_questions(source: str | Path | Sequence[dict[str, Any]]) -> list[Question]:
    """Read questions in the HippoRAG reproduce formats.

    MuSiQue style: `paragraphs[]` with `is_supporting`. 2Wiki/HotpotQA style: `context` as
    [[title, [sentences]], ...] with `supporting_facts` as [[title, sentence_idx], ...]; a
    supporting passage is title + the sentences joined as HippoRAG's corpus files join them.
    """
    items = _load_json(source) if isinstance(source, (str, Path)) else source
    src = describe_source(source, "questions")
    if not isinstance(items, list):
        raise DataFormatError(f"{src}: questions are a JSON list")
    out = []
    for i, q in enumerate(items):
        where = f"{src}: questions[{i}]"
        if not isinstance(q, dict) or not isinstance(q.get("question"), str):
            raise DataFormatError(f"{where}: needs a 'question' string")
        qid = str(q.get("id", q.get("_id", i)))
        answers = _answers(q, where)
        if "paragraphs" in q:
            gold = _musique_gold(q["paragraphs"], where)
        elif "context" in q and "supporting_facts" in q:
            gold = _context_gold(q["context"], q["supporting_facts"], where)
        else:
            raise DataFormatError(
                f"{where}: needs 'paragraphs' (MuSiQue) or 'context' + 'supporting_facts'"
            )
        out.append(Question(id=qid, question=q["question"], answers=answers, gold=gold))
    return out


def _musique_gold(paragraphs: Any, where: str) -> tuple[Passage, ...]:
    if not isinstance(paragraphs, list):
        raise DataFormatError(f"{where}: 'paragraphs' must be a list of objects")
    gold = []
    for j, p in enumerate(paragraphs):
        if not isinstance(p, dict):
            raise DataFormatError(f"{where}.paragraphs[{j}]: expected an object with title "
                                  "and text")
        if p.get("is_supporting"):
            gold.append(_passage_from(p, f"{where}.paragraphs[{j}]"))
    return tuple(gold)


def _context_gold(context: Any, facts: Any, where: str) -> tuple[Passage, ...]:
    """2Wiki/HotpotQA: the `context` entries whose title a supporting fact names."""
    if not isinstance(facts, list) or not all(
            isinstance(f, list) and f and isinstance(f[0], str) for f in facts):
        raise DataFormatError(f"{where}: 'supporting_facts' must be a list of [title, "
                              "sentence index] pairs")
    if not isinstance(context, list) or not all(
            isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
            and isinstance(c[1], list) and all(isinstance(s, str) for s in c[1])
            for c in context):
        raise DataFormatError(f"{where}: 'context' must be a list of [title, [sentence, ...]] "
                              "pairs")
    titles = {f[0] for f in facts}
    return tuple(Passage(title=t, text="".join(sents)) for t, sents in context if t in titles)


def _answers(q: dict[str, Any], where: str) -> tuple[str, ...]:
    ans, aliases = q.get("answer", []), q.get("answer_aliases", [])
    answers = [ans] if isinstance(ans, str) else ans or []
    if not isinstance(answers, list) or not isinstance(aliases or [], list):
        raise DataFormatError(f"{where}: 'answer' is a string or a list, 'answer_aliases' a "
                              "list")
    return tuple(a for a in [*answers, *(aliases or [])] if isinstance(a, str))


@dataclass(frozen=True)
class OpenIEDoc:
    entities: tuple[str, ...]
    triples: tuple[Triple, ...]  # raw (unnormalised) but well-formed triples
    error: str | None = None
    malformed: tuple[tuple[str, int], ...] = ()  # (reason, count) of the triples skipped
    # raw occurrences of each kept triple in the file (exact repeats are kept once in `triples`);
    # empty when every triple occurs once. HippoRAG 2 ignores repeats; legacy v1's graph counts
    # them (retrieval/hipporag1.py reads them through `repeat_counts`)
    raw_counts: tuple[int, ...] = ()

    def repeat_counts(self) -> tuple[int, ...]:
        """[len(triples)] raw occurrences of each kept triple (>= 1)."""
        return self.raw_counts or (1,) * len(self.triples)

    @classmethod
    def from_raw(cls, entities: Any, triples: Any, error: Any = None) -> OpenIEDoc:
        """One passage's OpenIE as the file holds it (`extracted_entities`,
        `extracted_triples`, `error`), checked: well-formed triples kept once each in their
        order (how often each occurred in `raw_counts`), the others counted by reason in
        `malformed`; non-string entities and a non-string error dropped. read_openie reads
        each doc of a file with this."""
        kept: list[Triple] = []
        seen: dict[Triple, int] = {}  # kept triple -> its position in `kept`
        counts: list[int] = []
        bad: Counter[str] = Counter()
        for t in triples if isinstance(triples, list) else []:
            reason = _check_triple(t)
            if reason is not None:
                bad[reason] += 1
                continue
            tt = (t[0], t[1], t[2])
            if tt in seen:
                counts[seen[tt]] += 1
            else:
                seen[tt] = len(kept)
                kept.append(tt)
                counts.append(1)
        entities = entities if isinstance(entities, (list, tuple)) else []
        return cls(entities=tuple(e for e in entities if isinstance(e, str)),
                   triples=tuple(kept), error=error if isinstance(error, str) else None,
                   malformed=tuple(sorted(bad.items())),
                   raw_counts=tuple(counts) if any(c > 1 for c in counts) else ())


def _check_triple(t: Any) -> str | None:
    """Return why a raw triple is malformed, or None when it is a usable (s, p, o)."""
    if not isinstance(t, (list, tuple)):
        return "not_a_list"
    if len(t) != 3:
        return "wrong_arity"
    if not all(isinstance(x, str) for x in t):
        return "non_string"
    if not all(x.strip() for x in t):
        return "empty_string"
    return None


def read_openie(
    source: str | Path | dict[str, Any],
    corpus: Sequence[Passage],
    *,
    allow_missing: bool = False,
) -> tuple[list[OpenIEDoc], OpenIEReport]:
    """Read an OpenIE JSON (v1 or v2) and align it to `corpus` order.

    v1 docs carry `passage` (or `title` + `text`); v2 docs carry `idx` (a chunk key) and
    `passage`. Docs are matched to corpus passages by chunk key. Within a doc, duplicate
    well-formed triples are dropped (as upstream's filter does).

    Returns:
        docs: one OpenIEDoc per corpus passage, in corpus order.
        report: counts of everything skipped.
    """
    data = _load_json(source) if isinstance(source, (str, Path)) else source
    src = describe_source(source, "OpenIE")
    docs_in = data.get("docs") if isinstance(data, dict) else data
    if not isinstance(docs_in, list):
        raise DataFormatError(f"{src}: an OpenIE file is an object with a 'docs' list")
    report = OpenIEReport(passages=len(corpus))
    wanted = {p.key for p in corpus}
    by_key: dict[str, OpenIEDoc] = {}
    for i, d in enumerate(docs_in):
        if not isinstance(d, dict):
            hint = ("; an OpenIEDoc names no passage: give dicts as an OpenIE file holds them "
                    "(IndexWriter.insert_docs takes OpenIEDoc objects beside their passages)"
                    if isinstance(d, OpenIEDoc) else "")
            raise DataFormatError(f"{src}: docs[{i}]: expected an object with 'idx' or "
                                  f"'passage' and 'extracted_triples', got "
                                  f"{type(d).__name__}{hint}")
        key = _doc_key(d, f"{src}: docs[{i}]")
        if key not in wanted:
            report.extra_passages += 1
            continue
        raw = d.get("extracted_triples") or []
        doc = OpenIEDoc.from_raw(d.get("extracted_entities"), raw, d.get("error"))
        report.triples_read += len(raw) if isinstance(raw, list) else 0
        report.malformed_triples.update(dict(doc.malformed))
        by_key[key] = doc
    missing = [p.content for p in corpus if p.key not in by_key]
    if missing and not allow_missing:
        raise CoverageError(missing, src)
    report.missing_passages = len(missing)
    docs = [by_key.get(p.key, OpenIEDoc(entities=(), triples=())) for p in corpus]
    report.triples_kept = sum(len(d.triples) for d in docs)
    report.passages_without_triples = sum(1 for d in docs if not d.triples)
    report.passages_with_error = sum(1 for d in docs if d.error)
    return docs, report


def _doc_key(d: dict[str, Any], where: str) -> str:
    idx = d.get("idx")
    if isinstance(idx, str) and idx.startswith("chunk-"):
        return idx
    if isinstance(d.get("passage"), str):
        return passage_key(d["passage"])
    if isinstance(d.get("title"), str) and isinstance(d.get("text"), str):
        return passage_key(f"{d['title']}\n{d['text']}")
    raise DataFormatError(f"{where}: needs 'idx' (chunk key), 'passage', or 'title' + 'text'")
