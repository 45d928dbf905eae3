"""The floor of hipporag2 against dense on one index (issue 53's ratio target): what each stage of
a hipporag2 query could cost at best on this CPU, beside what it costs, and their sum as a
multiple of the dense query.

    python -m benchmarks.bench_scale --passages 100000 --threads 1 --keep   # the index
    python -m benchmarks.bench_hipporag2_floor --threads 1 [--index DIR] [--queries 1,32]

On an index built by bench_scale (default its 100k one, kept with ``--keep``), per batch size Q,
with bench_scale's questions:

* measured, ms per query: ``dense`` and ``hipporag2`` (Searcher.rank, top 10, median of
  repeats) and hipporag2's stages (the path that needs no push, every column iterated, is
  bench_scale's ``hipporag2:chebyshev``, timed on this index by the run that built it);
* ``facts_floor``: the least one pass over the fact vectors costs for Q queries: at Q = 1 one
  read of them as int8 codes (F x D bytes, a sum over the bytes viewed as int64: what an exact
  compact scan must at least read), for Q > 1 the fastest of three [F, D] x [D, Q] products
  on this CPU: float32, bfloat16 (AMX where the CPU has it) and int8 (torch._int_mm), each
  without the selection or the exact re-rank a real scan adds;
* ``basis_floor``: the basis stage alone (PassageBasis.dense_part, the [P, D + 1] GEMM);
* ``push``: the push of this batch's seeds as shipped (PushOperator.push, replayed from the
  batch's own call), and ``push_floor``: one pass over the edges of every node any query of the
  batch pushed, each node once, one float64 scatter per edge (a plain loop): a push that shared
  all the batch's work perfectly still visits these edges. With it the edges the shipped push
  scans (``push_edges``, each query alone) and the union's (``push_union_edges``).

``floor_over_dense`` = (dense + facts_floor + basis_floor + push_floor) / dense. A hipporag2
query does all a dense query does (it encodes the query, scores every passage, whose min and
max its reset vector needs, and takes the top k of P scores, its PPR's instead of the
cosines), and on top the fact scan, the basis GEMM and the push: no hipporag2 query can cost
less than that multiple of the dense query (its seeds stage not even counted); the issue asks
for <= 3. A results line goes to
benchmarks/results/bench_hipporag2_floor.jsonl.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
    requested_backend,
    skip,
    time_call,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py")

DEFAULT_INDEX = "/tmp/hippo_bench_scale/p100000/index"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--index", default=DEFAULT_INDEX,
                    help="an index with a passage basis (default: bench_scale's kept 100k one)")
    ap.add_argument("--queries", default="1,32", help="comma list of batch sizes Q")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=30.0, help="per timed call set")
    ap.add_argument("--seed", type=int, default=0, help="bench_scale's question seed")
    ap.add_argument("--results", default=str(RESULTS / "bench_hipporag2_floor.jsonl"))
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    if not (Path(args.index) / "manifest.json").is_file():
        skip(f"no index at {args.index}: build one with `python -m benchmarks.bench_scale "
             f"--passages 100000 --threads {threads} --keep`, or pass --index")
    git = check_clean_or_exit(args.allow_dirty)

    import numba
    import numpy as np
    import torch

    from benchmarks.bench_scale import _queries
    from hippo_gpu.ppr import push as push_module
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.versions.load import load_index

    @numba.njit(boundscheck=False)
    def scatter_once(indptr: np.ndarray, indices: np.ndarray, coef: np.ndarray,
                     nodes: np.ndarray, r: np.ndarray) -> None:
        for u in nodes:
            m = r[u] + 1.0
            for e in range(indptr[u], indptr[u + 1]):
                r[indices[e]] += coef[e] * m

    index = load_index(args.index, device="cpu")
    if index.basis is None:
        skip(f"the index at {args.index} holds no passage basis")
    searcher = Searcher(index)
    searcher.warm_up()  # the encoder, the solvers and a lone query's fact codes
    gen = torch.Generator().manual_seed(args.seed)
    shipped = push_module.PushOperator.push

    def ms(fn, q: int) -> float:
        return time_call(fn, repeats=args.repeats, max_seconds=args.max_seconds).median * 1e3 / q

    def unit(q: int, d: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(q, d, generator=gen), dim=1)

    def facts_passes(q: int) -> dict:
        """ms per query of one pass over the fact vectors (module docstring)."""
        facts = index.fact_emb
        f, d = facts.shape
        if q == 1:
            codes = torch.zeros(f, d, dtype=torch.int8).numpy()
            return {"read_int8": ms(lambda: codes.view(np.int64).sum(), 1)}
        qv = unit(q, d).T.contiguous()
        fb, qb = facts.to(torch.bfloat16), qv.to(torch.bfloat16)
        f8, q8 = torch.zeros(f, d, dtype=torch.int8), torch.zeros(d, q, dtype=torch.int8)
        out = {"float32": ms(lambda: facts @ qv, q), "bfloat16": ms(lambda: fb @ qb, q)}
        try:
            out["int8"] = ms(lambda: torch._int_mm(f8, q8), q)
        except RuntimeError:  # a build or shape without a CPU kernel: that pass is left out
            pass
        return out

    def push_figures(calls: list, q: int) -> dict:
        """The batch's push replayed, its edges, its union's, and the floor (docstring)."""
        if not calls:
            return {"push_ms": 0.0, "push_floor_ms": 0.0,
                    "push_note": "no push ran (every query iterated)"}
        op, a = calls[-1]
        out = {"push_ms": ms(lambda: shipped(op, *a), q)}
        visits = np.zeros(op.num_nodes, dtype=np.int64)
        res = shipped(op, *a, visits=visits)
        nodes = np.flatnonzero(visits).astype(np.int64)
        deg = np.diff(op.indptr)
        out.update(push_edges=int(res.work.sum()), push_pushes=int(visits.sum()),
                   push_union_nodes=int(nodes.size), push_union_edges=int(deg[nodes].sum()))
        r = np.zeros(op.num_nodes, dtype=np.float64)
        scatter_once(op.indptr, op.indices, op.coef, nodes[:1], r)  # compile
        out["push_floor_ms"] = ms(
            lambda: scatter_once(op.indptr, op.indices, op.coef, nodes, r), q)
        out["push_ns_per_edge"] = out["push_ms"] * q * 1e6 / max(out["push_edges"], 1)
        out["push_floor_ns_per_edge"] = \
            out["push_floor_ms"] * q * 1e6 / max(out["push_union_edges"], 1)
        return out

    def measure(q: int) -> dict:
        texts = [t for t, _ in _queries(index, q, args.seed)]
        f, d = index.fact_emb.shape
        row: dict = {"queries": q, "facts": f, "dim": d, "passages": len(index.passage_keys)}
        row["dense_ms"] = ms(lambda: searcher.rank(texts, top_k=10, mode="dense"), q)
        row["hipporag2_ms"] = ms(lambda: searcher.rank(texts, top_k=10, mode="hipporag2"), q)
        calls: list = []

        def record(op, *a, **k):  # the batch's own push call, replayed in push_figures
            calls.append((op, a))
            return shipped(op, *a, **k)

        push_module.PushOperator.push = record
        try:
            ranking = searcher.rank(texts, top_k=10, mode="hipporag2")
        finally:
            push_module.PushOperator.push = shipped
        row["hipporag2_stages_ms"] = {k: v * 1e3 / q for k, v in ranking.stage_seconds.items()}
        passes = facts_passes(q)
        row["facts_passes_ms"] = passes
        row["facts_floor_ms"] = min(passes.values())
        e = unit(q, d)
        one, zero = torch.ones(q, dtype=torch.float64), torch.zeros(q, dtype=torch.float64)
        row["basis_floor_ms"] = ms(lambda: index.basis.dense_part(e, one, zero), q)
        row.update(push_figures(calls, q))
        floor = row["dense_ms"] + row["facts_floor_ms"] + row["basis_floor_ms"] + \
            row["push_floor_ms"]
        row["floor_ms"] = floor
        row["floor_over_dense"] = floor / row["dense_ms"]
        row["hipporag2_over_dense"] = row["hipporag2_ms"] / row["dense_ms"]
        print(f"Q={q}: dense {row['dense_ms']:.2f} ms/query, hipporag2 "
              f"{row['hipporag2_ms']:.2f} ({row['hipporag2_over_dense']:.1f}x); "
              f"floor {floor:.2f} = dense + "
              f"facts {row['facts_floor_ms']:.2f} + basis {row['basis_floor_ms']:.2f} + push "
              f"{row['push_floor_ms']:.2f} (shipped {row['push_ms']:.2f}): "
              f"{row['floor_over_dense']:.2f}x dense", flush=True)
        return row

    def rounded(x):
        if isinstance(x, float):
            return round(x, 4)
        return {k: rounded(v) for k, v in x.items()} if isinstance(x, dict) else x

    rows = [rounded(measure(int(q))) for q in args.queries.split(",")]
    record_ = provenance("bench_hipporag2_floor", threads=threads, device="cpu",
                         encoder_backend=requested_backend(index.config.encoder.model),
                         query_precision="float32", git=git,
                         batch_sizes={"queries": [r["queries"] for r in rows]})
    record_["index"] = str(args.index)
    record_["rows"] = rows
    append_result_or_exit(args.results, record_, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
