"""The one evaluator: scores any plan (exact, heuristic, baseline or hand-written) with the cost
model, so every comparison in hexhelix is made on the same ruler.

Iteration time = slowest pipeline (1F1B/GPipe: (m−1)·max u + Σ u; W-shape: see
:func:`~hexhelix.solver.cost.wshape_pipeline_time`) + gradient synchronisation across pipelines
(not overlapped) + the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hexhelix.ir.model import ModelConfig
from hexhelix.ir.plan import Plan, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost
from .gradsync import grad_sync_time

__all__ = ["Evaluation", "StageCost", "evaluate", "stage_cost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """Per-micro-batch seconds and per-GPU bytes of one stage in its pipeline."""

    fwd: float
    bwd: float
    comm: float           # outgoing boundary: activation send + gradient send (0 on the last stage)
    memory_bytes: float
    capacity_bytes: float
    params: float         # parameters held per GPU (after TP sharding)

    @property
    def time(self) -> float:
        """u_k of the pipeline formula: fwd + bwd + boundary communication."""
        return self.fwd + self.bwd + self.comm


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """The cost model's verdict on a plan; ``feasible`` is False when some GPU runs out of memory."""

    iteration_time_s: float
    pipeline_times_s: tuple[float, ...]
    grad_sync_s: float
    optimizer_s: float
    throughput_tokens_per_s: float
    mfu: float
    stages: tuple[tuple[StageCost, ...], ...]
    violations: tuple[str, ...] = field(default=())

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_time_s": self.iteration_time_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "mfu": self.mfu,
            "pipeline_times_s": list(self.pipeline_times_s),
            "grad_sync_s": self.grad_sync_s,
            "optimizer_s": self.optimizer_s,
            "feasible": self.feasible,
            "violations": list(self.violations),
            "stages": [[{"fwd_s": s.fwd, "bwd_s": s.bwd, "comm_s": s.comm, "memory_bytes": s.memory_bytes,
                         "capacity_bytes": s.capacity_bytes} for s in pipe] for pipe in self.stages],
        }


def stage_params(model: ModelConfig, num_layers: int, first: bool, last: bool) -> float:
    """Parameters of a stage before TP sharding: its layers plus embedding (first) and head (last)."""
    return (num_layers * model.params_per_layer + (model.embedding_params if first else 0)
            + (model.head_params if last else 0))


def stage_cost(plan_or_problem: Any, stage: StagePlan, index: int, num_stages: int, micro_batches: int,
               next_stage: StagePlan | None, profile: Profile = DEFAULT_PROFILE,
               schedule: str | None = None) -> StageCost:
    """Cost of stage ``index`` of a pipeline with ``num_stages`` stages running ``micro_batches``."""
    problem = getattr(plan_or_problem, "problem", plan_or_problem)
    cl, model, tr = problem.cluster, problem.model, problem.training
    sched = schedule or problem.schedule
    gpu = cl.gpu_of_node(stage.node)
    intra = cost.cluster_link(cl, stage.node, stage.node)
    lc = cost.layer_cost(model, tr, stage.tp, gpu, intra, profile)
    # W-shaped folding puts both ends of the model (embedding and head) on stage 0
    # (shared/reference/dhelix.md §3.1) and doubles the point-to-point messages per boundary (§3.6).
    folded = sched == "wshape"
    first, last = index == 0, (index == 0 if folded else index == num_stages - 1)
    heads = cost.head_cost(model, tr, stage.tp, gpu, profile)
    fwd = stage.num_layers * lc.fwd + (heads["embed_fwd"] if first else 0.0) + (heads["head_fwd"] if last else 0.0)
    bwd = stage.num_layers * lc.bwd + (heads["embed_bwd"] if first else 0.0) + (heads["head_bwd"] if last else 0.0)
    comm = 0.0
    if next_stage is not None:
        link = cost.cluster_link(cl, stage.node, next_stage.node)
        comm = (4.0 if folded else 2.0) * cost.stage_edge_cost(model, tr, link, profile)
    params = stage_params(model, stage.num_layers, first, last) / stage.tp
    inflight = cost.inflight_microbatches(sched, index, num_stages, micro_batches)
    act = stage.num_layers * cost.activation_bytes_per_layer(model, tr, stage.tp, profile) * inflight
    if last:
        act += cost.head_activation_bytes(model, tr, stage.tp)
    mem = cost.model_state_bytes(params * stage.tp, stage.tp, tr) + act + profile.runtime_reserve_bytes
    return StageCost(fwd=fwd, bwd=bwd, comm=comm, memory_bytes=mem, capacity_bytes=float(gpu.memory_bytes),
                     params=params)


def evaluate(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, pair_savings: dict[int, float] | None = None) -> Evaluation:
    """Score ``plan`` with the cost model.

    ``pair_savings`` (W-shape only) maps a TP degree to the per-tick saving g of co-executing two
    strands (from the pairing solver); missing degrees count as g = 0.
    """
    problem = plan.problem
    cl, model, tr = problem.cluster, problem.model, problem.training
    stages_out: list[tuple[StageCost, ...]] = []
    pipe_times: list[float] = []
    violations: list[str] = []
    opt = 0.0
    seen: dict[tuple, StageCost] = {}  # pipelines of one plan repeat stages (P identical ones: all of them)

    def cost_of(st: StagePlan, k: int, n: int, m: int, nxt: StagePlan | None) -> StageCost:
        key = (st.node, st.tp, st.num_layers, k, n, m, None if nxt is None else nxt.node)
        got = seen.get(key)
        if got is None:
            got = seen[key] = stage_cost(problem, st, k, n, m, nxt, profile)
        return got

    for p, pipe in enumerate(plan.pipelines):
        n = len(pipe.stages)
        costs = tuple(cost_of(st, k, n, pipe.micro_batches, pipe.stages[k + 1] if k + 1 < n else None)
                      for k, st in enumerate(pipe.stages))
        stages_out.append(costs)
        u = [c.time for c in costs]
        if problem.schedule == "wshape":
            g = [(pair_savings or {}).get(st.tp, 0.0) for st in pipe.stages]
            pipe_times.append(cost.wshape_pipeline_time(u, g, pipe.micro_batches,
                                                        [(c.fwd, c.bwd) for c in costs]))
        else:
            pipe_times.append(cost.pipeline_time(u, pipe.micro_batches))
        for k, (st, c) in enumerate(zip(pipe.stages, costs)):
            if c.memory_bytes > c.capacity_bytes:
                violations.append(
                    f"memory: pipeline {p} stage {k} ({cl.nodes[st.node].gpu} x{st.tp}, {st.num_layers} layers) "
                    f"needs {c.memory_bytes / 2**30:.2f} GiB per GPU, has {c.capacity_bytes / 2**30:.2f} GiB")
            gpu = cl.gpu_of_node(st.node)
            opt = max(opt, cost.optimizer_time(c.params, gpu, tr, profile))
    sync = grad_sync_time(plan, profile)
    it = max(pipe_times) + sync + opt
    tokens = tr.global_batch * tr.seq_len
    mfu = tokens * cost.model_flops_per_token(model, tr.seq_len) / it / cl.total_peak_flops()
    return Evaluation(iteration_time_s=it, pipeline_times_s=tuple(pipe_times), grad_sync_s=sync, optimizer_s=opt,
                      throughput_tokens_per_s=tokens / it, mfu=mfu, stages=tuple(stages_out),
                      violations=tuple(violations))


