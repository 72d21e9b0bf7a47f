"""Fluid masters rounded into plans, and the incumbent a bound search keeps (the primal side).

The fluid master of :mod:`.fluid_bound` holds fractional pipelines of priced shapes; rounding it
(:func:`round_master`) gives whole plans, which the one evaluator scores. A bound search that rounds
each master it solves (:class:`Incumbent`) prunes and prices later leaves against the best plan so
far instead of the heuristic it started from: on the 64-GPU generated cluster the fluid search over
odd pipeline counts proved 2.691 s in 100 s against hexiscale's 2.876 s and 2.729 s once its first
range's master rounded to a 2.780 s plan (2026-12-01, docs/formulation.md §11). Rounded plans are
heuristics: never optimal by themselves.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass

from hexhelix.ir.plan import PipelinePlan, Plan, StagePlan

from .candidates import CostTables
from .evaluate import evaluate
from .shape_pricing import Shape

__all__ = ["Incumbent", "round_master"]

logger = logging.getLogger(__name__)


@dataclass
class Incumbent:
    """The best plan a search knows and its evaluated time (an upper bound on the optimum);
    :meth:`offer` replaces it by a rounded master when that evaluates faster."""

    plan: Plan | None
    time_s: float
    improved: int = 0  # masters whose rounding replaced it

    def offer(self, tables: CostTables, solution: tuple[tuple[Shape, float], ...], *, pipelines: int) -> bool:
        """Round ``solution`` (a master with at most ``pipelines`` pipelines), keep the fastest
        feasible plan if it beats the incumbent; whether it did."""
        better = False
        for plan in round_master(tables, solution, pipelines=pipelines):
            ev = evaluate(plan, tables.profile)
            if ev.feasible and ev.iteration_time_s < self.time_s * (1 - 1e-12):
                self.plan, self.time_s, better = plan, ev.iteration_time_s, True
        if better:
            self.improved += 1
            logger.info("incumbent %.6g s from a rounded master (P <= %d)", self.time_s, pipelines)
        return better


def round_master(tables: CostTables, solution: tuple[tuple[Shape, float], ...], *, pipelines: int) -> list[Plan]:
    """Integer plans from a fractional master solution (the primal side; heuristics, never optimal
    by themselves): ⌊x⌋ copies of each shape, then shapes by decreasing fractional part and by
    micro-batch rate per GPU while GPUs and the pipeline count allow; micro-batches handed out one
    at a time to the pipeline that finishes it first, (m−1)·U + S; GPU ids in node order. Plans that
    break memory under the real in-flight counts are dropped by the caller's evaluator."""
    caps = [node.count for node in tables.problem.cluster.nodes]
    M = tables.micro_batches
    if not solution:
        return []
    shapes = [sh for sh, _ in solution]
    x = [v for _, v in solution]
    order = sorted(range(len(shapes)), key=lambda i: (-(x[i] - math.floor(x[i] + 1e-9)), -x[i]))
    extra = sorted(range(len(shapes)), key=lambda i: shapes[i].bottleneck * sum(shapes[i].gpus))
    out: list[Plan] = []
    limit = min(pipelines, M)
    for round_up, fill in ((True, False), (True, True), (False, True)):
        used = [0] * len(caps)
        chosen: list[Shape] = []
        for i in range(len(shapes)):
            for _ in range(math.floor(x[i] + 1e-9)):
                _take(shapes[i], chosen, used, caps, limit)
        if round_up:
            for i in order:
                if x[i] - math.floor(x[i] + 1e-9) > 1e-9:
                    _take(shapes[i], chosen, used, caps, limit)
        if fill:
            for i in extra:
                while _take(shapes[i], chosen, used, caps, limit):
                    pass
        if chosen:
            out.append(_decode(tables, chosen, M))
    return out


def _take(sh: Shape, chosen: list[Shape], used: list[int], caps: list[int], limit: int) -> bool:
    """Add one pipeline of shape ``sh`` if the GPUs and the pipeline count allow."""
    if len(chosen) >= limit or any(u + g > c for u, g, c in zip(used, sh.gpus, caps)):
        return False
    chosen.append(sh)
    for n, g in enumerate(sh.gpus):
        used[n] += g
    return True


def _decode(tables: CostTables, chosen: list[Shape], M: int) -> Plan:
    """Pipelines of ``chosen`` shapes with micro-batches by greedy finishing time and GPU ids."""
    m = [1] * len(chosen)
    heap = [(s.total + s.bottleneck, p) for p, s in enumerate(chosen)]
    heapq.heapify(heap)
    for _ in range(M - len(chosen)):
        _, p = heapq.heappop(heap)
        m[p] += 1
        heapq.heappush(heap, (chosen[p].total + m[p] * chosen[p].bottleneck, p))
    cl = tables.problem.cluster
    free = {n: list(cl.node_gpus(n)) for n in range(len(cl.nodes))}
    pipes = []
    for p, s in enumerate(chosen):
        stages, start = [], 0
        for c, ell in s.stages:
            o = tables.options[c]
            gpus = tuple(free[o.node][: o.tp])
            del free[o.node][: o.tp]
            stages.append(StagePlan(node=o.node, gpus=gpus, layers=(start, start + ell)))
            start += ell
        pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=m[p]))
    return Plan(problem=tables.problem, pipelines=tuple(pipes), meta={"solver": "fluid-rounding"})
