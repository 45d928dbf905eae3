"""hippo_gpu.ppr.basis_update against a float64 dense oracle: the updated basis of a changed graph
(nodes added and removed, edges and weights changed, several changes folded) is within its
certified bounds of the exact Z' = L'[T', P'] E', z1' = L'[T', P'] 1 and h' = L'ᵀ 1_{T'}, and its h
is an upper bound of the true one within h_err."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hippo_gpu.ppr.basis import solve_basis
from hippo_gpu.ppr.basis_update import changed_nodes, compose_node_maps, update_basis

D = 0.5
DIM = 8


class Graph:
    """A graph over named nodes: phrases ("p…") then passages ("t…") in row order, symmetric
    weighted edges, a unit vector per passage."""

    def __init__(self, phrases: list[str], passages: list[str], edges: dict, vec: dict):
        self.phrases, self.passages = sorted(phrases), list(passages)
        self.edges, self.vec = dict(edges), dict(vec)

    @property
    def names(self) -> list[str]:
        return self.phrases + self.passages

    def adjacency(self) -> torch.Tensor:
        row = {n: i for i, n in enumerate(self.names)}
        n = len(row)
        dense = torch.zeros(n, n, dtype=torch.float32)
        for (a, b), w in self.edges.items():
            if a in row and b in row:
                dense[row[a], row[b]] = dense[row[b], row[a]] = w
        return dense.to_sparse_csr()

    def passage_nodes(self) -> torch.Tensor:
        return torch.arange(len(self.phrases), len(self.names), dtype=torch.int64)

    def passage_emb(self) -> torch.Tensor:
        return torch.stack([self.vec[t] for t in self.passages])

    def node_map_to(self, other: Graph) -> np.ndarray:
        row = {n: i for i, n in enumerate(other.names)}
        return np.array([row.get(n, -1) for n in self.names], dtype=np.int64)


def random_graph(rng: np.random.Generator, phrases: int, passages: int) -> Graph:
    ph = [f"p{i:03d}" for i in range(phrases)]
    ts = [f"t{i:03d}" for i in range(passages)]
    edges = {}
    for t in ts:
        for p in rng.choice(ph, size=int(rng.integers(1, 5)), replace=False):
            edges[(t, str(p))] = 1.0
    for _ in range(phrases // 2):  # synonym-like phrase edges, weights in (0.5, 1)
        a, b = rng.choice(ph, size=2, replace=False)
        edges[(str(a), str(b))] = float(np.float32(rng.uniform(0.5, 1.0)))
    vec = {t: _unit(rng) for t in ts}
    return Graph(ph, ts, edges, vec)


def _unit(rng: np.random.Generator) -> torch.Tensor:
    v = torch.from_numpy(rng.normal(size=DIM)).float()
    return v / v.norm()


def changed(rng: np.random.Generator, g: Graph, kind: str) -> Graph:
    edges, vec = dict(g.edges), dict(g.vec)
    phrases, passages = list(g.phrases), list(g.passages)
    if kind in ("insert", "both"):
        t = f"t{len(passages) + 100:03d}"
        fresh = f"p{len(phrases) + 500:03d}"  # a phrase the graph lacks, and old ones
        phrases.append(fresh)
        passages.append(t)
        vec[t] = _unit(rng)
        for p in [fresh, *rng.choice(g.phrases, size=2, replace=False)]:
            edges[(t, str(p))] = 1.0
        edges[(fresh, str(rng.choice(g.phrases)))] = 0.75
    if kind in ("delete", "both"):
        gone = passages.pop(int(rng.integers(len(passages))))
        vec.pop(gone)
        edges = {e: w for e, w in edges.items() if gone not in e}
    if kind == "reweight":
        for e in list(edges)[:3]:
            edges[e] = float(np.float32(edges[e] * 0.5))
    return Graph(phrases, passages, edges, vec)


def oracle(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact (Z, z1, h) in float64 by a dense inverse."""
    a = g.adjacency().to_dense().double().numpy()
    deg = a.sum(axis=0)
    m = np.where(deg > 0, a / np.where(deg > 0, deg, 1.0), 0.0)
    n = len(a)
    lmat = (1 - D) * np.linalg.inv(np.eye(n) - D * m)
    t = g.passage_nodes().numpy()
    lt = lmat[np.ix_(t, t)]
    emb = g.passage_emb().double().numpy()
    return lt @ emb, lt @ np.ones(len(t)), lmat[t].sum(axis=0)


def assert_certified(basis, g: Graph) -> None:
    z, z1, h = oracle(g)
    err = np.abs(basis.z.numpy() - z).sum(axis=0)
    assert np.all(err <= basis.col_bound.numpy()), (err, basis.col_bound)
    assert np.abs(basis.z1.numpy() - z1).sum() <= basis.z1_bound
    hb = basis.h.numpy()
    assert np.all(hb >= h) and np.all(hb - h <= basis.h_err), (hb - h).max()


@pytest.mark.parametrize("kind", ["insert", "delete", "both", "reweight"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_update_is_certified_against_the_exact_basis(kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = random_graph(rng, phrases=40, passages=30)
    basis = solve_basis(g.adjacency(), g.passage_nodes(), g.passage_emb(), damping=D)
    assert_certified(basis, g)
    new = changed(rng, g, kind)
    up = update_basis(basis, g.adjacency(), g.passage_nodes(), g.passage_emb(),
                      new.adjacency(), new.passage_nodes(), new.passage_emb(),
                      g.node_map_to(new))
    assert_certified(up.basis, new)
    assert up.basis.updates == 1 and up.report.added_bound_ratio <= 1.0
    # the update added at most its budget to each column's bound: it stays near a fresh solve's
    fresh = solve_basis(new.adjacency(), new.passage_nodes(), new.passage_emb(), damping=D)
    assert np.all(up.basis.col_bound.numpy() <= basis.col_bound.numpy().max()
                  + 2 * fresh.col_bound.numpy().max())


@pytest.mark.parametrize("chunk", [16, 3])
def test_updates_chain_and_fold(chunk: int, monkeypatch) -> None:
    """Two changes in a row, updated one after the other or folded into one update from the
    first graph (composed node maps), are both certified against the exact basis (also when the
    columns are solved a few per call)."""
    import hippo_gpu.ppr.basis_update as module

    monkeypatch.setattr(module, "CHUNK", chunk)
    rng = np.random.default_rng(7)
    g0 = random_graph(rng, phrases=50, passages=40)
    g1 = changed(rng, g0, "insert")
    g2 = changed(rng, g1, "delete")
    b0 = solve_basis(g0.adjacency(), g0.passage_nodes(), g0.passage_emb(), damping=D)
    args = {g: (g.adjacency(), g.passage_nodes(), g.passage_emb()) for g in (g0, g1, g2)}
    b1 = update_basis(b0, *args[g0], *args[g1], g0.node_map_to(g1)).basis
    b2 = update_basis(b1, *args[g1], *args[g2], g1.node_map_to(g2)).basis
    assert b2.updates == 2
    assert_certified(b2, g2)
    folded = compose_node_maps(g0.node_map_to(g1), g1.node_map_to(g2))
    assert np.array_equal(folded, g0.node_map_to(g2))
    b02 = update_basis(b0, *args[g0], *args[g2], folded).basis
    assert b02.updates == 1
    assert_certified(b02, g2)


def test_changed_nodes_are_exactly_the_nodes_whose_edges_differ() -> None:
    rng = np.random.default_rng(3)
    g = random_graph(rng, phrases=30, passages=20)
    same = g.node_map_to(g)
    assert changed_nodes(g.adjacency(), g.adjacency(), same).size == 0
    a, b = next(iter(g.edges))
    edges = dict(g.edges)
    edges[(a, b)] = float(np.float32(edges[(a, b)] * 0.5))
    h = Graph(g.phrases, g.passages, edges, g.vec)
    row = {n: i for i, n in enumerate(h.names)}
    got = changed_nodes(g.adjacency(), h.adjacency(), same)
    assert got.tolist() == sorted([row[a], row[b]])
    # a removed node is changed (a row after the new graph's), and so are its neighbours
    new = changed(rng, g, "delete")
    gone = [n for n in g.names if n not in set(new.names)]
    got = set(changed_nodes(g.adjacency(), new.adjacency(), g.node_map_to(new)).tolist())
    assert len(new.names) + len(gone) - 1 in got


def test_an_update_refuses_a_basis_without_h_err() -> None:
    from dataclasses import replace

    rng = np.random.default_rng(4)
    g = random_graph(rng, phrases=20, passages=10)
    basis = replace(solve_basis(g.adjacency(), g.passage_nodes(), g.passage_emb(), damping=D),
                    h_err=float("inf"))
    new = changed(rng, g, "insert")
    with pytest.raises(ValueError, match="h_err"):
        update_basis(basis, g.adjacency(), g.passage_nodes(), g.passage_emb(),
                     new.adjacency(), new.passage_nodes(), new.passage_emb(),
                     g.node_map_to(new))
