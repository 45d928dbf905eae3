"""Seeded HippoRAG-2-shaped graphs and reset vectors for benchmarks (10k .. 1M passages).

Shape of a real index (musique_train: 1,890 passages, ~16k phrases, ~9 triples and ~10 distinct
phrases per passage, one very popular phrase in 169 passages, 91 % of phrases in one passage) and
the issue's 1M target (~6 nodes and ~60 directed CSR entries per passage):

* P passages and V = ``phrases_per_passage``·P phrase nodes; node order is phrases then passages,
  as in a real index. Phrase ids are a random permutation (a real index sorts phrases by string,
  which is unrelated to the passages that mention them), so locality is realistically poor.
* Mentions: each passage mentions its ``phrases_per_passage`` own phrases plus
  ``popular_mentions`` phrases drawn from a Zipf law over all phrases (frequency ∝ rank^-zipf).
* Fact edges: ``triples_per_passage`` (subject, object) pairs drawn among the passage's mentions;
  A[s, o] = A[o, s] = 2·count (each orientation counted, §3.2.6 of hipporag_semantics.md).
* Passage edges: A[p, e] = A[e, p] = 1 for each distinct phrase e the passage mentions.
* Synonym edges: ``synonyms_per_phrase``·V/2 random phrase pairs with cosine in [0.8, 1],
  A = 2·score (mutual neighbours). Duplicates add up, as in the official multigraph.

Everything is vectorised numpy: no Python loop per passage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import coo_matrix
from torch import Tensor

__all__ = ["SyntheticGraph", "synthetic_graph", "synthetic_reset_vectors"]


@dataclass(frozen=True)
class SyntheticGraph:
    """A synthetic index.

    Attributes:
        adjacency: [N, N] float32 symmetric sparse CSR (same type as a real index's adjacency).
        passage_nodes: [P] int64 node rows of the passages (they follow the V phrase rows).
        num_phrases: V.
        mentions: [P, K] int64 phrase node ids each passage mentions (K = own + popular; repeats
            possible), used to draw realistic query seeds.
        phrase_passage_count: [V] number of distinct passages mentioning each phrase.
    """

    adjacency: Tensor  # [N, N] CSR float32
    passage_nodes: Tensor  # [P]
    num_phrases: int
    mentions: np.ndarray  # [P, K]
    phrase_passage_count: np.ndarray  # [V]

    @property
    def num_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def num_passages(self) -> int:
        return int(self.passage_nodes.numel())


def _zipf_sample(rng: np.random.Generator, size: int, count: int, exponent: float) -> np.ndarray:
    """``count`` draws of a rank in [0, size) with P(rank) ∝ (rank + 1)^-exponent."""
    cdf = np.cumsum(np.arange(1, size + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(count)), size - 1)


def synthetic_graph(
    num_passages: int,
    *,
    seed: int = 0,
    phrases_per_passage: int = 5,
    popular_mentions: int = 5,
    triples_per_passage: int = 11,
    synonyms_per_phrase: float = 4.0,
    zipf: float = 0.7,
) -> SyntheticGraph:
    """Build a seeded HippoRAG-2-shaped graph (see module docstring).

    Args:
        num_passages: P >= 1.
        seed: RNG seed; the same arguments give the same graph.
        phrases_per_passage: phrases introduced per passage (V = this·P, N = V + P).
        popular_mentions: extra Zipf-distributed phrase mentions per passage.
        triples_per_passage: fact triples per passage.
        synonyms_per_phrase: mean synonym degree of a phrase.
        zipf: exponent of the phrase popularity law.

    Returns:
        :class:`SyntheticGraph`.
    """
    if num_passages < 1 or phrases_per_passage < 1:
        raise ValueError("need num_passages >= 1 and phrases_per_passage >= 1")
    rng = np.random.default_rng(seed)
    p = num_passages
    v = phrases_per_passage * p
    n = v + p
    phrase_id = rng.permutation(v).astype(np.int64)  # slot -> node row (random string order)
    own = phrase_id.reshape(p, phrases_per_passage)  # [P, own]
    popular = phrase_id[rng.permutation(v)][_zipf_sample(rng, v, p * popular_mentions, zipf)]
    mentions = np.concatenate([own, popular.reshape(p, popular_mentions)], axis=1)  # [P, K]
    k = mentions.shape[1]

    # Passage edges: one per distinct (passage, phrase), weight 1.
    passage_col = np.repeat(np.arange(p, dtype=np.int64) + v, k)
    pairs = np.unique(np.stack([passage_col, mentions.ravel()], axis=1), axis=0)  # [M, 2]
    phrase_passage_count = np.bincount(pairs[:, 1], minlength=v)

    # Fact edges: subject/object among the passage's mentions, each orientation += 1.
    pick = rng.integers(0, k, size=(p, triples_per_passage, 2))
    rows = np.arange(p)[:, None]
    subj = mentions[rows, pick[..., 0]].ravel()
    obj = mentions[rows, pick[..., 1]].ravel()
    keep = subj != obj
    subj, obj = subj[keep], obj[keep]

    # Synonym edges between random phrases (mutual: both orientations carry the score).
    m = int(round(synonyms_per_phrase * v / 2))
    syn_u = rng.integers(0, v, m)
    syn_v = rng.integers(0, v, m)
    keep = syn_u != syn_v
    syn_u, syn_v = syn_u[keep], syn_v[keep]
    syn_w = rng.uniform(0.8, 1.0, syn_u.size)

    src = np.concatenate([pairs[:, 0], subj, syn_u])
    dst = np.concatenate([pairs[:, 1], obj, syn_v])
    weight = np.concatenate([np.ones(len(pairs)), np.full(subj.size, 2.0), 2.0 * syn_w]).astype(
        np.float32
    )
    sym = coo_matrix(
        (
            np.concatenate([weight, weight]),
            (np.concatenate([src, dst]), np.concatenate([dst, src])),
        ),
        shape=(n, n),
    ).tocsr()  # duplicates summed
    sym.sort_indices()
    adjacency = torch.sparse_csr_tensor(
        torch.from_numpy(sym.indptr.astype(np.int64)),
        torch.from_numpy(sym.indices.astype(np.int64)),
        torch.from_numpy(sym.data.astype(np.float32)),
        (n, n),
        check_invariants=False,
    )
    passage_nodes = torch.arange(v, n, dtype=torch.int64)
    return SyntheticGraph(adjacency, passage_nodes, v, mentions, phrase_passage_count)


def synthetic_reset_vectors(
    graph: SyntheticGraph,
    num_queries: int,
    *,
    seed: int = 0,
    phrase_seeds: int = 5,
    passage_node_weight: float = 0.05,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """HippoRAG-2-style reset vectors [N, Q] (hipporag_semantics.md §3.3.6).

    Per query: two "gold" passages; ``phrase_seeds`` phrases drawn from their mentions get weight
    s_f / |passages(e)| with a fact score s_f ~ U(0.5, 1); every passage gets
    ``passage_node_weight``·minmax(dense score), the dense score being Gaussian noise plus a boost
    on the gold passages. The phrase part is sparse (≤ 5 rows), the passage part dense.

    Returns:
        [N, Q] non-negative, each column with a positive sum.
    """
    if num_queries < 1:
        raise ValueError("num_queries must be >= 1")
    rng = np.random.default_rng(seed)
    p, q, v = graph.num_passages, num_queries, graph.num_phrases
    gold = rng.integers(0, p, size=(q, 2))  # [Q, 2]
    k = graph.mentions.shape[1]
    slot = rng.integers(0, k, size=(q, phrase_seeds))
    which = rng.integers(0, 2, size=(q, phrase_seeds))
    phrases = graph.mentions[gold[np.arange(q)[:, None], which], slot]  # [Q, S] phrase node ids
    fact_score = rng.uniform(0.5, 1.0, size=(q, phrase_seeds))
    weight = fact_score / np.maximum(graph.phrase_passage_count[phrases], 1)
    reset = torch.zeros(graph.num_nodes, q, dtype=dtype)
    cols = torch.from_numpy(np.repeat(np.arange(q), phrase_seeds))
    # index_put with accumulate: a phrase drawn twice for one query sums, like repeated facts.
    reset.index_put_(
        (torch.from_numpy(phrases.ravel()), cols),
        torch.from_numpy(weight.ravel()).to(dtype),
        accumulate=True,
    )
    dense = rng.standard_normal((q, p)).astype(np.float64)  # [Q, P]
    dense[np.arange(q)[:, None], gold] += 3.0
    lo = dense.min(axis=1, keepdims=True)
    span = dense.max(axis=1, keepdims=True) - lo
    scaled = np.divide(dense - lo, span, out=np.ones_like(dense), where=span > 0)
    reset[v:] = torch.from_numpy(passage_node_weight * scaled.T).to(dtype)
    return reset
