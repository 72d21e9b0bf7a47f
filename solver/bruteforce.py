"""Exhaustive enumeration of every plan of a tiny instance, scored by the evaluator: the test oracle
of the exact models (conventions 14). Independent of the formulations: it uses only the plan IR and
:func:`~hexhelix.solver.evaluate.evaluate`.

Enumerated: every pipeline count, every ordered sequence of (node, TP degree) stages within the node
capacities, every composition of the layers over the stages, every multiset of pipelines that fits
the cluster together, every split of the micro-batches. GPUs inside a node are interchangeable for
the cost model, so they are handed out in order. Instances must be tiny (≤ 8 GPUs, ≤ 8 layers);
``limit`` caps the number of evaluated plans.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .candidates import stage_options
from .evaluate import Evaluation, evaluate
from .result import SolveResult, SolveStatus

__all__ = ["compositions", "enumerate_plans", "plan_bruteforce"]

Shape = tuple[tuple[int, int, int], ...]  # ((node, tp, layers), ...)


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Ordered ways to write ``total`` as ``parts`` positive integers.

    >>> list(compositions(3, 2))
    [(1, 2), (2, 1)]
    """
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


def _shapes(problem: PlanProblem) -> list[Shape]:
    cl, L = problem.cluster, problem.model.layers
    opts = [(o.node, o.tp) for o in stage_options(problem)]
    caps = [n.count for n in cl.nodes]
    out: list[Shape] = []

    def extend(seq: list[tuple[int, int]], used: list[int]) -> None:
        if seq:
            for lay in compositions(L, len(seq)):
                out.append(tuple((n, t, ell) for (n, t), ell in zip(seq, lay)))
        if len(seq) == L:
            return
        for n, t in opts:
            if used[n] + t <= caps[n]:
                used[n] += t
                seq.append((n, t))
                extend(seq, used)
                seq.pop()
                used[n] -= t

    extend([], [0] * len(caps))
    return out


def _usage(shape: Shape, nodes: int) -> list[int]:
    u = [0] * nodes
    for n, t, _ in shape:
        u[n] += t
    return u


def enumerate_plans(problem: PlanProblem) -> Iterator[Plan]:
    """Every plan of ``problem`` up to GPU relabelling inside a node."""
    cl = problem.cluster
    caps = [n.count for n in cl.nodes]
    shapes = _shapes(problem)
    usage = [_usage(s, len(caps)) for s in shapes]
    M = problem.training.num_micro_batches

    def multisets(start: int, left: list[int], depth: int) -> Iterator[tuple[int, ...]]:
        if depth == 0:
            yield ()
            return
        for i in range(start, len(shapes)):
            if all(u <= c for u, c in zip(usage[i], left)):
                rest = [c - u for u, c in zip(usage[i], left)]
                for tail in multisets(i, rest, depth - 1):
                    yield (i, *tail)

    for P in range(1, min(M, cl.num_gpus) + 1):
        for combo in multisets(0, list(caps), P):
            for split in compositions(M, P):
                free = {n: list(cl.node_gpus(n)) for n in range(len(caps))}
                pipes = []
                for i, m in zip(combo, split):
                    stages, start = [], 0
                    for n, t, ell in shapes[i]:
                        gpus = tuple(free[n][:t])
                        del free[n][:t]
                        stages.append(StagePlan(node=n, gpus=gpus, layers=(start, start + ell)))
                        start += ell
                    pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=m))
                yield Plan(problem=problem, pipelines=tuple(pipes))


def plan_bruteforce(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
                    time_limit: float | None = None, limit: int = 200_000) -> SolveResult:
    """Evaluate every plan; the best feasible one is optimal by exhaustion (bound = its time)."""
    if problem.cluster.num_gpus > 8 or problem.model.layers > 8:
        raise InvalidInputError(f"brute force is for tiny instances (<= 8 GPUs, <= 8 layers), got "
                                f"{problem.cluster.num_gpus} GPUs and {problem.model.layers} layers", field="--solver")
    t0 = time.monotonic()
    best: tuple[Plan, Evaluation] | None = None
    count = 0
    for plan in enumerate_plans(problem):
        count += 1
        if count > limit or (time_limit is not None and time.monotonic() - t0 > time_limit):
            return SolveResult(solver="bruteforce", status=SolveStatus.TIMEOUT, plan=best[0] if best else None,
                               evaluation=best[1] if best else None, solve_time_s=time.monotonic() - t0,
                               reason=f"stopped after {count - 1} plans", params={"plans": count - 1})
        ev = evaluate(plan, profile)
        if ev.feasible and (best is None or ev.iteration_time_s < best[1].iteration_time_s):
            best = (plan, ev)
    dt = time.monotonic() - t0
    if best is None:
        return SolveResult(solver="bruteforce", status=SolveStatus.INFEASIBLE, plan=None, evaluation=None,
                           solve_time_s=dt, reason=f"memory: none of the {count} plans fits in GPU memory",
                           params={"plans": count})
    plan = Plan(problem=problem, pipelines=best[0].pipelines, meta={"solver": "bruteforce"})
    return SolveResult(solver="bruteforce", status=SolveStatus.OPTIMAL, plan=plan, evaluation=best[1],
                       objective_s=best[1].iteration_time_s, bound_s=best[1].iteration_time_s, solve_time_s=dt,
                       params={"plans": count, "seed": seed})
