"""Exact whole-batch pricing: the pricing DP with Pareto labels of (S, π·g), compiled with numba.

The whole-batch certificate (docs/formulation.md §14) needs, per box U ∈ (lo, hi], W ∈ (·, b], the
least S + lo·max(0, ⌊π·g + κ'⌋) over the box's shapes. A floor of π·g is not a sum over stages, so
the plain DP (:mod:`.shape_dp_jit`) can only bound it through a Lagrangian in π·g; here every state
keeps its Pareto front of suffixes — (S, π·g) pairs, none with both more S and more π·g than
another — and the root reads the floor off each. Same transitions, flags and tables as
:func:`.shape_dp_jit._dp_batch` (its docstring lists the state arrays). A label is dropped when no
shape through it can come in under the box's cut ``ubs[k]``: its S, plus a floor on what any
first j layers add (``pre_s[j]``, a floor on their S, or their least S + lo·π·g less lo), plus the
floor term of its own π·g reach it. A front longer than ``cap_labels`` merges its two neighbours closest in S into one label with
their lesser S and lesser π·g — a relaxation (the value stays a lower bound, the label may match
no single shape): ``relaxed`` says whether that happened. Fronts over wide boxes are long (5–8 s
per certificate at 32 GPUs), so only a leaf the search cannot branch any further uses them.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import AVAILABLE, Kernel, signature

__all__ = ["AVAILABLE", "solve_labels"]


def _labels_batch(caps: np.ndarray, lows: np.ndarray, wcaps: np.ndarray, scale: np.ndarray,
                  kp: float, ubs: np.ndarray, pre_s: np.ndarray, pg_opt: np.ndarray, cap_labels: int,
                  u_mid: np.ndarray, u_first: np.ndarray, u_last: np.ndarray, u_single: np.ndarray,
                  onode: np.ndarray, snode: np.ndarray, smask: np.ndarray, ns: np.ndarray, fresh_to: np.ndarray,
                  last_state: np.ndarray, single_ok: np.ndarray, full: np.ndarray, full_fresh: np.ndarray,
                  full_mask: int, has_w: bool,
                  w_mid: np.ndarray, w_mid_full: np.ndarray, w_first: np.ndarray, w_first_full: np.ndarray,
                  w_last: np.ndarray, w_single: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """For each box k: min over shapes with every u ≤ caps[k], some u > lows[k] (and every w ≤
    wcaps[k]) of S + scale[k]·max(0, ⌊π·g + kp⌋), π·g = Σ pg_opt over the stages, among those
    under ubs[k]; the values (inf: none), the argmin's stages as (option, layers) rows, their count,
    and whether a front was thinned.

    Flag f of a suffix: 0 once one of its stages exceeds the low cap, 1 before. The two merges (a
    stage before a state's front, before the best front of a node and mask) are written out."""
    K = caps.shape[0]
    C, L = u_last.shape
    S = snode.shape[0]
    N = u_mid.shape[2]
    Mk = fresh_to.shape[1]
    B = cap_labels
    inf = math.inf
    vals = np.full(K, inf)
    stages = np.zeros((K, L, 2), dtype=np.int64)
    counts = np.zeros(K, dtype=np.int64)
    relaxed = False
    cnt = np.zeros((L + 1, 2, S), dtype=np.int64)
    LS = np.empty((L + 1, 2, S, B))               # S of each label (fronts sorted by π·g, S falling)
    LP = np.empty((L + 1, 2, S, B))               # its π·g
    Bc = np.empty((L + 1, 2, S, B), dtype=np.int32)   # option of the stage starting at layer j
    Bl = np.empty((L + 1, 2, S, B), dtype=np.int32)   # its layers
    Bs = np.empty((L + 1, 2, S, B), dtype=np.int32)   # the state after it (−1: last stage)
    Bf = np.empty((L + 1, 2, S, B), dtype=np.int8)    # the flag after it
    Bi = np.empty((L + 1, 2, S, B), dtype=np.int32)   # the label after it
    fcnt = np.zeros((L + 1, 2, N, Mk), dtype=np.int64)
    FS = np.empty((L + 1, 2, N, Mk, B))           # best front over the states of node a with mask m
    FP = np.empty((L + 1, 2, N, Mk, B))
    Fs = np.empty((L + 1, 2, N, Mk, B), dtype=np.int32)  # the state of each of its labels
    Fi = np.empty((L + 1, 2, N, Mk, B), dtype=np.int32)  # and its index there
    bufS = np.empty(2 * B)  # a merge of two fronts of at most B labels each, thinned back to B
    bufP = np.empty(2 * B)
    bufA = np.empty((2 * B, 5), dtype=np.int64)
    um_min = np.full((C, L), inf)  # a stage's least time over the node after it, middle and first
    uf_min = np.full((C, L), inf)
    for c in range(C):
        for ell in range(L):
            for a_node in range(N):
                um_min[c, ell] = min(um_min[c, ell], u_mid[c, ell, a_node])
                uf_min[c, ell] = min(uf_min[c, ell], u_first[c, ell, a_node])
    pre = np.empty(L + 1)
    dpre = np.empty(L + 1)
    for k in range(K):
        cap, low, wcap, sc, ub = caps[k], lows[k], wcaps[k], scale[k], ubs[k]
        # a floor on the first j layers' share of S + sc·⌊π·g + κ'⌋: pre_s[j], or D(j) − sc with
        # D(j) = least S + sc·π·g of any stages covering them (⌊x + y⌋ ≥ ⌊x⌋ + y − 1 for y ≥ 0)
        dpre[0] = 0.0
        for j in range(1, L + 1):
            best_j = inf
            for c in range(C):
                for ell in range(1, j + 1):
                    u = uf_min[c, ell - 1] if ell == j else um_min[c, ell - 1]
                    if u > cap:
                        break
                    v = u + sc * pg_opt[c] + (dpre[j - ell] if ell < j else 0.0)
                    if v < best_j:
                        best_j = v
            dpre[j] = best_j
        pre[0] = 0.0
        for j in range(1, L + 1):
            # (⌊x + y⌋ ≥ ⌊x⌋ + y − 1 for the rest y ≥ 0; a κ' below 0 — Σ x ≥ P_lo, docs §14 — shifts the floor by it)
            pre[j] = max(pre_s[j], dpre[j] - sc * (1.0 + max(0.0, -kp) + 1e-6))
        pg_cut = inf if sc <= 0 or not ub < inf else math.ceil(ub / sc) + 1 - kp  # beyond: the floor term alone ≥ ub
        cnt[:, :, :] = 0
        fcnt[:, :, :, :] = 0
        for j in range(L - 1, 0, -1):
            span = L - j
            for c in range(C):  # c is the last stage, layers j … L−1: a one-label front
                s = last_state[c]
                u = u_last[c, span - 1]
                if s < 0 or u > cap or (has_w and w_last[c, j, span - 1] > wcap) or pg_opt[c] >= pg_cut:
                    continue
                if u + pre[j] + sc * max(0.0, math.floor(pg_opt[c] + kp)) >= ub:
                    continue
                f = 0 if u > low else 1
                n = cnt[j, f, s]
                if n == 0 or (u < LS[j, f, s, 0]):  # fronts of last stages: one option's time alone
                    LS[j, f, s, 0], LP[j, f, s, 0] = u, pg_opt[c]
                    Bc[j, f, s, 0], Bl[j, f, s, 0], Bs[j, f, s, 0], Bf[j, f, s, 0], Bi[j, f, s, 0] = c, span, -1, 0, 0
                    cnt[j, f, s] = 1
            for c in range(C):
                nc = onode[c]
                pc = pg_opt[c]
                for s2 in range(S):  # c extends the run of the suffix state s2 (same node)
                    s1 = ns[c, s2]
                    if snode[s2] != nc or s1 < 0:
                        continue
                    fl = full[c, s2]
                    for ell in range(1, span):
                        u = u_mid[c, ell - 1, nc]
                        if u > cap:
                            break
                        if has_w:
                            w = w_mid_full[c, j, ell - 1] if fl else w_mid[c, j, ell - 1]
                            if w > wcap:
                                continue
                        j2 = j + ell
                        for f2 in range(2):
                            n2 = cnt[j2, f2, s2]
                            if n2 == 0:
                                continue
                            f1 = 0 if (f2 == 0 or u > low) else 1
                            # merge the front of s1 with s2's front shifted by (u, pc)
                            n1 = cnt[j, f1, s1]
                            a, b, n = 0, 0, 0
                            changed = False  # some label of s2's front entered (else the front stays as it is)
                            while a < n1 or b < n2:
                                mine = b >= n2 or (a < n1 and LP[j, f1, s1, a] <= LP[j2, f2, s2, b] + pc)
                                if mine:
                                    cs, cp = LS[j, f1, s1, a], LP[j, f1, s1, a]
                                    r0, r1, r2 = Bc[j, f1, s1, a], Bl[j, f1, s1, a], Bs[j, f1, s1, a]
                                    r3, r4 = Bf[j, f1, s1, a], Bi[j, f1, s1, a]
                                    a += 1
                                else:
                                    cs, cp = LS[j2, f2, s2, b] + u, LP[j2, f2, s2, b] + pc
                                    r0, r1, r2, r3, r4 = c, ell, s2, f2, b
                                    b += 1
                                if cp >= pg_cut:
                                    break
                                if n > 0 and cs >= bufS[n - 1]:
                                    continue  # dominated: no less S for more π·g
                                if cs + pre[j] + sc * max(0.0, math.floor(cp + kp)) >= ub:
                                    continue  # no shape through it can come in under ub
                                if n > 0 and cp <= bufP[n - 1]:
                                    n -= 1  # same π·g, less S: replaces it
                                bufS[n], bufP[n] = cs, cp
                                bufA[n, 0], bufA[n, 1], bufA[n, 2], bufA[n, 3], bufA[n, 4] = r0, r1, r2, r3, r4
                                n += 1
                                changed = changed or not mine
                            if not changed:
                                continue
                            while n > B:  # too long a front: merge the two neighbours closest in S (a relaxation)
                                gi, gv = 0, inf
                                for q in range(n - 1):
                                    if bufS[q] - bufS[q + 1] < gv:
                                        gi, gv = q, bufS[q] - bufS[q + 1]
                                bufP[gi + 1] = bufP[gi]  # the lesser S (and its shape) with the lesser π·g
                                for q in range(gi, n - 1):
                                    bufS[q], bufP[q] = bufS[q + 1], bufP[q + 1]
                                    bufA[q, :] = bufA[q + 1, :]
                                n -= 1
                                relaxed = True
                            for q in range(n):
                                LS[j, f1, s1, q], LP[j, f1, s1, q] = bufS[q], bufP[q]
                                Bc[j, f1, s1, q], Bl[j, f1, s1, q], Bs[j, f1, s1, q] = bufA[q, 0], bufA[q, 1], bufA[q, 2]
                                Bf[j, f1, s1, q], Bi[j, f1, s1, q] = bufA[q, 3], bufA[q, 4]
                            cnt[j, f1, s1] = n
                fl = full_fresh[c]
                for a_node in range(N):  # c starts a fresh run before a suffix on node a_node
                    if a_node == nc:
                        continue
                    for m in range(Mk):
                        s1 = fresh_to[c, m]
                        if s1 < 0:
                            continue
                        for ell in range(1, span):
                            u = u_mid[c, ell - 1, a_node]
                            if u > cap:
                                break
                            if has_w:
                                w = w_mid_full[c, j, ell - 1] if fl else w_mid[c, j, ell - 1]
                                if w > wcap:
                                    continue
                            j2 = j + ell
                            for f2 in range(2):
                                n2 = fcnt[j2, f2, a_node, m]
                                if n2 == 0:
                                    continue
                                f1 = 0 if (f2 == 0 or u > low) else 1
                                n1 = cnt[j, f1, s1]
                                a, b, n = 0, 0, 0
                                changed = False
                                while a < n1 or b < n2:
                                    mine = b >= n2 or (a < n1 and LP[j, f1, s1, a] <= FP[j2, f2, a_node, m, b] + pc)
                                    if mine:
                                        cs, cp = LS[j, f1, s1, a], LP[j, f1, s1, a]
                                        r0, r1, r2 = Bc[j, f1, s1, a], Bl[j, f1, s1, a], Bs[j, f1, s1, a]
                                        r3, r4 = Bf[j, f1, s1, a], Bi[j, f1, s1, a]
                                        a += 1
                                    else:
                                        cs, cp = FS[j2, f2, a_node, m, b] + u, FP[j2, f2, a_node, m, b] + pc
                                        r0, r1, r2 = c, ell, Fs[j2, f2, a_node, m, b]
                                        r3, r4 = f2, Fi[j2, f2, a_node, m, b]
                                        b += 1
                                    if cp >= pg_cut:
                                        break
                                    if n > 0 and cs >= bufS[n - 1]:
                                        continue
                                    if cs + pre[j] + sc * max(0.0, math.floor(cp + kp)) >= ub:
                                        continue
                                    if n > 0 and cp <= bufP[n - 1]:
                                        n -= 1
                                    bufS[n], bufP[n] = cs, cp
                                    bufA[n, 0], bufA[n, 1], bufA[n, 2], bufA[n, 3], bufA[n, 4] = r0, r1, r2, r3, r4
                                    n += 1
                                    changed = changed or not mine
                                if not changed:
                                    continue
                                while n > B:  # too long a front: merge the two neighbours closest in S (a relaxation)
                                    gi, gv = 0, inf
                                    for q in range(n - 1):
                                        if bufS[q] - bufS[q + 1] < gv:
                                            gi, gv = q, bufS[q] - bufS[q + 1]
                                    bufP[gi + 1] = bufP[gi]  # the lesser S (and its shape) with the lesser π·g
                                    for q in range(gi, n - 1):
                                        bufS[q], bufP[q] = bufS[q + 1], bufP[q + 1]
                                        bufA[q, :] = bufA[q + 1, :]
                                    n -= 1
                                    relaxed = True
                                for q in range(n):
                                    LS[j, f1, s1, q], LP[j, f1, s1, q] = bufS[q], bufP[q]
                                    Bc[j, f1, s1, q], Bl[j, f1, s1, q], Bs[j, f1, s1, q] = bufA[q, 0], bufA[q, 1], bufA[q, 2]
                                    Bf[j, f1, s1, q], Bi[j, f1, s1, q] = bufA[q, 3], bufA[q, 4]
                                cnt[j, f1, s1] = n
            for f in range(2):  # the best front per (node, mask): the union of its states' fronts
                for s in range(S):
                    n2 = cnt[j, f, s]
                    if n2 == 0:
                        continue
                    a_node, m = snode[s], smask[s]
                    n1 = fcnt[j, f, a_node, m]
                    a, b, n = 0, 0, 0
                    while a < n1 or b < n2:
                        if b >= n2 or (a < n1 and FP[j, f, a_node, m, a] <= LP[j, f, s, b]):
                            cs, cp = FS[j, f, a_node, m, a], FP[j, f, a_node, m, a]
                            r0, r1 = Fs[j, f, a_node, m, a], Fi[j, f, a_node, m, a]
                            a += 1
                        else:
                            cs, cp, r0, r1 = LS[j, f, s, b], LP[j, f, s, b], s, b
                            b += 1
                        if n > 0 and cs >= bufS[n - 1]:
                            continue
                        if n > 0 and cp <= bufP[n - 1]:
                            n -= 1
                        bufS[n], bufP[n] = cs, cp
                        bufA[n, 0], bufA[n, 1] = r0, r1
                        n += 1
                    while n > B:  # too long a front: merge the two neighbours closest in S (a relaxation)
                        gi, gv = 0, inf
                        for q in range(n - 1):
                            if bufS[q] - bufS[q + 1] < gv:
                                gi, gv = q, bufS[q] - bufS[q + 1]
                        bufP[gi + 1] = bufP[gi]  # the lesser S (and its shape) with the lesser π·g
                        for q in range(gi, n - 1):
                            bufS[q], bufP[q] = bufS[q + 1], bufP[q + 1]
                            bufA[q, :] = bufA[q + 1, :]
                        n -= 1
                        relaxed = True
                    for q in range(n):
                        FS[j, f, a_node, m, q], FP[j, f, a_node, m, q] = bufS[q], bufP[q]
                        Fs[j, f, a_node, m, q], Fi[j, f, a_node, m, q] = bufA[q, 0], bufA[q, 1]
                    fcnt[j, f, a_node, m] = n
        # the root: the first stage (or the only one) before a front; the value reads the floor
        best, bc0, bl0, bs0, bf0, bi0 = inf, -1, 0, -1, 0, 0
        for c in range(C):
            u = u_single[c, L - 1]
            if not single_ok[c] or u > cap or u <= low or (has_w and w_single[c, 0, L - 1] > wcap):
                continue
            v = u + sc * max(0.0, math.floor(pg_opt[c] + kp))
            if v < best:
                best, bc0, bl0, bs0, bf0, bi0 = v, c, L, -1, 0, 0
        for c in range(C):
            nc = onode[c]
            pc = pg_opt[c]
            for s2 in range(S):
                s1 = ns[c, s2]
                if snode[s2] != nc or s1 < 0 or smask[s1] != full_mask:
                    continue
                fl = full[c, s2]
                for ell in range(1, L):
                    u = u_first[c, ell - 1, nc]
                    if u > cap:
                        break
                    if has_w:
                        w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                        if w > wcap:
                            continue
                    for f2 in range(2):
                        if f2 == 1 and u <= low:
                            continue
                        for b in range(cnt[ell, f2, s2]):
                            v = u + LS[ell, f2, s2, b] + sc * max(0.0, math.floor(LP[ell, f2, s2, b] + pc + kp))
                            if v < best:
                                best, bc0, bl0, bs0, bf0, bi0 = v, c, ell, s2, f2, b
            fl = full_fresh[c]
            for a_node in range(N):
                if a_node == nc:
                    continue
                for m in range(Mk):
                    s1 = fresh_to[c, m]
                    if s1 < 0 or smask[s1] != full_mask:
                        continue
                    for ell in range(1, L):
                        u = u_first[c, ell - 1, a_node]
                        if u > cap:
                            break
                        if has_w:
                            w = w_first_full[c, 0, ell - 1] if fl else w_first[c, 0, ell - 1]
                            if w > wcap:
                                continue
                        for f2 in range(2):
                            if f2 == 1 and u <= low:
                                continue
                            for b in range(fcnt[ell, f2, a_node, m]):
                                v = u + FS[ell, f2, a_node, m, b] + sc * max(
                                    0.0, math.floor(FP[ell, f2, a_node, m, b] + pc + kp))
                                if v < best:
                                    best, bc0, bl0 = v, c, ell
                                    bs0, bf0, bi0 = Fs[ell, f2, a_node, m, b], f2, Fi[ell, f2, a_node, m, b]
        if best == inf:
            continue
        vals[k] = best
        n, c, ell, s, f, i, j = 0, bc0, bl0, bs0, bf0, bi0, 0
        while True:
            stages[k, n, 0], stages[k, n, 1] = c, ell
            n += 1
            j += ell
            if s < 0:
                break
            c, ell, s, f, i = Bc[j, f, s, i], Bl[j, f, s, i], Bs[j, f, s, i], Bf[j, f, s, i], Bi[j, f, s, i]
        counts[k] = n
    return vals, stages, counts, relaxed


solve_labels = Kernel(_labels_batch, (signature("f1 f1 f1 f1 f f1 f1 f1 i f3 f3 f2 f2 i1 i1 i1 i2 i2 i1 b1 b2 b1 i b "
                                                 "f3 f3 f3 f3 f3 f3"),))
"""The compiled :func:`_labels_batch` (:mod:`.kernels`: compiled ahead of a solve, cached on disk)."""
