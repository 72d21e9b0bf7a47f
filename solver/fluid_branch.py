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
Before pairs, whole nodes are decided (:func:`_node_to_branch`): *quiet* (no layer local at n: all of
n's pairs spread) or *visited* (some layer local at n: every pipeline then uses a GPU of n, which the
pricing DP enforces) — one decision moves every layer of a node at once. A leaf whose master mixes
pipelines of different sync + optimizer floors is cut by the plan's sync + optimizer time (W cells,
:func:`_w_split`; before pairs where the floors differ widely, else once no pair is left,
:func:`_last_split`): the master charges each pipeline its own floor, the plan pays the largest.

One best-first search does it all (:func:`best_first_bounds`): its leaves are ranges of pipeline
counts (a run with Σ x ≤ P_hi and floors for P_lo replicas covers P_lo … P_hi) and, for one P, locality
cells. The leaf of least bound gets more column generation until it converges, then is split —
ranges at the jump of the global sync floor or into single P, single P by locality — so time goes
where the bound is lowest instead of evenly over up to N/2 pipeline counts. Within a deadline;
every bound reported is valid whenever the search stops.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan

from . import cost
from .candidates import CostTables
from .fluid_bound import FluidResult, fluid_lower_bound, rest_lower_bound
from .master_rounding import Incumbent
from .shape_pricing import Shape, pricer_for
from .stage_floors import Locality, class_links

__all__ = ["BranchStats", "best_first_bounds", "fluid_bounds_by_pipelines"]

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
    """Plans with lo ≤ P ≤ hi pipelines in one locality cell, and the fluid run that bounds them."""

    bound: float
    tie: int
    lo: int = field(compare=False)
    hi: int = field(compare=False)
    locality: Locality = field(compare=False)
    result: FluidResult = field(compare=False)
    depth: int = field(compare=False, default=0)
    stalled: bool = field(compare=False, default=False)  # more column generation raised nothing
    w_lo: float = field(compare=False, default=-math.inf)  # the cell's plans have sync + optimizer in
    w_hi: float = field(compare=False, default=math.inf)   # (w_lo, w_hi] (a W cell, :func:`_w_split`)
    exact: bool = field(compare=False, default=False)  # its whole-batch pricing is exact (labels): last resort

    @property
    def settled(self) -> bool:
        """Its column generation converged or stopped raising the bound: time to split it."""
        return self.result.converged or self.stalled


def _stalled(before: FluidResult, after: FluidResult, rel_tol: float) -> bool:
    """More column generation raised nothing: the run's own certificate did not rise and its master's
    estimate did not fall (the leaf's bound may be its parent's, which a child's run must first catch
    up with, and a Lagrangian certificate can stay flat while the master still improves) — except in
    the whole-batch phase, where a bound that did not rise is enough: its master keeps falling by a
    hair per column while its certificates prove nothing (hexiscale-het2: 3 of 58 raised the bound),
    and the time goes to branching instead. A run cut off before its first iteration (e.g. the DP
    compiling) proves nothing either way."""
    return (after.iterations > 0 and after.lb_s <= before.lb_s * (1 + rel_tol)
            and (before.whole or after.upper_s >= before.upper_s * (1 - rel_tol)))


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


def _open_holdings(tables: CostTables, leaf: _Leaf) -> np.ndarray:
    """h[i, n]: how many of the leaf master's pipelines hold layer i on node n (Σ of x), 0 where the
    leaf's locality already fixes the pair."""
    h = np.zeros((tables.layers, len(tables.problem.cluster.nodes)))
    node_of = [o.node for o in tables.options]
    for sh, x in leaf.result.solution:
        j = 0
        for c, ell in sh.stages:
            h[j: j + ell, node_of[c]] += x
            j += ell
    for i, n in leaf.locality.local | leaf.locality.spread:
        h[i, n] = 0.0
    return h


def _violation(tables: CostTables, leaf: _Leaf, penalty: np.ndarray) -> tuple[int, int] | None:
    """The open (layer, node) pair most worth branching on: held on node n by a fraction h of the
    master's P pipelines with 0 < h < P, scored by h·(P − h)·penalty(n); None when there is none.
    Nodes with fewer than P GPUs are left out: no layer can be local there (the room rule already
    charges all their pairs spread, so a spread child would be its parent again and a local one
    empty — mixed-a100-a40-t4 spent 52 of its P = 6 branchings on the 4-GPU T4 node)."""
    P = leaf.lo
    h = _open_holdings(tables, leaf)
    score = h * (P - h) * penalty[None, :]
    score[(h < 1e-6) | (h > P - 1e-6)] = 0.0
    score[:, np.array([size < P for size in tables.physical_sizes])] = 0.0
    i, n = np.unravel_index(int(np.argmax(score)), score.shape)
    return (int(i), int(n)) if score[i, n] > 1e-12 else None


MAX_VISIT = 2  # nodes a cell may require every pipeline to use (each doubles the pricing DP's states)


def _orbit(tables: CostTables, loc: Locality, node: int) -> list[int]:
    """``node`` and the nodes interchangeable with it on which the cell has decided nothing (docs
    §15, orbital branching): "some of them visited" is then "``node`` visited" up to a swap of
    nodes, so the other child may make all of them quiet."""
    L = tables.layers

    def free(m: int) -> bool:
        return m not in loc.visit and not loc.quiet(m, L) and not any(
            k == m for _, k in (*loc.local, *loc.spread))

    # twins of one node are twins of each other (their links to it and to each other are then equal)
    return [m for m in range(len(tables.problem.cluster.nodes))
            if m == node or (free(m) and tables.problem.cluster.interchangeable(node, m))]


def _node_to_branch(tables: CostTables, leaf: _Leaf, penalty: np.ndarray) -> int | None:
    """The node most worth a node-level decision (docs §15): one that can host a local layer
    (G_n ≥ P), undecided, and holding master layers at open floors — scored by that mass times
    the node's spread penalty; None when there is none (or the cell already requires ``MAX_VISIT``)."""
    loc, P, L = leaf.locality, leaf.lo, tables.layers
    if len(loc.visit) >= MAX_VISIT:
        return None
    score = _open_holdings(tables, leaf).sum(axis=0) * penalty
    for n, size in enumerate(tables.physical_sizes):
        if size < P or n in loc.visit or any(m == n for _, m in loc.local) or loc.quiet(n, L):
            score[n] = 0.0
    n = int(np.argmax(score))
    return n if score[n] > 1e-12 else None


# a master whose columns' W differ by this share of the incumbent is cut by W before any pair: on
# mixed-a100-a40-t4 (P = 5: W 0.21-0.40 s in one master) pairs raised its bound 0.009 s per level
W_FIRST_SHARE = 0.01
W_SPLIT_SHARE = 0.002  # a final leaf is split where its master's pipelines' W differ by this share of the incumbent
# a step of the search gets at most the time left over this many (more when the heap is larger): 32
# against 8 before, fluid search alone for 100 s, odd and even P side by side (2026-12-01 22:20 UTC):
# gen-64 2.7135/2.7085 -> 2.7328/2.7246 s, hexiscale-het2 even 7.4855 -> 7.4951, mixed-a100-a40-t4
# even 8.1218 -> 8.1213 (noise), odd and hexiscale-het3 equal: the first slices no longer go to
# whole ranges of P (12 s each at 64 GPUs) before the best-first order can choose
SLICES = 32


def _w_split(leaf: _Leaf, upper_s: float, share: float = W_SPLIT_SHARE) -> float | None:
    """Where to split a final leaf's range of the plan's sync + optimizer time W (docs §15, W cells):
    the master lets each pipeline count only its own floor W_s, while the plan pays the largest
    over its pipelines, so a master mixing columns of low and high W_s is cut halfway between them:
    one child excludes the high ones, the other charges every column at least the cut. None when
    the used columns' W differ by less than ``share`` of ``upper_s``. The search asks first with
    :data:`W_FIRST_SHARE` (a wide spread: cut before any pair) and, for a leaf with nothing else to
    branch on, with :data:`W_SPLIT_SHARE`: narrow cuts made early cost more search time than they
    raised the bound (small-mixed at 10 s: 12.99 → 12.73 s). A column's W above the cell's w_hi (one
    the pricing DP cannot exclude: only its largest sync plus largest optimizer step exceed the cap)
    counts at w_hi, so the cut lies inside the cell: at its W, hexiscale-het2's least leaf (P = 5)
    was cut at its own w_hi 30 times over, the child its parent, for the rest of the search."""
    fl = leaf.result.floors
    ws = sorted({min(fl[i], leaf.w_hi) for i, (_, x) in enumerate(leaf.result.solution)
                 if x > 1e-6 and math.isfinite(fl[i])})
    if len(ws) < 2 or ws[-1] - ws[0] < share * upper_s:
        return None
    cut = 0.5 * (ws[0] + ws[-1])
    return cut if leaf.w_lo < cut < leaf.w_hi else None


def _last_split(tables: CostTables, leaf: _Leaf, upper_s: float,
                penalty: np.ndarray | None) -> tuple[str, tuple[int, int] | float] | None:
    """How a settled one-P leaf with no node left to decide is split: ("W", cut) when its master's
    W spread is wide (:data:`W_FIRST_SHARE`), else ("pair", (layer, node)) when a pair is open
    (P ≥ 2), else ("W", cut) for a narrow spread (:data:`W_SPLIT_SHARE`); None: the leaf is final."""
    cut = _w_split(leaf, upper_s, W_FIRST_SHARE)
    if cut is not None:
        return "W", cut
    pair = _violation(tables, leaf, penalty) if leaf.lo >= 2 and penalty is not None else None
    if pair is not None:
        return "pair", pair
    cut = _w_split(leaf, upper_s)
    return None if cut is None else ("W", cut)


JUMP_SHARE = 0.01  # a jump of the global floor R_P worth this share of the incumbent separates ranges of P
# from here on a root's first certificate is at rate multipliers (fluid_bound.RATE_SHARE): gen-256 / 512, fluid
# search alone 60 s: 1.212 -> 2.278 / 0.248 -> 2.086 s; at 8-64 GPUs no gain (goal run 2026-12-06 08:37 UTC:
# gen-16 lost its proof within 120 s, mixed-a100-a40-t4 8.239 -> 8.222 s; 60 s alone 8.1855 -> 8.1814 s);
# gen-128 loses too (60 s alone 2.6880 -> 2.6786 s; one 15 s solve 2.5961 -> 2.3048 s and a worse plan), gen-256
# at 15 s gains (bound 1.7225 -> 2.2299 s)
RATE_FIRST_MIN_GPUS = 256
# the children of a range split start there too (narrower ranges: their own least P's floors) while the search
# has this many seconds left: fluid search alone 60 s, gen-256 2.2779 -> 2.3119 s, gen-512 equal (its one range
# never converges, so never splits); with less, the certificates take time column generation needs (15 s
# solves: gen-256 bound 2.147 s against 2.205-2.223 s without, gen-512's plan 3.828 s three times against
# 3.633 or 3.828 s; with this guard 2.217 s and 3.633 / 3.828 s, as without)
RANGE_RATE_FIRST_MIN_S = 30.0


def _split(rest: dict[int, float], lo: int, hi: int, upper_s: float, few: int = 8) -> list[tuple[int, int]]:
    """Sub-ranges of [lo, hi]: at the largest jump of the global floor R_P when it is worth 1 % of the
    incumbent (a range's run uses its least P's floors, so a range across a jump is weak: e.g. more
    pipelines than GPUs per node forces inter-node sync); else one P each when there are ``few``
    or less; else halves."""
    P, jump = max(((q, rest[q] - rest[q - 1]) for q in range(lo + 1, hi + 1)), key=lambda t: (t[1], -t[0]))
    if jump >= JUMP_SHARE * upper_s:
        return [(lo, P - 1), (P, hi)]
    if hi - lo + 1 <= few:
        return [(q, q) for q in range(lo, hi + 1)]
    half = (lo + hi) // 2
    return [(lo, half), (half + 1, hi)]


def _jump_ranges(rest: dict[int, float], lo: int, hi: int, upper_s: float) -> list[tuple[int, int]]:
    """[lo, hi] cut before every P where the global floor R_P jumps by 1 % of the incumbent or more —
    the ranges :func:`_split` would reach first, without a run over the whole span (on
    hexiscale-het3 that run took half of the fluid search's time)."""
    cuts = [q for q in range(lo + 1, hi + 1) if rest[q] - rest[q - 1] >= JUMP_SHARE * upper_s]
    return list(zip((lo, *cuts), (*(q - 1 for q in cuts), hi)))


Child = tuple[int, int, Locality, float, float]  # (lo, hi, locality, w_lo, w_hi) of a leaf to run


def _branch(tables: CostTables, leaf: _Leaf, rest: dict[int, float], upper: float, penalty: np.ndarray | None,
            mine: Callable[[int, int], bool], exact_pricing: bool) -> tuple[str, list[Child]] | None:
    """How the least leaf goes on (:func:`best_first_bounds`), as (kind, children): a node decision
    once one P's fractional master has converged ("node": all quiet | visited), more column
    generation while it has not ("more columns", the leaf itself), sub-ranges of P ("range"), then
    a (layer, node) pair or a W cut (:func:`_last_split`), then exact whole-batch pricing as the
    last resort ("exact whole"); None: the leaf is final. ``penalty``: the spread penalty of its P
    (:func:`_spread_penalty`; None until one P's leaf first settles — ranges and P = 1 need none)."""
    lo, hi, loc, w_lo, w_hi = leaf.lo, leaf.hi, leaf.locality, leaf.w_lo, leaf.w_hi
    node = None
    if lo == hi >= 2 and (leaf.settled or leaf.result.whole) and penalty is not None:  # P = 1: no sync
        # once the fractional master has converged, a node decision raises the bound more than
        # the whole-batch phase does (measured on hexiscale-het2), so it comes first
        node = _node_to_branch(tables, leaf, penalty)
    if node is not None:  # no layer local at the node (all spread) | some layer is (all visit it)
        quiet = loc
        for m in _orbit(tables, loc, node):  # interchangeable undecided nodes: all quiet | one visited
            quiet = quiet.with_quiet(m, tables.layers)
        return "node", [(lo, hi, quiet, w_lo, w_hi), (lo, hi, loc.with_visit(node), w_lo, w_hi)]
    if not leaf.settled:
        return "more columns", [(lo, hi, loc, w_lo, w_hi)]  # continue its column generation
    if lo < hi:
        return "range", [(a, b, loc, w_lo, w_hi) for a, b in _split(rest, lo, hi, upper) if mine(a, b)]
    step = _last_split(tables, leaf, upper, penalty)
    if step is not None:
        kind, arg = step
        if isinstance(arg, tuple):  # the pair's layer is local at its node | spread
            return kind, [(lo, hi, loc.with_local(*arg), w_lo, w_hi), (lo, hi, loc.with_spread(*arg), w_lo, w_hi)]
        return kind, [(lo, hi, loc, w_lo, arg), (lo, hi, loc, arg, w_hi)]  # sync + optimizer ≤ the cut | above
    if leaf.result.whole and not leaf.exact and not leaf.result.exact and exact_pricing:
        # nothing left to branch on: before the search stops at this leaf, its whole-batch
        # certificate prices narrow boxes exactly (Pareto labels), which only it can afford
        return "exact whole", [(lo, hi, loc, w_lo, w_hi)]
    return None


def _log_open_leaves(heap: list[_Leaf]) -> None:
    """At debug level, the three least open leaves: where the bound is held (cell and master)."""
    for lf in sorted(heap)[:3] if logger.isEnabledFor(logging.DEBUG) else ():
        logger.debug("open leaf P=%d..%d %.6g s depth %d: visit %s, %d local, %d spread, W (%.4g, %.4g]; master %s",
                     lf.lo, lf.hi, lf.bound, lf.depth, sorted(lf.locality.visit), len(lf.locality.local),
                     len(lf.locality.spread), lf.w_lo, lf.w_hi,
                     "; ".join(f"{x:.3g} x {sh.stages}" for sh, x in lf.result.solution))


def best_first_bounds(tables: CostTables, bounds: dict[int, float], *, upper_s: float, rest: dict[int, float],
                      deadline: float, seed_plans: tuple[Plan, ...] = (), rel_tol: float = 5e-4,
                      gap_tol: float = 1e-6, max_nodes: int = 5000, min_slice: float = 0.5,
                      only: frozenset[int] | None = None,
                      incumbent: Incumbent | None = None) -> tuple[BranchStats, dict[int, FluidResult]]:
    """Raise ``bounds[P]`` (in place) for every P by one best-first search over leaves (a range of
    pipeline counts, a locality cell). The leaf of least bound is, in this order: given more column
    generation while it has not converged; split into sub-ranges (each one's run uses the
    floors of its least P and Σ x ≤ its greatest: valid for the whole range); for one P ≥ 2, split
    on a node (quiet | visited, :func:`_node_to_branch`) as soon as its fractional master has
    converged, else on the (layer, node) pair its master holds fractionally; otherwise final
    (:func:`_split` says how ranges split). Each step gets a slice
    of the time left (at least ``min_slice``), so the least leaf is re-chosen as bounds rise.
    ``rest[P]`` is the global sync + optimizer floor, ``upper_s`` the incumbent. With ``only``, the
    search covers those pipeline counts alone (leaves holding none of them are not made) and leaves
    the other bounds as they are: two searches on two cores share the counts. Also returns, per
    greatest P of a leaf without locality decisions, its latest run (for rounding into plans).
    With ``incumbent``, every leaf's master is rounded into plans as it is solved and a faster
    one replaces the incumbent: from then on leaves are pruned, split and priced against its
    time instead of ``upper_s`` (:mod:`.master_rounding`)."""
    stats = BranchStats()
    upper = upper_s if incumbent is None else min(upper_s, incumbent.time_s)
    pmax = max(bounds)
    heap: list[_Leaf] = []
    leaves: list[_Leaf] = []
    runs: dict[int, FluidResult] = {}
    last: tuple[Shape, ...] = ()  # the latest run's columns: the start of a leaf that has none yet
    penalties: dict[int, np.ndarray] = {}
    tie = 0
    exact_pricing = pricer_for(tables).engine == "jit"  # the labels of an exact whole-batch phase are compiled only
    big = tables.problem.cluster.num_gpus >= RATE_FIRST_MIN_GPUS  # roots start at rate multipliers (fluid_bound)

    def floor_of(lo: int, hi: int) -> float:
        return min(bounds[q] for q in range(lo, hi + 1))

    def mine(lo: int, hi: int) -> bool:
        return only is None or any(lo <= q <= hi for q in only)

    def add(leaf: _Leaf) -> None:
        leaves.append(leaf)
        if leaf.bound < upper * (1 - gap_tol):
            heapq.heappush(heap, leaf)
        else:
            stats.pruned += 1

    none = FluidResult(lb_s=0.0, upper_s=math.inf, iterations=0, columns=0, converged=False)
    for lo, hi in ((1, 1), *_jump_ranges(rest, 2, pmax, upper)) if pmax >= 2 else ((1, 1),):
        if mine(lo, hi):
            tie += 1
            add(_Leaf(floor_of(lo, hi), tie, lo, hi, Locality(), none))
    finals = math.inf  # least bound of a leaf with nothing left to split or branch on
    while heap:
        if time.monotonic() >= deadline or stats.nodes >= max_nodes:
            stats.stopped = "deadline" if stats.nodes < max_nodes else "node limit"
            break
        leaf = heapq.heappop(heap)
        if leaf.bound >= upper * (1 - gap_tol):
            stats.pruned += 1
            continue
        if leaf.bound >= finals:  # the least bound over all leaves is final: nothing can raise it
            heapq.heappush(heap, leaf)
            stats.stopped = "the least leaf has nothing to branch on"
            break
        lo, hi = leaf.lo, leaf.hi
        if lo == hi >= 2 and lo not in penalties and (leaf.settled or leaf.result.whole):
            penalties[lo] = _spread_penalty(tables, lo)
        step = _branch(tables, leaf, rest, upper, penalties.get(lo), mine, exact_pricing)
        if step is None:
            stats.final += 1  # stays in leaves: its bound still counts for P
            finals = min(finals, leaf.bound)
            continue
        kind, children = step
        leaves.remove(leaf)
        exact = leaf.exact or kind == "exact whole"  # (inherited: the cell's leaves stay at the end of the line)
        share = max(min_slice, (deadline - time.monotonic()) / max(SLICES, 2 * len(children), len(heap) + 1))
        for c_lo, c_hi, c_loc, c_wlo, c_whi in children:
            again = len(children) == 1  # more of the same run: it resumes in the phase it reached
            whole = again and leaf.result.whole  # whole-batch certificates are slower: a longer slice
            fr = fluid_lower_bound(tables, pmax=c_hi, replicas=c_lo, rest_s=max(rest[c_lo], c_wlo), upper_s=upper,
                                   seed_plans=seed_plans,
                                   deadline=min(deadline, time.monotonic() + (max(share, 4 * min_slice) if whole
                                                                             else share)),
                                   rel_tol=rel_tol, pool=leaf.result.shapes or last[-4000:], locality=c_loc,
                                   whole=whole, lb_s=leaf.result.lb_s if again else 0.0,
                                   # a root's first run, and a range's children (narrower: stronger rates)
                                   rate_first=big and (leaf.result.iterations == 0 or (
                                       kind == "range" and deadline - time.monotonic() >= RANGE_RATE_FIRST_MIN_S)),
                                   integral=c_lo == c_hi,  # whole batches pay off for one P, not a range
                                   w_cap=c_whi, exact_whole=exact or (whole and leaf.result.exact))
            stats.nodes += 1
            last = fr.shapes
            if incumbent is not None and fr.solution and incumbent.offer(tables, fr.solution, pipelines=c_hi):
                upper = min(upper, incumbent.time_s)  # a better plan: prune and price against it from now on
            if not c_loc.local and not c_loc.spread and not c_loc.visit and c_whi == math.inf:
                runs[c_hi] = fr
            tie += 1
            add(_Leaf(max(leaf.bound, floor_of(c_lo, c_hi), min(upper, fr.lb_s)), tie, c_lo, c_hi, c_loc, fr,
                      leaf.depth + (not again),
                      stalled=again and _stalled(leaf.result, fr, rel_tol),
                      w_lo=c_wlo, w_hi=c_whi, exact=exact))
        logger.info("P=%d..%d depth %d (%s): child bounds %s s", lo, hi, leaf.depth, kind,
                    ", ".join(f"{lf.bound:.6g}" for lf in leaves[-len(children):]))
    stats.open_leaves = len(heap)
    stats.stopped = stats.stopped or "no open leaf below the incumbent"
    _log_open_leaves(heap)
    for P in bounds if only is None else only & bounds.keys():  # every P searched lies in some leaf
        bounds[P] = max(bounds[P], min((lf.bound for lf in leaves if lf.lo <= P <= lf.hi), default=upper))
        bounds[P] = min(bounds[P], upper)
    return stats, runs


def fluid_bounds_by_pipelines(tables: CostTables, *, pmax: int, upper_s: float,
                              seed_plans: tuple[Plan, ...] = (), deadline: float | None = None,
                              rel_tol: float = 5e-4, branch_nodes: int = 5000,
                              only: frozenset[int] | None = None, incumbent: Incumbent | None = None,
                              ) -> tuple[dict[int, float], dict[int, FluidResult]]:
    """Per pipeline count P = 1 … pmax: a lower bound on the iteration time of every plan with P
    pipelines, each at most ``upper_s`` (any plan time: bounds are only claimed below it).

    R_P = :func:`.fluid_bound.rest_lower_bound` is nondecreasing in P, and so is
    each stage's floor w (a ring all-reduce over more replicas costs more), so a run with Σ x ≤ P_hi
    and floors for P_lo replicas covers every P in [P_lo, P_hi]: :func:`best_first_bounds` starts
    from P = 1 and the ranges of 2 … pmax between jumps of R_P (:func:`_jump_ranges`) and splits
    ranges, then locality cells, where the bound is
    least (at most ``branch_nodes`` fluid runs); ``only``: search those P alone, the others keep R_P;
    ``incumbent``: improved by the leaves' rounded masters as the search goes (bounds are then
    claimed below its final time).
    Also returns, per P, the latest run of a leaf whose greatest pipeline count is P
    (``master_rounding.round_master`` turns its master into plans)."""
    rest = {P: rest_lower_bound(tables, P) for P in range(1, pmax + 1)}
    # (each P starts at R_P: starting at the term-by-term floor instead left mixed-a100-a40-t4's 120 s bound
    # lower, 8.2115 / 8.217 s against 8.2203 / 8.227 s, by changing which leaves come first; the exact planner
    # takes the max with that floor per P, _ExactRun._floor)
    out = {P: min(upper_s, rest[P]) for P in rest}
    if pmax < 1:
        return out, {}
    stats, runs = best_first_bounds(tables, out, upper_s=upper_s, rest=rest, seed_plans=seed_plans,
                                    deadline=math.inf if deadline is None else deadline, rel_tol=rel_tol,
                                    max_nodes=branch_nodes, only=only, incumbent=incumbent)
    logger.info("fluid bounds: %s", stats)
    return out, runs
