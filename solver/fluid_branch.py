"""Branch and price on layer locality over the fluid master (docs/formulation.md §15).

The fluid master of :mod:`.fluid_bound` prices each pipeline's gradient sync as if the other
replicas of its layers sat on the same node (the most optimistic link). A fractional master then
mixes, e.g., pipelines entirely on a fast NVLink node with pipelines entirely on slow nodes, whose
layers really sync across nodes. Branching on a (layer i, node n) pair that the master's solution
holds on n in some but not all pipelines splits the plans into two sets that together cover them
all: *local* (every pipeline holds layer i on node n: other nodes may not hold it) and *spread*
(not every pipeline does: a holder on n syncs layer i at no more than n's best inter-node link).
Each child is a fluid master with those floors (:mod:`.stage_floors`), whose certificate is valid
for the plans of its set; the bound for a pipeline count is the least bound over the open leaves.
Best first over all pipeline counts, within a deadline; every bound reported is valid whenever the
search stops.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan

from . import cost
from .candidates import CostTables
from .fluid_bound import FluidResult, fluid_lower_bound, optimizer_lower_bound, sync_lower_bound
from .shape_pricing import Shape
from .stage_floors import Locality, class_links

__all__ = ["BranchStats", "branch_on_locality", "fluid_bounds_by_pipelines"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class BranchStats:
    """What the search did: tree nodes solved, leaves left open, leaves closed by the incumbent."""

    nodes: int = 0
    open_leaves: int = 0
    pruned: int = 0
    final: int = 0
    stopped: str = ""


@dataclass(order=True)
class _Leaf:
    bound: float
    tie: int
    P: int = field(compare=False)
    locality: Locality = field(compare=False)
    result: FluidResult = field(compare=False)
    depth: int = field(compare=False, default=0)
    stalled: bool = field(compare=False, default=False)  # more column generation raised nothing


def _spread_penalty(tables: CostTables, P: int) -> np.ndarray:
    """Seconds per layer (TP 1) by which a spread layer's sync at node n can exceed an open one's:
    the per-byte cost of the best spread link minus that of the best open link (0 when equal)."""
    model, dtype = tables.problem.model, tables.problem.training.dtype_bytes
    nbytes = model.params_per_layer * dtype
    out = []
    for n in range(len(tables.problem.cluster.nodes)):
        links = class_links(tables, n)

        def per(links_k: list[cost.Link]) -> float:
            return min((cost.collective_time(OpClass.ALL_REDUCE, P, nbytes, lk, tables.profile) for lk in links_k),
                       default=math.inf)

        out.append(max(0.0, per(links[2]) - per(links[0])))
    return np.minimum(np.array(out), 1e6)  # inf (one node: a spread layer cannot be held there) ranks first


def _violation(tables: CostTables, leaf: _Leaf, penalty: np.ndarray) -> tuple[int, int] | None:
    """The open (layer, node) pair most worth branching on: held on node n by a fraction h of the
    master's P pipelines with 0 < h < P, scored by h·(P − h)·penalty(n); None when there is none."""
    L, N, P = tables.layers, len(tables.problem.cluster.nodes), leaf.P
    h = np.zeros((L, N))
    node_of = [o.node for o in tables.options]
    for sh, x in leaf.result.solution:
        j = 0
        for c, ell in sh.stages:
            h[j: j + ell, node_of[c]] += x
            j += ell
    score = h * (P - h) * penalty[None, :]
    for i, n in leaf.locality.local | leaf.locality.spread:
        score[i, n] = 0.0
    score[(h < 1e-6) | (h > P - 1e-6)] = 0.0
    i, n = np.unravel_index(int(np.argmax(score)), score.shape)
    return (int(i), int(n)) if score[i, n] > 1e-12 else None


def branch_on_locality(tables: CostTables, roots: dict[int, FluidResult], bounds: dict[int, float], *,
                       upper_s: float, rest: dict[int, float], deadline: float, pool: list[Shape],
                       rel_tol: float = 5e-4, gap_tol: float = 1e-6, max_nodes: int = 400) -> BranchStats:
    """Raise ``bounds[P]`` (in place) by branching on layer locality from each P's root master in
    ``roots``; ``rest[P]`` is the global sync + optimizer floor, ``upper_s`` the incumbent."""
    stats = BranchStats()
    tie = 0
    heap: list[_Leaf] = []
    leaves: dict[int, list[_Leaf]] = {}
    penalties: dict[int, np.ndarray] = {}
    for P, fr in roots.items():
        if P < 2 or bounds[P] >= upper_s * (1 - gap_tol):
            continue
        tie += 1
        leaf = _Leaf(bounds[P], tie, P, Locality(), fr)
        heapq.heappush(heap, leaf)
        leaves.setdefault(P, []).append(leaf)
    finals = math.inf  # least bound of a leaf with nothing left to branch on
    while heap:
        if time.monotonic() >= deadline or stats.nodes >= max_nodes:
            stats.stopped = "deadline" if stats.nodes < max_nodes else "node limit"
            break
        leaf = heapq.heappop(heap)
        if leaf.bound >= upper_s * (1 - gap_tol):
            stats.pruned += 1
            continue
        if leaf.bound >= finals:  # the least bound over all leaves is final: nothing can raise it
            heapq.heappush(heap, leaf)
            stats.stopped = "the least leaf has nothing to branch on"
            break
        P = leaf.P
        if P not in penalties:
            penalties[P] = _spread_penalty(tables, P)
        # branching is valid whether or not the leaf's column generation converged
        pair = _violation(tables, leaf, penalties[P])
        if pair is None and (leaf.result.converged or leaf.stalled):
            stats.final += 1  # stays in leaves[P]: its bound still counts for P
            finals = min(finals, leaf.bound)
            continue
        left = deadline - time.monotonic()
        children = ([leaf.locality.with_local(*pair), leaf.locality.with_spread(*pair)] if pair is not None
                    else [leaf.locality])  # unconverged: continue its column generation
        leaves[P].remove(leaf)
        for loc in children:
            sub = time.monotonic() + max(0.5, left / (2 * len(children)))
            fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest[P], upper_s=upper_s,
                                   deadline=min(deadline, sub), rel_tol=rel_tol, pool=tuple(pool), locality=loc)
            stats.nodes += 1
            pool[:] = list(fr.shapes)[-4000:]
            tie += 1
            child = _Leaf(max(leaf.bound, min(upper_s, fr.lb_s)), tie, P, loc, fr, leaf.depth + 1,
                          stalled=pair is None and fr.lb_s <= leaf.bound * (1 + rel_tol))
            leaves[P].append(child)
            if child.bound < upper_s * (1 - gap_tol):
                heapq.heappush(heap, child)
            else:
                stats.pruned += 1
        bounds[P] = max(bounds[P], min((lf.bound for lf in leaves[P]), default=upper_s))
        logger.info("branch P=%d depth %d on %s: P bound %.6g s", P, leaf.depth, pair, bounds[P])
    stats.open_leaves = len(heap)
    stats.stopped = stats.stopped or "no open leaf below the incumbent"
    return stats


def fluid_bounds_by_pipelines(tables: CostTables, *, pmax: int, upper_s: float,
                              seed_plans: tuple[Plan, ...] = (), deadline: float | None = None,
                              rel_tol: float = 5e-4, branch: bool = True, root_share: float = 0.5,
                              branch_nodes: int = 400) -> tuple[dict[int, float], dict[int, FluidResult]]:
    """Per pipeline count P = 1 … pmax: a lower bound on the iteration time of every plan with P
    pipelines, each at most ``upper_s`` (any plan time: bounds are only claimed below it).

    R_P = :func:`sync_lower_bound` + :func:`optimizer_lower_bound` is nondecreasing in P, and so is
    each stage's floor w (a ring all-reduce over more replicas costs more), so a run with Σ x ≤ P_hi
    and floors for P_lo replicas covers every P in [P_lo, P_hi]. First a *floor run* covering
    2 … pmax (at most a quarter of the time), then always the P with the least bound so far is solved
    exactly (P_lo = P_hi = P), the time left shared evenly; a P whose bound reaches ``upper_s`` is not solved.
    With ``branch``, the time left after the roots (which get ``root_share`` of it when there is a
    deadline) goes to :func:`branch_on_locality` (at most ``branch_nodes`` tree nodes). Also returns each exact P's root
    :class:`FluidResult` (``exact_plan.round_master`` turns its master into plans)."""
    start = time.monotonic()
    root_deadline = None if deadline is None else start + root_share * max(0.0, deadline - start)
    rest = {P: sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P) for P in range(1, pmax + 1)}
    out = {P: min(upper_s, rest[P]) for P in rest}
    runs: dict[int, FluidResult] = {}
    pool: list[Shape] = []

    def run(p_lo: int, p_hi: int, share: int) -> FluidResult | None:
        nonlocal pool
        left = None if root_deadline is None else root_deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        sub = None if left is None else time.monotonic() + left / max(1, share)
        fr = fluid_lower_bound(tables, pmax=p_hi, replicas=p_lo, rest_s=rest[p_lo], upper_s=upper_s,
                               seed_plans=seed_plans, deadline=sub, rel_tol=rel_tol, pool=tuple(pool))
        pool = list(fr.shapes)
        for q in range(p_lo, p_hi + 1):
            out[q] = max(out[q], min(upper_s, fr.lb_s))
        logger.info("fluid P=%d..%d: iteration >= %.6g s (%d iterations)", p_lo, p_hi, fr.lb_s, fr.iterations)
        return fr

    todo = set(rest)
    if pmax >= 3:  # a floor for every P ≥ 2 first (a quarter of the time at most)
        run(2, pmax, 4)
    while todo:
        P = min(todo, key=lambda q: (out[q], q))
        todo.discard(P)
        if out[P] >= upper_s:
            continue
        fr = run(P, P, len(todo) + 1)
        if fr is None:
            break
        runs[P] = fr
    if branch and pmax >= 2:
        stats = branch_on_locality(tables, runs, out, upper_s=upper_s, rest=rest, pool=pool,
                                   deadline=math.inf if deadline is None else deadline, rel_tol=rel_tol,
                                   max_nodes=branch_nodes)
        logger.info("locality branching: %s", stats)
    return out, runs
