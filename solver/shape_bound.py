"""A lower bound on the pipeline term by enumerating order-free pipeline shapes (valid for every P).

A pipeline's time is (m−1)·max_k u_k + Σ_k u_k. Relax each pipeline to the *multiset* of its stage
options (order dropped): u_k ≥ τ_c·ℓ_k, the K−1 boundaries cost at least the cheapest boundary,
the embedding and head at least the cheapest among the multiset's options, and every stage holds at
most Lmax(c, middle, 1 in flight) layers (the most lenient memory cap). For a multiset the best
layer split for m micro-batches is then exactly

    t(m) = extras + min_A [ (m−1)·A + S(A) ],   S(A) = min Σ τ_k ℓ_k  s.t.  τ_k ℓ_k ≤ A, 1 ≤ ℓ_k ≤ cap_k, Σ ℓ_k = L,

a lower envelope of lines in m. A time T is reachable only if some multiset of pipelines that fits
the node capacities processes M micro-batches within T: an unbounded knapsack over per-node GPU
usage vectors, each item worth the most micro-batches one pipeline of that usage can run within T.
The least reachable T (bisection) bounds the slowest pipeline of every plan, whatever P; sync and
optimizer time only add to it. Skipped (None) when the enumeration would be too large.
"""

from __future__ import annotations

import itertools
import logging
import math
import time

import numpy as np

from .candidates import CostTables

__all__ = ["shape_lower_bound"]

logger = logging.getLogger(__name__)


def _tp_multisets(degrees: list[int], cap: int) -> list[tuple[int, ...]]:
    """Multisets of TP degrees (non-increasing tuples) with sum ≤ cap, the empty one included."""
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], left: int, maxd: int) -> None:
        out.append(prefix)
        for d in degrees:
            if d <= maxd and d <= left:
                rec((*prefix, d), left - d, d)

    rec((), cap, max(degrees, default=0))
    return out


def _lines(taus: list[float], caps: list[int], L: int) -> list[tuple[float, float]]:
    """Pareto lines (A, S(A)) of a multiset: for every threshold A = τ_k·j, the cheapest Σ τℓ with
    every τ_k ℓ_k ≤ A (greedy: one layer each, then the cheapest stages filled first), vectorised
    over all thresholds."""
    K = len(taus)
    order = np.argsort(taus, kind="stable")
    tau = np.asarray(taus, dtype=float)[order]
    cap = np.asarray(caps, dtype=np.int64)[order]
    cands = np.unique(np.concatenate([tau[k] * np.arange(1, cap[k] + 1) for k in range(K)]))
    lim = np.minimum(cap[None, :], np.floor(cands[:, None] / tau[None, :] * (1 + 1e-12)).astype(np.int64))
    ok = (lim.min(axis=1) >= 1) & (lim.sum(axis=1) >= L)
    cands, lim = cands[ok], lim[ok]
    if len(cands) == 0:
        return []
    extra = lim - 1
    before = np.cumsum(extra, axis=1) - extra            # extra layers taken by cheaper stages
    take = np.clip((L - K) - before, 0, extra)           # what this stage adds
    S = tau.sum() + (take * tau[None, :]).sum(axis=1)
    lines: list[tuple[float, float]] = []
    best_s = math.inf
    for A, s_val in zip(cands.tolist(), S.tolist()):
        if s_val < best_s - 1e-15:
            lines.append((A, s_val))
            best_s = s_val
    return lines


def shape_lower_bound(tables: CostTables, *, max_items: int = 50000, max_states: int = 4000,
                      deadline: float | None = None) -> float | None:
    """Seconds: a valid lower bound on max_p pipeline time over all plans, or None if too large."""
    pb = tables.problem
    cl, L, M = pb.cluster, pb.model.layers, pb.training.num_micro_batches
    per_node: list[list[tuple[int, ...]]] = []
    states = 1
    for n, node in enumerate(cl.nodes):
        degs = sorted({o.tp for o in tables.options if o.node == n}, reverse=True)
        per_node.append(_tp_multisets(degs, node.count))
        states *= node.count + 1
    count = math.prod(len(x) for x in per_node)
    if count > max_items or states > max_states:
        logger.info("shape bound skipped: %d shapes, %d capacity states", count, states)
        return None
    opt_index = {(o.node, o.tp): o.index for o in tables.options}
    comm_min = min(tables.comm.values(), default=0.0)
    items: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}  # usage → [(A, S + extras, ...)]
    for combo in itertools.product(*per_node):
        stages = [opt_index[(n, t)] for n, degs in enumerate(combo) for t in degs]
        K = len(stages)
        if K == 0 or K > L:
            continue
        caps = [min(L, tables.max_layers(c, False, False, 1)) for c in stages]
        if min(caps) < 1 or sum(caps) < L:
            continue
        if K == 1:
            extras = tables.time_first[stages[0]] + tables.time_last[stages[0]]
        else:
            extras = min(tables.time_first[c] for c in stages) + min(tables.time_last[c] for c in stages) \
                + (K - 1) * comm_min
        usage = tuple(sum(degs) for degs in combo)
        for A, S in _lines([tables.time_layer[c] for c in stages], caps, L):
            items.setdefault(usage, []).append((A, S + extras, extras))
        if deadline is not None and time.monotonic() > deadline:
            return None
    if not items:
        return None
    caps_vec = [node.count for node in cl.nodes]
    shape = tuple(c + 1 for c in caps_vec)

    usages = list(items)
    uid = {u: i for i, u in enumerate(usages)}
    line_a = np.array([A for u in usages for A, _, _ in items[u]])
    line_s = np.array([S for u in usages for _, S, _ in items[u]])
    line_u = np.array([uid[u] for u in usages for _ in items[u]], dtype=np.int64)

    def reachable(T: float) -> bool:
        """Unbounded knapsack over per-node usage: most micro-batches P pipelines run within T."""
        per_line = np.where(T >= line_s, np.minimum(M, np.floor((T - line_s) / line_a * (1 + 1e-12)) + 1), 0)
        value = np.zeros(len(usages), dtype=np.int64)
        np.maximum.at(value, line_u, per_line.astype(np.int64))
        best = np.zeros(shape, dtype=np.int64)
        for i in np.flatnonzero(value):
            usage, v = usages[i], int(value[i])
            src = tuple(slice(0, c + 1 - u) for u, c in zip(usage, caps_vec))
            dst = tuple(slice(u, c + 1) for u, c in zip(usage, caps_vec))
            while True:  # add copies of this pipeline while it helps (each pass adds one more copy)
                cand = best[src] + v
                if not (cand > best[dst]).any():
                    break
                best[dst] = np.maximum(best[dst], cand)
            if best.max() >= M:
                return True
        return int(best.max()) >= M

    lo = 0.0
    hi = float((line_s + (M - 1) * line_a).max())
    if not reachable(hi):
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if reachable(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-7 * hi or (deadline is not None and time.monotonic() > deadline):
            break
    return lo
