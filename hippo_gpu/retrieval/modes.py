"""The retrieval modes as values: what distinguishes hipporag2, hipporag1, dense and hybrid.

Users name a mode by its string (hippo_gpu.config.MODES); each edge (the CLI's --mode, the HTTP
and MCP schemas, the Python entry points Searcher.rank, retrieve_file, ircot_retrieve,
evaluate_mode) looks the `Mode` up once (`mode_of`) and the code below reads its fields instead
of comparing names (tests/retrieval/test_modes.py greps the package for a name comparison):

    mode       linking    prior     fusion
    hipporag2  facts      minmax    no      upstream HippoRAG 2 (parity)
    hybrid     facts      softmax   yes     PPR, dense and entity rankings fused by rank
    dense      none       -         no      the min-max cosine alone
    hipporag1  entities   -         no      legacy HippoRAG 1 on the phrase graph
"""

from __future__ import annotations

from dataclasses import dataclass

from hippo_gpu.config import MODES, RetrievalConfig

__all__ = ["DENSE", "HIPPORAG1", "HIPPORAG2", "HYBRID", "MODE_LIST", "Mode", "mode_of"]


@dataclass(frozen=True)
class Mode:
    """One retrieval mode.

    Attributes:
        name: the name users pass (one of hippo_gpu.config.MODES).
        linking: what seeds the PPR: "facts" (the query's best-matching facts, their phrases),
            "entities" (the query's named entities linked to phrases) or "none" (no PPR).
        prior: the passage part of a "facts" reset vector (hippo_gpu.retrieval.seeds):
            "minmax" (passage_node_weight · minmax(cos), upstream) or "softmax" (the phrase
            seeds normalised to sum 1 plus hybrid_passage_node_weight · softmax(T · cos)).
        fusion: the PPR ranking is fused with the dense and entity rankings by weighted
            reciprocal rank (hippo_gpu.retrieval.hybrid); a fused mode reads the hybrid_*
            settings of RetrievalConfig.
    """

    name: str
    linking: str
    prior: str = "minmax"
    fusion: bool = False

    @property
    def reads_entities(self) -> bool:
        """Whether the mode reads the query's entities (hipporag1 seeds from them; hybrid fuses
        an entity ranking); the others ignore any given."""
        return self.linking == "entities" or self.fusion

    @property
    def runs_ppr(self) -> bool:
        """Whether the mode runs a PPR (every mode but dense): only such a ranking can fall
        back to the dense one or carry a PPR bound."""
        return self.linking != "none"

    def link_k(self, cfg: RetrievalConfig) -> int:
        """Candidate facts per query, facts kept after the filter and phrase seeds kept."""
        return cfg.hybrid_linking_top_k if self.fusion else cfg.linking_top_k

    def links_entities(self, cfg: RetrievalConfig) -> bool:
        """Whether a "facts" mode also links the query's entities (hybrid's entity ranking)."""
        return self.fusion and cfg.hybrid_entity_weight > 0


HIPPORAG2 = Mode("hipporag2", "facts")
HIPPORAG1 = Mode("hipporag1", "entities")
DENSE = Mode("dense", "none")
HYBRID = Mode("hybrid", "facts", prior="softmax", fusion=True)
MODE_LIST = (HIPPORAG2, HIPPORAG1, DENSE, HYBRID)  # config.MODES' order
_BY_NAME = {m.name: m for m in MODE_LIST}
# one list of names: config.MODES (tests/retrieval/test_modes.py checks they agree)


def mode_of(name: str | Mode) -> Mode:
    """The Mode named ``name`` (a Mode passes through); ValueError naming MODES otherwise."""
    if isinstance(name, Mode):
        return name
    mode = _BY_NAME.get(name)
    if mode is None:
        raise ValueError(f"unknown mode {name!r}; choose one of {MODES}")
    return mode
