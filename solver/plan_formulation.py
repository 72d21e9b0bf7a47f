"""The joint heterogeneous-plan formulation for a fixed pipeline count P, as one backend-neutral
integer-linear model that both CP-SAT (:mod:`.cpsat_plan`) and PuLP/CBC/HiGHS (:mod:`.milp_plan`)
solve, so the two backends answer the same question. The math is in ``docs/formulation.md``.

All times are integer *ticks* (``scale`` ticks per second); every cost coefficient is rounded
**down**, so the model's value of any plan is at most its evaluator time: the model is a relaxation
and its bound is a valid lower bound. Gradient synchronisation is represented by a valid lower bound
per stage plus exact *no-good cuts* added lazily by :mod:`.exact_plan` (logic-based Benders).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hexhelix.ir.plan import PipelinePlan, Plan, StagePlan

from .candidates import CostTables, identical_node_groups

__all__ = ["SEARCH_RESERVE", "BackendOutcome", "LinearModel", "PlanModel", "build_plan_model", "search_seconds"]


# A backend call's time limit is a wall-clock budget for the whole call: building the backend's model (CP-SAT's
# CpModel, PuLP's problem, CBC's MPS file, HiGHS's model) counts, and the search gets what is left less
# SEARCH_RESERVE of it, for the solver's own overshoot (HiGHS checks its clock between phases: 1.87 s at a
# 1.58 s limit on hexiscale-het2's two-pipeline model; CP-SAT 2.88 s at 2.58 s on hexiscale-het1's, 2026-12-07)
SEARCH_RESERVE = 0.1


def search_seconds(end: float) -> float:
    """The search's own limit for a backend call that must be done by ``end`` (``time.monotonic()``): what
    is left, less :data:`SEARCH_RESERVE` of it."""
    return (1 - SEARCH_RESERVE) * (end - time.monotonic())


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendOutcome:
    """What a backend reports for one solve of a :class:`LinearModel`, in ticks.

    ``status``: "optimal" (proven), "timeout" (limit hit; ``values`` is the incumbent or None),
    "feasible" (stopped otherwise, not proven), "infeasible" (proven) or "error".
    ``bound`` is the backend's proven lower bound on the objective (None when it gives none).
    ``overhead_s``: seconds the call took beyond its search within the limit (handing the model
    over, presolve past the limit), as the backend reports it (0 where it cannot tell).
    ``overrun_s``: seconds the solver's own run went past the search limit it was given (a phase that
    does not check its clock: HiGHS's root cut separation, CP-SAT's presolve of a large model); part
    of ``overhead_s``, and not a budget this side can keep."""

    status: str
    values: list[float] | None
    objective: float | None
    bound: float | None
    log: str = ""
    overhead_s: float = 0.0
    overrun_s: float = 0.0


@dataclass
class LinearModel:
    """Variables with integer bounds, linear constraints with integer coefficients, a minimised
    objective. ``integer[i]`` False marks variables a MILP may keep continuous (their optimum is
    integral anyway because every coefficient is an integer); CP-SAT makes every variable integer."""

    names: list[str] = field(default_factory=list)
    lb: list[int] = field(default_factory=list)
    ub: list[int] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    time: list[bool] = field(default_factory=list)
    rows: list[tuple[dict[int, int], str, int, str]] = field(default_factory=list)
    objective: dict[int, int] = field(default_factory=dict)

    def var(self, name: str, lb: int, ub: int, integer: bool = True, time: bool = False) -> int:
        """A variable; ``time`` marks variables measured in ticks (a MILP backend may rescale them)."""
        self.names.append(name)
        self.lb.append(int(lb))
        self.ub.append(int(max(lb, ub)))
        self.integer.append(integer)
        self.time.append(time)
        return len(self.names) - 1

    def add(self, coefs: dict[int, int], sense: str, rhs: int, name: str) -> None:
        """Add Σ coefs·x (sense) rhs with sense one of '<=', '>=', '=='."""
        clean = {i: int(c) for i, c in coefs.items() if c}
        self.rows.append((clean, sense, int(rhs), name))

    @property
    def num_vars(self) -> int:
        return len(self.names)


@dataclass
class PlanModel:
    """A built model plus the handles needed to decode a solution and to add cuts."""

    tables: CostTables
    pipelines: int
    max_stages: int
    scale: float
    lin: LinearModel
    x: dict[tuple[int, int, int], int]
    y: dict[tuple[int, int, int], int]
    mb: dict[tuple[int, int], int]
    lay: dict[tuple[int, int, int], int]
    t_sync: int
    cuts: int = 0

    def ticks(self, seconds: float) -> int:
        """Seconds to ticks, rounded down (keeps the model a relaxation)."""
        return math.floor(seconds * self.scale)

    # ----------------------------------------------------------------- decoding / encoding
    def decode(self, values: list[float]) -> Plan:
        """Turn a solution vector into a validated Plan; GPUs are handed out per node in order."""
        pb = self.tables.problem
        cl = pb.cluster
        free = {n: list(cl.node_gpus(n)) for n in range(len(cl.nodes))}
        pipes = []
        for p in range(self.pipelines):
            stages, start = [], 0
            for k in range(self.max_stages):
                for c, opt in enumerate(self.tables.options):
                    if values[self.x[p, k, c]] > 0.5:
                        layers = round(values[self.y[p, k, c]])
                        gpus = tuple(free[opt.node][: opt.tp])
                        del free[opt.node][: opt.tp]
                        stages.append(StagePlan(node=opt.node, gpus=gpus, layers=(start, start + layers)))
                        start += layers
            m = 1 + sum(round(values[i]) for (q, _), i in self.mb.items() if q == p)
            pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=m))
        return Plan(problem=pb, pipelines=tuple(pipes))

    def encode(self, plan: Plan) -> dict[int, int] | None:
        """Values of the structural variables (x, y, mb, lay) that represent ``plan`` (pipelines
        sorted by micro-batches, as the symmetry breaking wants); None if it does not fit this model."""
        if len(plan.pipelines) != self.pipelines:
            return None
        index = {(o.node, o.tp): o.index for o in self.tables.options}
        vals = {i: 0 for i in (*self.x.values(), *self.y.values(), *self.mb.values(), *self.lay.values())}
        order = sorted(plan.pipelines, key=lambda pp: -pp.micro_batches)
        for p, pipe in enumerate(order):
            if len(pipe.stages) > self.max_stages:
                return None
            for k, st in enumerate(pipe.stages):
                c = index.get((st.node, st.tp))
                if c is None:
                    return None
                vals[self.x[p, k, c]] = 1
                vals[self.y[p, k, c]] = st.num_layers
                for j in range(1, st.num_layers + 1):
                    if (p, k, j) in self.lay:
                        vals[self.lay[p, k, j]] = 1
            for v in range(2, pipe.micro_batches + 1):
                if (p, v) not in self.mb:
                    return None
                vals[self.mb[p, v]] = 1
        return vals

    def structure_vars(self) -> list[int]:
        """Binary variables that fix every stage's node, TP degree and layer count."""
        return [*self.x.values(), *self.lay.values()]

    def add_sync_cut(self, values: list[float], sync_seconds: float) -> None:
        """No-good cut T_sync ≥ σ(S)·(1 − D(z, S)) for the structure S of ``values``: exact when the
        solution repeats S, void otherwise (D is the Hamming distance over the structure binaries)."""
        sig = self.ticks(sync_seconds)
        if sig <= 0:
            return
        ones = [i for i in self.structure_vars() if values[i] > 0.5]
        zeros = [i for i in self.structure_vars() if values[i] <= 0.5]
        coefs = {self.t_sync: 1}
        for i in ones:
            coefs[i] = -sig
        for i in zeros:
            coefs[i] = sig
        self.lin.add(coefs, ">=", sig - sig * len(ones), f"sync_cut_{self.cuts}")
        self.cuts += 1


@dataclass
class _Vars:
    """The P-model's sizes, tick rounding and variable families (docs/formulation.md §4), shared by
    the constraint blocks below."""

    tables: CostTables
    tk: Callable[[float], int]
    P: int
    K: int
    L: int
    C: int
    M: int
    mmax: int
    u_hi: int
    x: dict[tuple[int, int, int], int]
    y: dict[tuple[int, int, int], int]
    mb: dict[tuple[int, int], int]
    lay: dict[tuple[int, int, int], int]
    hl: dict[tuple[int, int, int], int]
    u: dict[tuple[int, int], int]
    U: dict[int, int]
    w: dict[tuple[int, int], int]
    comm: dict[tuple[int, int], int]
    t_pipe: int
    t_sync: int
    t_opt: int

    def s(self, p: int, k: int) -> dict[int, int]:
        """Stage k of pipeline p is used: Σ_c x[p,k,c] (empty past the last slot)."""
        return {self.x[p, k, c]: 1 for c in range(self.C)} if k < self.K else {}

    def last(self, p: int, k: int) -> dict[int, int]:
        """Stage k is the last one: s[k] − s[k+1]."""
        d = dict(self.s(p, k))
        for i, v in self.s(p, k + 1).items():
            d[i] = d.get(i, 0) - v
        return d


def build_plan_model(tables: CostTables, pipelines: int, max_stages: int, scale: float,
                     cutoff_s: float | None = None, pipe_lb_s: float | None = None) -> PlanModel:
    """Build the P-pipeline model (``pipelines`` = P, at most ``max_stages`` stages per pipeline).
    ``pipe_lb_s``: a known valid lower bound on the slowest pipeline (default: the total-work bound)."""
    lin = LinearModel()
    mv = _variables(lin, tables, pipelines, max_stages, scale, cutoff_s)
    usage = _add_assignment(lin, mv)
    _add_layers(lin, mv)
    _add_micro_batches(lin, mv)
    _add_memory(lin, mv)
    _add_stage_times(lin, mv)
    _add_work_bound(lin, mv)
    _add_optimizer_and_sync(lin, mv)
    # -- valid inequalities and cutoff
    lin.add({mv.t_pipe: 1}, ">=", mv.tk(max(tables.gpu_rate_bound(), pipe_lb_s or 0.0)), "rate_bound")
    if cutoff_s is not None:
        lin.add(dict(lin.objective), "<=", math.ceil(cutoff_s * scale), "cutoff")
    _add_symmetry_breaking(lin, tables, usage)
    return PlanModel(tables=tables, pipelines=mv.P, max_stages=mv.K, scale=scale, lin=lin, x=mv.x, y=mv.y, mb=mv.mb,
                     lay=mv.lay, t_sync=mv.t_sync)


def _variables(lin: LinearModel, tables: CostTables, P: int, K: int, scale: float, cutoff_s: float | None) -> _Vars:
    """Every variable family of §4 with its bounds; times in ticks, the objective T_pipe + T_sync + T_opt."""
    pb = tables.problem
    L, M = pb.model.layers, pb.training.num_micro_batches
    C = len(tables.options)
    tk = lambda s: math.floor(s * scale)  # noqa: E731  (floor: the model stays a relaxation)

    x = {(p, k, c): lin.var(f"x[{p},{k},{c}]", 0, 1) for p in range(P) for k in range(K) for c in range(C)}
    y = {(p, k, c): lin.var(f"y[{p},{k},{c}]", 0, L) for p in range(P) for k in range(K) for c in range(C)}
    mmax = M - (P - 1)
    mb = {(p, v): lin.var(f"mb[{p},{v}]", 0, 1) for p in range(P) for v in range(2, mmax + 1)}
    lay = ({(p, k, j): lin.var(f"lay[{p},{k},{j}]", 0, 1) for p in range(P) for k in range(K) for j in range(1, L + 1)}
           if P > 1 else {})
    stage_hi = _stage_time_cap(tables, tk)
    horizon = max(stage_hi * (K + mmax), 1)
    if cutoff_s is not None:
        horizon = min(horizon, math.ceil(cutoff_s * scale) + 1)
    u_hi = min(stage_hi, horizon)
    hl = {(p, k, c): lin.var(f"hl[{p},{k},{c}]", 0, 1, integer=False) for p in range(P) for k in range(K) for c in range(C)}
    u = {(p, k): lin.var(f"u[{p},{k}]", 0, u_hi, integer=False, time=True) for p in range(P) for k in range(K)}
    U = {p: lin.var(f"U[{p}]", 0, u_hi, integer=False, time=True) for p in range(P)}
    w = {(p, v): lin.var(f"w[{p},{v}]", 0, u_hi, integer=False, time=True) for p in range(P) for v in range(2, mmax + 1)}
    comm = {(p, k): lin.var(f"comm[{p},{k}]", 0, u_hi, integer=False, time=True) for p in range(P) for k in range(K - 1)}
    t_hi = horizon if cutoff_s is not None else 2**40  # without a cutoff, leave room for sync and optimizer
    t_pipe = lin.var("T_pipe", 0, t_hi, integer=False, time=True)
    t_sync = lin.var("T_sync", 0, t_hi, integer=False, time=True)
    t_opt = lin.var("T_opt", 0, t_hi, integer=False, time=True)
    lin.objective = {t_pipe: 1, t_sync: 1, t_opt: 1}
    return _Vars(tables=tables, tk=tk, P=P, K=K, L=L, C=C, M=M, mmax=mmax, u_hi=u_hi, x=x, y=y, mb=mb, lay=lay, hl=hl,
                 u=u, U=U, w=w, comm=comm, t_pipe=t_pipe, t_sync=t_sync, t_opt=t_opt)


def _add_assignment(lin: LinearModel, mv: _Vars) -> dict[int, dict[int, int]]:
    """Each pipeline a prefix of used stages, one option per stage, node capacity. Returns each node's
    GPU use (variable → TP degree), which the symmetry breaking compares."""
    x, P, K, tables = mv.x, mv.P, mv.K, mv.tables
    for p in range(P):
        lin.add(mv.s(p, 0), "==", 1, f"first_stage[{p}]")
        for k in range(K):
            lin.add(mv.s(p, k), "<=", 1, f"one_option[{p},{k}]")
            if k + 1 < K:
                lin.add({**mv.s(p, k), **{i: -1 for i in mv.s(p, k + 1)}}, ">=", 0, f"prefix[{p},{k}]")
    cl = tables.problem.cluster
    usage = {n: {x[p, k, o.index]: o.tp for p in range(P) for k in range(K) for o in tables.options if o.node == n}
             for n in range(len(cl.nodes))}
    for n, node in enumerate(cl.nodes):
        if usage[n]:
            lin.add(usage[n], "<=", node.count, f"capacity[{n}]")
    return usage


def _add_layers(lin: LinearModel, mv: _Vars) -> None:
    """y = layers of the stage if it uses option c (memory at ≥ 1 in flight caps it); each pipeline
    holds all L layers; hl marks the last stage's option (the head); unary layer counts for P > 1."""
    x, y, hl, lay, L, C = mv.x, mv.y, mv.hl, mv.lay, mv.L, mv.C
    for p in range(mv.P):
        lin.add({y[p, k, c]: 1 for k in range(mv.K) for c in range(C)}, "==", L, f"layers[{p}]")
        for k in range(mv.K):
            for c in range(C):
                lin.add({y[p, k, c]: 1, x[p, k, c]: -1}, ">=", 0, f"y_min[{p},{k},{c}]")
                cap1 = min(L, max(0, mv.tables.max_layers(c, k == 0, False, 1)))  # memory at ≥ 1 in flight
                lin.add({y[p, k, c]: 1, x[p, k, c]: -cap1}, "<=", 0, f"y_max[{p},{k},{c}]")
                row = {i: -coef for i, coef in mv.last(p, k).items()}
                row[x[p, k, c]] = row.get(x[p, k, c], 0) - 1
                row[hl[p, k, c]] = 1
                lin.add(row, ">=", -1, f"head_on[{p},{k},{c}]")  # hl ≥ x + last − 1
            if lay:
                lin.add({**{lay[p, k, j]: 1 for j in range(1, L + 1)}, **{y[p, k, c]: -1 for c in range(C)}}, "==", 0,
                        f"unary_layers[{p},{k}]")
                for j in range(1, L):
                    lin.add({lay[p, k, j]: 1, lay[p, k, j + 1]: -1}, ">=", 0, f"unary_order[{p},{k},{j}]")


def _add_micro_batches(lin: LinearModel, mv: _Vars) -> None:
    """Unary m_p = 1 + Σ_v mb[p,v]; they sum to M; pipelines sorted by m (symmetry)."""
    mb, P, mmax = mv.mb, mv.P, mv.mmax
    for p in range(P):
        for v in range(2, mmax):
            lin.add({mb[p, v]: 1, mb[p, v + 1]: -1}, ">=", 0, f"mb_order[{p},{v}]")
        if p + 1 < P:
            for v in range(2, mmax + 1):
                lin.add({mb[p, v]: 1, mb[p + 1, v]: -1}, ">=", 0, f"sym_pipelines[{p},{v}]")
    lin.add({i: 1 for i in mb.values()}, "==", mv.M - P, "micro_batches")


def _add_stage_times(lin: LinearModel, mv: _Vars) -> None:
    """Stage times u (ticks per micro-batch) with boundary communication, the bottleneck U, the
    ramp Σ_v w_v = (m − 1)·U (big-M) and the pipeline time, plus the leading pipeline's bound."""
    tables, tk, x, u, U, w, comm = mv.tables, mv.tk, mv.x, mv.u, mv.U, mv.w, mv.comm
    K, mmax, u_hi = mv.K, mv.mmax, mv.u_hi
    nodes = len(tables.problem.cluster.nodes)
    for p in range(mv.P):
        for k in range(K):
            row = {u[p, k]: 1}
            for c, _o in enumerate(tables.options):
                row[mv.y[p, k, c]] = -tk(tables.time_layer[c])
                if k == 0:
                    row[x[p, k, c]] = -tk(tables.time_first[c])
                row[mv.hl[p, k, c]] = -tk(tables.time_last[c])
            if k + 1 < K:
                row[comm[p, k]] = -1
                for a in range(nodes):
                    for b in range(nodes):
                        cab = tk(tables.comm.get((a, b), 0.0))
                        if cab > 0:
                            xa = {x[p, k, o.index]: cab for o in tables.options if o.node == a}
                            xb = {x[p, k + 1, o.index]: cab for o in tables.options if o.node == b}
                            lin.add({comm[p, k]: 1, **{i: -coef for i, coef in {**xa, **xb}.items()}}, ">=", -cab,
                                    f"comm[{p},{k},{a},{b}]")
            lin.add(row, ">=", 0, f"stage_time[{p},{k}]")
            lin.add({U[p]: 1, u[p, k]: -1}, ">=", 0, f"bottleneck[{p},{k}]")
        for v in range(2, mmax + 1):  # w_v ≥ U − big·(1 − mb_v): Σ_v w_v = (m − 1)·U at integer points
            lin.add({w[p, v]: 1, U[p]: -1, mv.mb[p, v]: -u_hi}, ">=", -u_hi, f"ramp[{p},{v}]")
        lin.add({mv.t_pipe: 1, **{w[p, v]: -1 for v in range(2, mmax + 1)}, **{u[p, k]: -1 for k in range(K)}}, ">=", 0,
                f"pipeline_time[{p}]")
    # valid inequality: pipelines are sorted by m, so m_0 ≥ ⌈M/P⌉ and T ≥ (⌈M/P⌉ − 1)·U_0 + Σ_k u_0k
    # holds with a constant coefficient (exact for P = 1) — unlike the big-M rows it survives the LP
    lead = -(-mv.M // mv.P) - 1
    lin.add({mv.t_pipe: 1, U[0]: -lead, **{u[0, k]: -1 for k in range(K)}}, ">=", 0, "leading_pipeline")


def _add_optimizer_and_sync(lin: LinearModel, mv: _Vars) -> None:
    """The optimizer step and the gradient-sync lower bound (§6), per stage and option."""
    tables, tk, x, y, hl = mv.tables, mv.tk, mv.x, mv.y, mv.hl
    model = tables.problem.model
    for p in range(mv.P):
        for k in range(mv.K):
            for c in range(mv.C):
                orow = {mv.t_opt: 1, y[p, k, c]: -tk(tables.opt_layer[c]), hl[p, k, c]: -tk(tables.opt_last[c])}
                if k == 0:
                    orow[x[p, k, c]] = -tk(tables.opt_first[c])
                lin.add(orow, ">=", 0, f"optimizer[{p},{k},{c}]")
                if mv.P > 1:
                    srow = {mv.t_sync: 1, y[p, k, c]: -tk(tables.sync_layer_lb(c, mv.P, model.params_per_layer)),
                            hl[p, k, c]: -tk(tables.sync_layer_lb(c, mv.P, model.head_params))}
                    if k == 0:
                        srow[x[p, k, c]] = -tk(tables.sync_layer_lb(c, mv.P, model.embedding_params))
                    lin.add(srow, ">=", 0, f"sync_bound[{p},{k},{c}]")


def _add_work_bound(lin: LinearModel, mv: _Vars) -> None:
    """Valid inequalities that survive the LP relaxation of (m−1)·U (whose big-M rows do not).

    z[p,k,c] stands for m_p·y[p,k,c], the layer-micro-batches stage k processes. It is tied to the
    integer variables by Σ_{k,c} z = L·m_p (exact) and the McCormick envelope of m ∈ [1, m_max],
    y ∈ [0, L]. Because stage k works m·u_k ≥ Σ_c τ_c·z seconds and idles at least the other
    stages' times during fill and drain, T_pipe ≥ (m−1)·u_k + Σ_j u_j ≥ Σ_c τ_c·z[p,k,c] + Σ_{j≠k} u[p,j]:
    the per-pipeline total-work bound with its fill/drain bubble."""
    tables, tk, y, mb, u, t_pipe = mv.tables, mv.tk, mv.y, mv.mb, mv.u, mv.t_pipe
    P, K, L, C, mmax = mv.P, mv.K, mv.L, mv.C, mv.mmax
    for p in range(P):
        # m_p − 1 = Σ_v mb[p,v] once, as its own variable: the envelope rows then hold 3 terms instead of
        # M − P + 3 (at 64 micro-batches they were 45 % of hexiscale-het1's P = 4 model; the LP is the same)
        extra = lin.var(f"m_extra[{p}]", 0, mmax - 1, integer=False)
        lin.add({extra: 1, **{i: -1 for (q, _), i in mb.items() if q == p}}, "==", 0, f"m_extra[{p}]")
        z = {(k, c): lin.var(f"z[{p},{k},{c}]", 0, mmax * L, integer=False) for k in range(K) for c in range(C)}
        lin.add({**{z[kc]: 1 for kc in z}, extra: -L}, "==", L, f"work_sum[{p}]")
        for (k, c), zi in z.items():
            yi = y[p, k, c]
            lin.add({zi: 1, yi: -mmax}, "<=", 0, f"work_hi[{p},{k},{c}]")
            lin.add({zi: 1, yi: -1}, ">=", 0, f"work_lo[{p},{k},{c}]")
            lin.add({zi: 1, yi: -mmax, extra: -L}, ">=", L - mmax * L, f"work_mc1[{p},{k},{c}]")
            lin.add({zi: 1, yi: -1, extra: -L}, "<=", 0, f"work_mc2[{p},{k},{c}]")
        for k in range(K):
            row = {t_pipe: 1}
            for c in range(C):
                row[z[k, c]] = -tk(tables.time_layer[c])
            for j in range(K):
                if j != k:
                    row[u[p, j]] = -1
            lin.add(row, ">=", 0, f"work_bound[{p},{k}]")


def _stage_time_cap(tables: CostTables, tk) -> int:
    """Largest stage time (ticks) any stage can have: all layers, embedding, head and the slowest send."""
    L = tables.layers
    worst_comm = max(tables.comm.values(), default=0.0)
    return max(tk(tables.time_layer[c]) * L + tk(tables.time_first[c]) + tk(tables.time_last[c])
               for c in range(len(tables.options))) + tk(worst_comm) + 1


def _add_memory(lin: LinearModel, mv: _Vars) -> None:
    """Memory per GPU ≤ capacity, as the evaluator checks it: for option c at a position (first,
    last) holding v in-flight micro-batches the evaluator accepts at most Lmax(c, first, last, v)
    layers. In-flight is min(K_p − k, m_p) under 1F1B (m_p under GPipe); the row for v is switched on
    exactly when stage k+v−1 exists (1F1B) and m_p ≥ v, so the binding row is the true in-flight."""
    tables, x, y, mb, last, K, L = mv.tables, mv.x, mv.y, mv.mb, mv.last, mv.K, mv.L
    sched = tables.problem.schedule
    for p in range(mv.P):
        for k in range(K):
            for c in range(len(tables.options)):
                for is_last in (False, True):
                    for v, lm in tables.inflight_values(c, k == 0, is_last):
                        if sched == "1f1b" and k + v - 1 >= K:
                            break
                        lm = max(lm, 0)
                        if lm >= L:
                            continue
                        if v > 1 and (p, v) not in mb:
                            break
                        row = {y[p, k, c]: 1, x[p, k, c]: L}
                        rhs = lm + L
                        if sched == "1f1b" and v > 1:
                            for i in (x[p, k + v - 1, c2] for c2 in range(len(tables.options))):
                                row[i] = row.get(i, 0) + L
                            rhs += L
                        if v > 1:
                            row[mb[p, v]] = row.get(mb[p, v], 0) + L
                            rhs += L
                        if is_last:
                            for i, coef in last(p, k).items():
                                row[i] = row.get(i, 0) + L * coef
                            rhs += L
                        lin.add(row, "<=", rhs, f"memory[{p},{k},{c},{int(is_last)},{v}]")


def _add_symmetry_breaking(lin: LinearModel, tables: CostTables, usage: dict[int, dict[int, int]]) -> None:
    """Interchangeable nodes (same type, count and links): GPUs used on the earlier one ≥ on the later."""
    for group in identical_node_groups(tables.problem):
        for a, b in itertools.pairwise(group):
            row = dict(usage[a])
            for i, v in usage[b].items():
                row[i] = row.get(i, 0) - v
            lin.add(row, ">=", 0, f"sym_nodes[{a},{b}]")
