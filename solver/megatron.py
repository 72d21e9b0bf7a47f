"""Homogeneous Megatron-style baseline: one uniform TP × PP × DP shape over all GPUs.

This is how a homogeneous framework runs a mixed cluster: it assumes every GPU is alike, so it
splits the layers equally over PP stages, the micro-batches equally over DP replicas, and can only
promise memory for the **smallest** GPU in the cluster (a shape is admissible only if every stage
fits in the smallest GPU's memory; the pace is then set by the slowest GPU in practice).
Among admissible shapes the best is chosen by the one evaluator
(:func:`hexhelix.solver.evaluate.evaluate`), on the real cluster.

Ranks follow Megatron-LM's default order (TP innermost, then DP, then PP): the GPU of TP rank t
of stage s of replica d is ``s·DP·TP + d·TP + t`` in the cluster's device numbering (contiguous
per node), so a TP group stays inside one node exactly when TP divides every node's GPU count.
"""

from __future__ import annotations

import logging
import time

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .evaluate import Evaluation, evaluate
from .result import SolveResult, SolveStatus

__all__ = ["megatron_plan", "megatron_shapes", "plan_megatron"]

logger = logging.getLogger(__name__)


def megatron_shapes(problem: PlanProblem, *, even_layers: bool = True) -> list[tuple[int, int, int]]:
    """Every (TP, PP, DP) with TP·PP·DP = #GPUs, TP dividing the heads and every node's GPU count,
    PP ≤ layers (and dividing them when ``even_layers``), DP dividing the micro-batch count."""
    cl, model, tr = problem.cluster, problem.model, problem.training
    n, L, N = cl.num_gpus, model.layers, tr.num_micro_batches
    out = []
    for tp in range(1, n + 1):
        if n % tp or any(node.count % tp for node in cl.nodes):
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


def megatron_plan(problem: PlanProblem, tp: int, pp: int, dp: int) -> Plan:
    """The uniform plan of shape (tp, pp, dp): equal layers (remainder to the last stages), equal
    micro-batches, Megatron rank order. Raises InvalidInputError if the shape does not fit."""
    cl, L, N = problem.cluster, problem.model.layers, problem.training.num_micro_batches
    devs = cl.devices()
    counts = [L // pp + (1 if s >= pp - L % pp else 0) for s in range(pp)]
    pipes = []
    for d in range(dp):
        stages, lo = [], 0
        for s in range(pp):
            first = s * dp * tp + d * tp
            gpus = tuple(range(first, first + tp))
            stages.append(StagePlan(node=devs[first].node, gpus=gpus, layers=(lo, lo + counts[s])))
            lo += counts[s]
        pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=N // dp))
    return Plan(problem=problem, pipelines=tuple(pipes),
                meta={"solver": "megatron", "tp": tp, "pp": pp, "dp": dp})


def _fits_smallest(problem: PlanProblem, ev: Evaluation) -> bool:
    """Every stage fits the smallest GPU memory of the cluster (the homogeneous view)."""
    cl = problem.cluster
    smallest = min(cl.gpu_of_node(i).memory_bytes for i in range(len(cl.nodes)))
    return all(c.memory_bytes <= smallest for pipe in ev.stages for c in pipe)


def plan_megatron(problem: PlanProblem, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
                  time_limit: float | None = None) -> SolveResult:
    """Best admissible uniform (TP, PP, DP) by the evaluator; deterministic (``seed`` is only echoed).

    Shapes with layers divisible by PP are tried first; if none is admissible, uneven layer counts
    (remainder on the last stages) are allowed. INFEASIBLE when no uniform shape fits the smallest
    GPU, with the reason.
    """
    t0 = time.perf_counter()
    best: tuple[float, Plan, Evaluation, tuple[int, int, int]] | None = None
    tried = 0
    for even in (True, False):
        for shape in megatron_shapes(problem, even_layers=even):
            if not even and problem.model.layers % shape[1] == 0:
                continue
            tried += 1
            plan = megatron_plan(problem, *shape)
            ev = evaluate(plan, profile)
            if _fits_smallest(problem, ev) and (best is None or ev.iteration_time_s < best[0]):
                best = (ev.iteration_time_s, plan, ev, shape)
        if best is not None:
            break
    elapsed = time.perf_counter() - t0
    params = {"seed": seed, "time_limit": time_limit, "shapes_tried": tried}
    if best is None:
        cl = problem.cluster
        smallest = min(cl.gpu_of_node(i).memory_gib for i in range(len(cl.nodes)))
        return SolveResult(solver="megatron", status=SolveStatus.INFEASIBLE, plan=None, evaluation=None,
                           solve_time_s=elapsed, params=params,
                           reason=f"no uniform TP x PP x DP shape over all {cl.num_gpus} GPUs fits the "
                                  f"smallest GPU ({smallest:g} GiB) with {problem.model.name}; "
                                  f"{tried} shapes tried")
    _, plan, ev, (tp, pp, dp) = best
    params.update({"tp": tp, "pp": pp, "dp": dp})
    return SolveResult(solver="megatron", status=SolveStatus.FEASIBLE, plan=plan, evaluation=ev,
                       objective_s=ev.iteration_time_s, bound_s=None, solve_time_s=elapsed, params=params)
