"""Helpers of the CLI tests: the app run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy")
# runs the app as `hippo-gpu ARGS` would, then prints its exit status and the heavy modules
# that are loaded
RUN_APP = f"""
import json, sys
from hippo_gpu.cli import app
try:
    app(sys.argv[1:], prog_name="hippo-gpu")
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({{"exit": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def run_app(*args: str) -> dict:
    """`hippo-gpu ARGS` in a fresh interpreter: {"exit": status, "loaded": heavy modules}."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RUN_APP, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
