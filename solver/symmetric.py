"""Plans of P identical pipelines, enumerated: a candidate family for hexiscale's portfolio.

Every pipeline has one shape: per *unit*, the same ordered TP split (or none), the units visited in
one order. A unit is a node that every pipeline uses (≤ ⌊G/P⌋ GPUs each), or a group of
interchangeable nodes taken in turn (pipeline p on member p mod k, ≤ ⌊G/⌈P/k⌉⌋ GPUs each, as
hexiscale-het3's two 4-GPU nodes under 8 pipelines). When every unit is a single node, each layer
sits on one node in every pipeline, so its gradient syncs on that node's link — the structure of the
best plans on clusters whose nodes talk over slow links. Phase 2 of hexiscale chooses a block's TP
split by pipeline time alone; here the fastest shapes by pipeline time are scored by the evaluator,
gradient sync included (hexiscale-het3: a 1-GPU 3090 stage with one layer in front, 5.492 → 5.449 s).

A second, separate listing (``mixed=True``) takes one *mixed* unit: one node from each of two groups of
different nodes, taken in turn, the slower node first (pipeline 0, whose layer counts every pipeline
copies, sits on it). Its layers sync over the slower link between the two nodes, which costs least on a
TP stage, where each GPU holds a share: on hexiscale-het1, two pipelines on a 3090 TP 4 stage and two
on a 3080 Ti TP 4 stage with the same three layers beat the best plan of locally synced pipelines
(8.768 → 8.741 s at P = 4).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .candidates import identical_node_groups
from .evaluate import Evaluation, evaluate
from .layer_assign import Stage, tp_splits, valid_tp

__all__ = ["Unit", "best_symmetric", "mixed_unit_sets", "ranked_shapes", "replicate", "unit_sets"]

Layout = Callable[[list[Stage], int], "tuple[tuple[int, ...], float] | None"]
Floor = Callable[[list[tuple[int, int]], int], float]  # (node, TP) of each stage, m → least pipeline time in any order
Fits = Callable[[list[tuple[int, int]], int], bool]    # (node, TP) of each stage in order, m → memory admits them
Shape = tuple[tuple["Unit", tuple[int, ...]], ...]   # (unit, its ordered TP split) in visiting order


@dataclass(frozen=True, slots=True)
class Unit:
    """Nodes a pipeline may take GPUs from: pipeline p uses ``members[p % len(members)]``."""

    members: tuple[int, ...]
    cap: int                  # GPUs per pipeline
    mixed: bool = False       # members of different groups (:func:`mixed_unit_sets`): always used

    def node(self, p: int) -> int:
        return self.members[p % len(self.members)]

    def first_gpu(self, p: int, take: int) -> int:
        """Local index of pipeline p's first GPU on its node (pipelines sharing a node take turns)."""
        return (p // len(self.members)) * take


def unit_sets(problem: PlanProblem, P: int) -> list[list[list[Unit]]]:
    """Every way to cut the nodes into units, as lists of interchangeable units: each group of
    interchangeable nodes is used node by node, or (two or more nodes) as one shared unit."""
    return _cut(problem, P, identical_node_groups(problem))


def _slower_first(problem: PlanProblem, a: int, b: int) -> tuple[int, int]:
    """Nodes a and b, the one with the slower GPU first (less memory, then index, on a tie)."""
    cl = problem.cluster

    def key(n: int) -> tuple[float, float, int]:
        gpu = cl.gpu_of_node(n)
        return gpu.tflops, gpu.memory_bytes, n

    return (a, b) if key(a) <= key(b) else (b, a)


def mixed_unit_sets(problem: PlanProblem, P: int) -> list[list[list[Unit]]]:
    """Unit sets with one mixed unit in front: for each pair of groups of interchangeable nodes, their
    first nodes taken in turn (the slower first; ⌊min G / ⌈P/2⌉⌋ GPUs per pipeline), the groups' other
    nodes cut into units as in :func:`unit_sets`. Needs P ≥ 2: one pipeline would use one node only."""
    if P < 2:
        return []
    cl, groups = problem.cluster, identical_node_groups(problem)
    out = []
    for i, j in itertools.combinations(range(len(groups)), 2):
        a, b = _slower_first(problem, groups[i][0], groups[j][0])
        cap = min(cl.nodes[a].count, cl.nodes[b].count) // math.ceil(P / 2)
        if cap < 1:
            continue
        rest = [g for g in (gr[1:] if k in (i, j) else gr for k, gr in enumerate(groups)) if g]
        out.extend([[Unit((a, b), cap, mixed=True)], *units] for units in _cut(problem, P, rest))
    return out


def _cut(problem: PlanProblem, P: int, groups: list[list[int]]) -> list[list[list[Unit]]]:
    """Every way to cut ``groups`` into units (:func:`unit_sets`' rule)."""
    cl = problem.cluster
    per_group = []
    for g in groups:
        G = cl.nodes[g[0]].count
        modes = [[Unit((n,), G // P) for n in g]]
        if len(g) > 1:
            modes.append([Unit(tuple(g), G // math.ceil(P / len(g)))])
        per_group.append(modes)
    return [list(combo) for combo in itertools.product(*per_group)]


def _splits(problem: PlanProblem, cap: int) -> list[tuple[int, ...]]:
    """() for an unused unit, then every ordered TP split of 1 … cap GPUs."""
    out: list[tuple[int, ...]] = [()]
    for a in range(1, cap + 1):
        for sp in tp_splits(a, valid_tp(problem, a)):
            out.extend(sorted(set(itertools.permutations(sp))))
    return out


class _Budget:
    """Enumeration steps left; spent by every split combination and visiting order looked at. With
    a ``deadline`` (``time.perf_counter()``), also gone once that passes (checked every 1024 steps)."""

    def __init__(self, steps: int | None, deadline: float | None = None):
        self.left, self.deadline, self.taken = steps, deadline, 0

    def spend(self) -> bool:
        """False once the budget is gone (no budget: never)."""
        self.taken += 1
        if self.deadline is not None and self.taken % 1024 == 0 and time.perf_counter() > self.deadline:
            self.left = -1
            return False
        if self.left is None:
            return True
        self.left -= 1
        return self.left >= 0


def _distinct_orders(keys: list[tuple]) -> Iterator[tuple[int, ...]]:
    """Orderings of ``keys`` (as index tuples) that differ in their key sequence; equal keys keep
    their relative order."""
    kinds = sorted(set(keys))
    pools = {k: [i for i, kk in enumerate(keys) if kk == k] for k in kinds}
    taken = dict.fromkeys(kinds, 0)
    out: list[int] = []

    def rec() -> Iterator[tuple[int, ...]]:
        if len(out) == len(keys):
            yield tuple(out)
            return
        for k in kinds:
            if taken[k] < len(pools[k]):
                out.append(pools[k][taken[k]])
                taken[k] += 1
                yield from rec()
                taken[k] -= 1
                out.pop()

    return rec()


def _shapes(problem: PlanProblem, groups: list[list[Unit]], seen: set[tuple], budget: _Budget,
            skip: Callable[[list[tuple[int, int]]], bool] | None = None,
            admit: Callable[[list[tuple[int, int]]], bool] | None = None) -> Iterator[Shape | None]:
    """Shapes over these groups of interchangeable units, one per new sequence of (group, split):
    a multiset of splits per group, then the orders that differ; None once ``budget`` is spent.
    ``skip``: a multiset of stages ((node, TP) each) none of whose orders is wanted; ``admit``: the
    stages of an order that is (else it is left out)."""
    menus = [_splits(problem, units[0].cap)[1:] if units[0].mixed else _splits(problem, units[0].cap)
             for units in groups]   # a mixed unit is never left unused: its listing has no other shapes

    def choices(gi: int) -> Iterator[tuple[tuple[int, ...], ...]]:     # lazily: groups may hold 32 nodes
        if gi == len(groups):
            yield ()
            return
        for combo in itertools.combinations_with_replacement(range(len(menus[gi])), len(groups[gi])):
            for rest in choices(gi + 1):
                yield (combo, *rest)

    for choice in choices(0):
        if not budget.spend():
            yield None
            return
        keys, used = [], []
        for gi, (units, menu, combo) in enumerate(zip(groups, menus, choice)):
            for u, c in zip(units, combo):
                if menu[c]:
                    keys.append((gi, len(u.members), c, u.members if u.mixed else ()))
                    used.append((u, menu[c]))
        if not used or sum(len(c) for _, c in used) > problem.model.layers:
            continue
        kinds = [[(u.node(0), t) for t in split] for u, split in used]
        if skip is not None and skip([k for ks in kinds for k in ks]):
            continue
        for order in _distinct_orders(keys):
            if not budget.spend():
                yield None
                return
            sig = tuple(keys[i] for i in order)
            if sig not in seen:
                seen.add(sig)
                if admit is None or admit([k for i in order for k in kinds[i]]):
                    yield tuple(used[i] for i in order)


def _by_node(problem: PlanProblem) -> dict[int, list[int]]:
    """Device ids of each node (:meth:`Cluster.node_gpus`), looked up once per listing."""
    cl = problem.cluster
    return {n: cl.node_gpus(n) for n in range(len(cl.nodes))}


def _stages(by_node: dict[int, list[int]], shape: Shape, p: int) -> list[Stage]:
    """Pipeline p's stages (node, device ids) under ``shape``."""
    out: list[Stage] = []
    for u, split in shape:
        n, g0 = u.node(p), u.first_gpu(p, sum(split))
        for t in split:
            out.append((n, tuple(by_node[n][g0:g0 + t])))
            g0 += t
    return out


def ranked_shapes(problem: PlanProblem, P: int, layout: Layout, *, max_steps: int | None = None,
                  floor: Floor | None = None, below: float = math.inf, fits: Fits | None = None,
                  deadline: float | None = None, mixed: bool = False,
                  ) -> list[tuple[float, tuple[int, ...], Shape]] | None:
    """(pipeline time, layer counts, shape) of every shape that fits, fastest first, at ⌈M/P⌉
    micro-batches; None when listing the shapes takes more than ``max_steps`` steps (split
    combinations and visiting orders looked at: a deterministic stand-in for a time limit, checked
    before any layout is paid for). With ``floor``, a split combination whose least pipeline time in
    any order is ``below`` or more (or that fits in no order) is left out before its orders are
    listed: it costs one step instead of one per order, and no layout; with ``fits``, so is an order
    that memory does not admit (no layout). ``deadline`` (``time.perf_counter()``): None as well
    when the listing or the layouts run past it. ``mixed``: the shapes with a mixed unit
    (:func:`mixed_unit_sets`) instead, a listing of their own."""
    m = math.ceil(problem.training.num_micro_batches / P)
    skip = None if floor is None else (lambda kinds: floor(kinds, m) >= below)
    admit = None if fits is None else (lambda kinds: fits(kinds, m))
    seen: set[tuple] = set()
    budget, shapes = _Budget(max_steps, deadline), []
    for groups in (mixed_unit_sets if mixed else unit_sets)(problem, P):
        for shape in _shapes(problem, groups, seen, budget, skip, admit):
            if shape is None:
                return None
            shapes.append(shape)
    by_node, out = _by_node(problem), []
    for i, shape in enumerate(shapes):
        if deadline is not None and i % 1024 == 1023 and time.perf_counter() > deadline:
            return None                  # the layouts ran past it too
        lay = layout(_stages(by_node, shape, 0), m)
        if lay is not None:
            out.append((lay[1], lay[0], shape))
    out.sort(key=lambda r: r[0])     # stable: ties keep the enumeration's order
    return out


def replicate(problem: PlanProblem, shape: Shape, counts: Sequence[int], P: int) -> Plan:
    """P pipelines of ``shape`` with these layer counts; micro-batches as even as possible."""
    M, by_node = problem.training.num_micro_batches, _by_node(problem)
    pipes = []
    for p in range(P):
        lo, out = 0, []
        for (n, g), c in zip(_stages(by_node, shape, p), counts):
            out.append(StagePlan(node=n, gpus=g, layers=(lo, lo + c)))
            lo += c
        pipes.append(PipelinePlan(stages=tuple(out), micro_batches=M // P + (p < M % P)))
    return Plan(problem=problem, pipelines=tuple(pipes))


def best_symmetric(problem: PlanProblem, P: int, layout: Layout, profile: Profile = DEFAULT_PROFILE, *,
                   below: float = math.inf, max_steps: int | None = None, deadline: float | None = None,
                   ranked: list[tuple[float, tuple[int, ...], Shape]] | None = None,
                   floor: Floor | None = None, fits: Fits | None = None,
                   mixed: bool = False) -> tuple[Plan, Evaluation] | None:
    """The best evaluated plan of P identical pipelines faster than ``below`` seconds, or None.

    Shapes are evaluated fastest pipeline first, and the scan stops at the first whose pipeline time
    alone reaches the best iteration time so far (sync and optimizer only add to it), so without
    limits the result is the best of the class's shapes, each with the layer counts that minimise its
    pipeline time. Limits (each makes it a heuristic): more than ``max_steps`` listing steps (then
    None), or ``deadline`` (a ``time.perf_counter()`` value). ``ranked``: this P's
    :func:`ranked_shapes`, when already listed; ``floor``: leave out the split combinations whose
    pipelines cannot beat ``below``, and with ``fits`` the orders memory does not admit (the result
    is the same, the listing shorter). ``mixed``: the shapes with a mixed unit (:func:`ranked_shapes`).
    """
    if P > problem.training.num_micro_batches:
        return None
    if ranked is None:
        ranked = ranked_shapes(problem, P, layout, max_steps=max_steps, floor=floor, below=below,
                               fits=fits, deadline=deadline, mixed=mixed)
    best: tuple[Plan, Evaluation] | None = None
    for pipe_s, counts, shape in ranked or ():
        limit = below if best is None else min(below, best[1].iteration_time_s)
        if pipe_s >= limit or (deadline is not None and time.perf_counter() > deadline):
            break
        plan = replicate(problem, shape, counts, P)
        ev = evaluate(plan, profile)
        if ev.feasible and ev.iteration_time_s < limit:
            best = (plan, ev)
    return best
