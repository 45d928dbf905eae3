"""Float64 oracles for the tests: a dense solve of the PPR fixed point and igraph prpack.

Nothing here imports hippo_gpu, so a bug in the package cannot leak into its own reference.
"""

from __future__ import annotations

import numpy as np
import torch


def random_graph(
    n: int,
    rng: np.random.Generator,
    *,
    avg_degree: float = 4.0,
    isolated_fraction: float = 0.1,
    components: int = 3,
    duplicate_fraction: float = 0.2,
) -> tuple[np.ndarray, np.ndarray]:
    """A random undirected multigraph with awkward features, as an edge list.

    Nodes are split into ``components`` blocks with edges only inside a block (disconnected parts);
    ``isolated_fraction`` of the nodes get no edge (dangling); ``duplicate_fraction`` of the edges
    are repeated with a fresh weight (a multigraph, as HippoRAG builds); weights are log-uniform
    over 1e-3 .. 1e3. No self-loops.

    Returns:
        (edges [E, 2] int64, weights [E] float64).
    """
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    nodes = rng.permutation(n)
    active = nodes[: max(2, int(round(n * (1.0 - isolated_fraction))))]
    blocks = np.array_split(active, min(components, max(1, active.size // 2)))
    edges = []
    for block in blocks:
        if block.size < 2:
            continue
        m = max(1, int(block.size * avg_degree / 2))
        u = rng.choice(block, m)
        v = rng.choice(block, m)
        keep = u != v
        edges.append(np.stack([u[keep], v[keep]], axis=1))
    e = np.concatenate(edges) if edges else np.zeros((0, 2), dtype=np.int64)
    dup = e[rng.random(len(e)) < duplicate_fraction]
    e = np.concatenate([e, dup[:, ::-1]]).astype(np.int64)
    weights = 10.0 ** rng.uniform(-3, 3, len(e))
    return e, weights


def edges_to_csr(edges: np.ndarray, weights: np.ndarray, n: int) -> torch.Tensor:
    """Symmetric float64 CSR [N, N] with A[u, v] = A[v, u] = sum of the weights of edges {u, v}."""
    dense = dense_adjacency(edges, weights, n)
    return torch.from_numpy(dense).to_sparse_csr()


def dense_adjacency(edges: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Dense symmetric [N, N] float64 adjacency of an undirected multigraph edge list."""
    a = np.zeros((n, n))
    np.add.at(a, (edges[:, 0], edges[:, 1]), weights)
    np.add.at(a, (edges[:, 1], edges[:, 0]), weights)
    return a


def dense_ppr(adjacency: np.ndarray, reset: np.ndarray, damping: float = 0.5) -> np.ndarray:
    """PPR by a dense linear solve of the prpack fixed point, one column at a time.

    With r̂ = r / 1ᵀr, D = diag(A 1), P = D⁻¹A (zero rows for dangling nodes) and δ the indicator
    of dangling nodes, x solves

        x = (1 − d) r̂ + d Pᵀ x + d (δᵀ x) r̂   ⇔   (I − d Pᵀ − d r̂ δᵀ) x = (1 − d) r̂.

    Args:
        adjacency: [N, N] symmetric, non-negative.
        reset: [N, Q] non-negative, columns with positive sum.

    Returns:
        [N, Q] float64.
    """
    a = np.asarray(adjacency, dtype=np.float64)
    n = a.shape[0]
    degree = a.sum(axis=1)
    dangling = (degree <= 0).astype(np.float64)
    p = np.divide(a, degree[:, None], out=np.zeros_like(a), where=degree[:, None] > 0)
    base = np.eye(n) - damping * p.T
    out = np.empty((n, reset.shape[1]))
    for q in range(reset.shape[1]):
        r_hat = reset[:, q] / reset[:, q].sum()
        system = base - damping * np.outer(r_hat, dangling)
        out[:, q] = np.linalg.solve(system, (1.0 - damping) * r_hat)
    return out


def igraph_ppr(
    edges: np.ndarray, weights: np.ndarray, n: int, reset: np.ndarray, damping: float = 0.5
) -> np.ndarray:
    """igraph prpack, called per column exactly as official HippoRAG calls it. Returns [N, Q]."""
    import igraph as ig

    graph = ig.Graph(n=n, edges=[tuple(map(int, e)) for e in edges], directed=False)
    graph.es["weight"] = [float(w) for w in weights]
    out = np.empty((n, reset.shape[1]))
    for q in range(reset.shape[1]):
        out[:, q] = graph.personalized_pagerank(
            vertices=range(n),
            damping=damping,
            directed=False,
            weights="weight",
            reset=reset[:, q].tolist(),
            implementation="prpack",
        )
    return out


def random_reset(n: int, q: int, rng: np.random.Generator, *, density: float = 0.05) -> np.ndarray:
    """[N, Q] non-negative reset weights: a few sparse seeds per column plus a small dense part."""
    reset = np.zeros((n, q))
    for j in range(q):
        k = max(1, int(n * density))
        idx = rng.choice(n, size=min(k, n), replace=False)
        reset[idx, j] = rng.random(idx.size) + 1e-3
    if q > 1:  # one column with weight on every node, like HippoRAG 2's passage part
        reset[:, -1] += 0.05 * rng.random(n)
    return reset
