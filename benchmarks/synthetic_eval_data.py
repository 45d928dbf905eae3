"""Write a synthetic corpus as an eval folder: corpus.json, openie.json and questions.json.

The corpus is hippo_gpu.synthetic's (musique_train's OpenIE statistics, seeded). Each question
asks about one fact of a sampled passage ("What <predicate> <subject>?") with that passage as
its one gold paragraph (MuSiQue format), so `hippo-gpu eval` runs every mode on it; recall is
not comparable to a real benchmark's, the point is that every mode completes at that size and
what its PPR certificates say (issue 20: no query may fail on round-off).

    python -m benchmarks.synthetic_eval_data --passages 10000 --out /tmp/syn10k
    hippo-gpu eval --data /tmp/syn10k --encoder hash:64 --modes dense,hipporag2,hybrid,hipporag1 \\
        --json /tmp/syn10k/eval.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=10_000)
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import numpy as np

    from hippo_gpu.synthetic import synthetic_corpus

    corpus = synthetic_corpus(args.passages, seed=args.seed)
    files = corpus.write(args.out)
    rng = np.random.default_rng(args.seed + 1)
    rows = sorted(rng.choice(corpus.num_passages, size=min(args.questions, corpus.num_passages),
                             replace=False).tolist())
    ptr = corpus.triple_ptr
    questions = []
    with files["corpus"].open(encoding="utf-8") as f:
        passages = json.load(f)
    for n, p in enumerate(rows):
        t = int(ptr[p])  # the passage's first triple
        subject = corpus.phrase_text[int(corpus.subject[t])]
        predicate = corpus.predicate_text[int(corpus.predicate[t])]
        obj = corpus.phrase_text[int(corpus.object[t])]
        questions.append({"id": f"syn-{n}", "question": f"What {predicate} {subject}?",
                          "answer": obj,
                          "paragraphs": [{**passages[p], "is_supporting": True}]})
    (args.out / "questions.json").write_text(json.dumps(questions), encoding="utf-8")
    print(f"{args.out}: {corpus.num_passages} passages, {len(questions)} questions")


if __name__ == "__main__":
    main()
