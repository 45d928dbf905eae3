"""What the command line costs before it does any work: `--help`, `stats` and a one-passage
`insert` into a synthetic index, each beside `python -c "import torch, hippo_gpu"` in one run.

    python -m benchmarks.bench_cli --passages 100000 --threads 1 [--repeats 3]

Every figure is a fresh process (the wall time a user waits, the process's peak RSS from
wait4), run `--repeats` times (median, p20, p80) after a first run reported apart:

* `import torch, hippo_gpu`: the floor of any command that computes (a writer needs torch);
* `hippo-gpu --help` and `hippo-gpu stats IDX`: with the modules they import checked (torch,
  numpy must stay out: the commands import their heavy modules inside, hippo_gpu.__init__ on
  first use, and stats reads the manifest, store.manifest_stats); `stats` beside what it did
  before (`load_index(IDX).stats()`: every file verified and loaded), whose output it must equal;
* `hippo-gpu insert COPY --corpus ONE.json --openie ONE_OPENIE.json`: one passage into a copy
  of the index (hard links, made afresh for every run: the store never rewrites a file in
  place), a different passage each run; its time beyond the import floor is what opening the
  index and the commit cost. A breakdown run times the same steps inside one process (imports,
  IndexWriter.open, insert + commit).

Targets (printed PASS / FAIL and recorded): no torch in `--help` and `stats`; stats < 300 MB
peak RSS; insert <= 2 s beyond the import floor.

The index of the first `--passages` of hippo_gpu.synthetic's corpus (hash:64 encoder) is built
once by `hippo-gpu index` (`--threads`) into `--work` (default .cache/bench/cli_N_SEED) and
reused while its manifest reads (a build of another format or without the manifest's basis
summary is rebuilt). Appends one JSON line to benchmarks/results/bench_cli.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    cpu_model,
    init_threads,
    provenance,
    subprocess_env,
    summarize,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/cli", "hippo_gpu/__init__.py", "hippo_gpu/storage", "hippo_gpu/versions",
            "hippo_gpu/indexing", "hippo_gpu/embed", "hippo_gpu/config.py")

RESULTS = "benchmarks/results/bench_cli.jsonl"
HEAVY = ("torch", "numpy", "scipy", "safetensors")
STATS_RSS_MB = 300  # target: stats of the index under this peak RSS
INSERT_BEYOND_IMPORT_S = 2.0  # target: a one-passage insert within this of the import floor
# passages generated beyond the index's for the inserts (a fixed count: the synthetic corpus,
# hence the built index, depends on its total size); --repeats + 1 of them are used
EXTRA = 32
# starts argv[2:] and writes its wall time and peak RSS (wait4) to argv[1]: a child's ru_maxrss
# counts the memory of the process it was forked from, so the benchmark (torch loaded) starts
# this small interpreter, which starts the command
_LAUNCH = """
import json, os, subprocess, sys, time
t = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - t
code = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": wall, "rss_kib": usage.ru_maxrss}, f)
sys.exit(code)
"""
# runs the app in-process as `hippo-gpu ARGS` would, then reports which heavy modules it loaded
_CHECK = f"""
import json, sys
from hippo_gpu.cli import app
try:
    app(sys.argv[1:], prog_name="hippo-gpu")
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({{"exit": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}),
      file=sys.stderr)
"""
# the breakdown of one insert inside a process: argv = index dir, corpus, openie
_PHASES = """
import json, sys, time
t0 = time.perf_counter()
import torch, hippo_gpu
t1 = time.perf_counter()
from hippo_gpu.versions.writer import IndexWriter
t2 = time.perf_counter()
w = IndexWriter(sys.argv[1], device="cpu", cache_dir=sys.argv[4], verify=False).open()
t3 = time.perf_counter()
w.insert(sys.argv[2], sys.argv[3])
w.commit()
t4 = time.perf_counter()
w.close()
print(json.dumps({"import_torch_hippo_gpu_s": t1 - t0, "import_writer_s": t2 - t1,
                  "open_s": t3 - t2, "insert_commit_s": t4 - t3,
                  "commit_stages": w.last_change.stage_seconds}))
"""
_OLD_STATS = ("import json, sys\nfrom hippo_gpu.versions.load import load_index\n"
              "print(json.dumps(load_index(sys.argv[1], device='cpu').stats()))\n")


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stderr) of one child process, through _LAUNCH (see there);
    a failure exits the run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        proc = subprocess.run([sys.executable, "-c", _LAUNCH, str(out), *cmd], env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"FAIL: {' '.join(cmd)} exited {proc.returncode}:\n"
                             f"{proc.stderr[-2000:]}")
        got = json.loads(out.read_text())
    return got["wall_s"], got["rss_kib"] / 1024, proc.stderr


def _timed(name: str, cmd: list[str], env: dict[str, str], repeats: int,
           before: Any = None) -> dict[str, Any]:
    """The first run apart (page-cache misses, first faults), then `repeats` runs: wall
    seconds as timing.summarize gives them (median, p20, p80) and the median peak RSS.
    `before(i)`, when given, prepares run i and returns its command."""
    walls, rss = [], []
    for i in range(repeats + 1):
        wall, mb, _ = _run(before(i) if before else cmd, env)
        walls.append(wall)
        rss.append(mb)
    t = summarize(walls[0], walls[1:])
    row = {**{k: round(v, 3) for k, v in t.as_dict(scale=1.0, suffix="_s").items()},
           "peak_rss_mb": round(statistics.median(rss[1:]), 1)}
    print(f"{name:<34} {t.median:7.3f} s (p20 {t.p20:.3f}, p80 {t.p80:.3f}, first "
          f"{t.first:.3f})  {row['peak_rss_mb']:7.1f} MB", flush=True)
    return row


def _loaded(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Which of HEAVY a `hippo-gpu ARGS` process imported, and its exit status."""
    _, _, err = _run([sys.executable, "-c", _CHECK, *args], env)
    return json.loads(err.strip().splitlines()[-1])


def _prepare(work: Path, n: int, extra: int, seed: int, threads: int,
             env: dict[str, str]) -> float | None:
    """The synthetic files and the index of the first n passages in `work` (built by
    `hippo-gpu index`; reused when there). Returns the build's seconds, None when reused."""
    from hippo_gpu.storage.directory import IndexFormatError, manifest_stats, read_manifest

    index, marker = work / "index", work / "build.json"
    want = {"passages": n, "extra": extra, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()).get("want") == want:
        try:
            if manifest_stats(read_manifest(index)) is not None:
                print(f"reusing {index} (built in {json.loads(marker.read_text())['build_s']} s)")
                return None
        except IndexFormatError as e:
            print(f"rebuilding {index}: {e}")
    from hippo_gpu.synthetic import synthetic_corpus

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    files = synthetic_corpus(n + extra, seed=seed).write(work / "data")
    corpus = json.loads(files["corpus"].read_text(encoding="utf-8"))
    docs = json.loads(files["openie"].read_text(encoding="utf-8"))["docs"]
    (work / "corpus.json").write_text(json.dumps(corpus[:n]), encoding="utf-8")
    for i in range(n, n + extra):  # one file pair per insert: what a user would hand over
        (work / f"insert_{i}.json").write_text(json.dumps(corpus[i:i + 1]), encoding="utf-8")
        (work / f"insert_{i}_openie.json").write_text(json.dumps({"docs": docs[i:i + 1]}),
                                                       encoding="utf-8")
    del corpus, docs
    print(f"building the index of {n} synthetic passages with {threads} thread(s) ...",
          flush=True)
    t = time.perf_counter()
    _run([sys.executable, "-m", "hippo_gpu.cli", "index", "--corpus", str(work / "corpus.json"),
          "--openie", str(files["openie"]), "--out", str(index), "--encoder", "hash:64",
          "--device", "cpu", "--threads", str(threads), "--cache-dir", str(work / "cache")], env)
    build_s = round(time.perf_counter() - t, 1)
    marker.write_text(json.dumps({"want": want, "build_s": build_s}))
    return build_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default=None, help="build and scratch folder (default "
                                                 ".cache/bench/cli_N_SEED)")
    ap.add_argument("--results", default=RESULTS)
    add_arguments(ap)
    args = ap.parse_args()
    git = check_clean_or_exit(args.allow_dirty)
    threads = init_threads(args.threads)  # the children inherit the thread variables
    env = subprocess_env(args.threads)
    work = Path(args.work or REPO / ".cache" / "bench" / f"cli_{args.passages}_{args.seed}")
    if not 1 <= args.repeats < EXTRA:
        raise SystemExit(f"--repeats takes 1 to {EXTRA - 1}")
    build_s = _prepare(work, args.passages, EXTRA, args.seed, args.threads, env)
    index = work / "index"
    index_bytes = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
    print(f"index {index}: {args.passages} passages, {index_bytes / 2**20:.0f} MiB; threads "
          f"{threads}; cpu {cpu_model()}\n")
    py = [sys.executable]
    cli = [*py, "-m", "hippo_gpu.cli"]
    rows: dict[str, Any] = {}
    rows["import_torch_hippo_gpu"] = _timed("python -c 'import torch, hippo_gpu'",
                                            [*py, "-c", "import torch, hippo_gpu"], env,
                                            args.repeats)
    rows["help"] = _timed("hippo-gpu --help", [*cli, "--help"], env, args.repeats)
    rows["stats"] = _timed("hippo-gpu stats IDX", [*cli, "stats", str(index)], env,
                           args.repeats)
    rows["stats_by_load_index"] = _timed("load_index(IDX).stats() (before)",
                                         [*py, "-c", _OLD_STATS, str(index)], env, args.repeats)
    copy = work / "insert_copy"

    def insert_cmd(i: int) -> list[str]:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(index, copy, copy_function=os.link)
        p = args.passages + i
        return [*cli, "insert", str(copy), "--corpus", str(work / f"insert_{p}.json"),
                "--openie", str(work / f"insert_{p}_openie.json"), "--device", "cpu",
                "--threads", str(args.threads), "--cache-dir", str(work / "cache")]

    rows["insert_one"] = _timed("hippo-gpu insert (1 passage)", [], env, args.repeats,
                                before=insert_cmd)
    p = args.passages
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(index, copy, copy_function=os.link)
    out = subprocess.run([*py, "-c", _PHASES, str(copy), str(work / f"insert_{p}.json"),
                          str(work / f"insert_{p}_openie.json"), str(work / "cache")],
                         env=env, cwd=REPO, capture_output=True, text=True, check=True)
    phases = {k: (round(v, 3) if isinstance(v, float) else
                  {s: round(x, 3) for s, x in v.items()})
              for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    shutil.rmtree(copy, ignore_errors=True)
    print(f"\ninsert inside one process: {phases}")

    loaded = {"help": _loaded(["--help"], env), "stats": _loaded(["stats", str(index)], env)}
    new = subprocess.run([*cli, "stats", str(index), "--json"], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    old = subprocess.run([*py, "-c", _OLD_STATS, str(index)], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    same_stats = json.loads(new) == json.loads(old)
    floor = rows["import_torch_hippo_gpu"]["median_s"]
    beyond = round(rows["insert_one"]["median_s"] - floor, 3)
    checks = {
        "help_imports_no_torch": "torch" not in loaded["help"]["loaded"],
        "stats_imports_no_torch": "torch" not in loaded["stats"]["loaded"],
        "stats_equals_load_index_stats": same_stats,
        "stats_rss_under_300mb": rows["stats"]["peak_rss_mb"] < STATS_RSS_MB,
        "insert_within_2s_of_import": beyond <= INSERT_BEYOND_IMPORT_S,
    }
    print(f"\nmodules loaded: --help {loaded['help']['loaded'] or 'none of ' + str(HEAVY)}; "
          f"stats {loaded['stats']['loaded'] or 'none of ' + str(HEAVY)}")
    print(f"insert beyond the import floor: {beyond:.3f} s (target <= "
          f"{INSERT_BEYOND_IMPORT_S} s)")
    print(f"stats / load_index(...).stats(): "
          f"{rows['stats']['median_s'] / rows['stats_by_load_index']['median_s']:.2f}x the time, "
          f"{rows['stats']['peak_rss_mb'] / rows['stats_by_load_index']['peak_rss_mb']:.2f}x "
          "the memory")
    for k, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {k}")
    record = {**provenance("cli", threads=threads, device="cpu", encoder_backend="hash",
                           precision="float32", git=git),
              "passages": args.passages, "seed": args.seed, "index_bytes": index_bytes,
              "build_s": build_s, "encoder": "hash:64", **rows,
              "insert_beyond_import_s": beyond, "insert_phases": phases,
              "loaded": {k: v["loaded"] for k, v in loaded.items()}, "checks": checks}
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)
    if not all(checks.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
