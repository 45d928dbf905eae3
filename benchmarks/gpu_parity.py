"""CUDA vs CPU parity on musique_train: build, synonym kNN and top-10 rankings (gpu_check.sh).

Builds the musique_train index twice from the same corpus and OpenIE file, with the weightless
hash encoder by default (no model weights on a bare device machine): once on the CPU, once on
--device. Both builds use the exact torch synonym kNN ("torch": chunked X X^T then top-k; faiss
is not on the device machine). Checked, each a PASS or FAIL line:

  counts     Index.stats() of the two builds equal (nodes, edges, facts, phrases, ...)
  synonyms   the accepted synonym pairs (src, dst) of the two builds: Jaccard >= --min-synonym
             (a pair whose cosine sits within float32 rounding of the 0.8 threshold may flip)
  knn        torch kNN of the phrase vectors on --device vs the float64 exact top-k on the CPU:
             neighbour-set recall >= --min-knn-recall, a miss whose exact score ties the k-th
             score within --tie-tol counted as found
  rankings   per mode (dense, hipporag2, hybrid), every distinct question's top-10 on --device vs
             the CPU's: a question agrees when the lists are equal, or differ only at ranks where
             the two devices' scores agree within --tie-tol (relative to the top score): a
             certified tie, two passages whose order float rounding may swap. PASS needs
             agreement >= --min-agreement (0.99) in every mode. CUDA promises the CPU's rankings
             up to such ties, never bit-equal scores.

With --device cpu (CI's dry run) both builds run on the CPU: the same code path, small
(--questions caps the questions). Exit status 0 PASS, 1 FAIL, 2 SKIP (no CUDA, no data).

    python -m benchmarks.gpu_parity --device cuda --data-dir .gpu_carry/musique_train
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import SKIP, init_threads, musique_dir, musique_openie

MODES = ("dense", "hipporag2", "hybrid")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="musique_train folder (questions, corpus, openie*.json)")
    ap.add_argument("--encoder", default="hash:64", help="hash:D (no weights) or a model path")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--questions", type=int, default=0, help="first N distinct questions (0: all)")
    ap.add_argument("--min-agreement", type=float, default=0.99)
    ap.add_argument("--min-synonym", type=float, default=0.99, help="synonym-pair Jaccard floor")
    ap.add_argument("--min-knn-recall", type=float, default=0.99)
    ap.add_argument("--knn-k", type=int, default=10)
    ap.add_argument("--tie-tol", type=float, default=1e-5,
                    help="relative score difference that counts as a tie")
    ap.add_argument("--results", type=Path, default=None, help="append one JSON line here")
    return ap


def tie_agreement(a: list[list[int]], b: list[list[int]], sa: list[list[float]],
                  sb: list[list[float]], tol: float) -> tuple[float, float, list[int]]:
    """(fraction equal, fraction equal up to certified ties, questions beyond ties).

    Lists a (reference) and b agree up to ties when at every rank r where a[r] != b[r] the two
    scores at r differ by <= tol * |sa[0]|: the passage b puts there scores like the one a puts
    there, so the swap is float rounding between equals, not a different ranking.
    """
    exact, tied, beyond = 0, 0, []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            exact += 1
            tied += 1
            continue
        scale = max(abs(sa[i][0]), 1e-30)
        if all(abs(sa[i][r] - sb[i][r]) <= tol * scale
               for r in range(min(len(x), len(y))) if x[r] != y[r]) and len(x) == len(y):
            tied += 1
        else:
            beyond.append(i)
    n = max(len(a), 1)
    return exact / n, tied / n, beyond


def knn_recall(x, device: str, k: int, tol: float) -> float:  # type: ignore[no-untyped-def]
    """Recall of the torch kNN on `device` against the float64 exact top-k on the CPU."""
    import torch

    from hippo_gpu.indexing.vector_search import knn

    m, k = x.shape[0], min(k, x.shape[0])
    _, ids = knn(x.to(device), k, backend="torch")
    x64, ok = x.double(), 0
    for start in range(0, m, 2048):  # [B, M] float64 blocks
        sim = x64[start:start + 2048] @ x64.T
        top, _ = torch.topk(sim, k, dim=1)
        got = torch.gather(sim, 1, ids[start:start + 2048].cpu())  # exact scores of the found
        ok += int((got >= top[:, -1:] - tol * top[:, :1].abs()).sum())
    return ok / (m * k)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    init_threads(args.threads)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return SKIP
    data = musique_dir(args.data_dir, need=("questions.json", "corpus.json"))  # else a SKIP
    openie = musique_openie(data)
    if openie is None:
        print(f"SKIP: no openie*.json in {data}")
        return SKIP

    import hippo_gpu
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.data import read_questions
    from hippo_gpu.retrieval.searcher import Searcher

    graph = GraphConfig(knn_backend="torch")
    builds, seconds = [], []
    for dev in ("cpu", args.device):  # two builds even when --device is cpu (the dry run)
        start = time.perf_counter()
        builds.append(hippo_gpu.build_index(data / "corpus.json", openie, None,
                                            encoder=args.encoder, device=dev, graph=graph))
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        print(f"build on {dev}: {seconds[-1]:.1f} s, {builds[-1].stats()}")
    cpu_index, dev_index = builds
    checks: dict[str, bool] = {}
    row: dict[str, object] = {"device": args.device, "encoder": args.encoder,
                              "build_s": seconds}

    s_cpu, s_dev = ({k: v for k, v in ix.stats().items() if k != "basis_seconds"}
                    for ix in builds)
    diff = {k: (s_cpu[k], s_dev.get(k)) for k in s_cpu if s_cpu[k] != s_dev.get(k)}
    checks["counts"] = not diff
    print(f"{'PASS' if not diff else 'FAIL'} counts: {len(s_cpu)} equal" if not diff
          else f"FAIL counts differ: {diff}")

    def pairs(ix) -> set[tuple[int, int]]:  # type: ignore[no-untyped-def]
        return set(zip(ix.synonym_src.cpu().tolist(), ix.synonym_dst.cpu().tolist(),
                       strict=True))

    p_cpu, p_dev = pairs(cpu_index), pairs(dev_index)
    jac = len(p_cpu & p_dev) / max(len(p_cpu | p_dev), 1)
    checks["synonyms"] = jac >= args.min_synonym
    row["synonyms"] = {"cpu": len(p_cpu), "device": len(p_dev), "jaccard": jac}
    print(f"{'PASS' if checks['synonyms'] else 'FAIL'} synonyms: {len(p_cpu)} pairs on the CPU, "
          f"{len(p_dev)} on {args.device}, Jaccard {jac:.4f} (floor {args.min_synonym})")

    x = cpu_index.phrase_emb.float().cpu()
    rec = knn_recall(x, args.device, args.knn_k, args.tie_tol)
    checks["knn"] = rec >= args.min_knn_recall
    row["knn_recall"] = rec
    print(f"{'PASS' if checks['knn'] else 'FAIL'} knn: torch top-{args.knn_k} on {args.device} "
          f"vs float64 exact over {x.shape[0]} phrases, recall {rec:.4f} up to ties")

    questions = list({q.question: q for q in read_questions(data / "questions.json")}.values())
    texts = [q.question for q in questions][:args.questions or None]
    ref, dut = Searcher(cpu_index), Searcher(dev_index)
    modes = [m for m in args.modes.split(",") if m]
    row["modes"] = {}
    for mode in modes:
        r_cpu = ref.rank(texts, top_k=args.top_k, mode=mode)
        dut.rank(texts, top_k=args.top_k, mode=mode)  # warm-up (CUDA context, kernels)
        start = time.perf_counter()
        r_dev = dut.rank(texts, top_k=args.top_k, mode=mode)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3 / len(texts)
        exact, tied, beyond = tie_agreement(
            r_cpu.passage_rows.tolist(), r_dev.passage_rows.cpu().tolist(),
            r_cpu.scores.double().tolist(), r_dev.scores.double().cpu().tolist(), args.tie_tol)
        ok = tied >= args.min_agreement
        checks[f"rankings_{mode}"] = ok
        row["modes"][mode] = {"Q": len(texts), "equal": exact, "equal_up_to_ties": tied,  # type: ignore[index]
                              "beyond_ties": beyond, "ms_per_query": ms}
        print(f"{'PASS' if ok else 'FAIL'} rankings {mode}: {len(texts)} questions, top-"
              f"{args.top_k} on {args.device} == CPU: {exact:.3f} exactly, {tied:.3f} up to "
              f"certified ties (floor {args.min_agreement}); {len(beyond)} beyond ties; "
              f"{ms:.3f} ms/query on {args.device} (batch {len(texts)})")

    passed = all(checks.values())
    row["checks"] = checks
    row["verdict"] = "PASS" if passed else "FAIL"
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with args.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
    print("PASS" if passed else "FAIL: " + ", ".join(k for k, v in checks.items() if not v))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
