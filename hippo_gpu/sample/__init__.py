"""The bundled sample: 30 invented passages with hand-written triples and 4 multi-hop questions.

The world is fictional on purpose, so that a question can only be answered by linking passages
(no encoder has seen these facts). Files: corpus.json, openie.json (OpenIE v2 format),
questions.json (MuSiQue format).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_dir() -> Path:
    return Path(str(files(__name__)))


def paths() -> dict[str, Path]:
    """{"corpus", "openie", "questions"} -> file paths of the bundled sample."""
    d = sample_dir()
    return {"corpus": d / "corpus.json", "openie": d / "openie.json",
            "questions": d / "questions.json"}
