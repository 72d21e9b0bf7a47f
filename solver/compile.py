"""The compiler driver: a Plan plus a schedule → a self-contained per-rank Program.

Rank numbering, per-op estimates and the pairing savings come from here (the solver side owns the
cost model); the structure comes from :func:`hexhelix.ir.lower.lower`. Estimates call
:mod:`hexhelix.solver.cost` / :func:`hexhelix.solver.evaluate.stage_cost` and never re-derive a
formula. Output semantics: docs/program.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.lower import PipeLayout, lower
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.program import Instr, Op, Program, RankInfo, StageInfo
from hexhelix.ir.schedules import SCHEDULE_NAMES

from . import cost
from .evaluate import stage_cost, stage_params

__all__ = ["CostEstimator", "compile_plan", "pair_savings_of"]


def pair_savings_of(pairing: Any) -> dict[int, float]:
    """Per-TP-degree saving g of a co-executed tick from a pairing result.

    Accepts ``None`` (no pairing: g = 0), a mapping ``{tp: g}``, or an object with a
    ``savings`` / ``pair_savings`` mapping or a ``saving(tp)`` method (the pairing engineer's
    PairingPlan). Savings are clamped to [0, 1)."""
    if pairing is None:
        return {}
    table = pairing if isinstance(pairing, Mapping) else getattr(pairing, "savings", None) or getattr(
        pairing, "pair_savings", None)
    if table is None and callable(getattr(pairing, "saving", None)):
        return {tp: min(max(float(pairing.saving(tp)), 0.0), 0.999) for tp in (1, 2, 4, 8, 16)}
    if not isinstance(table, Mapping):
        raise TypeError(f"cannot read pair savings from {type(pairing).__name__}")
    return {int(k): min(max(float(v), 0.0), 0.999) for k, v in table.items()}


@dataclass(frozen=True, slots=True)
class CostEstimator:
    """:class:`hexhelix.ir.lower.Estimator` backed by the cost model for one plan and profile."""

    plan: Plan
    devices: tuple[int, ...]  # rank -> cluster device id
    profile: Profile = DEFAULT_PROFILE
    savings: Mapping[int, float] | None = None

    @property
    def _cluster(self) -> Cluster:
        return self.plan.problem.cluster

    def _node(self, rank: int) -> int:
        return self._cluster.devices()[self.devices[rank]].node

    def _stage_plan(self, stage: StageInfo) -> StagePlan:
        return StagePlan(node=self._node(stage.ranks[0]), gpus=tuple(self.devices[r] for r in stage.ranks),
                         layers=stage.layers)

    def compute(self, stage: StageInfo, op: Op) -> tuple[float, int]:
        # stage_cost marks embedding on index 0 and the head on index num_stages − 1.
        index, num = {(True, True): (0, 1), (True, False): (0, 2), (False, True): (1, 2),
                      (False, False): (1, 3)}[(stage.embed, stage.head)]
        sc = stage_cost(self.plan.problem, self._stage_plan(stage), index, num, 1, None, self.profile)
        pr = self.plan.problem
        tp = len(stage.ranks)
        act = (stage.layers[1] - stage.layers[0]) * cost.activation_bytes_per_layer(pr.model, pr.training, tp)
        if stage.head:
            act += cost.head_activation_bytes(pr.model, pr.training, tp)
        return (sc.fwd if op is Op.F else sc.bwd), int(act)

    def boundary_bytes(self) -> int:
        return cost.boundary_bytes(self.plan.problem.model, self.plan.problem.training)

    def p2p(self, src: int, dst: int, nbytes: int) -> float:
        link = cost.cluster_link(self._cluster, self._node(src), self._node(dst))
        return cost.p2p_time(nbytes, link, self.profile)

    def allreduce(self, ranks: tuple[int, ...], elements: int) -> tuple[float, int]:
        nbytes = elements * self.plan.problem.training.dtype_bytes
        nodes = sorted({self._node(r) for r in ranks})
        links = [cost.cluster_link(self._cluster, a, b) for a in nodes for b in nodes if a <= b]
        slow = min(links, key=lambda lk: lk.bandwidth / (1 + lk.bandwidth * lk.latency))
        return cost.collective_time(OpClass.ALL_REDUCE, len(ranks), nbytes, slow, self.profile), nbytes

    def optimizer(self, rank: int, program: Program) -> float:
        model = program.model
        params = sum(stage_params(model, s.layers[1] - s.layers[0], s.embed, s.head) / len(s.ranks)
                     for s in program.stages if rank in s.ranks)
        gpu = self._cluster.devices()[self.devices[rank]].gpu
        return cost.optimizer_time(params, gpu, program.training, self.profile)

    def pair(self, a: Instr, b: Instr, stage: StageInfo) -> float:
        g = (self.savings or {}).get(len(stage.ranks), 0.0)
        return max((1.0 - g) * (a.dur + b.dur), a.dur, b.dur)


def _rank_infos(plan: Plan, devices: tuple[int, ...]) -> list[RankInfo]:
    cl, model, tr = plan.problem.cluster, plan.problem.model, plan.problem.training
    devs = cl.devices()
    out = []
    for r, d in enumerate(devices):
        dev = devs[d]
        params = 0.0
        tp = 1
        for pipe in plan.pipelines:
            for k, st in enumerate(pipe.stages):
                if d in st.gpus:
                    params, tp = stage_params(model, st.num_layers, k == 0, k == len(pipe.stages) - 1), st.tp
        out.append(RankInfo(rank=r, node=cl.nodes[dev.node].name, gpu=dev.gpu.name,
                            capacity_bytes=int(dev.gpu.memory_bytes),
                            state_bytes=int(cost.model_state_bytes(params, tp, tr))))
    return out


def compile_plan(plan: Plan, schedule: str | None = None, profile: Profile = DEFAULT_PROFILE,
                 pairing: Any = None) -> Program:
    """Compile ``plan`` into per-rank programs (docs/program.md).

    Parameters
    ----------
    plan
        any valid plan; every pipeline is scheduled with its own stage and micro-batch count.
    schedule
        ``gpipe``, ``1f1b`` or ``wshape``; default the plan problem's schedule.
    profile
        cost-model calibration for the per-op ``dur``/``bytes`` estimates.
    pairing
        optional pair savings for W-shape ticks (see :func:`pair_savings_of`); without it a PAIR's
        estimate is the sum of its halves.

    Raises
    ------
    UnsupportedError
        e.g. wshape with a stage of fewer than two layers.
    """
    schedule = schedule or plan.problem.schedule
    if schedule not in SCHEDULE_NAMES:
        from hexhelix.ir.errors import InvalidInputError

        raise InvalidInputError(f"must be one of {', '.join(SCHEDULE_NAMES)}, got {schedule!r}", field="schedule")
    devices = tuple(sorted(g for pipe in plan.pipelines for st in pipe.stages for g in st.gpus))
    rank_of = {d: r for r, d in enumerate(devices)}
    layouts = [PipeLayout(micro_batches=pipe.micro_batches,
                          ranks=tuple(tuple(rank_of[g] for g in st.gpus) for st in pipe.stages),
                          layers=tuple(st.layers for st in pipe.stages)) for pipe in plan.pipelines]
    plan_hash = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    meta = {"compiler": "hexhelix.solver.compile", "plan_hash": plan_hash, "devices": list(devices),
            "profile": profile.device}
    est = CostEstimator(plan, devices, profile, pair_savings_of(pairing))
    return lower(schedule=schedule, model=plan.problem.model, training=plan.problem.training, pipes=layouts,
                 ranks=_rank_infos(plan, devices), estimator=est, pairing=pairing, meta=meta)
