"""Stage candidates and cost tables shared by the exact plan formulations (and readable by heuristics).

The exact models never re-derive a formula: every number here is tabulated by calling the one
evaluator's :func:`~hexhelix.solver.evaluate.stage_cost` (and :mod:`~hexhelix.solver.cost` for the
collective used by gradient sync) on synthetic stages. Because stage time, memory and optimizer
parameters are affine in the layer count for a fixed (node, TP degree, first/last position,
in-flight micro-batches), two evaluations per option give the exact slope and intercept; the memory
limit is tabulated as the largest layer count the evaluator accepts, so the models' memory
constraints agree with the evaluator bit for bit.

A *stage option* is a TP group of ``tp`` GPUs on node ``node`` (GPUs inside a node are
interchangeable, so the models choose counts per node and concrete GPU ids are assigned when a
solution is decoded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial

import numpy as np
from hexhelix.ir.errors import InvalidInputError, UnsupportedError
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost
from .evaluate import StageCost, stage_cost

__all__ = [
    "CostTables",
    "StageOption",
    "build_tables",
    "identical_node_groups",
    "memory_shortfall",
    "stage_options",
    "synthetic_stage_cost",
]


@dataclass(frozen=True, slots=True)
class StageOption:
    """A candidate stage: ``tp`` GPUs of node ``node`` forming one TP group."""

    index: int
    node: int
    tp: int


def stage_options(problem: PlanProblem, node_sizes: Sequence[int] | None = None) -> list[StageOption]:
    """Every (node, TP degree) whose degree fits the node (``node_sizes``: the physical node behind
    each node of a merged view, :mod:`.node_merge`) and divides heads, KV heads and FFN."""
    out: list[StageOption] = []
    for n, node in enumerate(problem.cluster.nodes):
        for t in range(1, (node.count if node_sizes is None else node_sizes[n]) + 1):
            try:
                problem.model.check_tp(t)
            except InvalidInputError:
                continue
            out.append(StageOption(index=len(out), node=n, tp=t))
    return out


def _position_args(schedule: str, first: bool, last: bool, inflight: int) -> tuple[int, int, int]:
    """(index, num_stages, micro_batches) for :func:`stage_cost` that reproduce a stage's position
    flags and its in-flight micro-batch count under ``schedule``; checked against the cost model."""
    if first and last:
        args = (0, 1, inflight)
    elif last:
        args = (1, 2, inflight)
    elif first:
        args = (0, max(inflight, 2), inflight)
    else:
        args = (1, inflight + 2, inflight)
    got = cost.inflight_microbatches(schedule, args[0], args[1], args[2])
    if got != inflight:
        raise ValueError(f"cannot place a stage with {inflight} in-flight micro-batches "
                         f"(first={first}, last={last}) under {schedule}")
    return args


def synthetic_stage_cost(problem: PlanProblem, opt: StageOption, layers: int, *, first: bool, last: bool,
                         inflight: int = 1, next_node: int | None = None,
                         profile: Profile = DEFAULT_PROFILE) -> StageCost:
    """The evaluator's cost of a stage of option ``opt`` holding ``layers`` layers at the given position."""
    index, num, m = _position_args(problem.schedule, first, last, inflight)
    gpus = tuple(problem.cluster.node_gpus(opt.node)[: opt.tp])
    st = StagePlan(node=opt.node, gpus=gpus, layers=(0, layers))
    nxt = None
    if next_node is not None:
        nxt = StagePlan(node=next_node, gpus=tuple(problem.cluster.node_gpus(next_node)[:1]), layers=(0, 1))
    return stage_cost(problem, st, index, num, m, nxt, profile)


def identical_node_groups(problem: PlanProblem) -> list[list[int]]:
    """Groups of interchangeable nodes (:meth:`~hexhelix.ir.cluster.Cluster.interchangeable`: a
    relation that is transitive, so each node is compared with each group's first)."""
    cl = problem.cluster
    groups: list[list[int]] = []
    for a in range(len(cl.nodes)):
        g = next((g for g in groups if cl.interchangeable(a, g[0])), None)
        if g is None:
            groups.append([a])
        else:
            g.append(a)
    return groups


@dataclass(frozen=True, kw_only=True)
class CostTables:
    """Tabulated per-option costs in seconds (the models scale them to integer ticks)."""

    problem: PlanProblem
    profile: Profile
    options: tuple[StageOption, ...]
    time_layer: dict[int, float]          # seconds per layer per micro-batch (fwd + bwd)
    time_first: dict[int, float]          # embedding fwd + bwd on the first stage
    time_last: dict[int, float]           # norm/head/loss fwd + bwd on the last stage
    comm: dict[tuple[int, int], float]    # boundary send+recv from node a to node b per micro-batch
    opt_layer: dict[int, float]           # optimizer seconds per layer held
    opt_first: dict[int, float]
    opt_last: dict[int, float]
    lmax: dict[tuple[int, bool, bool, int], int] = field(default_factory=dict)  # (opt, first, last, inflight)
    max_inflight: int = 1
    node_sizes: tuple[int, ...] | None = None  # a merged view's physical node behind each node (node_merge)
    _drops: dict[tuple[int, bool, bool, int], list[tuple[int, int]]] = field(default_factory=dict, repr=False)

    @property
    def layers(self) -> int:
        return self.problem.model.layers

    @property
    def micro_batches(self) -> int:
        return self.problem.training.num_micro_batches

    def max_layers(self, c: int, first: bool, last: bool, inflight: int) -> int:
        """Largest layer count of option ``c`` that fits in memory (−1: not even the embedding/head)."""
        v = min(inflight, self.max_inflight)
        key = (c, first, last, v)
        if key not in self.lmax:
            opt = self.options[c]

            def fits(layers: int) -> bool:
                sc = synthetic_stage_cost(self.problem, opt, layers, first=first, last=last, inflight=v,
                                          profile=self.profile)
                return sc.memory_bytes <= sc.capacity_bytes

            # memory is affine in the layer count: estimate the limit from two evaluations, then
            # settle it with the evaluator's own comparison (so float rounding cannot disagree)
            m0 = synthetic_stage_cost(self.problem, opt, 0, first=first, last=last, inflight=v, profile=self.profile)
            m1 = synthetic_stage_cost(self.problem, opt, 1, first=first, last=last, inflight=v, profile=self.profile)
            slope = m1.memory_bytes - m0.memory_bytes
            guess = self.layers if slope <= 0 else int((m0.capacity_bytes - m0.memory_bytes) // slope)
            hi = max(-1, min(self.layers, guess))
            while hi >= 0 and not fits(hi):
                hi -= 1
            while hi < self.layers and fits(hi + 1):
                hi += 1
            self.lmax[key] = hi
        return self.lmax[key]

    def inflight_values(self, c: int, first: bool, last: bool) -> list[tuple[int, int]]:
        """(inflight v, max layers) at each v where the limit strictly drops, until it reaches 0;
        constraints at other v are implied by these (memory grows with v)."""
        key = (c, first, last, -1)
        if key in self._drops:
            return self._drops[key]
        if last and self.problem.schedule == "1f1b":
            self._drops[key] = [(1, self.max_layers(c, first, last, 1))]
            return self._drops[key]
        # the limit is nonincreasing in v: bisect for the drops instead of scanning every v (a step of
        # 10,000 micro-batches: 140,000 memory evaluations per P-model before, a few hundred now)
        lm_of = partial(self.max_layers, c, first, last)
        out: list[tuple[int, int]] = [(1, lm_of(1))]
        todo = [(1, self.max_inflight)]
        while todo and out[-1][1] > 0:
            lo, hi = todo.pop()                     # lm_of(lo) is out[-1][1]; drops in (lo, hi] follow
            if hi <= lo or lm_of(hi) == lm_of(lo):
                continue
            if hi == lo + 1:
                out.append((hi, lm_of(hi)))
                continue
            mid = (lo + hi) // 2
            todo += [(mid, hi), (lo, mid)]          # the left half first: drops come out in order of v
        self._drops[key] = out
        return out

    def sync_layer_lb(self, c: int, pipelines: int, unit_params: float) -> float:
        """A lower bound on one GPU's gradient-sync seconds for a unit of ``unit_params`` parameters
        held by a stage of option ``c`` when there are ``pipelines`` pipelines (0 for one).

        The GPU moves its 1/t share in ring all-reduces over ``pipelines`` ranks at the speed of the
        slowest link among the holders (gradsync). That link is no faster (by gradsync's ordering) than
        the best link leaving this GPU's node, E_n = max(intra(n), max_n' link(n, n')); we take the
        cheapest collective over every cluster link not faster than E_n, with one piece (latency paid
        once): a valid bound, exact when the holders' slowest link is the fastest admissible one."""
        if pipelines < 2:
            return 0.0
        return self._sync_min(self.options[c].node, pipelines, unit_params / self.options[c].tp)

    @property
    def physical_sizes(self) -> tuple[int, ...]:
        """GPUs of one physical node behind each node: the node itself, or in a merged view
        (:mod:`.node_merge`) one of the nodes it stands for. A TP group and the P replicas of a
        layer synced on a node's own link fit within one physical node."""
        return self.node_sizes or tuple(node.count for node in self.problem.cluster.nodes)

    def _sync_min(self, node: int, pipelines: int, params: float) -> float:
        payload = params * self.problem.training.dtype_bytes
        best = self._admissible_links[node]
        return min(cost.collective_time(OpClass.ALL_REDUCE, pipelines, payload, lk, self.profile) for lk in best)

    def admissible_links(self, node: int) -> list[cost.Link]:
        """Cluster links no faster (gradsync's ordering) than the best link leaving ``node``: the
        slowest link among holders that include a GPU of ``node`` is one of these."""
        return self._admissible_links[node]

    @cached_property
    def inter_node_links(self) -> list[cost.Link]:
        """Cluster links no faster (gradsync's ordering) than the fastest link between two different
        nodes: the slowest link among holders on two nodes is one of these (none on one node)."""
        cl = self.problem.cluster
        n = len(cl.nodes)
        if n < 2:
            return []
        top = max(cost.link_order(cost.cluster_link(cl, a, b)) for a in range(n) for b in range(a + 1, n))
        return [lk for lk in cost.cluster_links(cl) if cost.link_order(lk) <= top]

    @cached_property
    def _admissible_links(self) -> dict[int, list[cost.Link]]:
        cl = self.problem.cluster
        n = len(cl.nodes)
        every = cost.cluster_links(cl)
        out: dict[int, list[cost.Link]] = {}
        for a in range(n):
            top = max(cost.link_order(cost.cluster_link(cl, a, b)) for b in range(n))
            out[a] = [lk for lk in every if cost.link_order(lk) <= top]
        return out

    def layer_rates(self) -> np.ndarray:
        """Per node, the best layer-micro-batches per second one of its GPUs works: max_t 1/(t·τ_{n,t})."""
        return np.array([max((1.0 / (o.tp * self.time_layer[o.index]) for o in self.options if o.node == n),
                             default=0.0) for n in range(len(self.problem.cluster.nodes))])

    def gpu_rate_bound(self) -> float:
        """Seconds: the total-work bound on the slowest pipeline, M·L layer-micro-batches over the
        cluster's best layer rate Σ_n G_n · max_t 1/(t·τ_{n,t}) (valid inequality: each stage of a
        pipeline with m micro-batches works m·ℓ·τ seconds, within the pipeline time)."""
        rate = float(self.layer_rates() @ np.array([node.count for node in self.problem.cluster.nodes], dtype=float))
        return self.micro_batches * self.layers / rate if rate > 0 else math.inf


def build_tables(problem: PlanProblem, profile: Profile = DEFAULT_PROFILE, *,
                 node_sizes: Sequence[int] | None = None) -> CostTables:
    """Tabulate every per-option cost the exact models need (a few evaluator calls per option);
    ``node_sizes`` for a merged view (:mod:`.node_merge`)."""
    if problem.schedule not in ("1f1b", "gpipe"):
        raise UnsupportedError(f"the exact plan models support the 1f1b and gpipe schedules, not "
                               f"{problem.schedule!r}; plan with 1f1b and compile with wshape")
    opts = tuple(stage_options(problem, node_sizes))
    if not opts:
        raise InvalidInputError(f"no node can host a TP group of model {problem.model.name} (heads "
                                f"{problem.model.heads})", field="cluster")
    tl, tf, tla, ol, of, ola = {}, {}, {}, {}, {}, {}
    for o in opts:
        def sc(layers: int, first: bool, last: bool, o: StageOption = o) -> StageCost:
            return synthetic_stage_cost(problem, o, layers, first=first, last=last, profile=profile)
        gpu = problem.cluster.gpu_of_node(o.node)
        tr = problem.training
        mid0, mid1 = sc(0, False, False), sc(1, False, False)
        f0, l0 = sc(0, True, False), sc(0, False, True)
        tl[o.index] = (mid1.fwd + mid1.bwd) - (mid0.fwd + mid0.bwd)
        tf[o.index] = (f0.fwd + f0.bwd) - (mid0.fwd + mid0.bwd)
        tla[o.index] = (l0.fwd + l0.bwd) - (mid0.fwd + mid0.bwd)
        ot = [cost.optimizer_time(s.params, gpu, tr, profile) for s in (mid0, mid1, f0, l0)]
        ol[o.index], of[o.index], ola[o.index] = ot[1] - ot[0], ot[2] - ot[0], ot[3] - ot[0]
    comm: dict[tuple[int, int], float] = {}
    n = len(problem.cluster.nodes)
    probe = {o.node: o for o in opts}
    for a in range(n):
        for b in range(n):
            if a in probe:
                comm[(a, b)] = synthetic_stage_cost(problem, probe[a], 0, first=False, last=False,
                                                    next_node=b, profile=profile).comm
    m = problem.training.num_micro_batches
    return CostTables(problem=problem, profile=profile, options=opts, time_layer=tl, time_first=tf,
                      time_last=tla, comm=comm, opt_layer=ol, opt_first=of, opt_last=ola, max_inflight=m,
                      node_sizes=None if node_sizes is None else tuple(node_sizes))


def memory_shortfall(tables: CostTables) -> str | None:
    """A one-line reason when no stage of any option can hold even one layer plus the model's
    states spread over the whole cluster, or when the cluster's total memory is below the model
    states; None when memory does not rule every plan out by this simple test."""
    pb = tables.problem
    model, tr, cl = pb.model, pb.training, pb.cluster
    need = cost.model_state_bytes(model.total_params, 1, tr)
    reserve = tables.profile.runtime_reserve_bytes
    avail = sum(max(0.0, cl.gpu_of_node(i).memory_bytes - reserve) * node.count for i, node in enumerate(cl.nodes))
    per_type: dict[str, int] = {}
    for node in cl.nodes:
        per_type[node.gpu] = per_type.get(node.gpu, 0) + node.count
    desc = ", ".join(f"{g} {cl.gpu_types[g].memory_gib:g} GiB x {c}" for g, c in per_type.items())
    if need > avail:
        return (f"memory: {model.name} needs at least {need / 2**30:.1f} GiB of model states "
                f"({tr.state_bytes_per_param:g} B/param x {model.total_params / 1e9:.2f} B params); the cluster has "
                f"{avail / 2**30:.1f} GiB after the {reserve / 2**30:g} GiB/GPU runtime reserve ({desc})")
    if all(tables.max_layers(o.index, False, False, 1) < 1 for o in tables.options):
        worst = min(synthetic_stage_cost(pb, o, 1, first=False, last=False, profile=tables.profile).memory_bytes
                    for o in tables.options)
        return (f"memory: one layer of {model.name} needs at least {worst / 2**30:.2f} GiB per GPU at "
                f"micro-batch {tr.micro_batch}, seq-len {tr.seq_len}; no GPU has that much ({desc})")
    return None
