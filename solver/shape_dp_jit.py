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

import importlib.util
import math
from collections.abc import Callable

import numpy as np

__all__ = ["AVAILABLE", "solve_batch"]

# numba is imported (~0.8 s) and the loops compiled (~4 s, then cached on disk) on first use only
AVAILABLE = importlib.util.find_spec("numba") is not None
_compiled: Callable | None = None


def _dp_batch(caps: np.ndarray, weights: np.ndarray, wcaps: np.ndarray, pen_base: np.ndarray,
              u_mid: np.ndarray, u_first: np.ndarray, u_last: np.ndarray, u_single: np.ndarray,
              onode: np.ndarray, snode: np.ndarray, smask: np.ndarray, ns: np.ndarray, fresh_to: np.ndarray,
              last_state: np.ndarray, single_ok: np.ndarray, full: np.ndarray, full_fresh: np.ndarray,
              full_mask: int, has_w: bool,
              w_mid: np.ndarray, w_mid_full: np.ndarray, w_first: np.ndarray, w_first_full: np.ndarray,
              w_last: np.ndarray, w_single: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each cap k: min S + weights[k]·π·g over shapes with every u ≤ caps[k] (and w ≤ wcaps[k]);
    returns the values (inf: none), the argmin's stages as (option, layers) rows and their count.

    A stage of option c before a suffix on another node starts a fresh run whose state depends only
    on c and the suffix's mask, and its time only on the suffix's node: those transitions read the
    best suffix per (node, mask) — N·masks candidates instead of every state. The four scans over a
    stage's length (extend a run | start one, in the middle | first) are written out, not shared
    through a helper: a compiled helper, inlined or not, measured 1.5× slower per cap."""
    K = caps.shape[0]
    C, L = u_last.shape
    S = snode.shape[0]
    N = u_mid.shape[2]
    Mk = fresh_to.shape[1]
    inf = math.inf
    vals = np.full(K, inf)
    stages = np.zeros((K, L, 2), dtype=np.int64)
    counts = np.zeros(K, dtype=np.int64)
    G = np.empty((L + 1, S))
    bc = np.empty((L + 1, S), dtype=np.int64)   # option of the stage starting at layer j in state s
    bl = np.empty((L + 1, S), dtype=np.int64)   # its layers
    bs = np.empty((L + 1, S), dtype=np.int64)   # the state after it (−1: it is the last stage)
    best_g = np.empty((L + 1, N, Mk))           # least G[j] over the states of node a with mask m
    arg_g = np.empty((L + 1, N, Mk), dtype=np.int64)
    pen = np.empty(C)
    for k in range(K):
        cap, wcap = caps[k], wcaps[k]
        for c in range(C):
            pen[c] = weights[k] * pen_base[c]
        G[:, :] = inf
        best_g[:, :, :] = inf
        for j in range(L - 1, 0, -1):
            span = L - j
            for c in range(C):  # c is the last stage, layers j … L−1
                s = last_state[c]
                u = u_last[c, span - 1]
                if s < 0 or u > cap or (has_w and w_last[c, j, span - 1] > wcap):
                    continue
                v = u + pen[c]
                if v < G[j, s]:
                    G[j, s], bc[j, s], bl[j, s], bs[j, s] = v, c, span, -1
            for c in range(C):
                nc = onode[c]
                for s2 in range(S):  # c extends the run of the suffix state s2 (same node)
                    s1 = ns[c, s2]
                    if snode[s2] != nc or s1 < 0:
                        continue
                    fl = full[c, s2]
                    for ell in range(1, span):
                        u = u_mid[c, ell - 1, nc]
                        if u > cap:  # longer stages only take longer (inf beyond the memory cap)
                            break
                        g = G[j + ell, s2]
                        if g == inf:
                            continue
                        if has_w:
                            w = w_mid_full[c, j, ell - 1] if fl else w_mid[c, j, ell - 1]
                            if w > wcap:
                                continue
                        v = u + g + pen[c]
                        if v < G[j, s1]:
                            G[j, s1], bc[j, s1], bl[j, s1], bs[j, s1] = v, c, ell, s2
                fl = full_fresh[c]
                for a in range(N):  # c starts a fresh run before a suffix on node a
                    if a == nc:
                        continue
                    for m in range(Mk):
                        s1 = fresh_to[c, m]
                        if s1 < 0:
                            continue
                        for ell in range(1, span):
                            u = u_mid[c, ell - 1, a]
                            if u > cap:
                                break
                            g = best_g[j + ell, a, m]
                            if g == inf:
                                continue
                            if has_w:
                                w = w_mid_full[c, j, ell - 1] if fl else w_mid[c, j, ell - 1]
                                if w > wcap:
                                    continue
                            v = u + g + pen[c]
                            if v < G[j, s1]:
                                G[j, s1], bc[j, s1], bl[j, s1], bs[j, s1] = v, c, ell, arg_g[j + ell, a, m]
            for s in range(S):
                if G[j, s] < best_g[j, snode[s], smask[s]]:
                    best_g[j, snode[s], smask[s]] = G[j, s]
                    arg_g[j, snode[s], smask[s]] = s
        best, bc0, bl0, bs0 = inf, -1, 0, -1
        for c in range(C):  # one stage holds everything
            u = u_single[c, L - 1]
            if not single_ok[c] or u > cap or (has_w and w_single[c, 0, L - 1] > wcap):
                continue
            v = u + pen[c]
            if v < best:
                best, bc0, bl0, bs0 = v, c, L, -1
        for c in range(C):  # c is the first stage, layers 0 … ℓ−1: the shape then uses every required node
            nc = onode[c]
            for s2 in range(S):
                s1 = ns[c, s2]
                if snode[s2] != nc or s1 < 0 or smask[s1] != full_mask:
                    continue
                fl = full[c, s2]
                for ell in range(1, L):
                    u = u_first[c, ell - 1, nc]
                    if u > cap:
                        break
                    g = G[ell, s2]
                    if g == inf:
                        continue
                    if has_w:
                        w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                        if w > wcap:
                            continue
                    v = u + g + pen[c]
                    if v < best:
                        best, bc0, bl0, bs0 = v, c, ell, s2
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
                        g = best_g[ell, a, m]
                        if g == inf:
                            continue
                        if has_w:
                            w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                            if w > wcap:
                                continue
                        v = u + g + pen[c]
                        if v < best:
                            best, bc0, bl0, bs0 = v, c, ell, arg_g[ell, a, m]
        if best == inf:
            continue
        vals[k] = best
        n, c, ell, s, j = 0, bc0, bl0, bs0, 0
        while True:
            stages[k, n, 0], stages[k, n, 1] = c, ell
            n += 1
            j += ell
            if s < 0:
                break
            c, ell, s = bc[j, s], bl[j, s], bs[j, s]
        counts[k] = n
    return vals, stages, counts


def solve_batch(*args: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_dp_batch` compiled by numba (on the first call; the machine code is cached on disk)."""
    global _compiled
    if _compiled is None:
        import numba

        try:
            _compiled = numba.njit(cache=True, nogil=True)(_dp_batch)
        except RuntimeError:  # no writable cache next to the source nor in the user's cache folder
            _compiled = numba.njit(nogil=True)(_dp_batch)
    return _compiled(*args)
