"""Index build benchmark on musique_train: time per stage at an explicit thread count.

Builds the index from corpus.json + the authors' OpenIE file with a cold embedding cache (every
text is embedded), once per requested encoder precision, and prints the per-stage table. With
both precisions the bfloat16 build is compared to the float32 one: max cosine error of the
embeddings and the synonym-edge count. One JSON line per build goes to
benchmarks/results/bench_index.jsonl. For reference, the official HippoRAG 2 code took 358 s on
one thread here (337 s of it embedding 35,161 texts), as measured by the issue author.

    python -m benchmarks.bench_index --threads 1 --precisions float32,bfloat16

Each line carries provenance.py's fields. Here ``encoder_precision`` is the build's encoder
precision (what --precisions sweeps; older lines called it ``precision``), ``precision`` the
built index's embedding precision (float32: the files always hold float32), ``query_precision``
null (no query is encoded) and ``batch_sizes.encoder_batch_size`` the passage/phrase/fact encoder
batch. A dirty git tree needs --allow-dirty.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    cpu_model,
    init_threads,
    musique_dir,
    musique_openie,
    provenance,
)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + faiss threads")
    ap.add_argument("--precisions", default="float32", help="comma list: float32,bfloat16")
    ap.add_argument("--data-dir", default=None, help="default $HIPPO_DATA_DIR or ../shared/data")
    ap.add_argument("--out", default="/tmp/hippo_gpu_bench_index", help="scratch index dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    init_threads(ARGS.threads)

import resource  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/indexing", "hippo_gpu/embed", "hippo_gpu/storage", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/data.py",
            "hippo_gpu/tables.py")


def main(args: argparse.Namespace) -> None:
    import faiss

    import hippo_gpu
    from hippo_gpu.config import EncoderConfig

    git = check_clean_or_exit(args.allow_dirty)  # before minutes of building, not after
    faiss.omp_set_num_threads(args.threads)
    data = musique_dir(root=args.data_dir, need=("corpus.json", "openie*.json"))
    openie = musique_openie(data)
    results = Path(args.results or RESULTS / "bench_index.jsonl")
    built = {}
    print(f"threads {torch.get_num_threads()} (torch), {args.threads} (faiss); "
          f"cpu {cpu_model()}; load {os.getloadavg()}")
    for precision in args.precisions.split(","):
        start = time.perf_counter()
        idx = hippo_gpu.build_index(
            data / "corpus.json", openie, Path(args.out) / precision,
            encoder=EncoderConfig(precision=precision), device=args.device, cache_dir=None)
        total = time.perf_counter() - start
        built[precision] = idx
        print(f"\n== {precision}: {total:.1f} s in all")
        print(f"{'stage':<16}{'seconds':>10}")
        for k, v in idx.timings.items():
            print(f"{k:<16}{v:>10.2f}")
        embed = sum(v for k, v in idx.timings.items() if k.startswith("embed"))
        texts = len(idx.passage_keys) + len(idx.phrases) + len(idx.facts)
        print(f"embedding: {texts} texts in {embed:.1f} s = {texts / embed:.0f} texts/s")
        s = idx.stats()
        print("counts: " + ", ".join(f"{k} {s[k]}" for k in
                                     ("phrase_nodes", "passage_nodes", "facts", "synonym_edges")))
        line = {
            **provenance("index", threads=args.threads, device=args.device,
                         encoder_backend=idx.config.encoder.backend,
                         precision=idx.precision, query_precision=None,
                         batch_sizes={"encoder_batch_size": idx.config.encoder.batch_size},
                         optional_versions=("faiss", "sentence_transformers", "hippo_gpu"),
                         git=git),
            "encoder_precision": precision, "seconds_total": round(total, 2),
            "stages": idx.timings, "texts_embedded": texts, "counts": s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        if "float32" in built and precision != "float32":
            ref = built["float32"]
            err = max(float((1 - (a * b).sum(1)).max()) for a, b in
                      ((ref.passage_emb, idx.passage_emb), (ref.phrase_emb, idx.phrase_emb),
                       (ref.fact_emb, idx.fact_emb)))
            line["max_cosine_error_vs_float32"] = err
            line["synonym_edges_float32"] = ref.stats()["synonym_edges"]
            print(f"vs float32: max cosine error {err:.2e}, synonym edges "
                  f"{s['synonym_edges']} vs {ref.stats()['synonym_edges']}")
        append_result_or_exit(results, line, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main(ARGS)
