"""Maps `kernels/src` to `hippo_gpu.kernels` without an install (benchmarks/gpu_check.sh).

An install maps the folder through pyproject's package-dir; a bare device machine gets only the
working tree, where `import hippo_gpu.kernels` would fail and every solver would fall back or
fail. gpu_check.sh puts this folder on PYTHONPATH, so every interpreter it starts (pytest workers
and benchmark children included) imports this file at start-up. The finder is appended last to
sys.meta_path: where an install maps the package already, the install wins and this does nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path

_SRC = Path(__file__).resolve().parents[2] / "kernels" / "src"
_NAME = "hippo_gpu.kernels"


class KernelsFinder(MetaPathFinder):
    """Finds `hippo_gpu.kernels` (and its submodules) in kernels/src."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> ModuleSpec | None:
        if fullname == _NAME:
            return importlib.util.spec_from_file_location(
                fullname, _SRC / "__init__.py", submodule_search_locations=[str(_SRC)])
        if fullname.startswith(_NAME + "."):
            leaf = _SRC / (fullname.rsplit(".", 1)[1] + ".py")
            if leaf.is_file():
                return importlib.util.spec_from_file_location(fullname, leaf)
        return None


if _SRC.is_dir():
    sys.meta_path.append(KernelsFinder())
# the carried wheels gpu_check.sh installed: after site-packages, so what the image has wins
_SITE = os.environ.get("HIPPO_GPU_CHECK_SITE")
if _SITE and _SITE not in sys.path:
    sys.path.append(_SITE)
