"""Probe LLM-free second hops on musique_train (issue 45): how much a perfect second-hop scorer
could add with the candidates our graph offers, and what six scorers add.

Step 1 is the hybrid mode. A second hop may only change what follows step 1's top `keep`
passages (keep = 1 or 2: the first hop's best passages stay where they are).

* ceilings: an oracle moves the gold passages of a candidate pool right below hybrid's top 2
  (or top 1: the last row, the room for R@2). The pools are hybrid's top 10 and 20 (a
  reranker's), and the passages that share a phrase with hybrid's top 1 or top 2, the phrase
  named by at most 10 passages (a bridge step's).
  The gap between a ceiling and a family's score is the scorer's, not the candidates'.
* families: each scorer over a small grid; the grid point best on the tune half (even
  positions; R@2 + R@5) is reported on the held-out half (odd positions), untouched.
  - bridge_ppr: the phrases of hybrid's top n passages, less the query's linked entities, seed
    the entity ranking's phrase-graph PPR (weights 1 / passages naming the phrase);
  - bridge_gate: passages that share a phrase named by at most c passages with hybrid's top n,
    ranked among themselves in hybrid's order;
  - passage_pair: p2 scores max over p1 in hybrid's top n of cos(q, e_p1 + e_p2), p2 among the
    neighbours of that top n (as bridge_gate);
  - bridge_fact: a neighbour (as bridge_gate) scores its best fact that names a bridge phrase,
    by the query-fact cosine;
  - title_link: passages whose title (less a parenthesis; or its part before a comma) is a
    phrase of hybrid's top n passages and not in the question (Wikipedia's links, rebuilt),
    ranked by the query-passage cosine;
  - rocchio: the query vector moved by lambda times the mean of hybrid's top n passages.
  Each second ranking is fused into hybrid's by reciprocal rank, weight w, k = 60, below the
  top keep.

Appends one JSON line to benchmarks/results/probe_second_hop.jsonl (provenance.py's fields).

    python -m benchmarks.probe_second_hop --threads 1
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    musique_dir,
    musique_index,
    provenance,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")

Ranking = list[list[int]]  # per query, passage rows best first
RRF_K = 60


def fuse(step1: Ranking, step2: Ranking, keep: int, w: float) -> Ranking:
    """Step 1's top `keep`, then reciprocal-rank fusion of both rankings (step 2 weight w)."""
    out = []
    for first, second in zip(step1, step2):
        total: dict[int, float] = defaultdict(float)
        for r, j in enumerate(first[:300]):
            total[j] += 1.0 / (RRF_K + r + 1)
        for r, j in enumerate(second[:300]):
            total[j] += w / (RRF_K + r + 1)
        head = first[:keep]
        out.append(head + sorted((j for j in total if j not in head), key=lambda j: -total[j]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--index-dir", default="/tmp/mus_index")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--results", type=Path, default=RESULTS / "probe_second_hop.jsonl")
    add_arguments(ap)
    args = ap.parse_args()
    torch_threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)
    print(f"threads {args.threads} (torch {torch_threads})")

    import torch

    from hippo_gpu.data import read_questions
    from hippo_gpu.evaluate import recall_at_k
    from hippo_gpu.retrieval.entities import heuristic_entities
    from hippo_gpu.retrieval.searcher import Searcher

    data = musique_dir(root=args.data_dir, need=("questions.json",))
    idx = musique_index(data, args.index_dir)
    questions = read_questions(data / "questions.json")
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    keys = idx.passage_keys
    halves = {"tune": list(range(0, len(texts), 2)), "held_out": list(range(1, len(texts), 2))}
    searcher = Searcher(idx)
    cfg = searcher.config

    def recalls(ranking: Ranking) -> dict[str, dict[str, float]]:
        return {h: recall_at_k([[keys[j] for j in ranking[i][:5]] for i in sel],
                               [gold[i] for i in sel], (2, 5)) for h, sel in halves.items()}

    def rank(mode: str) -> Ranking:
        return searcher.rank(texts, top_k=len(keys), mode=mode).passage_rows.tolist()

    baselines = {m: rank(m) for m in ("dense", "hipporag2", "hybrid")}
    hyb = baselines["hybrid"]
    phrases_of: dict[int, set[int]] = defaultdict(set)
    passages_of: dict[int, set[int]] = defaultdict(set)
    for p, m in zip(idx.incidence_passage.tolist(), idx.incidence_phrase.tolist()):
        phrases_of[p].add(m)
        passages_of[m].add(p)
    named_by = idx.phrase_passage_counts.tolist()

    def neighbours(i: int, n: int, c: int) -> set[int]:
        """Passages sharing a phrase named by <= c passages with hybrid's top n of query i."""
        out: set[int] = set()
        for p in hyb[i][:n]:
            for m in phrases_of[p]:
                if named_by[m] <= c:
                    out |= passages_of[m]
        return out - set(hyb[i][:n])

    def oracle(pool: Callable[[int], Iterable[int]], keep: int = 2) -> Ranking:
        out = []
        for i, first in enumerate(hyb):
            head = first[:keep]
            found = [j for j in pool(i) if j not in head and keys[j] in gold[i]]
            out.append(head + found + [j for j in first if j not in head and j not in found])
        return out

    ceilings = {
        "hybrid top 10": oracle(lambda i: hyb[i][:10]),
        "hybrid top 20": oracle(lambda i: hyb[i][:20]),
        "neighbours of top 1": oracle(lambda i: neighbours(i, 1, 10)),
        "neighbours of top 2": oracle(lambda i: neighbours(i, 2, 10)),
        "neighbours of top 1, below it": oracle(lambda i: neighbours(i, 1, 10), keep=1),
    }
    pool_sizes = {f"neighbours of top {n}": sum(len(neighbours(i, n, 10))
                                                for i in range(len(texts))) / len(texts)
                  for n in (1, 2)}

    e_pass, e_fact = searcher.encode_queries(texts)
    e_pass, e_fact = e_pass.float(), e_fact.float()
    passage_emb, fact_emb = idx.passage_emb.float(), idx.fact_emb.float()
    linked, owner = searcher.entities.link(heuristic_entities(texts), cfg)
    query_phrases: dict[int, set[int]] = defaultdict(set)
    for m, i in zip(linked.tolist(), owner.tolist()):
        query_phrases[i].add(m)
    facts_of_phrase: dict[int, list[int]] = defaultdict(list)
    for f, pair in enumerate(idx.fact_phrases.tolist()):
        for m in pair:
            facts_of_phrase[m].append(f)
    fact_row = {tuple(t): r for r, t in enumerate(idx.facts)}
    passages_of_fact: dict[int, set[int]] = defaultdict(set)
    for p, triples in enumerate(idx.passage_triples):
        for t in triples:
            if (r := fact_row.get(tuple(t))) is not None:
                passages_of_fact[r].add(p)
    fact_cos = e_fact @ fact_emb.T  # [Q, F]

    def by_score(scores: dict[int, float]) -> list[int]:
        return sorted(scores, key=lambda j: (-scores[j], j))

    def bridge_ppr(n: int) -> Ranking:
        seeds, who = [], []
        for i in range(len(texts)):
            ph = sorted({m for p in hyb[i][:n] for m in phrases_of[p]} - query_phrases[i])
            seeds += ph
            who += [i] * len(ph)
        doc, has, _ = searcher.entities.doc(torch.tensor(seeds), torch.tensor(who), 0,
                                            len(texts), cfg)
        return torch.argsort(-doc.masked_fill(~has.unsqueeze(1), 0), dim=1,
                             stable=True).tolist()

    def bridge_gate(n: int, c: int) -> Ranking:
        out = []
        for i in range(len(texts)):
            nb = neighbours(i, n, c)
            out.append([j for j in hyb[i] if j in nb])
        return out

    def passage_pair(n: int, c: int) -> Ranking:
        out = []
        for i in range(len(texts)):
            best: dict[int, float] = {}
            nb = sorted(neighbours(i, n, c))
            for p1 in hyb[i][:n] if nb else []:
                sums = passage_emb[nb] + passage_emb[p1]
                for j, v in zip(nb, ((sums @ e_pass[i]) / sums.norm(dim=1)).tolist()):
                    best[j] = max(best.get(j, -2.0), v)
            out.append(by_score(best))
        return out

    def bridge_fact(n: int, c: int) -> Ranking:
        out = []
        for i in range(len(texts)):
            best: dict[int, float] = {}
            top = set(hyb[i][:n])
            bridges = {m for p in top for m in phrases_of[p] if named_by[m] <= c}
            for m in bridges:
                for f in facts_of_phrase[m]:
                    v = float(fact_cos[i, f])
                    for j in passages_of_fact[f] - top:
                        best[j] = max(best.get(j, -2.0), v)
            out.append(by_score(best))
        return out

    def plain(text: str) -> str:
        return re.sub(r"[^a-z0-9 ]+", " ", re.sub(r"\s*\(.*?\)", "", text).lower()).strip()

    titled: dict[str, set[int]] = defaultdict(set)
    for j, title in enumerate(idx.passage_titles):
        titled[plain(title)].add(j)
        titled[plain(title.split(",")[0])].add(j)
    dense_cos = e_pass @ passage_emb.T  # [Q, P]

    def title_link(n: int) -> Ranking:
        out = []
        for i, text in enumerate(texts):
            asked, top = plain(text), set(hyb[i][:n])
            names = {plain(idx.phrases[m]) for p in top for m in phrases_of[p]}
            found = set().union(*(titled.get(x, set()) for x in names if x and x not in asked))
            out.append(sorted(found - top, key=lambda j: -float(dense_cos[i, j])))
        return out

    def rocchio(n: int, lam: float) -> Ranking:
        mean = torch.stack([passage_emb[row[:n]].mean(0) for row in hyb])
        moved = torch.nn.functional.normalize(e_pass + lam * mean, dim=1)
        return torch.argsort(-(moved @ passage_emb.T), dim=1, stable=True).tolist()

    families: dict[str, tuple[Callable[..., Ranking], dict[str, Sequence[Any]]]] = {
        "bridge_ppr": (bridge_ppr, {"n": (1, 2, 3)}),
        "bridge_gate": (bridge_gate, {"n": (1, 2), "c": (3, 10)}),
        "passage_pair": (passage_pair, {"n": (1, 2), "c": (3, 10)}),
        "bridge_fact": (bridge_fact, {"n": (1, 2), "c": (3, 10)}),
        "title_link": (title_link, {"n": (1, 2)}),
        "rocchio": (rocchio, {"n": (1, 2), "lam": (-0.3, 0.3, 1.0)}),
    }
    fusion = {"keep": (1, 2), "w": (0.5, 1.0)}
    found: dict[str, Any] = {}
    for name, (make, grid) in families.items():
        best: tuple[float, dict[str, Any], dict[str, dict[str, float]]] | None = None
        for values in itertools.product(*grid.values()):
            params = dict(zip(grid, values))
            second = make(**params)
            for keep, w in itertools.product(*fusion.values()):
                r = recalls(fuse(hyb, second, keep, w))
                score = r["tune"]["2"] + r["tune"]["5"]
                if best is None or score > best[0]:
                    best = (score, {**params, "keep": keep, "w": w}, r)
        assert best is not None
        found[name] = {"params": best[1], **best[2]}

    def row(kind: str, name: str, r: dict[str, dict[str, float]],
            params: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"kind": kind, "name": name,
                "params": ", ".join(f"{k}={v}" for k, v in (params or {}).items()),
                "tune_R@2": r["tune"]["2"], "tune_R@5": r["tune"]["5"],
                "held_out_R@2": r["held_out"]["2"], "held_out_R@5": r["held_out"]["5"]}

    rows = ([row("baseline", m, recalls(r)) for m, r in baselines.items()]
            + [row("ceiling", name, recalls(r)) for name, r in ceilings.items()]
            + [row("family", name, {h: f[h] for h in halves}, f["params"])
               for name, f in found.items()])
    for r in rows:
        print(f"{r['kind']:8s} {r['name']:29s} tune R@2 {r['tune_R@2']:6.2f} R@5 "
              f"{r['tune_R@5']:6.2f}  held out R@2 {r['held_out_R@2']:6.2f} R@5 "
              f"{r['held_out_R@5']:6.2f}  {r['params']}")
    record = {
        **provenance("probe_second_hop", threads=args.threads, device="cpu",
                     encoder_backend=searcher.encoder.backend,
                     precision=idx.precision, query_precision=searcher.encoder_config.precision,
                     batch_sizes={"query_batch": len(texts)}, optional_versions=("hippo_gpu",),
                     git=git),
        "questions": len(texts), "mean_pool_size": pool_sizes, "rows": rows,
    }
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
