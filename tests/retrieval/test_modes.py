"""The modes as values: one list of names (config.MODES) and one Mode per name, looked up once."""

from __future__ import annotations

import pytest

from hippo_gpu.config import ENTITY_MODES, MODES, RetrievalConfig
from hippo_gpu.retrieval.modes import DENSE, HIPPORAG1, HIPPORAG2, HYBRID, Mode, mode_of


def test_every_name_has_one_mode_and_every_mode_a_name():
    assert tuple(mode_of(name).name for name in MODES) == MODES
    assert {m.name for m in (HIPPORAG2, HIPPORAG1, DENSE, HYBRID)} == set(MODES)


def test_the_modes_that_read_entities_are_the_entity_linking_and_fused_ones():
    reads = {m.name for m in map(mode_of, MODES) if m.linking == "entities" or m.fusion}
    assert reads == set(ENTITY_MODES)


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
