"""IRCoT on musique_train with oracle thoughts: recall of the loop, and the batched loop's speed.

The thought source is an ORACLE, not a model: step t's thought is the t-th sub-question of the
question's `question_decomposition`, its "#k" references replaced by the earlier answers, with its
gold answer appended ("What company published Journal of Psychotherapy Integration? American
Psychological Association."); the last sub-question's thought also carries "So the answer is:
<answer>", so the loop stops there. Its recall is an UPPER BOUND OF THE LOOP (what IRCoT's
retrieval can reach when every thought states the right bridge fact), not a model's recall.

Part 1, recall: per mode (dense, hipporag2, hybrid), recall@2/@5/@10 of one-step retrieval and
of the IRCoT merged list for each --steps S (hippo_gpu.retrieval.ircot: max-merge of the retrievals,
ranked[:k] passages per step, stop phrase), top_k --top-k per retrieval, all questions in one
batched loop.

Part 2, throughput: the same 100 questions x --throughput-steps steps, with the oracle's thoughts
WITHOUT the stop phrase (so every question takes every step; after its last sub-question it
repeats it), run (a) batched: `ircot_retrieve`, every step one `Searcher.rank` call for all
questions, and (b) one question at a time: `ircot_one_at_a_time`, upstream's order (each
question's whole loop alone, one `rank` call per question and step). Same searcher, same thoughts,
same run. After a warm-up of each, --repeats pairs are timed, the batched run and then the
sequential one, so both see the same load on a shared CPU: the medians of each, and the median
of the pairs' ratios (the speedup). Their merged rankings are compared question by question
(identical key lists, and the largest score difference: float32 query-encoder rounding with the
batch's shape).

Prints both tables and appends one JSON line (provenance.py) to benchmarks/results/
bench_ircot.jsonl; a dirty git tree needs --allow-dirty. The CPU may be shared with other work
(the line records the load average).

    python -m benchmarks.bench_ircot --threads 1 --index-dir /tmp/musique_index
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    limit_threads,
    musique_dir,
    musique_index,
    provenance,
    summarize,
)

MODES = ("dense", "hipporag2", "hybrid")
KS = (2, 5, 10)
ORACLE_LABEL = ("oracle thoughts from question_decomposition: an upper bound of the IRCoT loop, "
                "not of a model")


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--index-dir", default="/tmp/mus_index", help="float32 index; built if missing")
    ap.add_argument("--data-dir", default=None,
                    help="default $HIPPO_DATA_DIR/musique_train ($HIPPO_DATA_DIR default "
                         "../shared/data)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--top-k", type=int, default=10, help="passages per retrieval (k)")
    ap.add_argument("--steps", default="2,3,4", help="IRCoT max_steps values of part 1")
    ap.add_argument("--throughput-steps", type=int, default=3, help="max_steps of part 2")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed (batched, one-at-a-time) pairs in part 2")
    ap.add_argument("--results", default=str(RESULTS / "bench_ircot.jsonl"))
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch load
    init_threads(ARGS.threads)

import time  # noqa: E402

import torch  # noqa: E402

from hippo_gpu.data import read_questions  # noqa: E402
from hippo_gpu.evaluate import recall_at_k  # noqa: E402
from hippo_gpu.retrieval.ircot import (  # noqa: E402
    STOP_PHRASE,
    IRCoTReport,
    Thought,
    ThoughtRequest,
    ircot_one_at_a_time,
    ircot_retrieve,
)
from hippo_gpu.retrieval.searcher import Searcher  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")

_REF = re.compile(r"#(\d+)")


def oracle_chains(raw: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """question -> its (resolved sub-question, answer) pairs, in decomposition order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for q in raw:
        answers: list[str] = []
        chain = []
        for sub in q["question_decomposition"]:
            def resolve(m: re.Match[str], answers: list[str] = answers) -> str:
                k = int(m.group(1)) - 1
                return answers[k] if 0 <= k < len(answers) else m.group(0)

            text = _REF.sub(resolve, sub["question"]).replace(" >> ", " ").strip()
            answers.append(sub["answer"])
            chain.append((text, sub["answer"]))
        out.setdefault(q["question"], chain)
    return out


class OracleThoughts:
    """The oracle thought source (see the module docstring); `stop` False leaves the stop phrase
    out, so every question runs every step."""

    def __init__(self, chains: dict[str, list[tuple[str, str]]], *, stop: bool = True) -> None:
        self.chains = chains
        self.stop = stop
        self.requests = 0

    @property
    def identity(self) -> Mapping[str, Any]:
        return {"oracle": "question_decomposition", "stop": self.stop}

    def __call__(self, requests: Sequence[ThoughtRequest]) -> list[Thought]:
        self.requests += len(requests)
        out = []
        for r in requests:
            chain = self.chains[r.question]
            t = min(len(r.thoughts), len(chain) - 1)
            sub, answer = chain[t]
            thought = f"{sub.rstrip('?.')}? {answer}."
            if self.stop and t == len(chain) - 1:
                thought += f" {STOP_PHRASE} {answer}."
            out.append(Thought(thought))
        return out


def _recall(report: IRCoTReport, gold: list[set[str]]) -> dict[str, float]:
    return recall_at_k([[h.key for h in r.hits] for r in report.results], gold, KS)


def main(args: argparse.Namespace) -> int:
    git = check_clean_or_exit(args.allow_dirty)  # before the measurement, not after
    limit_threads(args.threads)
    data = musique_dir(args.data_dir, need=("questions.json", "corpus.json"))
    raw = json.loads((data / "questions.json").read_text())
    if not all("question_decomposition" in q for q in raw):
        from benchmarks.common import skip

        skip(f"{data / 'questions.json'} has no question_decomposition: no oracle thoughts")
    questions = read_questions(raw)
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    chains = oracle_chains(raw)
    modes = [m for m in args.modes.split(",") if m]
    steps = [int(s) for s in args.steps.split(",") if s]
    index = musique_index(data, Path(args.index_dir))
    searcher = Searcher(index)
    searcher.warm_up(modes)  # encoder and solvers loaded outside the timings
    q = len(texts)
    print(f"threads {args.threads} (torch {torch.get_num_threads()}), Q={q}, top_k "
          f"{args.top_k}, query backend {searcher.encoder.backend}, loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n{ORACLE_LABEL}")

    # Part 1: recall of one step and of the IRCoT loop
    part1 = []
    for mode in modes:
        one = recall_at_k([[h.key for h in hits] for hits in
                           searcher.retrieve(texts, top_k=args.top_k, mode=mode)], gold, KS)
        row: dict[str, Any] = {"mode": mode, "one_step": one, "ircot": {}}
        for s in steps:
            oracle = OracleThoughts(chains)
            report = ircot_retrieve(searcher, texts, oracle, max_steps=s, top_k=args.top_k,
                                    mode=mode)
            row["ircot"][str(s)] = {
                "recall": _recall(report, gold),
                "mean_steps": sum(r.steps for r in report.results) / q,
                "answered": sum(r.stop == "answer" for r in report.results),
                "retrieval_calls": report.retrieval_calls,
                "retrieved_queries": report.retrieved_queries}
        part1.append(row)
        print(f"  part 1 {mode:<10} done")

    # Part 2: batched vs one question at a time, same thoughts, every step taken
    s2 = args.throughput_steps
    part2 = []
    for mode in modes:
        nostop = OracleThoughts(chains, stop=False)
        run = {"batched": ircot_retrieve, "sequential": ircot_one_at_a_time}
        seconds: dict[str, list[float]] = {"batched": [], "sequential": []}
        first: dict[str, float] = {}
        out: dict[str, IRCoTReport] = {}
        for rep in range(args.repeats + 1):  # the first pair warms up
            for name, fn in run.items():
                start = time.perf_counter()
                out[name] = fn(searcher, texts, nostop, max_steps=s2, top_k=args.top_k,
                               mode=mode)
                if rep:
                    seconds[name].append(time.perf_counter() - start)
                else:
                    first[name] = time.perf_counter() - start
        t = summarize(first["batched"], seconds["batched"])
        seq = summarize(first["sequential"], seconds["sequential"])
        ratios = summarize(first["sequential"] / first["batched"],
                           [s / b for b, s in zip(seconds["batched"], seconds["sequential"])])
        b, alone = out["batched"], out["sequential"]
        same = sum([h.key for h in x.hits] == [h.key for h in y.hits]
                   for x, y in zip(b.results, alone.results, strict=True))
        diff = max((abs(hx.score - hy.score) for x, y in zip(b.results, alone.results)
                    for hx, hy in zip(x.hits, y.hits)), default=0.0)
        part2.append({
            "mode": mode, "questions": q, "max_steps": s2,
            "retrievals": b.retrieved_queries, "batched_rank_calls": b.retrieval_calls,
            "sequential_rank_calls": alone.retrieval_calls,
            "batched_s": t.median, "batched_p20_s": t.p20, "batched_p80_s": t.p80,
            "sequential_s": seq.median, "sequential_p20_s": seq.p20,
            "sequential_p80_s": seq.p80, "pairs": len(seconds["batched"]),
            "warmup_s": first,
            "batched_questions_per_s": q / t.median,
            "sequential_questions_per_s": q / seq.median,
            "speedup": ratios.median, "speedup_p20": ratios.p20, "speedup_p80": ratios.p80,
            "identical_rankings": same,
            "max_score_diff": diff,
            "batched_stage_s": {k: v for k, v in b.stage_seconds.items()},
        })
        print(f"  part 2 {mode:<10} batched {t.median:.2f} s, one at a time {seq.median:.2f} s")

    print(f"\nPart 1: recall (%) on musique_train, {q} questions, top_k {args.top_k} per "
          f"retrieval; {ORACLE_LABEL}")
    head = f"{'mode':<10} {'loop':<11} " + " ".join(f"{'R@' + str(k):>6}" for k in KS) + \
        f" {'steps/q':>8} {'answered':>9}"
    print(head + "\n" + "-" * len(head))
    for row in part1:
        print(f"{row['mode']:<10} {'one step':<11} "
              + " ".join(f"{row['one_step'][str(k)]:>6.2f}" for k in KS))
        for s, r in row["ircot"].items():
            print(f"{'':<10} {'IRCoT S=' + s:<11} "
                  + " ".join(f"{r['recall'][str(k)]:>6.2f}" for k in KS)
                  + f" {r['mean_steps']:>8.2f} {r['answered']:>9}")

    print(f"\nPart 2: {q} questions x {s2} steps (every step taken: oracle thoughts without the "
          f"stop phrase), same thoughts, same run, threads {args.threads}")
    head = (f"{'mode':<10} {'batched s':>10} {'q/s':>7} {'1-at-a-time s':>14} {'q/s':>7} "
            f"{'speedup (p20-p80)':>18} {'same rank':>10} {'max |dscore|':>13}")
    print(head + "\n" + "-" * len(head))
    for r in part2:
        print(f"{r['mode']:<10} {r['batched_s']:>10.2f} {r['batched_questions_per_s']:>7.1f} "
              f"{r['sequential_s']:>14.2f} {r['sequential_questions_per_s']:>7.1f} "
              f"{r['speedup']:>7.1f}x ({r['speedup_p20']:.1f}-{r['speedup_p80']:.1f}) "
              f"{r['identical_rankings']:>6}/{q:<3} "
              f"{r['max_score_diff']:>13.2g}")

    record = {
        **provenance("ircot", threads=args.threads, device="cpu",
                     encoder_backend=searcher.encoder.backend, precision=index.precision,
                     query_precision=searcher.encoder_config.precision,
                     batch_sizes={"query_batch": [q, 1],
                                  "encoder_query_batch_size":
                                      searcher.encoder_config.query_batch_size},
                     optional_versions=("sentence_transformers", "onnxruntime", "hippo_gpu"),
                     git=git),
        "data": str(data), "index": str(args.index_dir), "Q": q, "top_k": args.top_k,
        "query_backend": searcher.encoder.backend, "thoughts": ORACLE_LABEL,
        "part1": part1, "part2": part2,
    }
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)
    print(f"appended to {args.results} (commit {record['commit']}, dirty {record['dirty']})")
    return 0


if __name__ == "__main__" and ARGS is not None:
    sys.exit(main(ARGS))
