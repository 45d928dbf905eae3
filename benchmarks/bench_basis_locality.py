"""Can a commit patch the passage basis instead of dropping it? What the patch would cost.

    python -m benchmarks.bench_basis_locality --threads 1 --synthetic 10000 [--repeat 5]

The question (issue 23, item 2). With L = (1 − d)(I − dM)⁻¹ and M' the transition after a
commit, the resolvent identity gives, for each basis column x_j = L b_j (hippo_gpu.ppr.basis),

    L' b'_j = x_j + L' u_j,    u_j = d/(1 − d)·(M' − M) x_j + (b'_j − b_j),               (R1)

and u_j lives on the nodes S whose transition column changed (and the added passages). So a
patch needs x_j at S (the basis holds x_j at the passage rows only; S is mostly phrases). By
the graph's symmetry (D⁻¹ L D = Lᵀ on the non-isolated nodes), x_j[u] = D_u Σ_{w∈T}
(L e_u)_w b_j[w] / D_w, one forward push from e_u; its error is at most
D_u · max_w(b_j[w]/D_w) · hᵀρ_u (push.py P2), and an error Δ in x_j[u] moves u_j by up to
2d/(1 − d)·|Δ| in L1 and the patched column by as much (L' keeps mass).

How precise must x_j[u] be? A query certifies tol·σ (linear.py L2), of which the basis takes
w(|α| Σ_j |e_j| δ_j + |β| δ₁) (basis.py B2). This script takes the per-commit allowance A: a
uniform increase of every column bound δ_j that, after COMMITS commits (the writer's compaction
policy), uses SHARE of the median query's budget; half of A goes to the x_j errors at S. It
then runs, on the old graph, the push from e_u of every u in S to the h-weighted budget that
accuracy needs, and reports the edges it scans next to what re-solving the basis costs (its
Chebyshev steps x (D + 1) columns x nnz). The push of u_j itself (R1's second half, on the new
graph) is not run: the x half alone is a lower bound of the patch's cost.

Measured on single-passage inserts of the synthetic corpus (hash:64): |S|, the allowance, and
for the needed accuracy (and 10² and 10⁴ times looser, to show the trend) the push work per node
of S (edges scanned / nnz; a push that passes WORK_CAP x nnz stops and counts as capped, so a
total with capped nodes is a lower bound) and the x half's total next to a re-solve's. A results
line goes to benchmarks/results/bench_basis_locality.jsonl.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    cpu_model,
    init_threads,
    provenance,
    quantile,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/ppr", "hippo_gpu/versions/delta.py", "hippo_gpu/indexing",
            "hippo_gpu/embed", "kernels/src", "hippo_gpu/synthetic.py", "hippo_gpu/config.py",
            "hippo_gpu/device.py")

COMMITS = 16  # hippo_gpu.versions.compaction.COMPACT_AFTER: commits between two basis solves
SHARE = 0.1  # of the median query's certified budget the patched bounds may use by then
LOOSER = (1e4, 1e2, 1.0)  # accuracies tried: the needed one times these
WORK_CAP = 50  # edges a node's push may scan, in multiples of nnz (then it counts as capped)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch threads")
    ap.add_argument("--synthetic", type=int, default=10000, help="passages in the base")
    ap.add_argument("--repeat", type=int, default=5, help="single-passage inserts examined")
    ap.add_argument("--queries", type=int, default=32, help="queries for the budget")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


def changed_columns(old: Any, new: Any, node_to_new: Any) -> Any:
    """Old nodes whose transition column changes (M' e_u' != M e_u, in the new numbering):
    rows compared by (entries, Σ A, Σ A·(col + 1)) after the old columns are renumbered and
    the removed neighbours dropped (an unchanged row gives the same sums bit for bit)."""
    import numpy as np

    def sums(crow: Any, col: Any, val: Any) -> tuple[Any, Any, Any]:
        rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
        n = len(crow) - 1
        return (np.bincount(rows, minlength=n), np.bincount(rows, val, minlength=n),
                np.bincount(rows, val * (col + 1.0), minlength=n))

    o_crow = old.crow_indices().numpy()
    o_col = node_to_new[old.col_indices().numpy()]
    o_val = old.values().double().numpy()
    keep = o_col >= 0
    o_rows = np.repeat(np.arange(len(o_crow) - 1), np.diff(o_crow))[keep]
    o_crow = np.concatenate([[0], np.cumsum(np.bincount(o_rows, minlength=len(o_crow) - 1))])
    a = sums(o_crow, o_col[keep], o_val[keep])
    b = sums(new.crow_indices().numpy(), new.col_indices().numpy(),
             new.values().double().numpy())
    alive = np.nonzero(node_to_new >= 0)[0]
    at = node_to_new[alive]
    differs = (a[0][alive] != b[0][at]) | (a[1][alive] != b[1][at]) | (a[2][alive] != b[2][at])
    return np.concatenate([alive[differs], np.nonzero(node_to_new < 0)[0]])


def single_passage_insert(base: Any, corpus: Any, i: int, encoder: Any) -> tuple[Any, Any, Any]:
    """Passage i of the synthetic `corpus` inserted into `base` as one commit computes it
    (versions.delta: plan, new vectors by `encoder`, apply): (the new index, its plan, the old
    node -> new node map, -1 for a removed node)."""
    import numpy as np
    import torch

    from hippo_gpu.indexing.build import corpus_state
    from hippo_gpu.versions.delta import Change, NewVectors, apply_change, new_texts, plan_change

    dim = int(base.passage_emb.shape[1])
    passage, doc = corpus.passages(i, i + 1)[0], corpus.docs(i, i + 1)[0]
    state = corpus_state([passage], [doc])
    change = Change(np.zeros(0, np.int64), state.passages, state.triples, state.malformed,
                    state.error)
    plan = plan_change(base, change)
    phrases, facts = new_texts(plan)
    vectors = NewVectors(encoder.encode([passage.content]),
                         encoder.encode(phrases) if phrases else torch.zeros(0, dim),
                         encoder.encode(facts) if facts else torch.zeros(0, dim))
    new, _ = apply_change(base, change, plan, vectors, base.config, torch.device("cpu"))
    node_to_new = np.concatenate([plan.phrase_to_new,
                                  np.where(plan.keep, plan.passage_to_new + len(new.phrases),
                                           -1)])
    return new, plan, node_to_new


def _allowance(index: Any, encoder: Any, texts: list[str], damping: float, weight: float,
               tol: float) -> float:
    """A: the uniform per-commit increase of every δ_j that uses SHARE of the median query's
    budget tol·σ after COMMITS commits (module docstring)."""
    import torch

    e = encoder.encode(texts).double()  # [Q, D]
    emb = index.passage_emb.double()
    cos = e @ emb.T
    lo, hi = cos.amin(1), cos.amax(1)
    alpha = 1.0 / (hi - lo)
    beta = -lo * alpha
    sigma = weight * (cos * alpha.unsqueeze(1) + beta.unsqueeze(1)).sum(1)  # dense half of cᵀr
    per_delta = weight * (alpha.abs() * e.abs().sum(1) + beta.abs())  # B2 per unit δ
    allowance = SHARE * tol * sigma / (COMMITS * per_delta)
    return float(torch.median(allowance))


def main(args: argparse.Namespace, git: dict[str, Any]) -> None:
    import torch

    from hippo_gpu import build_index
    from hippo_gpu.config import EncoderConfig, RetrievalConfig
    from hippo_gpu.embed import Encoder
    from hippo_gpu.ppr.iteration import default_tol
    from hippo_gpu.ppr.push import PushOperator
    from hippo_gpu.synthetic import synthetic_corpus

    n, repeat = args.synthetic, args.repeat
    cfg = RetrievalConfig()
    d, tol = cfg.damping, default_tol(torch.float32)
    print(f"threads {torch.get_num_threads()}; cpu {cpu_model()}; {n} passages; "
          f"damping {d}; tol {tol}")
    corpus = synthetic_corpus(n + repeat, seed=0)
    work = Path(tempfile.mkdtemp(prefix="basis_locality_"))
    files = corpus.write(work / "data")
    t0 = time.perf_counter()
    base = build_index(corpus.passages(0, n), files["openie"], encoder="hash:64", device="cpu")
    build_s = time.perf_counter() - t0
    basis = base.basis
    assert basis is not None
    nnz = int(base.adjacency.values().numel())
    resolve_edges = basis.steps * (basis.z.shape[1] + 1) * nnz
    print(f"base: {len(base.phrases)} phrases, {nnz} adjacency entries; build {build_s:.1f} s, "
          f"basis solve {basis.seconds:.2f} s ({basis.steps} steps x {basis.z.shape[1] + 1} "
          f"columns = {resolve_edges / nnz:.0f} x nnz edges)")
    encoder = Encoder(EncoderConfig(model="hash:64"), torch.device("cpu"))
    probe = corpus.passages(0, n)[:: max(1, n // args.queries)][: args.queries]
    allowance = _allowance(base, encoder, [f"{p.title} {p.text[:80]}" for p in probe], d,
                           cfg.passage_node_weight, tol)
    push = PushOperator(base.adjacency, base.passage_nodes, basis.h, damping=d)
    deg = push.deg[push.position.numpy()]  # in node order
    m = len(base.phrases)
    passage_deg = deg[m:]
    cmax = 2.0 / float(passage_deg[passage_deg > 0].min())  # max_w b_j[w] / D_w, b_j <= 2
    rows: list[dict[str, Any]] = []
    print(f"allowance A {allowance:.3e} per column per commit", flush=True)
    for i in range(n, n + repeat):
        new, _, node_to_new = single_passage_insert(base, corpus, i, encoder)
        s = changed_columns(base.adjacency, new.adjacency, node_to_new)
        if len(s) == 0:  # every phrase of the passage is new: no old column to patch
            print(f"insert {i - n}: no transition column changed", flush=True)
            continue
        # x_j[u] to |Δ| <= A / (4 |S| d/(1 - d)): an h-weighted push budget of |Δ| / (D_u cmax)
        per_node = allowance / (4 * len(s) * d / (1 - d))
        row: dict[str, Any] = {"changed_columns": int(len(s)), "x_accuracy": per_node}
        for loose in LOOSER:  # the needed accuracy, and looser ones to show the trend
            budget = torch.from_numpy(loose * per_node / (deg[s] * cmax))
            t = time.perf_counter()
            out = push.push(torch.arange(len(s)), torch.from_numpy(s), torch.ones(len(s)),
                            len(s), budget, work_cap=WORK_CAP * nnz)
            seconds = time.perf_counter() - t
            work = out.work.double()
            row[f"x{loose:g}"] = {
                "work_per_node_p50": round(float(work.median()) / nnz, 4),
                "work_per_node_max": round(float(work.max()) / nnz, 4),
                "over_resolve": round(float(work.sum()) / resolve_edges, 4),
                "capped": int(out.capped.sum()), "seconds": round(seconds, 3)}
            print(f"insert {i - n}: |S| {len(s)}, x accuracy {loose:g} x {per_node:.2e}: push "
                  f"per node p50 {row[f'x{loose:g}']['work_per_node_p50']} x nnz (max "
                  f"{row[f'x{loose:g}']['work_per_node_max']}, {int(out.capped.sum())} capped "
                  f"at {WORK_CAP} x nnz), all of S = {row[f'x{loose:g}']['over_resolve']} x a "
                  f"re-solve's edges, {seconds:.2f} s", flush=True)
        rows.append(row)
    ratio = [r["x1"]["over_resolve"] for r in rows]
    summary = {"synthetic": n, "phrases": m, "nnz": nnz, "allowance": allowance,
               "commits": COMMITS, "share": SHARE, "tol": tol, "damping": d,
               "basis_seconds": round(basis.seconds, 3), "basis_steps": basis.steps,
               "x_half_over_resolve_p50": quantile(ratio, 0.5), "inserts": rows}
    print(f"x half / re-solve p50 {summary['x_half_over_resolve_p50']} (capped: lower bound)")
    append_result_or_exit(args.results or RESULTS / "bench_basis_locality.jsonl",
                          {**provenance("bench_basis_locality", threads=args.threads,
                                        device="cpu", encoder_backend="hash", precision="float64",
                                        git=git), **summary},
                          allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    ARGS = _parse()
    init_threads(ARGS.threads)
    main(ARGS, check_clean_or_exit(ARGS.allow_dirty))
