"""Homogeneous Megatron-style baseline: one uniform TP × PP × DP shape over all GPUs.

This is how a homogeneous framework runs a mixed cluster: it assumes every GPU is alike, so it
splits the layers equally over PP stages, the micro-batches equally over DP replicas, and can only
promise memory for the **smallest** GPU in the cluster (a shape is admissible only if every stage
fits in the smallest GPU's memory; the pace is then set by the slowest GPU in practice).
Among admissible shapes the best is chosen by the one evaluator
(:func:`hexhelix.solver.evaluate.evaluate`), on the real cluster. When no shape over all GPUs is
admissible, the GPUs of the smallest-memory types are left out, one type at a time, as a user of a
homogeneous framework would do (the result's ``reason`` says so).

Ranks follow Megatron-LM's default order (TP innermost, then DP, then PP): the GPU of TP rank t
of stage s of replica d is ``s·DP·TP + d·TP + t`` in the cluster's device numbering (contiguous
per node), so a TP group stays inside one node exactly when TP divides every node's GPU count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from hexhelix.ir.errors import InvalidInputError, UnsupportedError
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .evaluate import Evaluation, evaluate
from .result import SolveResult, SolveStatus

__all__ = ["megatron_plan", "megatron_shapes", "node_subsets", "plan_megatron"]

logger = logging.getLogger(__name__)


def megatron_shapes(problem: PlanProblem, *, even_layers: bool = True,
                    nodes: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """Every (TP, PP, DP) with TP·PP·DP = #GPUs (of ``nodes``, default all), TP dividing the heads
    and every node's GPU count, PP ≤ layers (and dividing them when ``even_layers``), DP dividing
    the micro-batch count."""
    cl, model, tr = problem.cluster, problem.model, problem.training
    nodes = list(range(len(cl.nodes))) if nodes is None else list(nodes)
    n, L, N = sum(cl.nodes[i].count for i in nodes), model.layers, tr.num_micro_batches
    out = []
    for tp in range(1, n + 1):
        if n % tp or any(cl.nodes[i].count % tp for i in nodes):
            continue
        try:
            model.check_tp(tp)
        except InvalidInputError:
            continue
        for pp in range(1, n // tp + 1):
            if (n // tp) % pp or pp > L or (even_layers and L % pp):
                continue
            dp = n // (tp * pp)
            if N % dp == 0:
                out.append((tp, pp, dp))
    return out


def megatron_plan(problem: PlanProblem, tp: int, pp: int, dp: int, *, nodes: Sequence[int] | None = None) -> Plan:
    """The uniform plan of shape (tp, pp, dp) on ``nodes`` (default all): equal layers (remainder to
    the last stages), equal micro-batches, Megatron rank order. Raises InvalidInputError if the
    shape does not fit."""
    cl, L, N = problem.cluster, problem.model.layers, problem.training.num_micro_batches
    keep = set(range(len(cl.nodes))) if nodes is None else set(nodes)
    devs = [d for d in cl.devices() if d.node in keep]
    counts = [L // pp + (1 if s >= pp - L % pp else 0) for s in range(pp)]
    pipes = []
    for d in range(dp):
        stages, lo = [], 0
        for s in range(pp):
            first = s * dp * tp + d * tp
            gpus = tuple(dv.id for dv in devs[first:first + tp])
            stages.append(StagePlan(node=devs[first].node, gpus=gpus, layers=(lo, lo + counts[s])))
            lo += counts[s]
        pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=N // dp))
    return Plan(problem=problem, pipelines=tuple(pipes),
                meta={"solver": "megatron", "tp": tp, "pp": pp, "dp": dp})


def _fits_smallest(ev: Evaluation, smallest: float) -> bool:
    """Every stage fits the smallest GPU memory in use (the homogeneous view)."""
    return all(c.memory_bytes <= smallest for pipe in ev.stages for c in pipe)


def node_subsets(problem: PlanProblem) -> list[list[int]]:
    """All nodes, then without the smallest-memory GPU type, and so on (what a user of a
    homogeneous framework does when the smallest card cannot hold the model)."""
    cl = problem.cluster
    mems = sorted({cl.gpu_of_node(i).memory_bytes for i in range(len(cl.nodes))})
    return [[i for i in range(len(cl.nodes)) if cl.gpu_of_node(i).memory_bytes >= m] for m in mems]


def plan_megatron(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
                  time_limit: float | None = None) -> SolveResult:
    """Best admissible uniform (TP, PP, DP) by the evaluator; deterministic (``seed`` is only echoed).

    Shapes with layers divisible by PP are tried first; if none is admissible, uneven layer counts
    (remainder on the last stages) are allowed. If no shape over all GPUs fits the smallest GPU,
    the smallest-memory GPU types are left out one at a time (``reason`` says which, and
    ``params['gpus_used']`` how many GPUs remain). INFEASIBLE when nothing fits, with the reason.
    """
    t0 = time.perf_counter()
    cl = problem.cluster
    best: tuple[float, Plan, Evaluation, tuple[int, int, int]] | None = None
    tried, used = 0, list(range(len(cl.nodes)))
    for used in node_subsets(problem):
        smallest = min(cl.gpu_of_node(i).memory_bytes for i in used)
        for even in (True, False):
            for shape in megatron_shapes(problem, even_layers=even, nodes=used):
                if not even and problem.model.layers % shape[1] == 0:
                    continue
                tried += 1
                plan = megatron_plan(problem, *shape, nodes=used)
                try:
                    ev = evaluate(plan, profile)
                except UnsupportedError:        # e.g. W-shape folding needs >= 2 layers per stage
                    continue
                if _fits_smallest(ev, smallest) and (best is None or ev.iteration_time_s < best[0]):
                    best = (ev.iteration_time_s, plan, ev, shape)
            if best is not None:
                break
        if best is not None:
            break
    elapsed = time.perf_counter() - t0
    params = {"seed": seed, "time_limit": time_limit, "shapes_tried": tried}
    if best is None:
        smallest_gib = min(cl.gpu_of_node(i).memory_gib for i in range(len(cl.nodes)))
        return SolveResult(solver="megatron", status=SolveStatus.INFEASIBLE, plan=None, evaluation=None,
                           solve_time_s=elapsed, params=params,
                           reason=f"no uniform TP x PP x DP shape fits {problem.model.name} on all "
                                  f"{cl.num_gpus} GPUs (smallest {smallest_gib:g} GiB) nor on any subset "
                                  f"without the smallest GPU types; {tried} shapes tried")
    reason = ""
    if len(used) < len(cl.nodes):
        dropped = sorted({cl.nodes[i].gpu for i in range(len(cl.nodes)) if i not in used})
        reason = (f"no uniform shape fits all {cl.num_gpus} GPUs; ran on the "
                  f"{sum(cl.nodes[i].count for i in used)} GPUs left without {', '.join(dropped)}")
    _, plan, ev, (tp, pp, dp) = best
    params.update({"tp": tp, "pp": pp, "dp": dp, "gpus_used": plan.num_gpus_used})
    return SolveResult(solver="megatron", status=SolveStatus.FEASIBLE, plan=plan, evaluation=ev,
                       objective_s=ev.iteration_time_s, bound_s=None, solve_time_s=elapsed, params=params,
                       reason=reason)
