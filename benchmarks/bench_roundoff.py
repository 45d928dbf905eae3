"""What no-failure-on-round-off costs (issue 20), and whether every certificate holds (issue 47):
each solve's reported L1 bound against its true error, at the default tol, near float32's floor
and below it.

On musique_train's two graphs (the passage graph with 100 real HippoRAG 2 reset vectors, the
phrase graph with 100 hybrid entity seed vectors), for each solver kernel, one run:

* ``unchecked``: the float32 solver with its float64 check switched off, at tol 1e-6: the cost
  baseline of the check. Its float32 bound is an estimate, not a certificate (it holds only up
  to the float32 round-off of the residual, as before issue 20), so its row reports
  ``error_over_float32_estimate`` and ``error_over_bound`` null;
* ``float32`` and ``float64`` at tol 1e-6 (the float32 default), 1e-7 (the iterate gets
  1e-7 − 2⁻²⁴ = 4e-8 in float32: at or below musique's float32 floors, so columns are finished in
  float64) and 5e-9 (below the rounding of a float32 result, 2⁻²⁴: refused before any step, a
  ``refused`` row with the smallest tol float32 can certify; float64 certifies it).

Each row: ms per query (median of repeats, first call apart), columns refined, worst certified
bound, the worst L1 error against a float64 solve at tol 1e-13 and ``error_over_bound``, the
columns whose error exceeds their bound (0 in every certified row: the bound covers the returned
vector, its rounding included, hippo_gpu/ppr/rounding.py). The seeds are rounded to float32
first and every solve and the reference take those: a float32 solver certifies the PPR of the
float32 reset vector it computes with. One JSON line is appended to
benchmarks/results/bench_roundoff.jsonl.

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

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/ppr", "hippo_gpu/retrieval", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/data.py")

RESULTS = "benchmarks/results/bench_roundoff.jsonl"
TOLS = (1e-6, 1e-7, 5e-9)


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
    from hippo_gpu.ppr import PPRSolver, ToleranceError
    from hippo_gpu.retrieval.entities import heuristic_entities
    from hippo_gpu.retrieval.hybrid import link_entities
    from hippo_gpu.retrieval.seeds import leading_block

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
    cases = [("unchecked", torch.float32, 1e-6)] + [
        (str(dtype).removeprefix("torch."), dtype, tol)
        for dtype in (torch.float32, torch.float64) for tol in TOLS]
    rows = []
    for graph, (adj, targets, seeds) in graphs.items():
        seeds = seeds.float().double()  # what a float32 solver computes with, for every solve
        exact = PPRSolver(adj, target_nodes=targets, dtype=torch.float64, tol=1e-13)(seeds)
        for kernel in ("numba", "torch"):
            for case, dtype, tol in cases:
                row = {"graph": graph, "kernel": kernel, "case": case,
                       "dtype": str(dtype).removeprefix("torch."), "tol": tol}
                try:
                    solver = PPRSolver(adj, target_nodes=targets, dtype=dtype, kernel=kernel,
                                       tol=tol)
                except ToleranceError as e:
                    row.update(refused=True, smallest_tol=e.floor, smallest_tol_float64=e.floor64)
                    rows.append(row)
                    print(f"{graph:8s} {kernel:6s} {case:9s} tol {tol:.0e}: refused (float32 "
                          f"certifies tol > {e.floor:.3g}, float64 tol > {e.floor64:.3g})",
                          flush=True)
                    continue
                if case == "unchecked":
                    solver._exact = None  # the float32 estimate alone, as before issue 20
                solution = solver.solve(seeds)
                timing = time_call(lambda s=solver, r=seeds: s.solve(r), repeats=args.repeats)
                err = (solution.scores.double() - exact).abs().sum(0)
                over = int((err > solution.bound).sum())
                row.update({
                    "refused": False,
                    "ms_per_query": timing.median * 1e3 / seeds.shape[1],
                    "first_ms_per_query": timing.first * 1e3 / seeds.shape[1],
                    "refined": int(solution.refined.sum()),
                    "uncertified": int((~solution.certified).sum()),
                    "max_bound": float(solution.bound.max()),
                    "max_l1_error": float(err.max()),
                    "error_over_bound": None if case == "unchecked" else over})
                if case == "unchecked":
                    row["error_over_float32_estimate"] = over
                rows.append(row)
                print(f"{graph:8s} {kernel:6s} {case:9s} tol {tol:.0e}: "
                      f"{row['ms_per_query']:.3f} ms/query, refined {row['refined']:3d}, "
                      f"max bound {row['max_bound']:.2e}, max L1 error {row['max_l1_error']:.2e}"
                      f" (columns with error > bound: {over}"
                      f"{', an estimate' if case == 'unchecked' else ''})", flush=True)
    record = provenance("bench_roundoff", threads=threads, device="cpu", git=git,
                        encoder_backend=searcher.encoder.backend,
                        precision=["float32", "float64"], batch_sizes={"queries": len(texts)})
    record["rows"] = rows
    append_result_or_exit(RESULTS, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
