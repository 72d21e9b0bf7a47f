"""The depth-aware pricing DP of :mod:`.depth_bound`, compiled with numba (plain loops, one cap at a time).

A backward shortest path over (first layer of the suffix, depth of its first stage): the depth of a
stage is the number of stages from it to the last, which fixes its micro-batches in flight under
1F1B (min(depth, v) for pipelines of at least v micro-batches), so each stage's memory is checked at
the count it really holds. Depths from ``D`` on share one state (checked at depth ``D``: fewer in
flight, a relaxation). Stage times and memory limits come in as tables per option class
(:class:`.depth_bound.DepthTables`); nodes and runs on a node are not tracked (also a relaxation).
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import Kernel, signature

__all__ = ["depth_dp"]


def _depth_dp(caps: np.ndarray, weights: np.ndarray, alpha: float, pg: np.ndarray,
              u_mid: np.ndarray, u_first: np.ndarray, u_last: np.ndarray, u_single: np.ndarray,
              lm_mid: np.ndarray, lm_first: np.ndarray, lm_last: np.ndarray, lm_single: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each cap k: min over shapes whose stage times are all ≤ caps[k] and whose stages fit in
    memory at their depth of alpha·S + weights[k]·Σ pg[o] over the stages; the values (inf: none),
    the argmins' stages as (option, layers) rows from first to last, and their counts.

    ``lm_mid[o, d]`` / ``lm_first[o, d]``: the most layers a middle / first stage of option o holds at
    depth d + 1 (the last index: that depth or more); ``lm_last``, ``lm_single``: depth 1."""
    K = caps.shape[0]
    C, L = u_last.shape
    D = lm_mid.shape[1]
    inf = math.inf
    vals = np.full(K, inf)
    stages = np.zeros((K, L, 2), dtype=np.int64)
    counts = np.zeros(K, dtype=np.int64)
    G = np.empty((L + 1, D))
    bo = np.empty((L + 1, D), dtype=np.int64)   # option of the stage starting at layer j with depth state d
    bl = np.empty((L + 1, D), dtype=np.int64)   # its layers
    bd = np.empty((L + 1, D), dtype=np.int64)   # the depth state of the suffix after it (−1: it is last)
    for k in range(K):
        cap, w = caps[k], weights[k]
        G[:, :] = inf
        for j in range(L - 1, 0, -1):
            span = L - j
            for o in range(C):  # the last stage: layers j … L−1, depth 1
                if span > lm_last[o]:
                    continue
                u = u_last[o, span - 1]
                if u > cap:
                    continue
                v = alpha * u + w * pg[o]
                if v < G[j, 0]:
                    G[j, 0], bo[j, 0], bl[j, 0], bd[j, 0] = v, o, span, -1
            for o in range(C):  # a middle stage: layers j … j+ℓ−1 before a suffix of depth state d
                add0 = w * pg[o]
                for ell in range(1, span):
                    u = u_mid[o, ell - 1]
                    if u > cap:  # longer stages only take longer
                        break
                    add = alpha * u + add0
                    i = j + ell
                    for d in range(min(D, L - i)):  # a suffix of L − i layers has at most L − i stages
                        g = G[i, d]
                        if g == inf:
                            continue
                        nd = min(d + 1, D - 1)
                        if ell > lm_mid[o, nd]:
                            continue
                        if g + add < G[j, nd]:
                            G[j, nd], bo[j, nd], bl[j, nd], bd[j, nd] = g + add, o, ell, d
        best, b_o, b_l, b_d = inf, -1, 0, -1
        for o in range(C):
            if L <= lm_single[o]:  # one stage holds every layer
                u = u_single[o, L - 1]
                if u <= cap:
                    v = alpha * u + w * pg[o]
                    if v < best:
                        best, b_o, b_l, b_d = v, o, L, -1
            add0 = w * pg[o]
            for ell in range(1, L):  # the first stage: layers 0 … ℓ−1
                u = u_first[o, ell - 1]
                if u > cap:
                    break
                add = alpha * u + add0
                for d in range(min(D, L - ell)):
                    g = G[ell, d]
                    if g == inf:
                        continue
                    if ell > lm_first[o, min(d + 1, D - 1)]:
                        continue
                    if g + add < best:
                        best, b_o, b_l, b_d = g + add, o, ell, d
        vals[k] = best
        if b_o < 0:
            continue
        n, j, o, ell, d = 0, 0, b_o, b_l, b_d
        while True:
            stages[k, n, 0], stages[k, n, 1] = o, ell
            n += 1
            j += ell
            if d < 0:
                break
            o, ell, d = bo[j, d], bl[j, d], bd[j, d]
        counts[k] = n
    return vals, stages, counts


depth_dp = Kernel(_depth_dp, (signature("f1 f1 f f1 f2 f2 f2 f2 i2 i2 i1 i1"),))
"""The compiled :func:`_depth_dp` where numba is installed (:mod:`.kernels`), else plain Python (the
tests' small instances only)."""
