"""Seeded synthetic data at any size: corpora in the users' input formats, and HippoRAG-2-shaped
graphs and reset vectors for the PPR benchmarks (10k .. 1M passages).

Two generators live here. `synthetic_corpus` makes passages and OpenIE triples (what users bring
to `hippo-gpu index`), matching musique_train's statistics, so the whole build pipeline can be
measured at any size; `corpus_statistics` measures those statistics on any OpenIE docs, so a
benchmark prints generated next to real. `synthetic_graph` (below) skips the build and draws a
graph directly, for the PPR kernels.

The graph generator:

Shape of a real index (musique_train: 1,890 passages, ~16k phrases, ~9 triples and ~10 distinct
phrases per passage, one very popular phrase in 169 passages, 91 % of phrases in one passage) and
the issue's 1M target (~6 nodes and ~60 directed CSR entries per passage):

* P passages and V = ``phrases_per_passage``·P phrase nodes; node order is phrases then passages,
  as in a real index. Phrase ids are a random permutation (a real index sorts phrases by string,
  which is unrelated to the passages that mention them), so locality is realistically poor.
* Mentions: each passage mentions its ``phrases_per_passage`` own phrases plus
  ``popular_mentions`` phrases drawn from a Zipf law over all phrases (frequency ∝ rank^-zipf).
* Fact edges: ``triples_per_passage`` (subject, object) pairs drawn among the passage's mentions;
  A[s, o] = A[o, s] = 2·count (each orientation counted, as the official graph does).
* Passage edges: A[p, e] = A[e, p] = 1 for each distinct phrase e the passage mentions.
* Synonym edges: ``synonyms_per_phrase``·V/2 random phrase pairs with cosine in [0.8, 1],
  A = 2·score (mutual neighbours). Duplicates add up, as in the official multigraph.

The graph generator is vectorised numpy: no Python loop per passage. The corpus generator draws
its structure the same way and loops in Python only to build strings (one per phrase, one per
passage when writing), about 15 s per million passages here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.sparse import coo_matrix
from torch import Tensor

from hippo_gpu.data import OpenIEDoc, Passage, Triple, memoised_normalize, passage_key

__all__ = ["SyntheticCorpus", "SyntheticGraph", "corpus_statistics", "synthetic_corpus",
           "synthetic_graph", "synthetic_reset_vectors"]


@dataclass(frozen=True)
class SyntheticGraph:
    """A synthetic index.

    Attributes:
        adjacency: [N, N] float32 symmetric sparse CSR (same type as a real index's adjacency).
        passage_nodes: [P] int64 node rows of the passages (they follow the V phrase rows).
        num_phrases: V.
        mentions: [P, K] int64 phrase node ids each passage mentions (K = own + popular; repeats
            possible), used to draw realistic query seeds.
        phrase_passage_count: [V] number of distinct passages mentioning each phrase.
    """

    adjacency: Tensor  # [N, N] CSR float32
    passage_nodes: Tensor  # [P]
    num_phrases: int
    mentions: np.ndarray  # [P, K]
    phrase_passage_count: np.ndarray  # [V]

    @property
    def num_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def num_passages(self) -> int:
        return int(self.passage_nodes.numel())


def _zipf_sample(rng: np.random.Generator, size: int, count: int, exponent: float) -> np.ndarray:
    """``count`` draws of a rank in [0, size) with P(rank) ∝ (rank + 1)^-exponent."""
    cdf = np.cumsum(np.arange(1, size + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(count)), size - 1)


def synthetic_graph(
    num_passages: int,
    *,
    seed: int = 0,
    phrases_per_passage: int = 5,
    popular_mentions: int = 5,
    triples_per_passage: int = 11,
    synonyms_per_phrase: float = 4.0,
    zipf: float = 0.7,
) -> SyntheticGraph:
    """Build a seeded HippoRAG-2-shaped graph (see module docstring).

    Args:
        num_passages: P >= 1.
        seed: RNG seed; the same arguments give the same graph.
        phrases_per_passage: phrases introduced per passage (V = this·P, N = V + P).
        popular_mentions: extra Zipf-distributed phrase mentions per passage.
        triples_per_passage: fact triples per passage.
        synonyms_per_phrase: mean synonym degree of a phrase.
        zipf: exponent of the phrase popularity law.

    Returns:
        :class:`SyntheticGraph`.
    """
    if num_passages < 1 or phrases_per_passage < 1:
        raise ValueError("need num_passages >= 1 and phrases_per_passage >= 1")
    rng = np.random.default_rng(seed)
    p = num_passages
    v = phrases_per_passage * p
    n = v + p
    phrase_id = rng.permutation(v).astype(np.int64)  # slot -> node row (random string order)
    own = phrase_id.reshape(p, phrases_per_passage)  # [P, own]
    popular = phrase_id[rng.permutation(v)][_zipf_sample(rng, v, p * popular_mentions, zipf)]
    mentions = np.concatenate([own, popular.reshape(p, popular_mentions)], axis=1)  # [P, K]
    k = mentions.shape[1]

    # Passage edges: one per distinct (passage, phrase), weight 1.
    passage_col = np.repeat(np.arange(p, dtype=np.int64) + v, k)
    pairs = np.unique(np.stack([passage_col, mentions.ravel()], axis=1), axis=0)  # [M, 2]
    phrase_passage_count = np.bincount(pairs[:, 1], minlength=v)

    # Fact edges: subject/object among the passage's mentions, each orientation += 1.
    pick = rng.integers(0, k, size=(p, triples_per_passage, 2))
    rows = np.arange(p)[:, None]
    subj = mentions[rows, pick[..., 0]].ravel()
    obj = mentions[rows, pick[..., 1]].ravel()
    keep = subj != obj
    subj, obj = subj[keep], obj[keep]

    # Synonym edges between random phrases (mutual: both orientations carry the score).
    m = int(round(synonyms_per_phrase * v / 2))
    syn_u = rng.integers(0, v, m)
    syn_v = rng.integers(0, v, m)
    keep = syn_u != syn_v
    syn_u, syn_v = syn_u[keep], syn_v[keep]
    syn_w = rng.uniform(0.8, 1.0, syn_u.size)

    src = np.concatenate([pairs[:, 0], subj, syn_u])
    dst = np.concatenate([pairs[:, 1], obj, syn_v])
    weight = np.concatenate([np.ones(len(pairs)), np.full(subj.size, 2.0), 2.0 * syn_w]).astype(
        np.float32
    )
    sym = coo_matrix(
        (
            np.concatenate([weight, weight]),
            (np.concatenate([src, dst]), np.concatenate([dst, src])),
        ),
        shape=(n, n),
    ).tocsr()  # duplicates summed
    sym.sort_indices()
    adjacency = torch.sparse_csr_tensor(
        torch.from_numpy(sym.indptr.astype(np.int64)),
        torch.from_numpy(sym.indices.astype(np.int64)),
        torch.from_numpy(sym.data.astype(np.float32)),
        (n, n),
        check_invariants=False,
    )
    passage_nodes = torch.arange(v, n, dtype=torch.int64)
    return SyntheticGraph(adjacency, passage_nodes, v, mentions, phrase_passage_count)


def synthetic_reset_vectors(
    graph: SyntheticGraph,
    num_queries: int,
    *,
    seed: int = 0,
    phrase_seeds: int = 5,
    passage_node_weight: float = 0.05,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """HippoRAG-2-style reset vectors [N, Q] (as the official query seeds them).

    Per query: two "gold" passages; ``phrase_seeds`` phrases drawn from their mentions get weight
    s_f / |passages(e)| with a fact score s_f ~ U(0.5, 1); every passage gets
    ``passage_node_weight``·minmax(dense score), the dense score being Gaussian noise plus a boost
    on the gold passages. The phrase part is sparse (≤ 5 rows), the passage part dense.

    Returns:
        [N, Q] non-negative, each column with a positive sum.
    """
    if num_queries < 1:
        raise ValueError("num_queries must be >= 1")
    rng = np.random.default_rng(seed)
    p, q, v = graph.num_passages, num_queries, graph.num_phrases
    gold = rng.integers(0, p, size=(q, 2))  # [Q, 2]
    k = graph.mentions.shape[1]
    slot = rng.integers(0, k, size=(q, phrase_seeds))
    which = rng.integers(0, 2, size=(q, phrase_seeds))
    phrases = graph.mentions[gold[np.arange(q)[:, None], which], slot]  # [Q, S] phrase node ids
    fact_score = rng.uniform(0.5, 1.0, size=(q, phrase_seeds))
    weight = fact_score / np.maximum(graph.phrase_passage_count[phrases], 1)
    reset = torch.zeros(graph.num_nodes, q, dtype=dtype)
    cols = torch.from_numpy(np.repeat(np.arange(q), phrase_seeds))
    # index_put with accumulate: a phrase drawn twice for one query sums, like repeated facts.
    reset.index_put_(
        (torch.from_numpy(phrases.ravel()), cols),
        torch.from_numpy(weight.ravel()).to(dtype),
        accumulate=True,
    )
    dense = rng.standard_normal((q, p)).astype(np.float64)  # [Q, P]
    dense[np.arange(q)[:, None], gold] += 3.0
    lo = dense.min(axis=1, keepdims=True)
    span = dense.max(axis=1, keepdims=True) - lo
    scaled = np.divide(dense - lo, span, out=np.ones_like(dense), where=span > 0)
    reset[v:] = torch.from_numpy(passage_node_weight * scaled.T).to(dtype)
    return reset


# --- synthetic corpora in the users' input formats ----------------------------------------------

# musique_train (1,890 passages, gpt-3.5-turbo-1106 OpenIE), measured by `corpus_statistics`.
MUSIQUE_STATISTICS = {"facts_per_passage": 9.10, "phrases_per_passage": 8.59,
                      "distinct_phrases_per_passage": 10.45, "single_passage_phrases": 0.912,
                      "predicates_per_passage": 2.66}

_CONSONANTS = list("bcdfgklmnprstvz")
_VOWELS = list("aeiou")
_KINDS = ("River", "College", "County", "Records", "Party", "Island", "Festival", "Church",
          "Award", "Valley", "Station", "Museum", "Company", "Stadium", "Theatre", "Bridge")
_PREPS = ("in", "of", "by", "at", "for", "to", "with", "from", "on", "as", "into", "during",
          "after", "before", "under", "near")
# Near-duplicate forms of a phrase X: what LLM OpenIE emits for one entity in two passages.
_VARIANTS = ("The {}", "{}s", "{} Group", "{} Jr")
_WORDS = 32768  # pseudo-words per position: base phrase b is (word[b % W], word[b // W % W], ..)


def _pseudo_words(rng: np.random.Generator, count: int) -> list[str]:
    """`count` distinct capitalised consonant-vowel words of 3 syllables (seeded order).

    Every word ends in a vowel, so no word equals a variant suffix ("s", "Group", "Jr") and
    "The" (two consonants) is never a word: variant texts never collide with base texts.
    """
    syl = [c + v for c in _CONSONANTS for v in _VOWELS]  # 75 syllables
    pick = rng.permutation(len(syl) ** 3)[:count]  # of 421,875 words
    n = len(syl)
    return [(syl[i // (n * n)] + syl[i // n % n] + syl[i % n]).capitalize() for i in pick.tolist()]


@dataclass(frozen=True)
class SyntheticCorpus:
    """Passages and their OpenIE triples, held as arrays (materialise with `passages()` /
    `docs()`, or stream to files with `write()`).

    Triple t belongs to the passage p with triple_ptr[p] <= t < triple_ptr[p + 1]; its raw
    texts are (phrase_text[subject[t]], predicate_text[predicate[t]], phrase_text[object[t]]).
    """

    phrase_text: list[str]  # [V] raw phrase texts (capitalised, as LLM OpenIE writes entities)
    predicate_text: list[str]  # [R]
    triple_ptr: np.ndarray  # [P + 1] int64
    subject: np.ndarray  # [T] int64 phrase ids
    predicate: np.ndarray  # [T] int64 predicate ids
    object: np.ndarray  # [T] int64 phrase ids
    seed: int

    @property
    def num_passages(self) -> int:
        return int(len(self.triple_ptr) - 1)

    def _rows(self, start: int = 0,
              stop: int | None = None) -> Iterator[tuple[Passage, list[Triple], list[str]]]:
        """Passages start..stop-1 (Python objects for those rows only)."""
        stop = self.num_passages if stop is None else min(stop, self.num_passages)
        start = max(0, min(start, stop))
        ph, pr = self.phrase_text, self.predicate_text
        lo, hi = int(self.triple_ptr[start]), int(self.triple_ptr[stop])
        s_all, p_all, o_all = (a[lo:hi].tolist() for a in (self.subject, self.predicate,
                                                           self.object))
        ptr = (self.triple_ptr[start:stop + 1] - lo).tolist()
        for i in range(stop - start):
            a, b = ptr[i], ptr[i + 1]
            triples = [(ph[s], pr[p], ph[o]) for s, p, o in
                       zip(s_all[a:b], p_all[a:b], o_all[a:b])]
            text = " ".join(f"{s} {p} {o}." for s, p, o in triples)
            entities = list(dict.fromkeys(x for s, _, o in triples for x in (s, o)))
            yield Passage(title=triples[0][0], text=text), triples, entities

    def passages(self, start: int = 0, stop: int | None = None) -> list[Passage]:
        """The passages (rows start..stop-1 of them: only those are built)."""
        return [p for p, _, _ in self._rows(start, stop)]

    def docs(self, start: int = 0, stop: int | None = None) -> list[OpenIEDoc]:
        """OpenIE docs in passage order, as `data.read_openie` returns them (rows
        start..stop-1)."""
        return [OpenIEDoc(entities=tuple(e), triples=tuple(dict.fromkeys(t)))
                for _, t, e in self._rows(start, stop)]

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write `corpus.json` (list of {title, text}) and `openie.json` (HippoRAG v2 OpenIE:
        {"docs": [{idx, passage, extracted_entities, extracted_triples}]}), streaming one
        passage at a time. Returns {"corpus": path, "openie": path}."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        corpus_path, openie_path = out / "corpus.json", out / "openie.json"
        with corpus_path.open("w", encoding="utf-8") as fc, \
                openie_path.open("w", encoding="utf-8") as fo:
            fc.write("[")
            fo.write('{"docs": [')
            for i, (p, triples, entities) in enumerate(self._rows()):
                sep = "," if i else ""
                fc.write(sep + json.dumps({"title": p.title, "text": p.text}))
                fo.write(sep + json.dumps({
                    "idx": passage_key(p.content), "passage": p.content,
                    "extracted_entities": entities,
                    "extracted_triples": [list(t) for t in triples]}))
            fc.write("]")
            fo.write("]}")
        return {"corpus": corpus_path, "openie": openie_path}


def synthetic_corpus(
    num_passages: int,
    *,
    seed: int = 0,
    facts_per_passage: float = 9.1,
    phrases_per_fact: float = 1.148,
    new_phrase_rate: float = 0.80,
    zipf: float = 0.95,
    variant_rate: float = 0.08,
    predicates_per_passage: float = 2.66,
) -> SyntheticCorpus:
    """A seeded corpus with musique_train's OpenIE statistics (see MUSIQUE_STATISTICS).

    Per passage p: T_p ~ max(1, Poisson(facts_per_passage)) triples over
    K_p = clip(round(phrases_per_fact * T_p + N(0, 1)), 2, 2 T_p) distinct phrase slots. Slot 0
    is a phrase new to the corpus (so every passage is unique, and it titles the passage); every
    other slot is new with probability `new_phrase_rate`, else a reuse of an existing phrase drawn
    by a Zipf law over a seeded popularity order (P(rank r) ∝ (r + 1)^-zipf). A fraction
    `variant_rate` of the new phrases are near-duplicates of another phrase ("The X", "Xs",
    "X Group", "X Jr"): the synonym step's work. The 2·T_p subject/object positions cover the
    K_p slots first, then draw uniformly among them (subject != object); predicates are Zipf
    over a vocabulary of `predicates_per_passage`·P. Everything is array work except building
    the strings (one Python expression per phrase).

    Args:
        num_passages: P >= 1.
        seed: the same arguments give the same corpus, byte for byte.
    """
    if num_passages < 1:
        raise ValueError(f"num_passages must be >= 1, got {num_passages}")
    if not 0.0 <= new_phrase_rate <= 1.0 or not 0.0 <= variant_rate < 1.0:
        raise ValueError("new_phrase_rate must be in [0, 1] and variant_rate in [0, 1)")
    if facts_per_passage <= 0 or phrases_per_fact <= 0 or zipf <= 0:
        raise ValueError("facts_per_passage, phrases_per_fact and zipf must be > 0")
    rng = np.random.default_rng(seed)
    p = num_passages
    t_p = np.maximum(1, rng.poisson(facts_per_passage, p))  # [P] triples per passage
    k_p = np.clip(np.rint(phrases_per_fact * t_p + rng.standard_normal(p)), 2, 2 * t_p)
    k_p = k_p.astype(np.int64)  # [P] phrase slots per passage
    slot_ptr = np.concatenate([[0], np.cumsum(k_p)])
    s_total = int(slot_ptr[-1])

    # slots -> phrase ids: new phrases numbered in slot order, reuses drawn by Zipf
    new = rng.random(s_total) < new_phrase_rate
    new[slot_ptr[:-1]] = True
    v = int(new.sum())
    slot_phrase = np.empty(s_total, dtype=np.int64)
    slot_phrase[new] = np.arange(v)
    popularity = rng.permutation(v)  # rank -> phrase id
    slot_phrase[~new] = popularity[_zipf_sample(rng, v, int((~new).sum()), zipf)]

    # triple positions: position j of passage p (2 per triple) takes slot j if j < K_p
    t_ptr = np.concatenate([[0], np.cumsum(t_p)])
    t_total = int(t_ptr[-1])
    pas = np.repeat(np.arange(p), 2 * t_p)  # [2T] passage of each position
    j = np.arange(2 * t_total) - np.repeat(2 * t_ptr[:-1], 2 * t_p)  # [2T] position in passage
    k_of = k_p[pas]
    local = np.where(j < k_of, j, (rng.random(2 * t_total) * k_of).astype(np.int64))
    local = local.reshape(t_total, 2)
    k_t = k_p[np.repeat(np.arange(p), t_p)]
    clash = local[:, 0] == local[:, 1]
    local[clash, 1] = (local[clash, 1] + 1) % k_t[clash]
    base = np.repeat(slot_ptr[:-1], t_p)
    subject = slot_phrase[base + local[:, 0]]
    obj = slot_phrase[base + local[:, 1]]

    # predicates: a fresh one with probability q (q·T ≈ 0.9 of the vocabulary), else a Zipf
    # draw from a small popular set ("is", "born in" ...)
    popular = max(16, int(0.1 * predicates_per_passage * p))
    fresh = rng.random(t_total) < 0.9 * predicates_per_passage / facts_per_passage
    predicate = _zipf_sample(rng, popular, t_total, 1.0)
    predicate[fresh] = popular + np.arange(int(fresh.sum()))
    r = popular + int(fresh.sum())

    # texts: base phrases from their id's digits in base W, variants from a base phrase's text
    words = _pseudo_words(rng, _WORDS)
    is_variant = rng.random(v) < variant_rate
    is_variant[0] = False
    bases = np.nonzero(~is_variant)[0]
    kind = rng.integers(0, 3 * len(_KINDS), len(bases))  # >= len(_KINDS): no kind word
    texts: list[str] = [""] * v
    # a bijection of [0, W^2) (odd multiplier), so neighbouring ids do not share a first word
    scrambled = (np.arange(len(bases), dtype=np.int64) * 2654435761) % (_WORDS * _WORDS)
    scrambled += np.arange(len(bases), dtype=np.int64) // (_WORDS * _WORDS) * _WORDS * _WORDS
    for n, b, kd in zip(scrambled.tolist(), bases.tolist(), kind.tolist()):
        parts = [words[n // _WORDS % _WORDS], words[n % _WORDS]]
        if n >= _WORDS * _WORDS:
            parts.insert(0, words[n // (_WORDS * _WORDS) % _WORDS])
        if kd < len(_KINDS):
            parts.append(_KINDS[kd])
        texts[b] = " ".join(parts)
    variants = np.nonzero(is_variant)[0]
    of = bases[rng.integers(0, len(bases), len(variants))]
    form = rng.integers(0, len(_VARIANTS), len(variants))
    for i, b, f in zip(variants.tolist(), of.tolist(), form.tolist()):
        texts[i] = _VARIANTS[f].format(texts[b])
    predicates = [f"{words[i % _WORDS].lower()}s {_PREPS[i // _WORDS % len(_PREPS)]}"
                  + (f" {words[i // (_WORDS * len(_PREPS))].lower()}"
                     if i >= _WORDS * len(_PREPS) else "")
                  for i in range(r)]
    return SyntheticCorpus(phrase_text=texts, predicate_text=predicates, triple_ptr=t_ptr,
                           subject=subject, predicate=predicate.astype(np.int64), object=obj,
                           seed=seed)


def corpus_statistics(
    docs: Sequence[OpenIEDoc],
    *,
    embed: Any = None,
    near_duplicate_threshold: float = 0.8,
    sample: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """The OpenIE statistics the synthetic generator matches, measured on any docs.

    facts_per_passage: mean triples per passage (well-formed, deduplicated as read_openie does);
    phrases_per_passage: M / P, distinct normalised subjects and objects over passages (the
    issue's "phrase mentions per passage"); distinct_phrases_per_passage: mean distinct phrases
    within one passage; single_passage_phrases: fraction of phrases mentioned by one passage;
    max_phrase_passages: passages of the most popular phrase; zipf_slope: -slope of
    log(passages) against log(rank) over the phrases in >= 2 passages; predicates_per_passage;
    near_duplicate_phrases (only with `embed`, a texts -> [n, D] L2-normalised array function):
    fraction of `sample` phrases with another phrase at cosine >= `near_duplicate_threshold`.
    """

    p = len(docs)
    if p == 0:
        raise ValueError("corpus_statistics needs at least one doc")
    norm = memoised_normalize()

    phrase_row: dict[str, int] = {}
    predicates: set[str] = set()
    pas, phr = [], []
    facts = 0
    for d, doc in enumerate(docs):
        facts += len(doc.triples)
        for s, rel, o in doc.triples:
            predicates.add(norm(rel))
            for x in (norm(s), norm(o)):
                pas.append(d)
                phr.append(phrase_row.setdefault(x, len(phrase_row)))
    m = len(phrase_row)
    pairs = np.unique(np.asarray(pas, np.int64) * max(m, 1) + np.asarray(phr, np.int64))
    per_phrase = np.bincount(pairs % max(m, 1), minlength=m)
    counts = np.sort(per_phrase)[::-1]
    multi = counts[counts >= 2]
    slope = 0.0
    if len(multi) >= 3:
        ranks = np.arange(1, len(multi) + 1, dtype=np.float64)
        slope = float(-np.polyfit(np.log(ranks), np.log(multi.astype(np.float64)), 1)[0])
    out = {
        "passages": float(p),
        "facts_per_passage": facts / p,
        "phrases_per_passage": m / p,
        "distinct_phrases_per_passage": len(pairs) / p,
        "single_passage_phrases": float(np.mean(per_phrase == 1)) if m else 0.0,
        "max_phrase_passages": float(counts[0]) if m else 0.0,
        "zipf_slope": slope,
        "predicates_per_passage": len(predicates) / p,
    }
    if embed is not None and m > 1:
        phrases = list(phrase_row)
        vec = torch.from_numpy(np.asarray(embed(phrases), dtype=np.float32))  # [M, D]
        rows = torch.from_numpy(np.random.default_rng(seed).permutation(m)[:sample])
        near = torch.zeros(len(rows), dtype=torch.bool)
        for start in range(0, m, 32768):  # [S, 32768] cosines at a time (256 MB at S = 2000)
            sim = vec[rows] @ vec[start:start + 32768].T
            own = (rows >= start) & (rows < start + sim.shape[1])
            sim[own, (rows[own] - start)] = -1.0  # not itself
            near |= (sim >= near_duplicate_threshold).any(dim=1)
        out["near_duplicate_phrases"] = float(near.double().mean())
    return {k: round(v, 4) for k, v in out.items()}
