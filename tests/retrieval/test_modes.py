"""The modes as values: one list of names (config.MODES) and one Mode per name, looked up once
at each edge; nothing in the package compares mode names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hippo_gpu
from hippo_gpu.config import MODES, RetrievalConfig
from hippo_gpu.retrieval.modes import DENSE, HIPPORAG1, HIPPORAG2, HYBRID, MODE_LIST, Mode, mode_of


def test_every_name_has_one_mode_and_every_mode_a_name():
    assert tuple(mode_of(name).name for name in MODES) == MODES
    assert {m.name for m in (HIPPORAG2, HIPPORAG1, DENSE, HYBRID)} == set(MODES)


def test_the_modes_that_read_entities_are_the_entity_linking_and_fused_ones():
    assert MODE_LIST == tuple(map(mode_of, MODES))
    assert {m.name for m in MODE_LIST if m.reads_entities} == {"hipporag1", "hybrid"}
    assert {m.name for m in MODE_LIST if not m.runs_ppr} == {"dense"}


_NAME = "|".join(MODES)
# a mode name compared (== / != either side), or a membership test against the name lists
_NAME_TEST = re.compile(
    rf"""(==|!=)\s*["']({_NAME})["']|["']({_NAME})["']\s*(==|!=)|\bin\s+\(?\s*["']({_NAME})["']"""
    r"|\b(if|elif|and|or|not|return|assert)\b.*?\bin\s+\(?(MODES|ENTITY_MODES)\b")


def test_no_module_compares_mode_names():
    """Every edge (CLI, HTTP, MCP, Python entry points) turns the name into a Mode with
    mode_of; the code below reads the Mode's fields. Only modes.py maps names to values."""
    root = Path(hippo_gpu.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "retrieval/modes.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _NAME_TEST.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert found == []


def test_the_name_test_finds_what_it_looks_for():
    for line in ('if mode == "hipporag1":', "x if 'dense' != m else y", "if m in MODES:",
                 'ok = mode in ("hipporag1", "hybrid")', "if req.mode in ENTITY_MODES:"):
        assert _NAME_TEST.search(line), line
    assert _NAME_TEST.search("bad = [m for m in modes if m not in MODES]")
    for line in ('mode: str = "hipporag2"', 'MODES = ("hipporag2", "dense")',
                 'key = (True, "dense")', "for mode in MODES:", "{m: 1 for m in MODES}"):
        assert not _NAME_TEST.search(line), line


def test_a_mode_passes_through_and_an_unknown_name_is_named():
    assert mode_of(HYBRID) is HYBRID
    with pytest.raises(ValueError, match=r"unknown mode 'fast'; choose one of \('hipporag2'"):
        mode_of("fast")


def test_link_k_and_entity_linking_follow_the_fusion_settings():
    cfg = RetrievalConfig(linking_top_k=5, hybrid_linking_top_k=9)
    assert (HIPPORAG2.link_k(cfg), HYBRID.link_k(cfg)) == (5, 9)
    assert HYBRID.links_entities(cfg) == (cfg.hybrid_entity_weight > 0)
    assert not HYBRID.links_entities(RetrievalConfig(hybrid_entity_weight=0.0))
    assert not HIPPORAG2.links_entities(cfg)
    assert Mode("x", "facts") == HIPPORAG2.__class__("x", "facts")  # frozen values compare
