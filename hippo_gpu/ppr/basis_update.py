"""The passage basis of a changed graph from an earlier graph's basis: a certified low-rank update.

A commit changes a few nodes' edges; the basis (hippo_gpu.ppr.basis: Z = L[T, P] E_P,
z1 = L[T, P] 1_P and the passage mass h) depends on the whole graph, so a full solve costs D + 1
PPR columns over every edge. This module brings a basis of the *anchor* graph A (the last
version that has one) to a later graph A' (one commit or several folded, any insertions and
deletions) with one certified PPR column per changed node, all on the anchor graph, and small
dense algebra.

**The node space.** Rows of the new version keep their numbers; an anchor node the change removed
gets a row after them. So both graphs live on U = N' + (removed) nodes: a node new to A' is
isolated in A, a removed node is isolated in A'. Write A = I − dM and A' = I − dM' (the
operators of iteration.py eq. 2: M = A D⁻¹, dangling columns zero) — from here on A, A' name
these operators and the adjacencies are adj, adj' — so that L = (1 − d)A⁻¹. V is the set of
nodes whose adjacency column differs (by exact comparison of the two CSR rows; a removed or new
node is in V); M' − M is zero outside the columns V.

**Woodbury (U1).** With m_u = (M' − M) e_u, W = [m_u]_{u∈V} and E_V = [e_u]_{u∈V},
A' = A − d W E_Vᵀ, and for any seed matrix B'

    A'⁻¹ B' = A⁻¹ B' + d G v,   G = A⁻¹ W,   C v = X,   C = I − d E_Vᵀ G,   X = E_Vᵀ A⁻¹ B'  (U1)

(from A' x = B' ⇔ A x = B' + d W (E_Vᵀ x): x = A⁻¹B' + d G v with v = E_Vᵀ x, and v solves
C v = X). C is [|V|, |V|].

**Every column from one solve per changed node (U2).** Let a_u = A⁻¹ e_u (a_u = e_u for a node
isolated in A: fresh or isolated anchor nodes need no solve). Since A⁻¹ M = (A⁻¹ − I)/d and, with
Δ_u = adj'[:, u] − adj[:, u] (whose support lies in V: adj is symmetric, so a changed entry
changes both its row and its column), M' e_u = (D_u/D'_u) M e_u + Δ_u/D'_u,

    G_u = c_u (a_u − e_u)/d + Σ_{w∈V} (Δ_u[w]/D'_u) a_w,   c_u = D_u/D'_u − 1           (U2)

(c_u = −1 and no Δ term when D'_u = 0: M' e_u = 0). So G = A_V K − E_V diag(c/d) for the [|V|,
|V|] matrix K (K[w, u] = Δ_u[w]/D'_u, plus c_u/d on the diagonal) and A_V = [a_w]. The one PPR
solve per node of V that is not isolated in A is the whole PPR cost of an update.

**The seeds.** The update carries D + 2 seed columns: the embedding columns E_j (signed; Z is
linear in them), 1_T and the degree column D_T. B is the anchor's (on T), B' the new one (on T'),
ΔB = B' − B is supported in V ∪ (fresh passages) ⊂ V (a kept passage keeps its vector; a passage
whose degree changed is in V). Then A⁻¹B' = A⁻¹B + Σ_{r∈V} ΔB[r] a_r, where A⁻¹B is known from the
anchor basis: Z/(1 − d) and z1/(1 − d) at the anchor's passage rows, and (L D_T)_v = D_v h_v at
every row, h = Lᵀ 1_T being the passage mass the anchor stores (by the graph's symmetry
Lᵀ = D⁻¹ L D off the isolated nodes, basis.py). X needs A⁻¹B at the rows V, which the basis does
not hold; the same symmetry gives it from the solved columns:

    (A⁻¹B)[u] = D_u Σ_{w∈T} a_u[w] B[w] / D_w   (u not isolated in A),   B[u] if isolated.   (U3)

The outputs are Z' = (1 − d)(A'⁻¹E')[T'], z1' = (1 − d)(A'⁻¹1_{T'})[T'] and h'_v = (1 − d)
(A'⁻¹D'_{T'})[v]/D'_v (h'_v = (1 − d)[v ∈ T'] for an isolated v).

**The certificate (U4).** Let α_w be the L1 bound of â_w (the solver's certified bound over all
rows divided by 1 − d; 0 for an exact e_w), ω_u ≥ ‖m_u‖₁ (computed from the two columns), and
g_u = Σ_w |K[w, u]| α_w the L1 bound of Ĝ_u. For a column c of B':

  * X̂ is off by δX[u] ≤ D_u μ_c α_u + Σ_r |ΔB[r, c]| α_r (pointwise ≤ L1), μ_c = max_{w∈T}
    |B[w, c]|/D_w.
  * The exact v = C⁻¹X and the computed v̂ satisfy v − v̂ = C⁻¹ρ with ρ = (X − X̂) + (X̂ − Ĉv̂) +
    (Ĉ − C)v̂, so |ρ_u| ≤ δX[u] + |X̂ − Ĉv̂|_u + d Σ_w g_w |v̂_w|.
  * C⁻¹ = I + d E_Vᵀ A'⁻¹ W (Woodbury's identity; multiply out and use A'⁻¹ − A⁻¹ =
    A⁻¹(dWE_Vᵀ)A'⁻¹). With Ω = diag(ω), column w of Ω C⁻¹ Ω⁻¹ sums in absolute value to at most
    1 + d ω_max ‖A'⁻¹ m_w‖₁/ω_w ≤ 1 + d ω_max/(1 − d) =: κ, as ‖A'⁻¹‖₁ ≤ 1/(1 − d) (M' has
    columns summing to 1 or 0). So Σ_u ω_u |v_u − v̂_u| ≤ κ Σ_u ω_u |ρ_u| =: Wδ.
    (The weights matter: a hub's v_u is large, its m_u small; Σ ω|δv| keeps the product at the
    size of the solve tolerance instead of multiplying it by the hub's degree.)
  * ‖G_w‖₁ ≤ ω_w/(1 − d), so the correction d G v is off by at most
    d (Wδ/(1 − d) + Σ_w g_w |v̂_w| + max_w(g_w/ω_w) Wδ) in L1.

Adding the anchor's own bound (col_bound/(1 − d), z1_bound/(1 − d); for h pointwise D_v h_err/(1 −
d), h_err the max-norm distance of the stored h from the true one) and Σ_r |ΔB[r, c]| α_r gives the
L1 bound of (A'⁻¹B')[T'] for each column; times 1 − d, of Z'_j and z1'. h' is certified pointwise
(each L1 term bounds every entry) and stored rounded up by its bound, an upper bound of the new h
as the push needs (push.py). The float64 rounding of each computed quantity is added as Higham's
γ_k times the absolute sum of its terms (k the longest sum: |T| + max degree for X, 2|V| + 4 for
an output entry, |V| + 2 for the residual, the degree sums for K).

The update's bound adds to the anchor's: after k updates a column carries the anchor solve's bound
plus k update bounds. Each update solves its columns at ``tol`` (relative to each column's mass 1)
and checks that its added bound is within ``budget`` × the fresh solve's own allowance for the
column (tol_basis · σ'_c, σ'_c the mass of the non-negative column E'_j + 1); if not, it solves
again at a tolerance scaled down by the excess (once) and otherwise raises.

Cost: one float64 PPR column over the anchor graph per non-isolated changed node (4-6 for a
single-passage insert at 100k passages), an exact O(nnz) comparison of the two graphs, and dense
work of O(N |V| + |T| |V| D). Memory: the solved columns, 8·N·|V_solved| bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.ppr.basis import PassageBasis
from hippo_gpu.ppr.iteration import ConvergenceError
from hippo_gpu.ppr.rounding import certifiable_floor
from hippo_gpu.ppr.solver import PPRSolver

__all__ = ["BasisUpdate", "UpdateReport", "anchor_solver", "changed_nodes", "compose_node_maps",
           "update_basis"]

U64 = 2.0 ** -53
UPDATE_TOL = 1e-7  # the loosest per-column L1 tol of the update's solves (mass 1 each); the
# budget usually asks for less (_tol_for)
UPDATE_BUDGET = 1.0  # an update may add this times a fresh solve's allowance to each column


def _gamma(k: int) -> float:
    ku = k * U64
    return ku / (1.0 - ku)


@dataclass(frozen=True)
class UpdateReport:
    """What an update did: the changed nodes, the columns it solved and what its bound used.

    Attributes:
        changed: |V|, nodes whose adjacency column changed (new and removed nodes included).
        solved: PPR columns solved on the anchor graph.
        steps: the most sparse products of a column.
        tol: the per-column tol of the last solve.
        added_bound_ratio: max over columns of the bound the update added over the fresh
            solve's allowance (tol_basis · σ'_c); <= budget.
        seconds: wall time.
    """

    changed: int
    solved: int
    steps: int
    tol: float
    added_bound_ratio: float
    seconds: float


@dataclass(frozen=True)
class BasisUpdate:
    """The updated basis and the report of the update that made it."""

    basis: PassageBasis
    report: UpdateReport


def compose_node_maps(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The node map of two changes in a row: old row -> row after both, −1 if removed by either.

    Args:
        first: [N] row after the first change of each row before it (−1: removed).
        second: [N1] the same for the second change.
    """
    first = np.asarray(first, dtype=np.int64)
    out = np.full(len(first), -1, dtype=np.int64)
    alive = first >= 0
    out[alive] = np.asarray(second, dtype=np.int64)[first[alive]]
    return out


def _degrees(adjacency: Tensor) -> np.ndarray:
    """Weighted degree of each row, float64, summed as build_transition sums it."""
    crow = adjacency.crow_indices()
    values = adjacency.values().to(torch.float64)
    n = adjacency.shape[0]
    rows = torch.repeat_interleave(torch.arange(n), crow[1:] - crow[:-1])
    return torch.zeros(n, dtype=torch.float64).index_add_(0, rows, values).numpy()


def _csr(adjacency: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (adjacency.crow_indices().numpy().astype(np.int64, copy=False),
            adjacency.col_indices().numpy().astype(np.int64, copy=False),
            adjacency.values().numpy().astype(np.float64, copy=False))


def _union_ids(node_to_new: np.ndarray, n_new: int) -> np.ndarray:
    """The U-space row of each anchor node (module docstring: removed ones after N')."""
    u_of = np.asarray(node_to_new, dtype=np.int64).copy()
    gone = np.nonzero(u_of < 0)[0]
    u_of[gone] = n_new + np.arange(len(gone), dtype=np.int64)
    return u_of


def changed_nodes(adjacency: Tensor, new_adjacency: Tensor, node_to_new: np.ndarray) -> np.ndarray:
    """V of the module docstring, as sorted U-space rows: nodes whose adjacency column differs
    (entries compared exactly after renumbering), removed nodes and new nodes.

    Args:
        adjacency: [N, N] the anchor graph (CSR). new_adjacency: [N', N'] the new graph.
        node_to_new: [N] new row of each anchor node, −1 if removed.
    """
    n, n_new = adjacency.shape[0], new_adjacency.shape[0]
    node_to_new = np.asarray(node_to_new, dtype=np.int64)
    if node_to_new.shape != (n,):
        raise ValueError(f"node_to_new must have one entry per anchor node ({n})")
    u_of = _union_ids(node_to_new, n_new)
    crow_a, col_a, val_a = _csr(adjacency)
    crow_b, col_b, val_b = _csr(new_adjacency)
    alive = np.nonzero(node_to_new >= 0)[0]
    at = node_to_new[alive]
    len_a, len_b = np.diff(crow_a)[alive], np.diff(crow_b)[at]
    same = len_a == len_b
    cand, cand_at, lengths = alive[same], at[same], len_a[same]
    total = int(lengths.sum())
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos_a = np.repeat(crow_a[cand], lengths) + offsets
    pos_b = np.repeat(crow_b[cand_at], lengths) + offsets
    differs = (u_of[col_a[pos_a]] != col_b[pos_b]) | (val_a[pos_a] != val_b[pos_b])
    bad = np.zeros(len(cand), dtype=bool)
    bad[np.repeat(np.arange(len(cand)), lengths)[differs]] = True
    fresh = np.ones(n_new, dtype=bool)
    fresh[at] = False
    changed = np.concatenate([at[~same], cand_at[bad], np.nonzero(fresh)[0],
                              n_new + np.arange(n - len(alive), dtype=np.int64)])
    return np.unique(changed)


def anchor_solver(adjacency: Tensor, damping: float) -> PPRSolver:
    """The float64 solver of the anchor graph an update runs its columns on (all rows returned;
    built once per anchor and reusable for every update from it)."""
    return PPRSolver(adjacency, damping=damping, target_nodes=None, dtype=torch.float64,
                     method="chebyshev", tol=UPDATE_TOL, reorder=False)


def _column_entries(crow: np.ndarray, col: np.ndarray, val: np.ndarray, row: int,
                    ids: np.ndarray | None) -> dict[int, float]:
    s, e = int(crow[row]), int(crow[row + 1])
    cols = col[s:e] if ids is None else ids[col[s:e]]
    return dict(zip(cols.tolist(), val[s:e].tolist(), strict=True))


def update_basis(
    basis: PassageBasis,
    adjacency: Tensor,
    passage_nodes: Tensor,
    passage_emb: Tensor,
    new_adjacency: Tensor,
    new_passage_nodes: Tensor,
    new_passage_emb: Tensor,
    node_to_new: np.ndarray,
    *,
    solver: PPRSolver | None = None,
    tol: float = UPDATE_TOL,
    budget: float = UPDATE_BUDGET,
    changed: np.ndarray | None = None,
) -> BasisUpdate:
    """The basis of the new graph from ``basis`` of the anchor graph (module docstring, U1-U4).

    Args:
        basis: the anchor's basis (with its h_err).
        adjacency, passage_nodes, passage_emb: the anchor graph [N, N], its passage rows [P] and
            passage vectors [P, D].
        new_adjacency, new_passage_nodes, new_passage_emb: the same of the new version.
        node_to_new: [N] new row of each anchor node, −1 if removed (compose_node_maps folds
            several commits).
        solver: :func:`anchor_solver` of ``adjacency`` (built here when None).
        tol: the loosest per-column L1 tol of the solves.
        budget: the most an update may add to a column's bound, in units of a fresh solve's
            allowance for it.
        changed: :func:`changed_nodes` of the two graphs, if the caller has it.

    Raises:
        ValueError: the anchor basis has no h_err (stored before updates existed).
        ConvergenceError: a column could not be certified, or the added bound stays over the
            budget after one tighter solve (a large change on a small graph: the caller
            solves the basis instead).
    """
    t0 = time.perf_counter()
    if not math.isfinite(basis.h_err):
        raise ValueError("the anchor basis records no h_err (solved before updates existed): "
                         "solve it again")
    node_to_new = np.asarray(node_to_new, dtype=np.int64)
    if changed is None:
        changed = changed_nodes(adjacency, new_adjacency, node_to_new)
    ch = _change_of(basis, adjacency, passage_nodes, passage_emb, new_adjacency,
                    new_passage_nodes, new_passage_emb, node_to_new, changed)
    _transition_change(ch, adjacency, new_adjacency)
    solve_rows = ch.anchor_of[ch.v_nodes[ch.solve_idx]]
    if solver is None and len(solve_rows):
        solver = anchor_solver(adjacency, ch.d)
    floor = 8.0 * certifiable_floor(torch.float64, max(adjacency.shape[0], 1))  # x8 the lowest
    tol_used = max(min(tol, _tol_for(ch, budget)), floor)
    for attempt in range(2):
        steps = _solve(ch, solver, solve_rows, tol_used, adjacency.shape[0])
        result, need = _assemble(ch)
        ratio = float((need / ch.allow).max()) if len(need) else 0.0
        if ratio <= budget:
            break
        if attempt == 1 or tol_used <= floor:
            raise ConvergenceError(f"basis update bound {ratio:.3g} x the allowance exceeds the "
                                   f"budget {budget} after a solve at tol {tol_used:.3g}",
                                   [], [])
        tol_used = max(tol_used * budget / ratio / 4.0, floor)
    ch.a_anchor = np.zeros((0, 0))  # the [N, k] columns go before the basis is kept
    z, z1, col_bound, z1_bound, h, h_err = result
    seconds = time.perf_counter() - t0
    new_basis = PassageBasis(z=z, z1=z1, h=h, col_bound=col_bound, z1_bound=z1_bound,
                             z_norm1=z.abs().sum(dim=0), damping=ch.d, tol=basis.tol,
                             steps=steps, seconds=seconds, h_err=h_err,
                             updates=basis.updates + 1)
    report = UpdateReport(changed=len(ch.v_nodes), solved=len(solve_rows), steps=steps,
                          tol=tol_used, added_bound_ratio=ratio, seconds=seconds)
    return BasisUpdate(new_basis, report)


@dataclass
class _Change:
    """One update's arrays (module docstring's names; "U rows" are the union node space)."""

    basis: PassageBasis
    d: float
    v_nodes: np.ndarray  # [k_v] V, sorted U rows
    u_of: np.ndarray  # [N] U row of each anchor node
    anchor_of: np.ndarray  # [U] anchor row of each U row, −1 for a new node
    n_new: int  # N': the new version's rows are U rows 0..N'−1
    deg_a: np.ndarray  # [U] D_u (0 for a new node)
    deg_n: np.ndarray  # [U] D'_u (0 for a removed node)
    t_a: np.ndarray  # [P] anchor passages in U rows
    t_n: np.ndarray  # [P'] new passages (U rows)
    b_a: np.ndarray  # [P, D + 2] anchor seeds B: E, 1, degree
    delta_b: np.ndarray  # [k_v, D + 2] ΔB at the rows V
    allow: np.ndarray  # [D + 1] a fresh solve's allowance tol·σ'_c per basis column
    solve_idx: np.ndarray  # positions in V of the nodes not isolated in A (solved)
    kmat: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [k_v, k_v] K (U2)
    cvec: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [k_v] c_u/d of G's e_u part
    omega: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [k_v] ω_u >= ||m_u||_1
    scaled: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # m_u = 0 (rounding)
    gam_deg: float = 0.0  # γ of the degree sums
    a_anchor: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [N, k_s] a_u
    alpha: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [k_v] L1 bound of â_u

    @property
    def identity(self) -> np.ndarray:
        """[k_v] a_w = e_w exactly (isolated in A: not solved)."""
        out = np.ones(len(self.v_nodes), dtype=bool)
        out[self.solve_idx] = False
        return out


def _change_of(basis: PassageBasis, adjacency: Tensor, passage_nodes: Tensor,
               passage_emb: Tensor, new_adjacency: Tensor, new_passage_nodes: Tensor,
               new_passage_emb: Tensor, node_to_new: np.ndarray, v_nodes: np.ndarray) -> _Change:
    """The node space, degrees and seeds of an update (module docstring: "The seeds")."""
    n, n_new = adjacency.shape[0], new_adjacency.shape[0]
    u_of = _union_ids(node_to_new, n_new)
    n_u = n_new + int((node_to_new < 0).sum())
    anchor_of = np.full(n_u, -1, dtype=np.int64)
    anchor_of[u_of] = np.arange(n)
    deg_a, deg_n = np.zeros(n_u), np.zeros(n_u)
    deg_a[u_of] = _degrees(adjacency)
    deg_n[:n_new] = _degrees(new_adjacency)
    t_a = u_of[passage_nodes.numpy().astype(np.int64)]
    t_n = new_passage_nodes.numpy().astype(np.int64)
    emb_a = passage_emb.detach().to("cpu", torch.float64).numpy()
    emb_n = new_passage_emb.detach().to("cpu", torch.float64).numpy()
    b_a = np.concatenate([emb_a, np.ones((len(t_a), 1)), deg_a[t_a, None]], axis=1)
    b_n = np.concatenate([emb_n, np.ones((len(t_n), 1)), deg_n[t_n, None]], axis=1)
    delta_b = np.zeros((len(v_nodes), b_a.shape[1]))
    for rows, vals, sign in ((t_n, b_n, 1.0), (t_a, b_a, -1.0)):
        in_v = np.isin(rows, v_nodes)
        np.add.at(delta_b, np.searchsorted(v_nodes, rows[in_v]), sign * vals[in_v])
    # each column's allowance in a fresh solve: tol · σ'_c (σ'_j = Σ (E'_j + 1), σ'_1 = P')
    allow = basis.tol * np.maximum(np.concatenate([(emb_n + 1.0).sum(axis=0), [len(t_n)]]), 1.0)
    return _Change(basis=basis, d=float(basis.damping), v_nodes=v_nodes, u_of=u_of,
                   anchor_of=anchor_of, n_new=n_new, deg_a=deg_a, deg_n=deg_n, t_a=t_a,
                   t_n=t_n, b_a=b_a, delta_b=delta_b, allow=allow,
                   solve_idx=np.nonzero(deg_a[v_nodes] > 0)[0])


def _transition_change(ch: _Change, adjacency: Tensor, new_adjacency: Tensor) -> None:
    """K, c/d, ω and the rescaled columns of U2/U4, from each changed node's two columns."""
    crow_a, col_a, val_a = _csr(adjacency)
    crow_b, col_b, val_b = _csr(new_adjacency)
    k_v, d = len(ch.v_nodes), ch.d
    pos_v = {int(u): i for i, u in enumerate(ch.v_nodes.tolist())}
    kmat, omega = np.zeros((k_v, k_v)), np.zeros(k_v)
    scaled = np.zeros(k_v, dtype=bool)
    deg_max = 1
    for i, u in enumerate(ch.v_nodes.tolist()):
        ai = int(ch.anchor_of[u])
        old = _column_entries(crow_a, col_a, val_a, ai, ch.u_of) if ai >= 0 else {}
        new = _column_entries(crow_b, col_b, val_b, u, None) if u < ch.n_new else {}
        deg_max = max(deg_max, len(old), len(new))
        du, dn = ch.deg_a[u], ch.deg_n[u]
        omega[i] = sum(abs((new.get(w, 0.0) / dn if dn > 0 else 0.0)
                           - (old.get(w, 0.0) / du if du > 0 else 0.0))
                       for w in old.keys() | new.keys())
        if omega[i] == 0.0:  # a rescaled (or still empty) column: m_u = 0 up to D's rounding,
            scaled[i] = du > 0  # so G_u is taken as 0 (its error: U4's g_u = ω_u/(1 − d))
            continue
        if dn > 0:
            if du > 0:
                kmat[i, i] += (du / dn - 1.0) / d
            for w in old.keys() | new.keys():
                delta = new.get(w, 0.0) - old.get(w, 0.0)
                if delta != 0.0:
                    j = pos_v.get(w)
                    if j is None:
                        raise RuntimeError("an adjacency entry changed outside the changed set")
                    kmat[j, i] += delta / dn
        elif du > 0:
            kmat[i, i] -= 1.0 / d
    ch.gam_deg = _gamma(deg_max + 4)
    # (cancelling quotients; a rescaled column's m_u is at most D's rounding, 2γ per entry)
    ch.omega = omega * (1.0 + ch.gam_deg) + 4.0 * ch.gam_deg * ((omega > 0) | scaled)
    ch.kmat, ch.scaled = kmat, scaled
    ch.cvec = np.where(ch.deg_a[ch.v_nodes] > 0, np.diag(kmat), 0.0)  # a_u = e_u: no c term


def _solve(ch: _Change, solver: PPRSolver | None, rows: np.ndarray, tol: float, n: int) -> int:
    """The columns a_u (U2) of the solved nodes into `ch` with their bounds α; the most steps."""
    alpha = np.zeros(len(ch.v_nodes))
    if not len(rows):
        ch.a_anchor, ch.alpha = np.zeros((n, 0)), alpha
        return 0
    assert solver is not None
    ch.a_anchor, bound, steps = _solve_columns(solver, rows, tol)
    ch.a_anchor /= 1.0 - ch.d  # a_u = L e_u / (1 − d), in place
    # the division by 1 − d rounds each entry: u·||x̂||_1 <= u(1 + bound) more
    alpha[ch.solve_idx] = (bound + 2 * U64 * (1.0 + bound)) / (1.0 - ch.d) * (1.0 + 4 * U64)
    ch.alpha = alpha
    return steps


CHUNK = 16  # columns per solver call: the CPU kernel pads a call to 4, 8, 16 or 32 columns, and
# 16 + 4 cost less than a padded 32 (measured at 955k nodes: 115 + 37 against 195 ms a step)


def _solve_columns(solver: PPRSolver, rows: np.ndarray,
                   tol: float) -> tuple[np.ndarray, np.ndarray, int]:
    """([N, k] float64 L e_u of each anchor row u in `rows`, [k] certified L1 bounds, the most
    steps), in calls of CHUNK columns; raises ConvergenceError for an uncertified column."""
    n = solver.num_nodes
    out = np.empty((n, len(rows)))
    bounds = np.empty(len(rows))
    steps = 0
    for a in range(0, len(rows), CHUNK):
        part = rows[a:a + CHUNK]
        seeds = torch.zeros(n, len(part), dtype=torch.float64)
        seeds[torch.from_numpy(part), torch.arange(len(part))] = 1.0
        solution = solver.solve(seeds, tol=tol)
        solution.raise_if_uncertified()
        out[:, a:a + len(part)] = solution.scores.to(torch.float64).numpy()
        bounds[a:a + len(part)] = solution.bound.to(torch.float64).numpy()
        steps = max(steps, int(solution.steps.max()))
    return out, bounds, steps


def _tol_for(ch: _Change, budget: float) -> float:
    """The per-column solve tol whose a-priori share of the bound (U4's terms linear in α, at
    half the allowance) fits every column: δX's D_u μ_c α and Σ|ΔB| α through κ Σ ω. The
    certificate is computed afterwards all the same; this only picks the tol."""
    dim1, d = len(ch.allow), ch.d
    deg_t = ch.deg_a[ch.t_a]
    mu = (np.abs(ch.b_a[:, :dim1]) / np.maximum(deg_t, 1e-300)[:, None])[deg_t > 0].max(axis=0) \
        if (deg_t > 0).any() else np.zeros(dim1)
    s_c = np.abs(ch.delta_b[:, :dim1]).sum(axis=0)
    kappa = 1.0 + d * (float(ch.omega.max()) if len(ch.omega) else 0.0) / (1.0 - d)
    deg_v = ch.deg_a[ch.v_nodes]
    per_alpha = s_c + d * kappa * (ch.omega[:, None] * (deg_v[:, None] * mu[None, :]
                                                        + s_c[None, :])).sum(axis=0) / (1.0 - d)
    per_alpha = (1.0 - d) * np.maximum(per_alpha, 1e-300)
    alpha = float((ch.allow * budget / (2.0 * per_alpha)).min()) if dim1 else 1.0
    return max(alpha * (1.0 - d), 1e-13)


class _Columns:
    """The columns a_w (w in V) at chosen U rows: the solved ones, and e_w for the others."""

    def __init__(self, ch: _Change) -> None:
        self.ch = ch
        n_u, k_v = len(ch.anchor_of), len(ch.v_nodes)
        self.pos_v = np.full(n_u, -1, dtype=np.int64)  # U row -> position in V
        self.pos_v[ch.v_nodes] = np.arange(k_v)
        self.id_pos = np.full(n_u, -1, dtype=np.int64)  # U row -> position of an exact e_w
        self.id_pos[ch.v_nodes[ch.identity]] = np.nonzero(ch.identity)[0]
        self.t_pos = np.full(n_u, -1, dtype=np.int64)  # U row -> anchor passage position
        self.t_pos[ch.t_a] = np.arange(len(ch.t_a))

    def solved(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), k_s] the solved a_w at U rows (0 at a node new to A)."""
        at = self.ch.anchor_of[rows]
        out = self.ch.a_anchor[np.maximum(at, 0)]
        out[at < 0] = 0.0
        return out

    def all(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), k_v] every a_w at U rows."""
        out = np.zeros((len(rows), len(self.ch.v_nodes)))
        out[:, self.ch.solve_idx] = self.solved(rows)
        hit = np.nonzero(self.id_pos[rows] >= 0)[0]
        out[hit, self.id_pos[rows[hit]]] = 1.0
        return out


def _assemble(ch: _Change) -> tuple[tuple, np.ndarray]:
    """U1-U4 from the solved columns: ((z, z1, col_bound, z1_bound, h, h_err), the bound the
    update added to each of the D + 1 basis columns)."""
    cols = _Columns(ch)
    v, kv, ev, err = _small_system(ch, cols)
    z_part = _basis_rows(ch, cols, kv, ev, err)
    h, h_err = _passage_mass(ch, kv, ev, err)
    return (*z_part[:4], h, h_err), z_part[4]


def _small_system(ch: _Change, cols: _Columns) -> tuple[np.ndarray, ...]:
    """v = C⁻¹X (U1, U3) and U4's error of the correction d G v per seed column: (v, K v,
    c/d ⊙ v, [D + 2] its L1 bound plus Σ_r |ΔB[r, c]| α_r)."""
    d, alpha, k_v = ch.d, ch.alpha, len(ch.v_nodes)
    ncol = ch.delta_b.shape[1]
    a_v = cols.all(ch.v_nodes)  # [k_v, k_v]
    a_t = cols.solved(ch.t_a)  # [P, k_s]
    deg_t = ch.deg_a[ch.t_a]
    with np.errstate(divide="ignore", invalid="ignore"):
        b_over = np.where(deg_t[:, None] > 0, ch.b_a / deg_t[:, None], 0.0)  # [P, c]
    mu = np.abs(b_over).max(axis=0) if len(b_over) else np.zeros(ncol)
    x = np.zeros((k_v, ncol))
    x_abs = np.zeros((k_v, ncol))  # the absolute terms of X̂ (an upper bound), for its rounding
    if len(ch.solve_idx):
        deg_s = ch.deg_a[ch.v_nodes[ch.solve_idx], None]
        x[ch.solve_idx] = deg_s * (a_t.T @ b_over)
        # Σ_w |a_u[w]| |B[w]|/D_w <= μ ||a_u||_1 <= μ (1/(1 − d) + α_u)
        x_abs[ch.solve_idx] = deg_s * mu[None, :] * (1.0 / (1.0 - d) + alpha[ch.solve_idx, None])
    for i in np.nonzero(ch.identity)[0]:  # isolated in A: (A⁻¹B)[u] = B[u]
        j = cols.t_pos[ch.v_nodes[i]]
        if j >= 0:
            x[i], x_abs[i] = ch.b_a[j], np.abs(ch.b_a[j])
    x += a_v @ ch.delta_b
    x_abs += np.abs(a_v) @ np.abs(ch.delta_b)
    sum_db_alpha = np.abs(ch.delta_b).T @ alpha  # [c] Σ_r |ΔB[r, c]| α_r
    dx = (ch.deg_a[ch.v_nodes, None] * mu[None, :] * alpha[:, None] + sum_db_alpha[None, :]
          + _gamma(len(ch.t_a) + 8) * x_abs * 2.0)
    cap = np.eye(k_v) - d * (a_v @ ch.kmat - np.diag(ch.cvec))  # C = I − d G_V
    v = np.linalg.solve(cap, x) if k_v else np.zeros((0, ncol))
    res = np.abs(x - cap @ v) + _gamma(k_v + 2) * (np.abs(x) + np.abs(cap) @ np.abs(v))
    a_norm = np.where(ch.identity, 1.0, 1.0 / (1.0 - d) + alpha)  # ||a_w||_1 bounds
    g_err = np.abs(ch.kmat).T @ alpha + ch.gam_deg * (np.abs(ch.kmat).T @ (a_norm + 1.0))
    g_err[ch.scaled] = ch.omega[ch.scaled] / (1.0 - d)  # Ĝ_u = 0, ||G_u||_1 <= ω_u/(1 − d)
    g_v = (g_err[:, None] * np.abs(v)).sum(axis=0)  # [c] Σ_w g_w |v̂_w|
    rho = dx + res + d * g_v[None, :]
    live = ch.omega > 0
    kappa = 1.0 + d * (float(ch.omega.max()) if k_v else 0.0) / (1.0 - d)
    w_delta = kappa * (ch.omega[:, None] * rho).sum(axis=0)  # [c] Σ ω |v − v̂| <= this
    g_over = float((g_err[live] / ch.omega[live]).max()) if live.any() else 0.0
    if (g_err[~live] != 0).any():  # m_u = 0: K's column and c_u are zero, G_u is exactly 0
        raise RuntimeError("a node with an unchanged transition column has a correction")
    err = sum_db_alpha + d * (w_delta / (1.0 - d) + g_v + g_over * w_delta)
    return v, ch.kmat @ v, ch.cvec[:, None] * v, err


def _basis_rows(ch: _Change, cols: _Columns, kv: np.ndarray, ev: np.ndarray,
                err: np.ndarray) -> tuple:
    """Z' and z1' at the new passage rows T' (U1: base + ΔB part + d G v, times 1 − d) with
    their bounds: (z, z1, col_bound, z1_bound, the bound the update added per column)."""
    d, basis, t_n = ch.d, ch.basis, ch.t_n
    dim = ch.delta_b.shape[1] - 2
    c1 = slice(0, dim + 1)  # E_j and the ones column
    a_tn = cols.all(t_n)  # [P', k_v]
    base_t = np.zeros((len(t_n), dim + 1))
    kept = cols.t_pos[t_n]
    keep = kept >= 0
    base_t[keep, :dim] = basis.z.to(torch.float64).numpy()[kept[keep]] / (1.0 - d)
    base_t[keep, dim] = basis.z1.to(torch.float64).numpy()[kept[keep]] / (1.0 - d)
    ev_at = np.zeros((len(t_n), dim + 1))
    t_in_v = np.nonzero(cols.pos_v[t_n] >= 0)[0]
    ev_at[t_in_v] = ev[cols.pos_v[t_n[t_in_v]], c1]
    out = base_t + a_tn @ (ch.delta_b[:, c1] + d * kv[:, c1]) - d * ev_at
    # the rounding of each entry (2|V| + 6 terms at most) over the column: Σ_t of the absolute
    # terms, whose a-part sums to (Σ_t |a_tn[t]|) @ (|ΔB| + d|K v|)
    k_v = len(ch.v_nodes)
    out_abs = (np.abs(base_t).sum(axis=0) + np.abs(a_tn).sum(axis=0)
               @ (np.abs(ch.delta_b[:, c1]) + d * np.abs(kv[:, c1]))
               + d * np.abs(ev_at).sum(axis=0)) * (1.0 + 2 * _gamma(len(t_n) + k_v))
    added = err[c1] + _gamma(2 * k_v + 6) * out_abs
    base_err = np.concatenate([basis.col_bound.to(torch.float64).numpy(),
                               [basis.z1_bound]]) / (1.0 - d)
    total = (base_err + added) * (1.0 - d) * (1.0 + 4 * U64)
    out *= 1.0 - d
    return (torch.from_numpy(np.ascontiguousarray(out[:, :dim])),
            torch.from_numpy(np.ascontiguousarray(out[:, dim])),
            torch.from_numpy(total[:dim].copy()), float(total[dim]), added * (1.0 - d))


def _passage_mass(ch: _Change, kv: np.ndarray, ev: np.ndarray,
                  err: np.ndarray) -> tuple[Tensor, float]:
    """h' at every new row, rounded up by its pointwise bound, and h_err (module docstring):
    h'_v = (1 − d)(A'⁻¹ D'_{T'})[v] / D'_v with A'⁻¹ D' = A⁻¹ D + A_V q − d E_V (c/d ⊙ v_h),
    q = ΔB_h + d K v_h, and (A⁻¹ D)[v] = D_v h_v / (1 − d) from the anchor's h."""
    d, n_new, hc = ch.d, ch.n_new, ch.delta_b.shape[1] - 1
    anchor_n = np.full(n_new, -1, dtype=np.int64)
    alive = ch.u_of < n_new
    anchor_n[ch.u_of[alive]] = np.nonzero(alive)[0]
    has = anchor_n >= 0
    y_h = np.zeros(n_new)
    y_h[has] = ch.deg_a[:n_new][has] * ch.basis.h.to(torch.float64).numpy()[anchor_n[has]] \
        / (1.0 - d)
    y_abs = np.abs(y_h)
    q = ch.delta_b[:, hc] + d * kv[:, hc]
    if len(ch.solve_idx):  # A_V q over the solved columns, in anchor rows, then renumbered
        rows = np.nonzero(alive)[0]
        y_h[ch.u_of[rows]] += (ch.a_anchor @ q[ch.solve_idx])[rows]
        # |a_w[v]| <= ||a_w||_1 <= 1/(1 − d) + α_w at every row: a constant for the rounding
        y_abs += float(np.abs(q[ch.solve_idx]) @ (1.0 / (1.0 - d) + ch.alpha[ch.solve_idx]))
    identity = ch.identity
    for k, u in enumerate(ch.v_nodes.tolist()):
        if u < n_new:
            y_h[u] += (q[k] if identity[k] else 0.0) - d * ev[k, hc]
            y_abs[u] += abs(q[k]) * identity[k] + d * abs(ev[k, hc])
    err_y = np.where(has, ch.deg_a[:n_new] * ch.basis.h_err / (1.0 - d), 0.0) + err[hc] \
        + _gamma(2 * len(ch.v_nodes) + 6) * y_abs
    dn = ch.deg_n[:n_new]
    passage = np.zeros(n_new, dtype=bool)
    passage[ch.t_n] = True
    safe = np.where(dn > 0, dn, 1.0)
    h_hat = np.where(dn > 0, (1.0 - d) * y_h / safe, np.where(passage, 1.0 - d, 0.0))
    h_e = np.where(dn > 0, (1.0 - d) * err_y / safe * (1.0 + 8 * U64), 0.0)
    h_err = float(2.0 * h_e.max() * (1.0 + 2.0 ** -50)) if n_new else 0.0
    return torch.from_numpy((h_hat + h_e) * (1.0 + 2 * U64)), h_err
