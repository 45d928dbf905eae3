#!/usr/bin/env bash
# The device check of hippo_gpu: one run on a bare CUDA machine (working tree + <= 64 MiB of
# carried files, no network, no install) that proves the GPU claims; docs/gpu_check.md says what
# each step proves and what a pass looks like. CI runs the same steps on the CPU, small:
#
#   bash benchmarks/gpu_check.sh                          (CUDA; data from ./.gpu_carry)
#   bash benchmarks/gpu_check.sh --device cpu             (CI's dry run: same steps, CPU, small)
#   bash benchmarks/gpu_check.sh --data-dir DIR           (musique_train elsewhere)
#   bash benchmarks/gpu_check.sh --steps "parity ppr_1m"  (a subset; opt-in steps: scale_1m,
#                                                          synonym_floor)
#
# Carry (ignored paths; tests/benchmarks/test_gpu_check.py checks the size):
#   .gpu_carry/musique_train/   corpus.json, questions.json, openie_*.json (about 5.3 MiB)
#   .gpu_carry/wheels/*.whl     what the image lacks (env.log lists it): hippo_gpu needs scipy,
#                               safetensors, tqdm; the tests pytest (+ pluggy, iniconfig,
#                               packaging); the prpack rows python-igraph + texttable
# Results come back under $OUT (default ./gpu_out): summary.txt, NAME.log per step, *.jsonl.
# Each step has a time limit (the *_LIMIT values below: 480 s in all with the set-up); a timeout
# is a FAIL. Exit status: 1 if a step FAILed, else 0 when at least one step PASSed, else 2.
set -uo pipefail

DEVICE=cuda
STEPS="cuda_tests parity ppr_100k ppr_1m hipporag2_100k prpack"
DATA=""
PRINT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --data-dir) DATA="$2"; shift 2 ;;
        --print-commands) PRINT=1; shift ;;  # each step's command, one a line (the tests)
        *) echo "unknown argument $1" >&2; exit 64 ;;
    esac
done

OUT="${OUT:-./gpu_out}"  # relative to the caller's folder
[ "$PRINT" = 1 ] || { mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"; }
cd "$(dirname "$0")/.."
REPO="$PWD"
CARRY="$REPO/.gpu_carry"
DATA="${DATA:-${HIPPO_DATA_DIR:+$HIPPO_DATA_DIR/musique_train}}"
[ -n "$DATA" ] || DATA="$CARRY/musique_train"
[ -d "$DATA" ] || DATA="$REPO/../shared/data/musique_train"
# benchmarks/kernel_path/sitecustomize.py maps kernels/src to hippo_gpu.kernels (no install)
export PYTHONPATH="$REPO:$REPO/benchmarks/kernel_path${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
THREADS="$(nproc 2>/dev/null || echo 8)"
SUMMARY="$OUT/summary.txt"
[ "$PRINT" = 1 ] || : >"$SUMMARY"
N_PASS=0; N_FAIL=0; N_SKIP=0
STARTED=$(date +%s)

# ---- sizes and limits: the CUDA run, then the dry run's (CPU, small, < 3 minutes) --------------
if [ "$DEVICE" = cpu ]; then
    P100K=3000; P1M=4000; QUESTIONS=10; PPR_QUERIES=16; TEST_K="cuda and not slow"
else
    P100K=100000; P1M=1000000; QUESTIONS=0; PPR_QUERIES=64; TEST_K="cuda"
fi
WHEELS_LIMIT=40; ENV_LIMIT=30; TESTS_LIMIT=75; PARITY_LIMIT=100; PPR100K_LIMIT=50; PPR1M_LIMIT=80
SCALE100K_LIMIT=105  # with the set-up: 480 s in all
SCALE1M_LIMIT=470  # opt-in, a run of its own: --steps scale_1m (the 1M build alone takes minutes)
SYN_LIMIT=90  # opt-in: --steps synonym_floor (a commit's exact synonym update, 85k-8.55M phrases)

# the test files with CUDA cases (tests/benchmarks runs this script: not from inside it)
TEST_FILES=$(grep -rlE 'mark\.cuda|"cuda"' --include='test_*.py' tests 2>/dev/null \
    | grep -v '^tests/benchmarks/' | sort | tr '\n' ' ')
TESTS_CMD=(python3 -m pytest -q -p no:cacheprovider -p no:xdist -k "$TEST_K" $TEST_FILES)
# every `python3 -m benchmarks.X` command below is parsed by its module's argparse in
# tests/benchmarks/test_gpu_check.py: keep one argument per array element
PARITY_CMD=(python3 -m benchmarks.gpu_parity --device "$DEVICE" --threads "$THREADS"
    --data-dir "$DATA" --questions "$QUESTIONS" --results "$OUT/gpu_parity.jsonl")
PPR100K_CMD=(python3 -m benchmarks.bench_ppr --graph synthetic --passages "$P100K"
    --queries "$PPR_QUERIES" --batch-sizes 1,32 --threads "$THREADS" --device "$DEVICE"
    --dtypes float32 --prpack-queries 8 --scipy-queries 0 --networkx-max-nodes 0 --top-k 10
    --repeats 3 --max-seconds 5 --bandwidth-gib 0 --allow-dirty
    --results "$OUT/bench_ppr.jsonl")
PPR1M_CMD=(python3 -m benchmarks.bench_ppr --graph synthetic --passages "$P1M"
    --queries "$PPR_QUERIES" --batch-sizes 1,32 --threads "$THREADS" --device "$DEVICE"
    --dtypes float32 --prpack-queries 0 --scipy-queries 0 --networkx-max-nodes 0 --top-k 10
    --repeats 3 --max-seconds 5 --bandwidth-gib 0 --allow-dirty
    --results "$OUT/bench_ppr.jsonl")
SCALE100K_CMD=(python3 -m benchmarks.bench_scale --passages "$P100K" --threads "$THREADS"
    --device "$DEVICE" --batches 1,32 --modes hipporag2 --repeats 2 --prpack-queries 8
    --timeout 95 --work-dir /tmp/hippo_gpu_check_scale --allow-dirty
    --results "$OUT/bench_scale.jsonl" --plot "$OUT/bench_scale.png")
SCALE1M_CMD=(python3 -m benchmarks.bench_scale --passages "$P1M" --threads "$THREADS"
    --device "$DEVICE" --batches 1,32 --modes hipporag2 --repeats 2 --prpack-queries 0
    --timeout 460 --work-dir /tmp/hippo_gpu_check_scale --allow-dirty
    --results "$OUT/bench_scale.jsonl" --plot "$OUT/bench_scale_1m.png")
SYN_CMD=(python3 -m benchmarks.bench_synonym_floor --threads "$THREADS" --device "$DEVICE"
    --repeats 3 --allow-dirty --results "$OUT/bench_synonym_floor.jsonl")

if [ "$PRINT" = 1 ]; then
    for cmd in TESTS_CMD PARITY_CMD PPR100K_CMD PPR1M_CMD SCALE100K_CMD SCALE1M_CMD SYN_CMD; do
        declare -n args="$cmd"
        printf '%s' "$cmd:"; printf ' %q' "${args[@]}"; printf '\n'
    done
    exit 0
fi

want() { [[ " $STEPS " == *" $1 "* ]]; }

record() {  # record NAME STATUS SECONDS NOTE
    local line
    line=$(printf '%-15s %-4s %4ss  %s' "$1" "$2" "$3" "$4")
    echo "$line" | tee -a "$SUMMARY"
    case "$2" in
        PASS) N_PASS=$((N_PASS + 1)) ;;
        FAIL) N_FAIL=$((N_FAIL + 1)) ;;
        *) N_SKIP=$((N_SKIP + 1)) ;;
    esac
}

run_logged() {  # run_logged NAME SECONDS CMD...: sets RC and ELAPSED; output in $OUT/NAME.log
    local name="$1" limit="$2" start
    shift 2
    start=$(date +%s)
    echo "== $name (limit ${limit}s): $*"
    RC=0
    timeout --kill-after=2 "$limit" "$@" >"$OUT/$name.log" 2>&1 || RC=$?
    ELAPSED=$(( $(date +%s) - start ))
    tail -n 15 "$OUT/$name.log"
}

check() {  # check NAME SECONDS CMD...: exit 0 PASS, 2 SKIP, a timeout or anything else FAIL
    local name="$1" limit="$2" why bad
    run_logged "$@"
    why=$(grep -E '^(SKIP|FAIL)' "$OUT/$name.log" | tail -n 1)
    if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
        record "$name" FAIL "$ELAPSED" "timed out after ${limit}s"
    elif [ "$RC" = 0 ] && [[ "$name" == ppr_* ]] && bad=$(ppr_quality "$OUT/$name.log") \
            && [ -n "$bad" ]; then
        record "$name" FAIL "$ELAPSED" "quality: $bad"
    elif [ "$RC" = 0 ]; then
        record "$name" PASS "$ELAPSED" "${5#benchmarks.} exit 0 $(grep -E '^PASS' \
            "$OUT/$name.log" | tail -n 1 | cut -c1-100)"
        return 0
    elif [ "$RC" = 2 ]; then
        record "$name" SKIP "$ELAPSED" "${why:-exit 2}"
    else
        record "$name" FAIL "$ELAPSED" "exit $RC ${why}"
    fi
    return 1
}

ppr_quality() {  # ppr_quality LOG: why a bench_ppr table fails (hippo_gpu top-10 < 0.99), or ""
    local rows
    rows=$(awk '/^hippo_gpu-/ && NF >= 15' "$1")  # the table (progress lines are indented)
    if [ -z "$rows" ]; then
        echo "no hippo_gpu row in the table"
    else
        echo "$rows" | awk '$14 + 0 < 0.99 {printf "%s %s Q=%s top10 %s; ", $1, $2, $4, $14}'
    fi
}

# ---- setup: carried wheels (optional), then the environment (logged, no check) ------------------
if compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
    # one wheel at a time: a wheel for another Python is logged and the others still install
    run_logged wheels "$WHEELS_LIMIT" bash -c 'for w in "$0"/*.whl; do
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --disable-pip-version-check --target /tmp/hippo_gpu_site "$w" \
            || echo "not installed: $(basename "$w")"; done' "$CARRY/wheels"
    # appended after site-packages by kernel_path/sitecustomize.py: the image's packages win
    export HIPPO_GPU_CHECK_SITE=/tmp/hippo_gpu_site
    [ "$RC" = 0 ] || echo "wheels: install failed (exit $RC), see wheels.log"
fi
run_logged env "$ENV_LIMIT" python3 -c "
import importlib.util, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')
print('missing:', [m for m in ('numpy', 'scipy', 'safetensors', 'tqdm', 'numba', 'triton',
                               'pytest', 'igraph', 'faiss') if importlib.util.find_spec(m) is None])
import hippo_gpu.kernels as k
print('hippo_gpu.kernels from', k.__file__, 'AVAILABLE', k.AVAILABLE)
print(f'cuda_available={int(torch.cuda.is_available())}')"
CUDA=$(sed -n 's/^cuda_available=\([01]\)$/\1/p' "$OUT/env.log" | tail -n 1)
if [ -z "$CUDA" ]; then
    record env FAIL "$ELAPSED" "python, torch or hippo_gpu.kernels does not import (env.log)"
    CUDA=0
fi
echo "== device=$DEVICE CUDA=$CUDA threads=$THREADS data=$DATA out=$OUT"

# ---- steps ---------------------------------------------------------------------------------------
if [ "$DEVICE" != cpu ] && [ "$CUDA" != 1 ]; then
    for name in $STEPS; do
        record "$name" SKIP 0 "SKIP: no CUDA device (torch.cuda.is_available() is False)"
    done
else
    if want cuda_tests; then
        run_logged cuda_tests "$TESTS_LIMIT" "${TESTS_CMD[@]}"
        last=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$OUT/cuda_tests.log" \
            | tail -n 1)
        if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
            record cuda_tests FAIL "$ELAPSED" "timed out after ${TESTS_LIMIT}s"
        elif [ "$RC" = 0 ] && { [ "$DEVICE" = cpu ] || echo "$last" | grep -q ' passed'; }; then
            record cuda_tests PASS "$ELAPSED" "$last"
        elif [ "$RC" = 0 ] || [ "$RC" = 5 ]; then
            record cuda_tests FAIL "$ELAPSED" "no CUDA test ran on a CUDA machine: $last"
        else
            record cuda_tests FAIL "$ELAPSED" "exit $RC: $last"
        fi
    fi
    want parity && check parity "$PARITY_LIMIT" "${PARITY_CMD[@]}"
    want ppr_100k && check ppr_100k "$PPR100K_LIMIT" "${PPR100K_CMD[@]}"
    want ppr_1m && check ppr_1m "$PPR1M_LIMIT" "${PPR1M_CMD[@]}"
    want hipporag2_100k && check hipporag2_100k "$SCALE100K_LIMIT" "${SCALE100K_CMD[@]}"
    want scale_1m && check scale_1m "$SCALE1M_LIMIT" "${SCALE1M_CMD[@]}"
    want synonym_floor && check synonym_floor "$SYN_LIMIT" "${SYN_CMD[@]}"
    if want prpack; then  # the prpack rows of ppr_100k / hipporag2_100k need python-igraph here
        if python3 -c "import igraph" 2>/dev/null; then
            n=$(grep -c 'igraph-prpack' "$OUT/ppr_100k.log" 2>/dev/null)
            if [ "${n:-0}" -gt 0 ]; then
                record prpack PASS 0 "igraph prpack rows beside hippo_gpu in ppr_100k.log"
            else
                record prpack FAIL 0 "igraph is here but ppr_100k.log has no prpack row"
            fi
        else
            record prpack SKIP 0 "SKIP: python-igraph not on this machine (carry its wheel in \
.gpu_carry/wheels); the speed-ups vs prpack are NaN, hippo_gpu's timings stand"
        fi
    fi
fi

# ---- summary -------------------------------------------------------------------------------------
if [ "$N_FAIL" -gt 0 ]; then RESULT=FAIL; STATUS=1
elif [ "$N_PASS" -eq 0 ]; then RESULT=SKIP; STATUS=2
else RESULT=PASS; STATUS=0; fi
{
    echo "SUMMARY: $N_PASS PASS, $N_FAIL FAIL, $N_SKIP SKIP in $(( $(date +%s) - STARTED )) s" \
        "(device $DEVICE)"
    echo "RESULT: $RESULT"
} | tee -a "$SUMMARY"
exit "$STATUS"
