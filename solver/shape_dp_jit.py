"""The pricing DP of :mod:`.shape_pricing` compiled with numba: the same recursion, one cap at a time.

:meth:`.shape_pricing.ShapePricer.solve` runs the backward shortest path over (layers covered, state
of the next stage) either vectorised in numpy over a batch of caps or here, as plain loops compiled
by numba. The loops stop a stage's length as soon as its time passes the cap (stage time grows with
the layer count), which the vectorised form cannot, and a fresh run reads the best suffix per node
instead of every state; at 8–64 GPUs a cap costs 0.02–1.2 ms here against 0.8–45 ms in numpy
(15–60×, ``python benchmarks/pricing.py``). Both forms are tested to return the same
values (tests/test_fluid_bound.py), the numpy one being the oracle; :data:`AVAILABLE` says whether
numba is installed.

State arrays (built by :func:`.shape_pricing._build_states`): ``snode[s]``, ``smask[s]`` the node
and the required-node mask of state s (a first stage must complete the mask to ``full_mask``);
``ns[c, s]`` the state after placing option c before s (−1: not allowed); ``fresh_to[c, m]`` the
state a fresh run of c starts before a suffix on another node with mask m; ``last_state[c]`` the
state a last stage of c is (−1: none); ``single_ok[c]``; ``full[c, s]`` (``full_fresh[c]`` for a
fresh run) the run c starts leaves no room on its node for the other replicas (the ``*_full``
floor tables apply); ``onode[c]`` the node of option c.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import AVAILABLE, Kernel, signature

__all__ = ["AVAILABLE", "solve_batch"]


def _dp_batch(caps: np.ndarray, lows: np.ndarray | None, weights: np.ndarray, slopes: np.ndarray, wcaps: np.ndarray,
              pen_base: np.ndarray,
              u_mid: np.ndarray, u_first: np.ndarray, u_last: np.ndarray, u_single: np.ndarray,
              onode: np.ndarray, snode: np.ndarray, smask: np.ndarray, ns: np.ndarray, fresh_to: np.ndarray,
              last_state: np.ndarray, single_ok: np.ndarray, full: np.ndarray, full_fresh: np.ndarray,
              full_mask: int, has_w: bool,
              w_mid: np.ndarray, w_mid_full: np.ndarray, w_first: np.ndarray, w_first_full: np.ndarray,
              w_last: np.ndarray, w_single: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each cap k: min over shapes with every u ≤ caps[k] (and w ≤ wcaps[k]) of
    S + Σ_stages π_n·t·max(weights[k], slopes[k]·u) — S + weights[k]·π·g where slopes[k] = 0 —
    with ``lows`` also some u > lows[k] (the bottleneck above the box's floor); returns the values
    (inf: none), the argmin's stages as (option, layers) rows and their count.

    A stage of option c before a suffix on another node starts a fresh run whose state depends only
    on c and the suffix's mask, and its time only on the suffix's node: those transitions read the
    best suffix per (node, mask) — N·masks candidates instead of every state. With ``lows`` each
    state has a flag: f = 0 once some stage of the suffix exceeds the low cap, 1 before (a shape
    counts only with f = 0); without, every suffix has f = 0. The four scans over a stage's length
    (extend a run | start one, in the middle | first) are written out, not shared through a helper:
    a compiled helper, inlined or not, measured 1.5× slower per cap. In the middle, a stage's time,
    floor and price are looked up once per (option, length) and then offered to every suffix state
    it may precede (the states it may extend are listed per option once per call): 1.2–1.6× per cap
    in cells with required nodes or a floor on U, equal at the root (the scans by suffix first, then
    length, looked them up per state)."""
    K = caps.shape[0]
    C, L = u_last.shape
    S = snode.shape[0]
    N = u_mid.shape[2]
    Mk = fresh_to.shape[1]
    has_low = lows is not None  # typed None: numba compiles the plain DP apart, without the flag's work
    nf = 2 if has_low else 1
    inf = math.inf
    vals = np.full(K, inf)
    stages = np.zeros((K, L, 2), dtype=np.int64)
    counts = np.zeros(K, dtype=np.int64)
    G = np.empty((L + 1, nf, S))
    bc = np.empty((L + 1, nf, S), dtype=np.int64)   # option of the stage starting at layer j in state s, flag f
    bl = np.empty((L + 1, nf, S), dtype=np.int64)   # its layers
    bs = np.empty((L + 1, nf, S), dtype=np.int64)   # the state after it (−1: it is the last stage)
    bf = np.empty((L + 1, nf, S), dtype=np.int64)   # the flag after it
    best_g = np.empty((L + 1, nf, N, Mk))           # least G[j, f] over the states of node a with mask m
    arg_g = np.empty((L + 1, nf, N, Mk), dtype=np.int64)
    # the states a stage of option c may extend (same node, the run still fits) and the state it makes
    npair = np.zeros(C, dtype=np.int64)
    pair_to = np.empty((C, S), dtype=np.int64)
    pair_from = np.empty((C, S), dtype=np.int64)
    for c in range(C):
        for s2 in range(S):
            if snode[s2] == onode[c] and ns[c, s2] >= 0:
                pair_from[c, npair[c]], pair_to[c, npair[c]] = s2, ns[c, s2]
                npair[c] += 1
    for k in range(K):
        cap, wcap = caps[k], wcaps[k]
        wk, sk = weights[k], slopes[k]  # a stage of option c and time u costs u + pen_base[c]·max(wk, sk·u)
        low = -inf
        if lows is not None:
            low = lows[k]
        G[:, :, :] = inf
        best_g[:, :, :, :] = inf
        for j in range(L - 1, 0, -1):
            span = L - j
            for c in range(C):  # c is the last stage, layers j … L−1
                s = last_state[c]
                u = u_last[c, span - 1]
                if s < 0 or u > cap or (has_w and w_last[c, j, span - 1] > wcap):
                    continue
                f = 0 if u > low else 1
                v = u + pen_base[c] * max(wk, sk * u)
                if v < G[j, f, s]:
                    G[j, f, s], bc[j, f, s], bl[j, f, s], bs[j, f, s], bf[j, f, s] = v, c, span, -1, 0
            for c in range(C):
                nc = onode[c]
                pb = pen_base[c]
                fl_fresh = full_fresh[c]
                for ell in range(1, span):  # a stage's time, floor and price do not depend on the suffix
                    u = u_mid[c, ell - 1, nc]
                    if u > cap:  # longer stages only take longer (inf beyond the memory cap)
                        break
                    ok0, ok1 = True, True  # its floor fits the cap (ok1: where its run leaves no room)
                    if has_w:
                        ok0, ok1 = w_mid[c, j, ell - 1] <= wcap, w_mid_full[c, j, ell - 1] <= wcap
                        if not ok0 and not ok1:
                            continue
                    add = u + pb * max(wk, sk * u)
                    f = 0 if u > low else 1
                    for i in range(npair[c]):  # c extends the run of the suffix state s2 (same node)
                        s2 = pair_from[c, i]
                        if not (ok1 if full[c, s2] else ok0):
                            continue
                        s1 = pair_to[c, i]
                        v = add + G[j + ell, 0, s2]
                        if v < G[j, 0, s1]:
                            G[j, 0, s1], bc[j, 0, s1], bl[j, 0, s1], bs[j, 0, s1], bf[j, 0, s1] = v, c, ell, s2, 0
                        if has_low:
                            v = add + G[j + ell, 1, s2]
                            if v < G[j, f, s1]:
                                G[j, f, s1], bc[j, f, s1], bl[j, f, s1], bs[j, f, s1], bf[j, f, s1] = v, c, ell, s2, 1
                for a in range(N):  # c starts a fresh run before a suffix on node a
                    if a == nc:
                        continue
                    for ell in range(1, span):
                        u = u_mid[c, ell - 1, a]
                        if u > cap:
                            break
                        if has_w and (w_mid_full[c, j, ell - 1] if fl_fresh else w_mid[c, j, ell - 1]) > wcap:
                            continue
                        add = u + pb * max(wk, sk * u)
                        f = 0 if u > low else 1
                        for m in range(Mk):
                            s1 = fresh_to[c, m]
                            if s1 < 0:
                                continue
                            v = add + best_g[j + ell, 0, a, m]
                            if v < G[j, 0, s1]:
                                G[j, 0, s1], bc[j, 0, s1], bl[j, 0, s1] = v, c, ell
                                bs[j, 0, s1], bf[j, 0, s1] = arg_g[j + ell, 0, a, m], 0
                            if has_low:
                                v = add + best_g[j + ell, 1, a, m]
                                if v < G[j, f, s1]:
                                    G[j, f, s1], bc[j, f, s1], bl[j, f, s1] = v, c, ell
                                    bs[j, f, s1], bf[j, f, s1] = arg_g[j + ell, 1, a, m], 1
            for f in range(nf):
                for s in range(S):
                    if G[j, f, s] < best_g[j, f, snode[s], smask[s]]:
                        best_g[j, f, snode[s], smask[s]] = G[j, f, s]
                        arg_g[j, f, snode[s], smask[s]] = s
        best, bc0, bl0, bs0, bf0 = inf, -1, 0, -1, 0
        for c in range(C):  # one stage holds everything
            u = u_single[c, L - 1]
            if not single_ok[c] or u > cap or u <= low or (has_w and w_single[c, 0, L - 1] > wcap):
                continue
            v = u + pen_base[c] * max(wk, sk * u)
            if v < best:
                best, bc0, bl0, bs0, bf0 = v, c, L, -1, 0
        for c in range(C):  # c is the first stage, layers 0 … ℓ−1: the shape then uses every required node
            nc = onode[c]
            for i in range(npair[c]):
                s2, s1 = pair_from[c, i], pair_to[c, i]
                if smask[s1] != full_mask:
                    continue
                fl = full[c, s2]
                for ell in range(1, L):
                    u = u_first[c, ell - 1, nc]
                    if u > cap:
                        break
                    g0 = G[ell, 0, s2]
                    g1 = G[ell, 1, s2] if has_low and u > low else inf  # the first stage lifts the flag
                    if g0 == inf and g1 == inf:
                        continue
                    if has_w:
                        w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                        if w > wcap:
                            continue
                    if g0 <= g1:
                        v, f = u + g0 + pen_base[c] * max(wk, sk * u), 0
                    else:
                        v, f = u + g1 + pen_base[c] * max(wk, sk * u), 1
                    if v < best:
                        best, bc0, bl0, bs0, bf0 = v, c, ell, s2, f
            fl = full_fresh[c]
            for a in range(N):
                if a == nc:
                    continue
                for m in range(Mk):
                    s1 = fresh_to[c, m]
                    if s1 < 0 or smask[s1] != full_mask:
                        continue
                    for ell in range(1, L):
                        u = u_first[c, ell - 1, a]
                        if u > cap:
                            break
                        g0 = best_g[ell, 0, a, m]
                        g1 = best_g[ell, 1, a, m] if has_low and u > low else inf
                        if g0 == inf and g1 == inf:
                            continue
                        if has_w:
                            w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                            if w > wcap:
                                continue
                        if g0 <= g1:
                            v, f = u + g0 + pen_base[c] * max(wk, sk * u), 0
                        else:
                            v, f = u + g1 + pen_base[c] * max(wk, sk * u), 1
                        if v < best:
                            best, bc0, bl0, bs0, bf0 = v, c, ell, arg_g[ell, f, a, m], f
        if best == inf:
            continue
        vals[k] = best
        n, c, ell, s, f, j = 0, bc0, bl0, bs0, bf0, 0
        while True:
            stages[k, n, 0], stages[k, n, 1] = c, ell
            n += 1
            j += ell
            if s < 0:
                break
            c, ell, s, f = bc[j, f, s], bl[j, f, s], bs[j, f, s], bf[j, f, s]
        counts[k] = n
    return vals, stages, counts


# the argument types the pricer passes (lows None where no box has a lower edge)
solve_batch = Kernel(_dp_batch, tuple(signature(f"f1 {lows} f1 f1 f1 f1 f3 f3 f2 f2 i1 i1 i1 i2 i2 i1 b1 b2 b1 i b "
                                                "f3 f3 f3 f3 f3 f3") for lows in ("N", "f1")))
"""The compiled :func:`_dp_batch` (:mod:`.kernels`: compiled ahead of a solve, cached on disk)."""
