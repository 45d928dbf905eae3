"""What no-failure-on-round-off costs (issue 20): the float64 check of every float32 certificate,
and the float64 finish of the columns that stall, side by side with the unchecked float32 solve.

On musique_train's two graphs (the passage graph with 100 real HippoRAG 2 reset vectors, the
phrase graph with 100 hybrid entity seed vectors), for each solver kernel, one run:

* ``unchecked``: the same float32 solver with its float64 check switched off (its certificates
  hold only up to the float32 round-off of the residual, as before issue 20);
* ``default``: the same solver as shipped (check on; a refuted or stalled column re-solved in
  float64), at the default tol 1e-6;
* ``below floor``: tol 5e-9, below float32's floor on both graphs, so columns stall and are
  finished in float64; ``float64`` beside it solves the whole batch in float64 at that tol.

Each row: ms per query (median of repeats, first call apart), columns refined, worst certified
bound, and the worst L1 error against a float64 solve at tol 1e-13. One JSON line is appended
to benchmarks/results/bench_roundoff.jsonl.

    python -m benchmarks.bench_roundoff --threads 1
"""

from __future__ import annotations

import argparse

from benchmarks.common import (
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    musique_dir,
    musique_index,
    provenance,
    time_call,
)

RESULTS = "benchmarks/results/bench_roundoff.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--index-dir", default=".cache/bench/musique_index")
    ap.add_argument("--repeats", type=int, default=5)
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)
    data = musique_dir(need=("corpus.json", "questions.json", "openie*.json"))

    import torch

    from hippo_gpu import Searcher
    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.data import read_questions
    from hippo_gpu.entities import heuristic_entities
    from hippo_gpu.hybrid import link_entities
    from hippo_gpu.ppr import PPRSolver
    from hippo_gpu.seeds import leading_block

    index = musique_index(data, args.index_dir)
    searcher = Searcher(index)
    texts = [q.question for q in read_questions(data / "questions.json")]
    passage_seeds = searcher.hipporag2_reset_vectors(texts)  # [N, Q] float64
    m = len(index.phrases)
    nearest, owner = link_entities(index, heuristic_entities(texts), RetrievalConfig(),
                                   searcher.encoder.encode, searcher.encoder_is_uncased)
    phrase_seeds = torch.zeros((m, len(texts)), dtype=torch.float64)
    weight = 1.0 / index.phrase_passage_counts.index_select(0, nearest).clamp_min(1).double()
    phrase_seeds.index_put_((nearest, owner), weight)
    phrase_seeds[:, phrase_seeds.sum(0) == 0] = 1.0  # queries without entities: uniform
    graphs = {
        "passage": (index.adjacency, index.passage_nodes, passage_seeds),
        "phrase": (leading_block(index.adjacency, m), None, phrase_seeds),
    }
    rows = []
    for graph, (adj, targets, seeds) in graphs.items():
        exact = PPRSolver(adj, target_nodes=targets, dtype=torch.float64, tol=1e-13)(seeds)
        for kernel in ("numba", "torch"):
            for case, tol in (("unchecked", 1e-6), ("default", 1e-6), ("below floor", 5e-9),
                              ("float64", 5e-9)):
                dtype = torch.float64 if case == "float64" else torch.float32
                solver = PPRSolver(adj, target_nodes=targets, dtype=dtype, kernel=kernel, tol=tol)
                if case == "unchecked":
                    solver._exact = None  # the float32 certificate alone, as before issue 20
                solution = solver.solve(seeds)
                timing = time_call(lambda s=solver, r=seeds: s.solve(r), repeats=args.repeats)
                err = (solution.scores.double() - exact).abs().sum(0)
                row = {"graph": graph, "kernel": kernel, "case": case, "tol": tol,
                       "ms_per_query": timing.median * 1e3 / seeds.shape[1],
                       "first_ms_per_query": timing.first * 1e3 / seeds.shape[1],
                       "refined": int(solution.refined.sum()),
                       "uncertified": int((~solution.certified).sum()),
                       "max_bound": float(solution.bound.max()),
                       "max_l1_error": float(err.max()),
                       "error_over_bound": int((err > solution.bound.double()).sum())}
                rows.append(row)
                print(f"{graph:8s} {kernel:6s} {case:12s} tol {tol:.0e}: "
                      f"{row['ms_per_query']:.3f} ms/query, refined {row['refined']:3d}, "
                      f"max bound {row['max_bound']:.2e}, max L1 error {row['max_l1_error']:.2e}"
                      f" (columns with error > bound: {row['error_over_bound']})", flush=True)
    record = provenance("bench_roundoff", threads=threads, device="cpu", git=git,
                        batch_sizes={"queries": len(texts)})
    record["rows"] = rows
    append_result_or_exit(RESULTS, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
