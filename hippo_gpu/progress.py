"""Progress bars for long work (tqdm), silenced when disabled or not on a terminal."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm


def progress(*, total: int | None, desc: str, unit: str = "it", disable: bool = False,
             **kwargs: Any) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, disable=disable or not sys.stderr.isatty(),
                dynamic_ncols=True, **kwargs)
