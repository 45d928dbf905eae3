"""Forward push for many queries on the CPU (numba), behind :mod:`hippo_gpu.ppr.push`.

The semantics, the invariant and the bound are in hippo_gpu/ppr/push.py; this file is only about
doing it fast:

* **Queries in parallel, each alone.** Queries are split among plain threads (the jitted code
  drops the GIL) by a fixed rule (query i on thread i mod T) and each query's push depends on
  nothing else, so its result is bit-identical whatever the batch or the thread count.
* **Workspaces of size N reused, cleared by what was touched.** Each thread owns its buffers,
  allocated once per solver and thread; a query starts from zero residuals and, when it ends,
  zeroes only the nodes it touched (its touched list), so a query costs its work, not N. What an
  edge reads of its far end (residual, passage reach h, threshold degree, state) is one 32-byte
  row of a [N, 4] array: one cache miss per edge instead of five (2.0x on the 100k synthetic
  graph, measured).
* **Phases of a threshold, FIFO within a phase** (Andersen-Chung-Lang): in phase k a node u is
  pushed while r_u >= eps_k max(deg_u, 1); eps_0 is the largest seed's r/deg over 4 and each
  phase divides it by 4. A node enters the queue when its residual crosses the threshold, so a
  phase costs its pushes and no scan of N. The loop stops as soon as the passage-reaching
  residual mass (push.py, bound P2) is within the budget, or when the work (edges scanned)
  passes the cap.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

__all__ = ["Workspace", "make_workspace", "push_queries"]

SHRINK = 4.0  # threshold divisor per phase
EPS = 2.0 ** -52


class Workspace:
    """Per-thread buffers of one graph. ``node`` [N, 4] float64 packs what a push reads of each
    neighbour into one 32-byte row, so an edge costs one cache miss, not five: its residual r,
    its passage reach h, its threshold degree max(D, 1) and its state (0 untouched, 1 touched,
    2 touched and queued). p [N], touched and queue [N] int64."""

    def __init__(self, n: int, h: np.ndarray, deg: np.ndarray) -> None:
        self.node = np.zeros((n, 4), dtype=np.float64)
        self.node[:, 1] = h
        self.node[:, 2] = np.maximum(deg, 1.0)
        self.p = np.zeros(n, dtype=np.float64)
        self.touched = np.empty(n, dtype=np.int64)
        self.queue = np.empty(n, dtype=np.int64)


def make_workspace(n: int, h: np.ndarray, deg: np.ndarray) -> Workspace:
    return Workspace(n, h, deg)


@njit(nogil=True, cache=True, inline="always")
def _enqueue(node, queue, tail, u):
    """Mark node u queued and append it to the ring buffer; returns the new tail."""
    node[u, 3] = 2.0
    queue[tail] = u
    tail += 1
    return 0 if tail == queue.shape[0] else tail


@njit(nogil=True, cache=True)
def _push_one(indptr, indices, coef, deg, seed_node, seed_w, budget, work_cap, damping,
              node, p, touched, queue, passage_row, out_row, visits):
    """One query: push from its seeds until h·r <= budget (or work > work_cap).

    Writes p at the passage rows into out_row ([P] float64, zero on entry), adds 1 to
    visits[u] per push of u when visits is not empty ([N] int64, diagnostics), and returns
    (certified bound h·r plus round-off slack, pushes, edges scanned, nodes touched, capped).
    node[:, 0] (r) and node[:, 3] (state) are zero on entry and left zero.
    """
    n = deg.shape[0]
    nt = 0
    mass = 0.0
    for i in range(seed_node.shape[0]):
        u = seed_node[i]
        node[u, 0] += seed_w[i]
        mass += seed_w[i]
        if node[u, 3] == 0.0:
            node[u, 3] = 1.0
            touched[nt] = u
            nt += 1
    err = 0.0
    eps = 0.0
    for i in range(nt):
        u = touched[i]
        err += node[u, 1] * node[u, 0]
        if node[u, 0] / node[u, 2] > eps:
            eps = node[u, 0] / node[u, 2]
    pushes = 0
    work = 0
    capped = False
    keep = 1.0 - damping
    while True:
        while err > budget and not capped and eps > 0.0:
            eps /= 4.0
            head = 0
            tail = 0
            size = 0
            for i in range(nt):
                u = touched[i]
                if node[u, 0] > 0.0 and node[u, 0] >= eps * node[u, 2]:
                    tail = _enqueue(node, queue, tail, u)
                    size += 1
            while size > 0 and err > budget:
                u = queue[head]
                head += 1
                if head == n:
                    head = 0
                size -= 1
                node[u, 3] = 1.0
                m = node[u, 0]
                node[u, 0] = 0.0
                p[u] += keep * m
                err -= node[u, 1] * m
                pushes += 1
                if visits.shape[0] > 0:
                    visits[u] += 1
                lo = indptr[u]
                hi = indptr[u + 1]
                work += hi - lo
                for e in range(lo, hi):
                    v = indices[e]
                    add = coef[e] * m
                    rv = node[v, 0] + add
                    node[v, 0] = rv
                    err += node[v, 1] * add
                    state = node[v, 3]
                    if state == 0.0:
                        touched[nt] = v
                        nt += 1
                        state = 1.0
                        node[v, 3] = 1.0
                    if state == 1.0 and rv >= eps * node[v, 2]:
                        tail = _enqueue(node, queue, tail, v)
                        size += 1
                if work > work_cap:
                    capped = True
                    break
            while size > 0:  # leave the phase: unmark what is still queued
                node[queue[head], 3] = 1.0
                head += 1
                if head == n:
                    head = 0
                size -= 1
        # the tracked sum drifts with round-off: recompute it over the touched nodes
        exact = 0.0
        for i in range(nt):
            u = touched[i]
            exact += node[u, 1] * node[u, 0]
        # float64 slack: each push and edge update rounds once (relative EPS of the mass moved)
        exact += (2.0 * (work + pushes + nt) + 4.0) * EPS * mass
        err = exact
        if err <= budget or capped or eps == 0.0:
            break
    for i in range(nt):
        u = touched[i]
        row = passage_row[u]
        if row >= 0:
            out_row[row] = p[u]
        node[u, 0] = 0.0
        node[u, 3] = 0.0
        p[u] = 0.0
    return err, pushes, work, nt, capped


@njit(nogil=True, cache=True)
def _push_range(indptr, indices, coef, deg, seed_ptr, seed_node, seed_w, budget, work_cap,
                damping, node, p, touched, queue, passage_row, out, bound, pushes, work,
                touched_count, capped, visits, start, step):
    q = seed_ptr.shape[0] - 1
    for i in range(start, q, step):
        a = seed_ptr[i]
        b = seed_ptr[i + 1]
        err, npush, nwork, nt, cap = _push_one(
            indptr, indices, coef, deg, seed_node[a:b], seed_w[a:b], budget[i], work_cap,
            damping, node, p, touched, queue, passage_row, out[i], visits)
        bound[i] = err
        pushes[i] = npush
        work[i] = nwork
        touched_count[i] = nt
        capped[i] = cap


def push_queries(indptr: np.ndarray, indices: np.ndarray, coef: np.ndarray, deg: np.ndarray,
                 seed_ptr: np.ndarray, seed_node: np.ndarray, seed_w: np.ndarray,
                 budget: np.ndarray, work_cap: int, damping: float, passage_row: np.ndarray,
                 num_passages: int, workspaces: list[Workspace],
                 visits: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Push every query (hippo_gpu.ppr.push); one workspace per thread.

    Args:
        indptr, indices: the graph's CSR (int64); coef: [E] float64 d·A_uv / deg(u) per edge of
            row u; deg: [N] float64 weighted degrees (the passage-mass upper bound h lives in
            each workspace, make_workspace).
        seed_ptr: [Q + 1] int64; seed_node / seed_w: [S] int64 / float64 (query i's seeds are
            seed_ptr[i]:seed_ptr[i + 1]).
        budget: [Q] float64 bound to reach; work_cap: edges scanned before a query gives up.
        passage_row: [N] int64 passage row of each node (-1 for phrases).
        visits: [N] int64 (push order) or None: when given, visits[u] += 1 per push of u, over
            every query (diagnostics: the queries then run on one thread, so no count races).

    Returns:
        (out [Q, P] float64 p at the passage rows, bound [Q] float64, pushes [Q] int64,
        work [Q] int64, touched [Q] int64, capped [Q] bool).
    """
    q = seed_ptr.shape[0] - 1
    out = np.zeros((q, num_passages), dtype=np.float64)
    bound = np.zeros(q, dtype=np.float64)
    pushes = np.zeros(q, dtype=np.int64)
    work = np.zeros(q, dtype=np.int64)
    touched = np.zeros(q, dtype=np.int64)
    capped = np.zeros(q, dtype=np.bool_)
    threads = 1 if visits is not None else max(1, min(len(workspaces), q))
    counts = np.zeros(0, dtype=np.int64) if visits is None else visits

    def run(t: int) -> None:
        w = workspaces[t]
        _push_range(indptr, indices, coef, deg, seed_ptr, seed_node, seed_w, budget,
                    work_cap, damping, w.node, w.p, w.touched, w.queue, passage_row,
                    out, bound, pushes, work, touched, capped, counts, t, threads)

    if threads == 1:
        run(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads)))
    return out, bound, pushes, work, touched, capped
