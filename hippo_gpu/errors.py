"""HippoGpuError: the base of every error hippo_gpu raises on purpose.

Each project error also keeps the builtin base that says what kind of failure it is
(`IndexFormatError(HippoGpuError, ValueError)`, `WriterLockedError(HippoGpuError,
RuntimeError)`, ...), so `except ValueError` around a call keeps working, while one
`except HippoGpuError` separates "hippo_gpu refused this, and says why" from a bug. The command
line catches it once (hippo_gpu.cli) and prints the message; its text is written for the user.
This module imports nothing, so every layer may use it.
"""

from __future__ import annotations

__all__ = ["BLANK", "DiskFullError", "HippoGpuError"]

# What every surface says of an empty or whitespace-only query or entity, after naming it
# (Python: "queries[0] is blank"; HTTP: this message at the field's location in the 422; MCP and
# the command line: "query is blank", "the question is blank").
BLANK = "is blank"


class HippoGpuError(Exception):
    """An error raised by hippo_gpu with a message meant for the user."""


class DiskFullError(HippoGpuError, OSError):
    """A file could not be written because its filesystem is full (ENOSPC) or the user's quota
    is spent (EDQUOT). The message names the file; the step it belonged to (a commit, a cache
    shard, a part of a batch job) was not made, and what was there before is unchanged
    (storage.durable.disk_full makes one). An OSError, so `except OSError` keeps catching it."""

    path: str = ""  # the file whose write failed
