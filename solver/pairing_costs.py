"""Costs of DHelix segment pairing: the problem builder, the overlap model and the block cost.

Overlap model (one definition, used by the DP, the lattice MILP, plan scoring and CP-SAT)
---------------------------------------------------------------------------------------
Resources: one compute stream shared by both strands (DHelix's integrated runtime runs both
strands' kernels on the default stream, shared/reference/dhelix.md §2.6; with the default OEF of 0
for compute∥compute nothing is lost), and one stream per link (``intra``, ``inter``). Ops on one
resource never overlap; two communication ops on the same link therefore never overlap, and a
block whose two strands both hold a collective on the same link is *illegal* (DHelix's rule).

Two ops ``a``, ``b`` on different resources that are not ordered by the dependency DAG may run
at the same time. If their execution intervals intersect, the pair pays the interference penalty

    p(a, b) = (1 − min(1, OEF(class_a, class_b))) · min(d_a, d_b),

added to the duration of the *longer* of the two (ties: the communication op, then the later op).
For two ops launched together this reproduces DHelix Eq. 1 exactly: T_ab = max(d_a, d_b) +
(1 − OEF)·min(d_a, d_b) ⇔ OEF = (d_a + d_b − T_ab)/min(d_a, d_b). For partial overlaps it is a
conservative charge (the whole of the shorter op counts as contended). OEFs come from the profile
(``Profile.overlap``, defaults: compute∥collective 0.5–0.9, collectives on different links 1).

Block cost (the barrier model, DHelix §2.4–2.5)
-------------------------------------------------
A block runs a forward segment F and a backward segment B between two barriers. Its cost is

    P(F, B) = makespan of the list schedule of F ∪ B + block_overhead_s,

where the list schedule is: repeatedly start the ready op with the earliest possible start
(max of its in-block predecessors' ends and its resource's free time; ties: longer remaining
path of its strand first, then communication first, then op order) — so collectives launch as
soon as their inputs exist and the other strand's compute fills the wait, as DHelix's runtime
does. Durations are solo durations plus the penalties of every pair found overlapping; the
schedule is recomputed until the set of penalised pairs stops growing (it only grows, so this
terminates), so the final schedule charges every overlap it contains. P(F, ∅) and P(∅, B) are
the same function with one side empty. Because every block is a feasible schedule of the CP-SAT
model (same resources, same penalties), every barrier plan is a feasible CP-SAT schedule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

from hexhelix.ir.catalog import GpuType
from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.opgraph import build_layer_graph
from hexhelix.ir.pairing import PairBlock, PairingPlan, PairingProblem, PairOp
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .cost import Link, op_time

__all__ = [
    "BlockSchedule",
    "CostTable",
    "OverlapModel",
    "build_cost_table",
    "build_pairing_problem",
    "candidate_segments",
    "lower_bound_s",
    "plan_from_blocks",
    "score_plan",
]


def build_pairing_problem(model: ModelConfig, train: TrainingConfig, tp: int, gpu: GpuType, link: Link,
                          profile: Profile = DEFAULT_PROFILE, *, sequence_parallel: bool | None = None,
                          block_overhead_s: float = 0.0) -> PairingProblem:
    """The pairing problem of one layer pair (forward of layer k ∥ backward of layer L−1−k) on a
    TP group of ``tp`` GPUs of type ``gpu`` joined by ``link``.

    Durations come from :func:`hexhelix.solver.cost.op_time`; the overlap table from
    ``profile.oef``. Base groups follow DHelix §1.5: a group boundary on both sides of every
    collective, and a backward weight-gradient GEMM directly followed by a collective is fused
    with it (one unit no cut may split). Activation recompute is not modelled here (the pair is
    the plain forward and backward of one layer).

    Examples
    --------
    >>> from hexhelix.ir.catalog import CATALOG
    >>> from hexhelix.ir.model import PRESETS, TrainingConfig
    >>> p = build_pairing_problem(PRESETS["llama2-13b"], TrainingConfig(), 4, CATALOG["A40"], Link(25e9, 5e-6))
    >>> len(p.fwd), len(p.bwd), len(p.fwd_groups), len(p.bwd_groups)
    (14, 18, 9, 9)
    """
    g = build_layer_graph(model, train, tp, sequence_parallel=sequence_parallel)
    strands = []
    for ops in (g.forward, g.backward):
        strands.append(tuple(PairOp(name=o.name, op_class=o.op_class.value, resource=o.resource.value,
                                    duration_s=op_time(o, gpu, link, profile), deps=o.deps, wgrad=o.wgrad)
                             for o in ops))
    fwd, bwd = strands
    fused = tuple((a.name, b.name) for a, b in itertools.pairwise(bwd) if a.wgrad and b.is_comm)
    meta = {"model": model.name, "gpu": gpu.name, "tp": tp, "sequence_parallel": g.sequence_parallel,
            "seq_len": train.seq_len, "micro_batch": train.micro_batch, "dtype": train.dtype,
            "link_GBps": link.bandwidth / 1e9, "link_latency_us": link.latency * 1e6,
            "profile": profile.device}
    if train.recompute != "none":
        meta["note"] = f"recompute={train.recompute} not modelled in the layer pair"
    return PairingProblem(fwd=fwd, bwd=bwd, oef=dict(profile.oef), block_overhead_s=block_overhead_s,
                          fwd_groups=_base_groups(fwd, ()), bwd_groups=_base_groups(bwd, fused),
                          fused=fused, meta=meta)


def _base_groups(ops: tuple[PairOp, ...], fused: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """Cut on both sides of each collective, but keep a fused (wgrad, collective) run together."""
    in_fused = {n for run in fused for n in run}
    groups: list[list[str]] = []
    for i, op in enumerate(ops):
        prev = ops[i - 1] if i else None
        start = (prev is None or op.is_comm or prev.is_comm or (op.name in in_fused and op.wgrad))
        if op.is_comm and prev is not None and prev.name in in_fused and op.name in in_fused:
            start = False  # collective fused to the wgrad GEMM before it
        if start:
            groups.append([])
        groups[-1].append(op.name)
    return tuple(tuple(g) for g in groups)


# ----------------------------------------------------------------------------- the overlap model
@dataclass(frozen=True, slots=True)
class BlockSchedule:
    """A block's list schedule: start/end per op (seconds from the block start), the pairs that
    pay the interference penalty, and the block cost (makespan + overhead)."""

    starts: dict[int, float]
    ends: dict[int, float]
    overlaps: frozenset[tuple[int, int]]
    cost: float


@dataclass(eq=False)
class OverlapModel:
    """Tabulated overlap model of one problem: solo durations, resources, DAG reachability and
    the penalty of every pair that may overlap (pair key ``(i, j)`` with i < j)."""

    problem: PairingProblem
    base: list[float] = field(init=False)
    resource: list[str] = field(init=False)
    preds: list[tuple[int, ...]] = field(init=False)
    penalty: dict[tuple[int, int], tuple[int, float]] = field(init=False)
    _cache: dict[tuple[tuple[int, ...], tuple[int, ...]], BlockSchedule] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        p = self.problem
        ops = p.ops
        self.base = [float(o.duration_s) for o in ops]
        self.resource = [o.resource for o in ops]
        self.preds = [tuple(p.index(d) for d in o.deps) for o in ops]
        n = len(ops)
        desc: list[set[int]] = [set() for _ in range(n)]
        for i in range(n - 1, -1, -1):
            for q in self.preds[i]:
                desc[q] |= desc[i] | {i}
        self.penalty = {}
        for i in range(n):
            for j in range(i + 1, n):
                if self.resource[i] == self.resource[j] or j in desc[i]:
                    continue
                oef = min(1.0, p.overlap_factor(ops[i].op_class, ops[j].op_class))
                pen = (1.0 - oef) * min(self.base[i], self.base[j])
                bi, bj = self.base[i], self.base[j]
                if bi != bj:
                    who = i if bi > bj else j
                elif ops[i].is_comm != ops[j].is_comm:
                    who = i if ops[i].is_comm else j
                else:
                    who = j
                self.penalty[(i, j)] = (who, pen)

    @cached_property
    def tail(self) -> list[float]:
        """Longest solo-duration path from each op to the end of its strand (list priority)."""
        n = len(self.base)
        t = list(self.base)
        for i in range(n - 1, -1, -1):
            for q in self.preds[i]:
                t[q] = max(t[q], self.base[q] + t[i])
        return t

    def legal(self, ops: tuple[int, ...]) -> bool:
        """False when both strands hold a collective on the same link (DHelix's illegal pair)."""
        seen: dict[str, bool] = {}
        F = self.problem.num_fwd
        for i in ops:
            r = self.resource[i]
            if r != "compute" and seen.setdefault(r, i < F) != (i < F):
                return False
        return True

    def block(self, fwd: tuple[int, ...], bwd: tuple[int, ...]) -> BlockSchedule:
        """P(F, B): the block cost described in the module docstring (cached)."""
        key = (fwd, bwd)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._block(fwd + bwd)
        return hit

    def _block(self, ops: tuple[int, ...]) -> BlockSchedule:
        if len({self.resource[i] for i in ops}) == 1:  # one resource: back to back, nothing overlaps
            t, starts, ends = 0.0, {}, {}
            for i in ops:  # forward then backward, each in topological order
                starts[i], t = t, t + self.base[i]
                ends[i] = t
            return BlockSchedule(starts=starts, ends=ends, overlaps=frozenset(),
                                 cost=t + self.problem.block_overhead_s)
        members = set(ops)
        pairs = [key for a, i in enumerate(ops) for j in ops[a + 1:]
                 if (key := (min(i, j), max(i, j))) in self.penalty]
        charged: set[tuple[int, int]] = set()
        while True:
            dur = {i: self.base[i] for i in ops}
            for key in charged:
                who, pen = self.penalty[key]
                dur[who] += pen
            starts, ends = self._list_schedule(ops, members, dur)
            new = {(i, j) for i, j in pairs if (i, j) not in charged
                   and min(ends[i], ends[j]) > max(starts[i], starts[j])}
            if not new:
                break
            charged |= new
        span = max(ends.values(), default=0.0)
        return BlockSchedule(starts=starts, ends=ends, overlaps=frozenset(charged),
                             cost=span + self.problem.block_overhead_s)

    def _list_schedule(self, ops: tuple[int, ...], members: set[int],
                       dur: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
        free: dict[str, float] = {}
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}
        todo = list(ops)
        tail = self.tail
        while todo:
            best, best_key = -1, None
            for i in todo:
                est = free.get(self.resource[i], 0.0)
                ready = True
                for q in self.preds[i]:
                    if q in members:
                        if q not in ends:
                            ready = False
                            break
                        est = max(est, ends[q])
                if not ready:
                    continue
                key = (est, -tail[i], self.resource[i] == "compute", i)
                if best_key is None or key < best_key:
                    best, best_key = i, key
            assert best_key is not None, "block ops are not closed under in-block dependencies"
            starts[best] = best_key[0]
            ends[best] = best_key[0] + dur[best]
            free[self.resource[best]] = ends[best]
            todo.remove(best)
        return starts, ends


def lower_bound_s(problem: PairingProblem) -> float:
    """max(total compute, busiest link): no schedule of the pair can be shorter (each resource
    runs one op at a time and penalties only lengthen ops)."""
    load: dict[str, float] = {}
    for o in problem.ops:
        load[o.resource] = load.get(o.resource, 0.0) + o.duration_s
    return max(load.values(), default=0.0)


# ----------------------------------------------------------------------------- segments & table
def candidate_segments(problem: PairingProblem, strand: str, segments: str = "groups") -> list[tuple[int, int]]:
    """Candidate segments [a, b) (local indices) of one strand.

    ``groups`` (the paper, DHelix §2.2): every contiguous run inside one base group that does not
    split a fused run — a segmentation is any refinement of the base groups. ``all``: every
    contiguous run of the canonical order (arbitrary cut points, reference §7 W4).
    """
    n = problem.num_fwd if strand == "fwd" else len(problem.bwd)
    if segments == "all":
        return [(a, b) for a in range(n) for b in range(a + 1, n + 1)]
    if segments != "groups":
        raise ValueError(f"segments must be 'groups' or 'all', got {segments!r}")
    mandatory, forbidden = problem.cut_rules(strand)
    out = []
    for a in range(n):
        if a in forbidden:
            continue
        for b in range(a + 1, n + 1):
            if b - 1 > a and (b - 1) in mandatory:
                break
            if b not in forbidden:
                out.append((a, b))
    return out


@dataclass(eq=False)
class CostTable:
    """Block costs over the candidate segments: ``alone_f[(a, b)]`` = P(f[a:b], ∅),
    ``alone_b[(c, d)]`` = P(∅, b[c:d]), ``pair[((a, b), (c, d))]`` = P(f[a:b], b[c:d]) for legal
    pairs only. Indices are local to each strand. A table can also be written by hand (tests)."""

    nf: int
    nb: int
    fwd_segs: list[tuple[int, int]]
    bwd_segs: list[tuple[int, int]]
    alone_f: dict[tuple[int, int], float]
    alone_b: dict[tuple[int, int], float]
    pair: dict[tuple[tuple[int, int], tuple[int, int]], float]


def build_cost_table(problem: PairingProblem, segments: str = "groups",
                     model: OverlapModel | None = None) -> CostTable:
    """Evaluate P for every candidate segment and every legal candidate pair."""
    m = model or OverlapModel(problem)
    F = problem.num_fwd
    fs = candidate_segments(problem, "fwd", segments)
    bs = candidate_segments(problem, "bwd", segments)
    frange = {s: tuple(range(s[0], s[1])) for s in fs}
    brange = {s: tuple(range(F + s[0], F + s[1])) for s in bs}
    alone_f = {s: m.block(frange[s], ()).cost for s in fs}
    alone_b = {s: m.block((), brange[s]).cost for s in bs}
    pair = {}
    for sf in fs:
        for sb in bs:
            ops = frange[sf] + brange[sb]
            if m.legal(ops):
                pair[(sf, sb)] = m.block(frange[sf], brange[sb]).cost
    return CostTable(nf=F, nb=len(problem.bwd), fwd_segs=fs, bwd_segs=bs, alone_f=alone_f, alone_b=alone_b, pair=pair)


# ----------------------------------------------------------------------------- plans
def plan_from_blocks(problem: PairingProblem, blocks: list[tuple[tuple[int, ...], tuple[int, ...]]],
                     meta: dict | None = None) -> PairingPlan:
    """Turn (forward ops, backward ops) global-index blocks into a :class:`PairingPlan`."""
    ops = problem.ops
    out = []
    for f, b in blocks:
        out.append(PairBlock(fwd=tuple(ops[i].name for i in f if not ops[i].is_comm),
                             bwd=tuple(ops[i].name for i in b if not ops[i].is_comm),
                             comm=tuple(ops[i].name for i in sorted(f + b) if ops[i].is_comm)))
    return PairingPlan(blocks=tuple(out), meta={**problem.meta, **(meta or {})})


def score_plan(problem: PairingProblem, plan: PairingPlan, model: OverlapModel | None = None) -> float:
    """Predicted layer-pair time of a barrier plan: Σ over blocks of P(F, B). Validates the plan
    (coverage, dependencies, legality) first; raises InvalidInputError naming the bad block."""
    m = model or OverlapModel(problem)
    total = 0.0
    for f, b in plan.strand_sets(problem):
        total += m.block(f, b).cost
    return total if plan.blocks else math.inf
