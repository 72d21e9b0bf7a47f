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
from dataclasses import dataclass, replace
from typing import Any

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.errors import UnsupportedError
from hexhelix.ir.lower import NullEstimator, PipeLayout, lower
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.program import Instr, Op, Program, RankInfo, StageInfo
from hexhelix.ir.schedules import SCHEDULE_NAMES

from . import cost
from .evaluate import stage_cost, stage_params

__all__ = ["CostEstimator", "compile_plan", "pair_savings_of"]


def pair_savings_of(pairing: Any, plan: Plan, profile: Profile = DEFAULT_PROFILE
                    ) -> tuple[dict[tuple[str, int], float], dict[str, Any]]:
    """Per-(GPU type, TP degree) saving g of one co-executed layer pair, and what to record in
    the program's ``meta["pairing"]``.

    ``pairing`` is ``None`` (no pairing), a mapping ``{tp: g}`` (every GPU type), or the result of
    :func:`hexhelix.solver.pairing.stage_pairings` — ``{(gpu, tp): PairingResult}``; then
    g = 1 − makespan / sequential time of the layer pair (as
    :func:`hexhelix.solver.pairing.pair_saving`), and the blocks (authors' ``DCBlocks`` form) are
    recorded for the runtime. Savings are clamped to [0, 1)."""
    if pairing is None:
        return {}, {}
    if not isinstance(pairing, Mapping):
        raise UnsupportedError(f"pairing must be a mapping {{tp: g}} or stage_pairings(...) output, "
                               f"got {type(pairing).__name__}")
    gpus = sorted({plan.problem.cluster.gpu_of_node(st.node).name for p in plan.pipelines for st in p.stages})
    savings: dict[tuple[str, int], float] = {}
    meta: dict[str, Any] = {}
    for key, val in pairing.items():
        if isinstance(key, int):
            for g in gpus:
                savings[(g, key)] = min(max(float(val), 0.0), 0.999)
            meta[f"tp{key}"] = {"saving": savings[(gpus[0], key)] if gpus else float(val)}
            continue
        gpu_name, tp = key
        res = val
        g = _result_saving(plan, gpu_name, tp, res, profile)
        savings[(gpu_name, tp)] = g
        meta[f"{gpu_name}/tp{tp}"] = {
            "saving": g, "solver": res.solver, "status": str(res.status.value if hasattr(res.status, "value")
                                                            else res.status),
            "DCBlocks": res.plan.to_dict()["DCBlocks"] if res.plan is not None else None}
    return savings, meta


def _result_saving(plan: Plan, gpu_name: str, tp: int, res: Any, profile: Profile) -> float:
    import math

    from .pairing_costs import build_pairing_problem

    pr = plan.problem
    node = next(st.node for p in plan.pipelines for st in p.stages
                if st.tp == tp and pr.cluster.gpu_of_node(st.node).name == gpu_name)
    problem = build_pairing_problem(pr.model, pr.training, tp, pr.cluster.gpu_of_node(node),
                                    cost.cluster_link(pr.cluster, node, node), profile)
    seq = sum(o.duration_s for o in problem.ops)
    if seq <= 0 or not math.isfinite(res.makespan_s):
        return 0.0
    return min(max(1.0 - res.makespan_s / seq, 0.0), 0.999)


@dataclass(frozen=True, slots=True)
class CostEstimator:
    """:class:`hexhelix.ir.lower.Estimator` backed by the cost model for one plan and profile."""

    plan: Plan
    devices: tuple[int, ...]  # rank -> cluster device id
    profile: Profile = DEFAULT_PROFILE
    savings: Mapping[tuple[str, int], float] | None = None  # (GPU type, TP) -> pair saving g

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
        act = (stage.layers[1] - stage.layers[0]) * cost.activation_bytes_per_layer(pr.model, pr.training, tp, self.profile)
        if stage.head:
            act += cost.head_activation_bytes(pr.model, pr.training, tp)
        return (sc.fwd if op is Op.F else sc.bwd), int(act)

    def compute_layer(self, stage: StageInfo, op: Op, layer: int) -> tuple[float, int]:
        lo, hi = stage.layers
        part = replace(stage, layers=(layer, layer + 1), embed=stage.embed and layer == lo,
                       head=stage.head and layer == hi - 1)
        return self.compute(part, op)

    def boundary_bytes(self) -> int:
        return cost.boundary_bytes(self.plan.problem.model, self.plan.problem.training)

    def p2p(self, src: int, dst: int, nbytes: int) -> float:
        link = cost.cluster_link(self._cluster, self._node(src), self._node(dst))
        return cost.p2p_time(nbytes, link, self.profile)

    def allreduce(self, ranks: tuple[int, ...], elements: int) -> tuple[float, int]:
        nbytes = elements * self.plan.problem.training.dtype_bytes
        nodes = sorted({self._node(r) for r in ranks})
        links = [cost.cluster_link(self._cluster, a, b) for a in nodes for b in nodes if a <= b]
        slow = min(links, key=cost.link_order)
        return cost.collective_time(OpClass.ALL_REDUCE, len(ranks), nbytes, slow, self.profile), nbytes

    def optimizer(self, rank: int, program: Program) -> float:
        model = program.model
        params = sum(stage_params(model, s.layers[1] - s.layers[0], s.embed, s.head) / len(s.ranks)
                     for s in program.stages if rank in s.ranks)
        gpu = self._cluster.devices()[self.devices[rank]].gpu
        return cost.optimizer_time(params, gpu, program.training, self.profile)

    def pair(self, a: Instr, b: Instr, stage: StageInfo) -> float:
        gpu = self._cluster.devices()[self.devices[stage.ranks[0]]].gpu.name
        g = (self.savings or {}).get((gpu, len(stage.ranks)), 0.0)
        return max((1.0 - g) * (a.dur + b.dur), a.dur, b.dur)


def _rank_infos(plan: Plan, devices: tuple[int, ...], schedule: str) -> list[RankInfo]:
    cl, model, tr = plan.problem.cluster, plan.problem.model, plan.problem.training
    devs = cl.devices()
    out = []
    for r, d in enumerate(devices):
        dev = devs[d]
        params = 0.0
        tp = 1
        for pipe in plan.pipelines:
            for k, st in enumerate(pipe.stages):
                if d in st.gpus:  # under W-shape folding the head lands on stage 0 with the embedding
                    head = k == 0 if schedule == "wshape" else k == len(pipe.stages) - 1
                    params, tp = stage_params(model, st.num_layers, k == 0, head), st.tp
        out.append(RankInfo(rank=r, node=cl.nodes[dev.node].name, gpu=dev.gpu.name,
                            capacity_bytes=int(dev.gpu.memory_bytes),
                            state_bytes=int(cost.model_state_bytes(params, tp, tr))))
    return out


def compile_plan(plan: Plan, schedule: str | None = None, profile: Profile = DEFAULT_PROFILE,
                 pairing: Any = None, *, estimates: bool = True, recv_ahead: int = 1) -> Program:
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
        optional DHelix pairing for W-shape (see :func:`pair_savings_of`): when given, every
        co-executed tick is expanded per layer pair (docs/program.md §7) and each layer pair's
        estimate is (1 − g)·(f + b); without it a PAIR holds the whole F and B and its estimate is
        their sum.
    estimates
        False: structure only (every ``dur``/``bytes`` 0; bucket order then follows bucket
        numbering) — for golden files that must not move with the cost model.
    recv_ahead
        post every RECV this many compute ops before its consumer
        (:func:`hexhelix.ir.lower.prepost_recvs`, docs/program.md §4); 0 places each RECV right
        before its consumer, where rendezvous transfers make the receiver wait them out.

    Raises
    ------
    UnsupportedError
        e.g. wshape with a stage of fewer than two layers.
    InvalidInputError
        an unknown schedule, or ``recv_ahead`` not a non-negative integer.
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
    # The simulator reads the reserve and the whole-op PAIR overlap factor from meta, so a
    # program compiled with a measured profile is replayed with that profile's numbers.
    meta = {"compiler": "hexhelix.solver.compile", "plan_hash": plan_hash, "devices": list(devices),
            "profile": profile.device, "runtime_reserve_bytes": profile.runtime_reserve_bytes,
            "pair_oef": profile.overlap("gemm", "gemm")}
    savings, pair_meta = pair_savings_of(pairing, plan, profile)
    if pairing is not None:
        meta["pairing"] = pair_meta
    est = CostEstimator(plan, devices, profile, savings) if estimates else NullEstimator()
    return lower(schedule=schedule, model=plan.problem.model, training=plan.problem.training, pipes=layouts,
                 ranks=_rank_infos(plan, devices, schedule), estimator=est,
                 per_layer_pairs=pairing is not None and schedule == "wshape", meta=meta, recv_ahead=recv_ahead)
