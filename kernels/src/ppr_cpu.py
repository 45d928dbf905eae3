"""Fused, cache-blocked PPR solve on the CPU (numba), behind :class:`hippo_gpu.ppr.PPRSolver`.

It computes the iterates of :func:`hippo_gpu.ppr.ppr_solve`: method "chebyshev" (``omegas`` from
:func:`hippo_gpu.ppr.chebyshev_weights`) or "power" (all ones) and stops
each column on the same certified bound; the derivations (semi-iteration, L1 bound, top-k
certificate) are in hippo_gpu/ppr/iteration.py's docstring. This file is only about doing it fast:

* **Column blocks solved to completion.** The Q columns are cut into blocks of W = 1, 2, 4 or 8
  SIMD vectors (8-64 float32, 4-32 float64 lanes; at most 128 bytes per gathered row while the
  block fits the L3 cache, 256 bytes on DRAM-bound graphs, see :func:`block_layout`). Columns
  never interact, so each block runs all of its steps before the next starts and
  its three [N, W] arrays (r̂, y, y_prev: 7 MB for 32 float32 columns at N = 18k) stay in L2/L3
  across steps instead of an [N, Q] batch streaming from DRAM every step: the per-query cost does
  not grow with Q. Blocks run in parallel, one per thread (plain threads: the jitted code drops the
  GIL; a fixed block-to-thread assignment, and buffers reused across calls).
* **One pass per step.** :func:`_sweep` is written in LLVM IR (a numba intrinsic) so the W lanes
  are explicit <8 x float> / <4 x double> vectors: for each row i it gathers
  g_i = (1 − d) r̂_i + Σ_e (d M)_e y_{j_e} over the row's nonzeros and, in the same pass,
  accumulates the residual Σ_i |g_i − y_i| and the mass Σ_i y_i, and writes
  y_prev_i ← ω g_i + (1 − ω) y_prev_i. Written as plain numba loops, LLVM's vectoriser left the
  lanes scalar (no fastmath, which we keep off for determinism; numba also disables SLP
  vectorisation): 3-5x slower. Nothing
  is reassociated: each lane sums in CSR order, so a column's result is bit-identical whatever its
  batch, block width or thread count (its seeds are normalised here too, in a fixed order).
* **Rows in locality order, gathers prefetched.** The operator arrives permuted (RCM by default,
  see PPRSolver), so the rows a row gathers sit near it in memory; on graphs far beyond the cache
  each gather is a DRAM round trip, so the sweep prefetches the y row it will gather
  ``PREFETCH`` nonzeros ahead (1.5x per sweep at N = 600k, neutral on musique).
* **Per-column exit.** After each sweep every open column checks its certified bound (and, with
  ``top_k``, the top-k certificate); a column that passes is written out at once (clamped at 0,
  normalised) with its step and bound, and the block stops when all have.
* **What is written out is what is certified.** :func:`_emit` sums each column in float64 by a
  binary counter (pairwise: each term passes ≤ 2⌈log₂ N⌉ + 1 roundings, not N − 1), scales by
  the float64 reciprocal and rounds once into the dtype, so its L1 rounding is within
  ω(dtype, N) of hippo_gpu/ppr/rounding.py (R1); every bound adds ``rounding`` (= ω, passed in),
  and a bound computed from float64 sums over N rows is multiplied by ``inflate``
  (rounding.inflation). Bounds are float64 and compared with a float64 tol.

JIT compilation happens on the first call per dtype (``cache=True`` keeps it on disk, in
__pycache__ or NUMBA_CACHE_DIR); benchmarks/bench_ppr.py reports that one-off cost.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array

__all__ = ["VECTOR_BYTES", "block_layout", "make_workspace", "solve_blocks", "workspace_fits"]

VECTOR_BYTES = 32  # one AVX2 register; LLVM splits it on narrower targets
PREFETCH = 16  # software-prefetch the y row gathered this many nonzeros ahead: 1.5x at N = 600k
L3_BYTES = 32 << 20  # a typical last-level cache; only picks the block width


@intrinsic(prefer_literal=True)
def _sweep(typingctx, n, indptr, indices, data, base, base_scale, y, y_prev, omega, res, tot, width,
           prefetch):
    """One fused step over flat [N, W] blocks (W a literal multiple of the vector lanes).

    For each row i, with g_i = s·base_i + Σ_{e in row i} data_e · y_{indices_e} (W lanes, s =
    ``base_scale``, data = d·M): res += |g_i − y_i|, tot += y_i, and
    y_prev_i ← ω g_i + (1 − ω) y_prev_i. res and tot ([W]) are written at the end. (The two
    running sums and the row's accumulators use 12 of AVX2's 16 vector registers at W = 32; a
    third sum, Σ max(y_i, 0), measured ~30 % slower from spills, so _emit computes it instead.)
    """
    if not all(isinstance(t, types.IntegerLiteral) for t in (width, prefetch)):
        return None
    w_lanes = width.literal_value
    prefetch_distance = prefetch.literal_value
    dtype = data.dtype
    lanes = min(w_lanes, VECTOR_BYTES // (dtype.bitwidth // 8))
    if w_lanes % lanes:
        return None
    k_vec = w_lanes // lanes
    sig = types.void(n, indptr, indices, data, base, base_scale, y, y_prev, omega, res, tot, width,
                     prefetch)

    def codegen(context, builder, signature, args):
        n_ = args[0]
        scale_, omega_ = (  # scalars in the arrays' float type
            context.cast(builder, args[k], signature.args[k], dtype) for k in (5, 8)
        )
        ptr = {k: make_array(signature.args[k])(context, builder, args[k]).data
               for k in (1, 2, 3, 4, 6, 7, 9, 10)}
        p_indptr, p_indices, p_data, p_base = ptr[1], ptr[2], ptr[3], ptr[4]
        p_y, p_prev, p_res, p_tot = ptr[6], ptr[7], ptr[9], ptr[10]
        fty = context.get_value_type(dtype)
        vty = ir.VectorType(fty, lanes)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        align = dtype.bitwidth // 8

        def const(v: int) -> ir.Constant:
            return ir.Constant(i64, v)

        def index(p, at):  # int32/uint32/int64 CSR entries (all non-negative) as i64
            v = builder.load(builder.gep(p, [at]))
            return builder.zext(v, i64) if v.type.width < 64 else v

        def vptr(p, at):
            return builder.bitcast(builder.gep(p, [at]), vty.as_pointer())

        def vload(p, at):
            return builder.load(vptr(p, at), align=align)

        def splat(x):
            v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(i32, 0))
            mask = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), mask)

        fabs = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty]), f"llvm.fabs.v{lanes}f{dtype.bitwidth}"
        )
        zero = ir.Constant(vty, [0.0] * lanes)
        s_vec, w_vec = splat(scale_), splat(omega_)
        keep_vec = splat(builder.fsub(ir.Constant(fty, 1.0), omega_))
        stride = const(w_lanes)
        nnz = index(p_indptr, n_)  # indptr[n]
        last = builder.sub(nnz, const(1))
        i32_0 = ir.Constant(i32, 0)
        prefetch = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
            "llvm.prefetch.p0",
        )
        fn = builder.function
        entry = builder.block
        row_head, row_body = fn.append_basic_block("row_head"), fn.append_basic_block("row_body")
        nz_head, nz_body = fn.append_basic_block("nz_head"), fn.append_basic_block("nz_body")
        row_end, done = fn.append_basic_block("row_end"), fn.append_basic_block("done")
        latch = fn.append_basic_block("latch")
        builder.branch(row_head)

        # for i in range(n): the residual and mass sums stay in registers across rows
        builder.position_at_end(row_head)
        i = builder.phi(i64)
        res_acc = [builder.phi(vty) for _ in range(k_vec)]
        tot_acc = [builder.phi(vty) for _ in range(k_vec)]
        i.add_incoming(const(0), entry)
        for phi in res_acc + tot_acc:
            phi.add_incoming(zero, entry)
        builder.cbranch(builder.icmp_signed("<", i, n_), row_body, done)

        builder.position_at_end(row_body)
        row = builder.mul(i, stride)
        start = index(p_indptr, i)
        stop = index(p_indptr, builder.add(i, const(1)))
        builder.branch(nz_head)

        # for e in range(indptr[i], indptr[i + 1]): acc += data[e] * y[indices[e]]
        builder.position_at_end(nz_head)
        e = builder.phi(i64)
        acc = [builder.phi(vty) for _ in range(k_vec)]
        e.add_incoming(start, row_body)
        for k in range(k_vec):
            acc[k].add_incoming(zero, row_body)
        builder.cbranch(builder.icmp_signed("<", e, stop), nz_body, row_end)

        builder.position_at_end(nz_body)
        if prefetch_distance:  # y rows gathered `prefetch_distance` nonzeros from now
            ahead = builder.add(e, const(prefetch_distance))
            ahead = builder.select(builder.icmp_signed("<", ahead, nnz), ahead, last)
            ahead_at = builder.mul(index(p_indices, ahead), stride)
            for line in range(0, w_lanes * align, 64):
                at = builder.gep(p_y, [builder.add(ahead_at, const(line // align))])
                target = builder.bitcast(at, ir.IntType(8).as_pointer())
                builder.call(prefetch, [target, i32_0, ir.Constant(i32, 3), ir.Constant(i32, 1)])
        col = builder.mul(index(p_indices, e), stride)
        weight = splat(builder.load(builder.gep(p_data, [e])))
        for k in range(k_vec):
            gathered = vload(p_y, builder.add(col, const(k * lanes)))
            acc[k].add_incoming(builder.fadd(acc[k], builder.fmul(weight, gathered)), nz_body)
        e.add_incoming(builder.add(e, const(1)), nz_body)
        builder.branch(nz_head)

        # g_i = s·base_i + acc (the small terms summed first); residual, mass, Chebyshev update
        builder.position_at_end(row_end)
        gs, ats = [], []
        for k in range(k_vec):
            at = builder.add(row, const(k * lanes))
            g = builder.fadd(builder.fmul(s_vec, vload(p_base, at)), acc[k])
            y_i = vload(p_y, at)
            diff = builder.call(fabs, [builder.fsub(g, y_i)])
            res_acc[k].add_incoming(builder.fadd(res_acc[k], diff), latch)
            tot_acc[k].add_incoming(builder.fadd(tot_acc[k], y_i), latch)
            gs.append(g)
            ats.append(at)
        # (A branch skipping the y_prev read when ω = 1 made the Chebyshev steps 7 % slower.)
        for k in range(k_vec):
            keep = builder.fmul(keep_vec, vload(p_prev, ats[k]))
            builder.store(builder.fadd(builder.fmul(w_vec, gs[k]), keep), vptr(p_prev, ats[k]),
                          align=align)
        builder.branch(latch)
        builder.position_at_end(latch)
        i.add_incoming(builder.add(i, const(1)), latch)
        builder.branch(row_head)

        builder.position_at_end(done)
        for k in range(k_vec):
            builder.store(res_acc[k], vptr(p_res, const(k * lanes)), align=align)
            builder.store(tot_acc[k], vptr(p_tot, const(k * lanes)), align=align)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def _sweep_any(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, width):
    # One fully unrolled vector loop per width (float32 uses 8..32, float64 4..16).
    if width == 4:
        _sweep(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, 4, PREFETCH)
    elif width == 8:
        _sweep(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, 8, PREFETCH)
    elif width == 16:
        _sweep(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, 16, PREFETCH)
    elif width == 32:
        _sweep(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, 32, PREFETCH)
    else:
        _sweep(n, indptr, indices, data, base, s, y, y_prev, omega, res, tot, 64, PREFETCH)


@njit(cache=True, nogil=True)
def _target_rows(y, width, target_pos):
    """[W, T] copy of the target rows of a flat [N, W] block (one pass, 128-byte reads)."""
    vals = np.empty((width, target_pos.size), y.dtype)
    for r in range(target_pos.size):
        row = target_pos[r] * width
        for c in range(width):
            vals[c, r] = y[row + c]
    return vals


@njit(cache=True, nogil=True)
def _topk_min_gap(scores, k):
    """Smallest gap between consecutive entries among the k + 1 largest of ``scores`` [T].

    The top-k certificate holds when this exceeds the L1 bound ε of the scores: any two rows'
    errors sum to at most ε, so then the k largest and their order are those of the exact scores
    (ppr/certificate.py, "Certified top-k exit"). The k + 1 largest are kept sorted in a small
    buffer (insertion; numba's sort/partition would add ~15 s of JIT compile for no gain at these
    sizes).
    """
    t = scores.size
    m = min(k + 1, t)
    top = np.empty(m, scores.dtype)  # descending
    filled = 0
    for r in range(t):
        v = scores[r]
        if filled == m and v <= top[m - 1]:
            continue
        pos = filled if filled < m else m - 1
        while pos > 0 and top[pos - 1] < v:
            top[pos] = top[pos - 1]
            pos -= 1
        top[pos] = v
        if filled < m:
            filled += 1
    gap = np.inf
    for r in range(m - 1):  # in float64, where the difference of two float32 scores is exact
        gap = min(gap, np.float64(top[r]) - np.float64(top[r + 1]))
    return gap


@njit(cache=True, nogil=True)
def _emit(y, width, lanes_out, target_pos, out, q0):
    """out[:, q0 + c] = max(y_c, 0)[targets] / Σ max(y_c, 0) for each lane c with lanes_out[c].

    Clamping at 0 can only shrink the error (x* ≥ 0). The sum is float64 and pairwise, by a
    binary counter over the rows: ``level[k]`` holds the sum of the last 2^k rows not yet merged,
    so adding row i merges the levels of the trailing one-bits of i; the levels left set in N
    are added at the end. Each term passes ≤ 2⌈log₂ N⌉ + 1 roundings (rounding.py, R1), where a
    running sum would pass N − 1. Two row-major passes for all lanes at once (a block emits once
    or twice: its columns finish within a step or two of each other).
    """
    n = y.size // width
    level = np.zeros((64, width))  # float64 partial sums of 2^k rows
    carry = np.zeros(width)
    for i in range(n):
        row = i * width
        for c in range(width):
            v = y[row + c]
            carry[c] = v if v > 0 else 0.0
        k = 0
        j = i
        while j & 1:  # merge the full levels below the lowest zero bit of i
            for c in range(width):
                carry[c] = level[k, c] + carry[c]
            k += 1
            j >>= 1
        for c in range(width):
            level[k, c] = carry[c]
    total = np.zeros(width)
    for k in range(64):
        if (n >> k) & 1:
            for c in range(width):
                total[c] += level[k, c]
    for c in range(width):
        total[c] = 1.0 / total[c] if total[c] > 0 else 0.0
    for r in range(target_pos.size):
        row = target_pos[r] * width
        for c in range(width):
            if lanes_out[c]:
                v = y[row + c]
                out[r, q0 + c] = v * total[c] if v > 0 else 0.0


@njit(cache=True, nogil=True)
def _solve_block(indptr, indices, data, reset, perm, target_pos, q0, width, omegas, damping, tol,
                 top_k, stall_steps, data64, slack, rounding, inflate, base, y, y_prev, out,
                 iterations, bounds, certified, stalled):
    """All steps of one column block [q0, q0 + width) in the flat [N, W] buffers base, y, y_prev.

    A column whose bound has not halved within ``stall_steps`` steps has reached the round-off
    floor of the dtype: it stops uncertified with ``stalled`` set
    (ppr/iteration.py, "Round-off floor").
    With ``data64`` (d·M in float64; empty to skip), a column's certificate is re-checked on its
    float64 residual before it is emitted, ``slack`` (residual units) covering the rounding of r̂
    and of the float64 step; a refuted column iterates on and is checked again, and after
    ``stall_steps`` refutations it is marked stalled too. Without ``data64`` the ``slack`` is
    added to every residual (a float64 solve's own round-off, or 0). Every bound adds
    ``rounding`` (the emitted vector's, ω) and is multiplied by ``inflate``.
    """
    n = indptr.size - 1
    live = min(width, reset.shape[1] - q0)
    max_iter = omegas.size
    one_minus_d = 1 - damping
    bound_factor = 2.0 / one_minus_d * inflate  # ‖x_k − x*‖₁ ≤ 2‖ρ_k‖₁ / ((1 − d) 1ᵀy_k)
    total = np.zeros(width)  # 1ᵀr per column, in float64, in the (fixed) permuted row order
    for i in range(n):  # r in block layout; padding lanes are exactly 0 and stay so
        src = perm[i]
        row = i * width
        for c in range(live):
            v = reset[src, q0 + c]
            y[row + c] = v
            total[c] += v
        for c in range(live, width):
            y[row + c] = 0
    for c in range(live):
        total[c] = 1.0 / total[c]
    for i in range(n):  # y_0 = r̂; base = r̂ (scaled by 1 − d inside the sweep); y_prev finite
        row = i * width
        for c in range(width):
            v = y[row + c] * total[c]
            y[row + c] = v
            base[row + c] = v
            y_prev[row + c] = v
    res = np.zeros(width, reset.dtype)
    tot = np.zeros(width, reset.dtype)  # Σ y per lane
    done = np.zeros(width, np.bool_)
    done[live:] = True
    finished = np.zeros(width, np.bool_)
    check_topk = np.zeros(width, np.bool_)
    last_gap = np.full(width, np.inf)  # min top-k gap at the last check (top-k only)
    halved = np.full(width, np.inf)  # the bound when it last halved, and at which step
    halved_step = np.zeros(width, np.int64)
    # The float64 check of float32 certificates is one float64 sweep of the same kernel from the
    # float32 iterate, over just the lanes to check packed into the narrowest block that holds
    # them: g₆₄ = (1 − d) r̂ + d M₆₄ y, res = Σ|g₆₄ − y|, tot = Σ y per lane.
    verify = data64.size > 0
    main_slack = 0.0 if verify else slack  # residual units, in the float32 pre-check: none
    size64 = base.size if verify else 0
    res64 = np.zeros(width)
    tot64 = np.zeros(width)
    base64 = np.empty(size64)  # the packed lanes' r̂, y and (scratch) g, as float64
    y64 = np.empty(size64)
    g64 = np.empty(size64)
    lane_of = np.zeros(width, np.int64)
    new = np.zeros(width, np.bool_)  # lanes certified in float32 this step, to verify
    topk_new = np.zeros(width, np.bool_)
    refuted = np.zeros(width, np.int64)  # float32 certificates the float64 check refuted
    for step in range(max_iter):
        _sweep_any(n, indptr, indices, data, base, one_minus_d, y, y_prev, omegas[step], res, tot,
                   width)
        finished[:] = False
        check_topk[:] = False
        new[:] = False
        topk_new[:] = False
        for c in range(live):
            if done[c]:
                continue
            rho = (res[c] + main_slack) * inflate
            bound = bound_factor * rho / tot[c] + rounding if tot[c] > 0 else np.inf
            bounds[q0 + c] = bound
            if bound <= tol:
                finished[c] = True
                certified[q0 + c] = True
                iterations[q0 + c] = step + 1
                new[c] = True
                continue
            if bound - rounding <= 0.5 * halved[c]:  # the solve's bound halves, not ω
                halved[c] = bound - rounding
                halved_step[c] = step
            elif step - halved_step[c] >= stall_steps:
                finished[c] = True
                stalled[q0 + c] = True
                iterations[q0 + c] = step + 1
                continue
            if top_k > 0 and (res[c] + main_slack) * inflate / one_minus_d <= last_gap[c]:
                # Worth checking only once the bound is below the gap last seen (gaps settle
                # while the bound keeps falling): a skipped check only delays the exit.
                check_topk[c] = True
        if check_topk.any():
            vals = _target_rows(y, width, target_pos)
            for c in range(live):
                if not check_topk[c]:
                    continue
                last_gap[c] = _topk_min_gap(vals[c], top_k)
                # res / (1 − d) bounds ‖y_k − y*‖₁, the certificate's unit (see ppr/iteration.py)
                if last_gap[c] > (res[c] + main_slack) * inflate / one_minus_d:
                    finished[c] = True
                    certified[q0 + c] = True
                    iterations[q0 + c] = step + 1
                    new[c] = True
                    topk_new[c] = True
        if step == max_iter - 1:  # out of steps: emit what we have, iterations = max_iter
            for c in range(live):
                if not done[c] and not finished[c]:
                    finished[c] = True
                    iterations[q0 + c] = max_iter
        if verify and new.any():  # the float32 certificates, on the float64 residual
            m = 0
            for c in range(live):
                if new[c]:
                    lane_of[m] = c
                    m += 1
            w64 = 4
            while w64 < m:
                w64 *= 2
            for i in range(n):
                row, row64 = i * width, i * w64
                for k in range(w64):
                    if k < m:
                        base64[row64 + k] = base[row + lane_of[k]]
                        y64[row64 + k] = y[row + lane_of[k]]
                    else:
                        base64[row64 + k] = 0.0
                        y64[row64 + k] = 0.0
            _sweep_any(n, indptr, indices, data64, base64[:n * w64], np.float64(one_minus_d),
                       y64[:n * w64], g64[:n * w64], np.float64(1.0), res64[:w64], tot64[:w64],
                       w64)
            for k in range(m):
                c = lane_of[k]
                rho = (res64[k] + slack) * inflate
                bound = bound_factor * rho / tot64[k] + rounding if tot64[k] > 0 else np.inf
                bounds[q0 + c] = bound
                ok = bound <= tol or (topk_new[c] and last_gap[c] > rho / one_minus_d)
                if ok:
                    continue
                # The float32 iterate is not yet as close as its float32 residual said: iterate
                # on (one step shrinks the true residual too), unless that keeps failing.
                certified[q0 + c] = False
                refuted[c] += 1
                if refuted[c] >= stall_steps or step == max_iter - 1:
                    stalled[q0 + c] = True
                else:
                    finished[c] = False
        if finished.any():
            _emit(y, width, finished, target_pos, out, q0)
            done |= finished
            if done.all():
                return
        y, y_prev = y_prev, y


@njit(cache=True, nogil=True)
def _solve_slot(indptr, indices, data, reset, perm, target_pos, block_start, block_width, omegas,
                damping, tol, top_k, stall_steps, data64, slack, rounding, inflate, slot, slots,
                buffers, out, iterations, bounds, certified, stalled):
    """Blocks slot, slot + slots, ... with this slot's [3, N·W] buffers (no GIL: one per thread)."""
    n = indptr.size - 1
    for b in range(slot, block_start.size, slots):
        size = n * block_width[b]
        _solve_block(indptr, indices, data, reset, perm, target_pos, block_start[b],
                     block_width[b], omegas, damping, tol, top_k, stall_steps, data64, slack,
                     rounding, inflate, buffers[0, :size],
                     buffers[1, :size], buffers[2, :size], out, iterations, bounds, certified,
                     stalled)


def block_layout(
    q: int, itemsize: int, threads: int, n: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """Column blocks for a batch of Q: (starts [B], widths [B], lanes per SIMD vector).

    Widths are 1, 2, 4 or 8 vectors: up to 4 (128 bytes per gathered row, two cache lines) while
    a block's three [N, W] arrays fit the L3 cache; 8 (256 bytes) beyond, where each gather is a
    DRAM access and wider rows amortise its latency (1.45x per query at N = 600k). Full blocks
    first; with more threads than blocks, narrower blocks so each thread has one.
    """
    lanes = VECTOR_BYTES // itemsize
    widest = (8 if 3 * n * 4 * VECTOR_BYTES > L3_BYTES else 4) * lanes
    per_thread = -(-q // max(1, threads))
    target = min(widest, max(lanes, per_thread))
    starts, widths = [], []
    q0 = 0
    while q0 < q:
        rest = q - q0
        vectors = -(-min(rest, target) // lanes)
        vectors = next(v for v in (1, 2, 4, 8) if v >= vectors)  # widths are 1, 2, 4, 8 vectors
        starts.append(q0)
        widths.append(lanes * vectors)
        q0 += min(lanes * vectors, rest)
    return np.asarray(starts, np.int64), np.asarray(widths, np.int64), lanes


def solve_blocks(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    reset: np.ndarray,
    perm: np.ndarray,
    target_pos: np.ndarray,
    omegas: np.ndarray,
    *,
    damping: float,
    tol: float,
    top_k: int,
    threads: int,
    stall_steps: int,
    data64: np.ndarray | None = None,
    slack: float = 0.0,
    rounding: float = 0.0,
    inflate: float = 1.0,
    workspace: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Solve all columns of ``reset``: (scores [T, Q], steps [Q], bounds [Q] float64,
    certified [Q], stalled [Q]).

    A column is certified when its L1 bound met ``tol`` (or its top-k certificate held) within
    ``omegas.size`` steps. An uncertified one is either stalled (its bound stopped halving for
    ``stall_steps`` steps: the dtype's round-off floor, see ppr/iteration.py) or ran out of
    steps; it reports the steps it ran and its last bound.

    Args:
        indptr, indices, data: the permuted operator d·M = d·A D⁻¹ as CSR ([N+1] int32/int64,
            [nnz] int32/uint32/int64, [nnz] float32/float64: the dtype of the computation); the
            index arrays can be zero-copy numpy views of a :class:`hippo_gpu.ppr.Transition`'s.
        reset: [N, Q] non-negative reset weights r in the *original* row order, C-contiguous,
            each column with a positive sum (normalised here: r̂ = r / 1ᵀr).
        perm: [N] int64, perm[k] = original row stored at position k.
        target_pos: [T] int64 positions (in permuted order) of the rows to return.
        omegas: [max_iter] step weights ω_k (ones for the power iteration).
        damping: d; tol: L1 bound per column; top_k: 0 or the top-k certificate's k.
        stall_steps: steps without the bound halving after which a column counts as stalled.
        data64: d·M in float64 (same indices), for a float32 solve: certificates are re-checked
            on the float64 residual (a column failing it is returned stalled); None to skip.
        slack: residual units: added to each float64 residual of the check (the rounding of
            r̂ into the dtype and of the float64 step); without ``data64``, to every residual
            (the round-off of a float64 solve's own steps, or 0).
        rounding: added to every bound: the L1 rounding of the emitted vector (ω of
            hippo_gpu.ppr.rounding, which also proves the emit within it).
        inflate: multiplies every bound: the float64 rounding of the sums over N rows it is
            computed from (rounding.inflation).
        threads: numba threads (one column block per thread at a time).
        workspace: from :func:`make_workspace` for these sizes, reused across calls (allocated here
            when None).
    """
    n, q = reset.shape
    dtype = reset.dtype
    starts, widths, _ = block_layout(q, dtype.itemsize, max(1, threads), n)
    slots = max(1, min(threads, starts.size))
    if workspace is None or not workspace_fits(workspace, n, int(widths.max()), slots, dtype):
        workspace = make_workspace(n, int(widths.max()), slots, dtype)
    out = np.zeros((target_pos.size, q), dtype)
    iterations = np.zeros(q, np.int64)
    bounds = np.zeros(q, np.float64)
    certified = np.zeros(q, np.bool_)
    stalled = np.zeros(q, np.bool_)
    args = (indptr, indices, data, reset, perm, target_pos, starts, widths, omegas.astype(dtype),
            float(damping), float(tol), int(top_k), int(stall_steps),
            np.zeros(0) if data64 is None else data64, float(slack), float(rounding),
            float(inflate))

    def run(slot: int) -> None:
        _solve_slot(*args, slot, slots, workspace[slot], out, iterations, bounds, certified,
                    stalled)

    if slots == 1:
        run(0)
    else:  # the jitted code releases the GIL: plain threads run the slots in parallel
        with ThreadPoolExecutor(slots) as pool:
            list(pool.map(run, range(slots)))
    return out, iterations, bounds, certified, stalled


def make_workspace(n: int, width: int, slots: int, dtype: np.dtype) -> np.ndarray:
    """[slots, 3, N·W] buffers (reset, y, y_prev of one block per thread slot)."""
    return np.empty((slots, 3, n * width), dtype)


def workspace_fits(workspace: np.ndarray, n: int, width: int, slots: int, dtype: np.dtype) -> bool:
    return (
        workspace.dtype == dtype
        and workspace.shape[0] >= slots
        and workspace.shape[2] >= n * width
    )
