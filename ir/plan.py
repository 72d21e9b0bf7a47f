"""Plan IR: pipelines of TP stages with layer ranges and micro-batch counts, and the problem they solve.

A plan file is self-contained: it embeds the problem (cluster, model, training, schedule) so
``hexhelix evaluate plan.json`` needs nothing else. Schema ``hexhelix.plan/1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cluster import Cluster
from .errors import InvalidInputError
from .model import ModelConfig, TrainingConfig
from .typed import mapping

__all__ = [
    "PLAN_SCHEMA",
    "PROBLEM_SCHEMA",
    "SCHEDULES",
    "PipelinePlan",
    "Plan",
    "PlanProblem",
    "StagePlan",
]

PLAN_SCHEMA = "hexhelix.plan/1"
PROBLEM_SCHEMA = "hexhelix.problem/1"
SCHEDULES = ("gpipe", "1f1b", "wshape")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanProblem:
    """What to plan for: a cluster, a model, the training settings and the pipeline schedule."""

    cluster: Cluster
    model: ModelConfig
    training: TrainingConfig
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise InvalidInputError(f"must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}",
                                    field="schedule")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROBLEM_SCHEMA, "kind": "plan", "cluster": self.cluster.to_dict(),
                "model": self.model.to_dict(), "training": self.training.to_dict(),
                "schedule": self.schedule}

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> PlanProblem:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a mapping")
            for key in ("cluster", "model", "training"):
                if key not in d:
                    raise InvalidInputError("missing required field", field=key)
            return cls(cluster=Cluster.from_dict(d["cluster"]), model=ModelConfig.from_dict(d["model"]),
                       training=TrainingConfig.from_dict(d["training"]),
                       schedule=d.get("schedule", "1f1b"))
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One pipeline stage: a TP group of GPUs inside one node and the layers [start, end) it holds."""

    node: int
    gpus: tuple[int, ...]
    layers: tuple[int, int]

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": list(self.gpus), "layers": list(self.layers)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePlan:
        return cls(node=int(d["node"]), gpus=tuple(int(g) for g in d["gpus"]),
                   layers=(int(d["layers"][0]), int(d["layers"][1])))


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """A data-parallel replica: ordered stages and how many micro-batches it runs per step."""

    stages: tuple[StagePlan, ...]
    micro_batches: int

    def to_dict(self) -> dict[str, Any]:
        return {"micro_batches": self.micro_batches, "stages": [s.to_dict() for s in self.stages]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelinePlan:
        return cls(stages=tuple(StagePlan.from_dict(s) for s in d["stages"]),
                   micro_batches=int(d["micro_batches"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A complete asymmetric DP x PP x TP plan for ``problem``; ``meta`` records who made it."""

    problem: PlanProblem
    pipelines: tuple[PipelinePlan, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Structural validity (not memory): raise InvalidInputError naming the first violation."""
        cl, model, tr = self.problem.cluster, self.problem.model, self.problem.training
        if not self.pipelines:
            raise InvalidInputError("a plan needs at least one pipeline", field="pipelines")
        used: dict[int, str] = {}
        ngpu = cl.num_gpus
        for p, pipe in enumerate(self.pipelines):
            where = f"pipelines[{p}]"
            if pipe.micro_batches < 1:
                raise InvalidInputError(f"must be >= 1, got {pipe.micro_batches}", field=f"{where}.micro_batches")
            if not pipe.stages:
                raise InvalidInputError("a pipeline needs at least one stage", field=f"{where}.stages")
            expect = 0
            for k, st in enumerate(pipe.stages):
                sw = f"{where}.stages[{k}]"
                if not 0 <= st.node < len(cl.nodes):
                    raise InvalidInputError(f"node index {st.node} out of range", field=f"{sw}.node")
                node_gpus = set(cl.node_gpus(st.node))
                if not st.gpus:
                    raise InvalidInputError("a stage needs at least one GPU", field=f"{sw}.gpus")
                for g in st.gpus:
                    if not 0 <= g < ngpu:
                        raise InvalidInputError(f"GPU {g} does not exist (cluster has {ngpu})", field=f"{sw}.gpus")
                    if g not in node_gpus:
                        raise InvalidInputError(f"GPU {g} is not in node {cl.nodes[st.node].name}; a TP group "
                                                "must stay inside one node", field=f"{sw}.gpus")
                    if g in used:
                        raise InvalidInputError(f"GPU {g} is already used by {used[g]}", field=f"{sw}.gpus")
                    used[g] = sw
                try:
                    model.check_tp(st.tp)
                except InvalidInputError as err:
                    raise InvalidInputError(err.message, field=f"{sw}.gpus") from None
                lo, hi = st.layers
                if lo != expect or hi <= lo:
                    raise InvalidInputError(
                        f"layers must be a non-empty range starting at {expect}, got [{lo}, {hi})",
                        field=f"{sw}.layers")
                expect = hi
            if expect != model.layers:
                raise InvalidInputError(f"stages hold {expect} layers, the model has {model.layers}",
                                        field=f"{where}.stages")
        total = sum(p.micro_batches for p in self.pipelines)
        if total != tr.num_micro_batches:
            raise InvalidInputError(
                f"micro-batches sum to {total}, but global batch {tr.global_batch} / micro-batch "
                f"{tr.micro_batch} = {tr.num_micro_batches}", field="pipelines")

    @property
    def num_gpus_used(self) -> int:
        return sum(len(s.gpus) for p in self.pipelines for s in p.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, "problem": self.problem.to_dict(),
                "pipelines": [p.to_dict() for p in self.pipelines], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> Plan:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a mapping")
            if d.get("schema") != PLAN_SCHEMA:
                raise InvalidInputError(f"expected schema {PLAN_SCHEMA!r}, got {d.get('schema')!r}; "
                                        "re-export the plan with this version of hexhelix", field="schema")
            if "problem" not in d or "pipelines" not in d:
                raise InvalidInputError("missing required field", field="problem" if "problem" not in d else "pipelines")
            pipes = _parse_pipelines(d["pipelines"])
            return cls(problem=PlanProblem.from_dict(d["problem"]), pipelines=pipes, meta=mapping(d.get("meta"), "meta"))
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


def _parse_pipelines(raw: Any) -> tuple[PipelinePlan, ...]:
    """Parse the ``pipelines`` list; a missing or mistyped entry names its path
    (``pipelines[1].stages[0].layers``)."""
    if not isinstance(raw, list):
        raise InvalidInputError("must be a list of pipelines", field="pipelines")
    out = []
    for p, pipe in enumerate(raw):
        where = f"pipelines[{p}]"
        if not isinstance(pipe, dict) or not isinstance(pipe.get("stages"), list):
            raise InvalidInputError("malformed pipeline entry: expected {micro_batches, stages: [...]}",
                                    field=where)
        for k, st in enumerate(pipe["stages"]):
            try:
                StagePlan.from_dict(st)
            except (KeyError, TypeError, ValueError, IndexError) as err:
                missing = f" (missing {err})" if isinstance(err, KeyError) else ""
                raise InvalidInputError(f"malformed pipeline entry: expected {{node, gpus, layers: [lo, hi]}}"
                                        f"{missing}", field=f"{where}.stages[{k}]") from None
        try:
            out.append(PipelinePlan.from_dict(pipe))
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidInputError(f"malformed pipeline entry ({err!s})", field=where) from None
    return tuple(out)
