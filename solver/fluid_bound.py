"""A fluid (column-generation) lower bound on the iteration time of every heterogeneous plan.

Idea (docs/formulation.md §14 proves it). Every pipeline of a plan is an ordered *shape*: stages
(option c = node and TP degree, ℓ ≥ 1 layers), with stage times u_k taken from the evaluator's
tabulated affine pieces (:mod:`.candidates`), bottleneck U = max u_k and sum S = Σ u_k; and a floor
W = max(R, max_k w_k) on the plan's sync + optimizer seconds that the shape alone implies (w_k: the
stage's own all-reduce over the P replicas and AdamW step, :mod:`.shape_pricing`; R: any global floor
for the pipeline count). If the plan finishes within T, each pipeline runs m ≤ r(T) =
1 + (T − W − S)/U micro-batches, the pipelines fit the node capacities, there are P_min … P_max of
them, and Σ m = M. So the *fluid master* LP

    V(T) = max Σ_s r_s(T)·x_s   s.t.  Σ_s g_{s,n}·x_s ≤ G_n (every node n),  P_min ≤ Σ_s x_s ≤ P_max,  x ≥ 0

(over all shapes with S + W ≤ T; every pipeline runs ≥ 1 micro-batch, so a plan of P pipelines is P
shapes) is ≥ M for every T ≥ the plan's iteration time. Weak duality gives, for *any* multipliers
π ≥ 0, μ ≥ 0 (A = π·G + μ·P_max < M, ρ = (M − A)/P_max):

    V(T) < M   whenever   T < T_cert(π, μ) = min_shapes [ S + W + U·(π·g + ρ − 1 + μ) ],

so T_cert is a valid lower bound on the iteration time, whatever π and μ are; good multipliers come
from the restricted master's duals (column generation). κ + 1 = (M − π·G)/P_max; with P_min ≥ 1,
π·G > M is valid too, with κ + 1 = (M − π·G)/P_min < 0 (docs §14), a shape's term then
max(0, π·g + κ)·U. The minimum over shapes is a shortest path
over (layers covered, node of the next stage and GPUs its run of consecutive stages uses) with the
maxima (U, and W through the largest sync σ and the largest optimizer step o) handled by branch and
bound over boxes: for U ∈ (lo, hi], max σ ∈ (a, b] and max o ∈ (a', b'] the path minimising
S + Σ_k π_n·t·max(lo, u_k) with every u_k ≤ hi, σ_k ≤ b and o_k ≤ b' gives a valid lower bound for
the box (U·π·g = Σ_k π_n·t·U and U ≥ max(lo, u_k); W ≥ a + a'), and the box with the least bound is
split until it is tight. Per pipeline count P
(``fluid_bounds_by_pipelines``) the master has Σ x = P and w_k uses exactly P replicas.

Relaxations (each can only lower the bound): memory with one micro-batch in flight on every stage
(the most lenient count); node capacity per shape only for runs of consecutive stages on one node
(the master enforces it for the sum over shapes); fractional pipelines and micro-batches; a stage's
sync at the best link leaving its node (wherever the other replicas sit).

Whole micro-batches (docs §14). A pipeline runs m ≤ ⌊r_s(T)⌋ micro-batches, so the master may count
⌊r⌋ instead of r, and the certificate becomes T_cert = min_shapes [S + W + U·⌊π·g + κ'⌋] (κ' = ρ + μ,
a hair low). Its boxes gain a third dimension, π·g ∈ [g0, g1): a shape with ⌊π·g + κ'⌋ = k has π·g in
a known interval, so S ≥ D(λ) − λ·(an end of it) for each Lagrange multiplier λ of a small grid
(D(λ) = min S + λ·π·g, the same DP), and the box bound is the least over whole k of lo·k plus the
best of those. Each run first converges the fractional master, then continues with the whole one.
With ``exact_whole`` (the search's last resort for a leaf it cannot branch, :mod:`.fluid_branch`)
narrow boxes are priced exactly instead, by Pareto labels of (S, π·g) (:mod:`.shape_labels_jit`).
Reference: the decomposition is the classic Dantzig–Wolfe / Gilmore–Gomory column generation with a
Lagrangian (Farley-type) bound that is valid at every iteration, not only at convergence.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import highspy
import numpy as np
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan

from . import cost
from .candidates import CostTables
from .milp_plan import quiet_stdout
from .shape_pricing import (
    Shape,
    micro_batches_within,
    pricer_for,
    shape_from_stages,
    shape_of_pipeline,
)
from .stage_floors import NO_LOCALITY, Locality, StageExtras, fits_visits

__all__ = ["FluidResult", "Shape", "certificate", "fluid_lower_bound", "optimizer_lower_bound", "shape_from_stages",
           "shape_of_pipeline", "sync_lower_bound"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FluidResult:
    """``lb_s``: proven lower bound on the iteration time (for the pipeline counts the run covers);
    ``upper_s``: the restricted master's estimate (≥ the fluid optimum); ``iterations`` of column
    generation; ``converged``: the last pricing found no column of positive reduced cost beyond the
    tolerance."""

    lb_s: float
    upper_s: float
    iterations: int
    columns: int
    converged: bool
    shapes: tuple[Shape, ...] = field(default=(), repr=False)
    last_duals: tuple[tuple[float, ...], float] | None = field(default=None, repr=False)
    solution: tuple[tuple[Shape, float], ...] = field(default=(), repr=False)  # final master x > 0
    floors: tuple[float, ...] = field(default=(), repr=False)  # W of each solution column
    replicas: int = 1
    rest_s: float = 0.0
    whole: bool = False  # the master counted whole micro-batches per column (its second phase)
    exact: bool = False  # its whole-batch certificates priced narrow boxes exactly (Pareto labels)


def optimizer_lower_bound(tables: CostTables, pipelines: int = 1) -> float:
    """Seconds no plan (with ``pipelines`` pipelines) beats in its optimizer step: the first stage
    holds the embedding and ≥ 1 layer, the last the head and ≥ 1 layer; and some pipeline uses at
    most ⌊N/P⌋ GPUs, one of which holds ≥ total/⌊N/P⌋ parameters (optimizer time is linear in the
    parameters held: the per-layer slope of each option, scaled by its TP degree)."""
    opts = tables.options
    first = min(tables.opt_layer[o.index] + tables.opt_first[o.index] for o in opts)
    last = min(tables.opt_layer[o.index] + tables.opt_last[o.index] for o in opts)
    model = tables.problem.model
    share = model.total_params / max(1, tables.problem.cluster.num_gpus // max(1, pipelines))
    heavy = min(tables.opt_layer[o.index] * o.tp * share / model.params_per_layer for o in opts)
    return max(0.0, first, last, heavy)


class _Floors:
    """W of each shape for one (replicas, R, locality): max(R, max_k w_k), cached by stage list
    (inf for a shape the locality forbids, e.g. one that skips a node every pipeline must use)."""

    def __init__(self, tables: CostTables, replicas: int, rest: float, locality: Locality = NO_LOCALITY,
                 w_cap: float = math.inf) -> None:
        self.pr = pricer_for(tables)
        self.extras: StageExtras = self.pr.extras(replicas, locality)
        self.rest = rest
        self.w_cap = w_cap  # the cell's plans have sync + optimizer ≤ w_cap (a W cell of .fluid_branch)
        self._w: dict[tuple, float] = {}

    def __call__(self, s: Shape) -> float:
        w = self._w.get(s.stages)
        if w is None:
            inside = fits_visits(s.stages, self.extras, self.pr.node_list, self.pr.tp_list)  # visited nodes' rules
            w = max(self.rest, self.pr.stage_w(s.stages, self.extras)) if inside else math.inf
            # a W cell leaves out the shapes the pricing DP's w caps exclude (some w_k above the cap);
            # one over the cap only by its largest sync plus largest optimizer step stays, at its W
            # (a relaxation: the certificate and the master must see the same shapes to close)
            if w > self.w_cap and self.pr.stage_w(s.stages, self.extras, joint=False) > self.w_cap:
                w = math.inf
            self._w[s.stages] = w
        return w


def _highs() -> highspy.Highs:
    """A silent single-threaded HiGHS: it prints its banner on stdout (would break --json output),
    and its scheduler is process-wide, so a later solve asking for another thread count than the
    first fails (PuLP's HiGHS, the MILP backend, then returns kNotset)."""
    with quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    return h


class _Master:
    """The restricted fluid master LP over the columns found so far (HiGHS). One model is kept and
    grown column by column; each solve at a time t only changes the costs r_s(t) and which columns
    are live (bounds), so the simplex restarts from the last basis instead of from scratch (the
    bisection of :func:`_master_root` solves it ~20 times per iteration)."""

    def __init__(self, caps: list[int], pmax: int, floors: _Floors, pmin: int = 0, penalty: float = 0.0) -> None:
        self.caps, self.pmax, self.floors = caps, pmax, floors
        self.pmin = pmin  # pmin ≤ Σ x ≤ pmax: the run's plans have at least pmin pipelines
        self.penalty = penalty  # the cost of the row's slack, the model's first column when pmin > 0
        self.counted = False  # the last duals are the counted master's (:meth:`solve`)
        self.short = False  # the last solve needed the slack: its live columns make fewer than pmin pipelines
        self.cols: list[Shape] = []
        self.keys: set[tuple] = set()
        self.last: tuple[list[Shape], np.ndarray] = ([], np.zeros(0))
        self.whole = False  # ⌊r⌋ micro-batches per column (the integral master), else fractional r
        self._h: highspy.Highs | None = None
        self._in_model = 0  # columns already in the HiGHS model (the first ones of self.cols)
        self._swu = np.zeros((3, 0))  # S, W and U of those columns

    def add(self, s: Shape) -> bool:
        if s.stages in self.keys or not math.isfinite(s.bottleneck):
            return False
        self.keys.add(s.stages)
        self.cols.append(s)
        return True

    @property
    def off(self) -> int:
        """Index of the first shape column: 1 behind the slack of P_min ≤ Σ x, else 0."""
        return int(self.pmin > 0)

    def _empty(self) -> highspy.Highs:
        """A model with the master's rows (node capacities, then the pipeline count) and no column."""
        h = _highs()
        for cap in self.caps:
            h.addRow(-highspy.kHighsInf, float(cap), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
        h.addRow(float(self.pmin) if self.pmin > 0 else -highspy.kHighsInf, float(self.pmax), 0,
                 np.zeros(0, dtype=np.int32), np.zeros(0))
        if self.pmin > 0:  # pipelines missing from Σ x ≥ pmin, each worth −penalty micro-batches: the LP
            # stays feasible when the live columns cannot make pmin pipelines (its duals price the ones it lacks)
            h.addCol(float(self.penalty), 0.0, highspy.kHighsInf, 1, np.array([len(self.caps)], dtype=np.int32),
                     np.array([1.0]))
        return h

    def _add_columns(self, h: highspy.Highs, cols: list[Shape], upper: float) -> None:
        """Columns x_s ∈ [0, upper] at cost 0 (each solve sets its costs), one GPU count per node row."""
        N = len(self.caps)
        for s in cols:
            idx = [n for n in range(N) if s.gpus[n] > 0]
            h.addCol(0.0, 0.0, upper, len(idx) + 1, np.array([*idx, N], dtype=np.int32),
                     np.array([*(float(s.gpus[n]) for n in idx), 1.0]))

    def _model(self) -> highspy.Highs:
        """The kept HiGHS model with every column so far (not live until a solve says so)."""
        if self._h is None:
            self._h = self._empty()
        h = self._h
        new = self.cols[self._in_model:]
        self._add_columns(h, new, 0.0)
        if new:
            self._swu = np.hstack([self._swu, np.array([[s.total, self.floors(s), s.bottleneck] for s in new]).T])
        self._in_model = len(self.cols)
        return h

    def value(self, t: float) -> float:
        """V_R(t) alone, on the kept model: only the costs r_s(t) and which columns are live change,
        so the simplex restarts from its last basis (the bisection of :func:`_master_root`)."""
        h = self._model()
        S, W, _ = self._swu
        live = S + W <= t
        if not live.any():
            return 0.0
        n = len(self.cols)
        idx = np.arange(self.off, self.off + n, dtype=np.int32)
        h.changeColsCost(n, idx, np.where(live, -self._rates(t), 0.0))
        h.changeColsBounds(n, idx, np.zeros(n), np.where(live, highspy.kHighsInf, 0.0))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return 0.0
        return -h.getInfo().objective_function_value

    def _rates(self, t: float) -> np.ndarray:
        """r_s(t) = 1 + (t − W − S)/U of every column in the model (⌊r⌋ with whole batches)."""
        S, W, U = self._swu
        with np.errstate(invalid="ignore"):  # W = inf: a column the cell excludes (never live)
            r = micro_batches_within(t - W, S, U)
        return np.floor(r + 1e-9) if self.whole else r

    def solve(self, t: float, slack_duals: bool = False) -> tuple[float, np.ndarray, float]:
        """V_R(t), node duals π ≥ 0 and the pipeline-count dual μ, from a fresh model of the live
        columns: a warm-started simplex ends on another optimal basis of this degenerate LP, whose
        duals certify less (the pricing then stalls short of the master's value). Sets ``counted``:
        whether the duals are those of the row P_min ≤ Σ x — not when the live columns cannot make
        P_min pipelines (the slack is used): its duals then price the missing pipelines at the
        slack's penalty, whose certificates proved little (hexiscale-het3's range 19 … 28 stalled at
        3.5-4.0 s, against 5.04 s in 4 iterations with Σ x ≤ P_max alone), so they come from the
        master without the row instead — unless ``slack_duals``: pricing at those duals found no new
        column, so the run prices once at the slack's (they value a further pipeline)."""
        N = len(self.caps)
        self._model()  # brings the columns' S, W and U (and the kept model) up to date
        S, W, _ = self._swu
        mask = S + W <= t
        live = [s for s, ok in zip(self.cols, mask) if ok]
        if not live:
            return 0.0, np.zeros(N), 0.0
        h = self._empty()
        self._add_columns(h, live, highspy.kHighsInf)
        h.changeColsCost(len(live), np.arange(self.off, self.off + len(live), dtype=np.int32), -self._rates(t)[mask])
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # e.g. fewer columns than P: no duals
            return 0.0, np.zeros(N), 0.0
        value = -h.getInfo().objective_function_value
        sol = h.getSolution()
        self.counted = self.pmin > 0
        self.short = self.counted and sol.col_value[0] > 1e-9
        if self.short and not slack_duals:  # short of P_min pipelines: the duals without the row
            h.changeRowBounds(N, -highspy.kHighsInf, float(self.pmax))
            h.changeColBounds(0, 0.0, 0.0)
            h.run()
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                return value, np.zeros(N), 0.0
            sol, self.counted = h.getSolution(), False
        self.last = (live, np.asarray(sol.col_value)[self.off:])
        duals = -np.asarray(sol.row_dual)   # minimisation of −V: duals of ≤ rows are ≤ 0
        mu = float(duals[N]) if self.counted else max(0.0, float(duals[N]))  # (< 0 when Σ x ≥ pmin binds)
        return value, np.maximum(0.0, duals[:N]), mu


def fluid_lower_bound(tables: CostTables, *, pmax: int, replicas: int = 1, rest_s: float = 0.0,
                      upper_s: float | None = None, seed_plans: tuple[Plan, ...] = (),
                      deadline: float | None = None, rel_tol: float = 1e-4, max_iterations: int = 200,
                      pool: tuple[Shape, ...] = (), locality: Locality = NO_LOCALITY,
                      whole: bool = False, integral: bool = True, lb_s: float = 0.0,
                      w_cap: float = math.inf, exact_whole: bool = False, rate_first: bool = False) -> FluidResult:
    """Seconds: a valid lower bound on the iteration time of every plan with P pipelines,
    ``replicas`` ≤ P ≤ ``pmax`` (module docstring), given ``rest_s`` ≤ sync + optimizer of every such plan.

    ``upper_s`` is any iteration time at least the optimum's, or an estimate (it only brackets the
    search: the result is clamped to it and stays valid even when the estimate is too low);
    ``seed_plans`` provide the first columns (e.g. the heuristics' plans). Column generation stops
    when the proven bound is within ``rel_tol`` of the restricted master's estimate, when pricing finds
    no new column, at ``deadline`` (monotonic seconds) or after ``max_iterations``; the bound proven
    so far is returned in every case. ``pool`` are columns from an earlier run on the same tables;
    ``locality`` restricts the plans to a branch-and-price node's (§15: the bound holds for those).
    With ``integral`` (default), once the fractional master has converged the run goes on with the
    whole-batch master and certificate (module docstring); ``whole`` starts there (a resumed run).
    ``lb_s``: a bound already proven for these plans (a resumed run: pricing starts as tight as the
    gap it left, not from scratch). ``w_cap``: only plans whose sync + optimizer time is at most this
    (a W cell of :mod:`.fluid_branch`; shapes whose floor W exceeds it are left out). ``exact_whole``:
    the whole-batch certificate prices its narrow boxes exactly, by Pareto labels (:func:`certificate`;
    slower per certificate, so the search keeps it for leaves nothing else can raise). ``rate_first``:
    before the first master is solved, one certificate at multipliers proportional to each GPU's layer
    rate (:data:`RATE_SHARE`) — where column generation converges slowly (hundreds of GPUs) its first
    duals prove far less.
    """
    pr = pricer_for(tables)
    M = tables.micro_batches
    caps = [node.count for node in tables.problem.cluster.nodes]
    floors = _Floors(tables, replicas, rest_s, locality, w_cap)
    master = _Master(caps, pmax, floors, pmin=replicas if LEAST_COUNT else 0, penalty=float(M))
    master.whole = whole
    for s in pool:
        master.add(s)
    for plan in seed_plans:
        for p in range(len(plan.pipelines)):
            master.add(shape_of_pipeline(tables, plan, p))
    # columns at π = 0 over a spread of caps: the fastest shape for each bottleneck level
    if not pool:
        grid = pr.u_floor * np.geomspace(1.0, 4.0 * tables.layers * max(1, min(tables.layers, len(caps) * 8)), 24)
        _, shapes = pr.solve(grid, np.zeros(len(grid)), np.zeros(pr.N), None, floors.extras)
        for s in shapes:
            if s is not None:
                master.add(s)
    if upper_s is None:
        upper_s = min((s.total + floors(s) + (M - 1) * s.bottleneck for s in master.cols), default=math.inf)
    if not master.cols or not math.isfinite(upper_s):
        return FluidResult(lb_s=0.0, upper_s=math.inf, iterations=0, columns=0, converged=False,
                           replicas=replicas, rest_s=rest_s)
    # every plan here runs longer than its sync + optimizer time, which is at least rest_s (the floor a
    # W cell raises: its bound holds from the start, before any certificate closes)
    lb, est, it, converged, duals, retry = min(max(lb_s, rest_s), upper_s), upper_s, 0, False, None, False
    if rate_first and RATE_SHARE > 0 and lb < upper_s:  # any π ≥ 0 gives a valid certificate
        rates = tables.layer_rates()
        pi = RATE_SHARE * M * rates / float(rates @ np.asarray(caps, dtype=float))
        cert, new, _ = certificate(tables, pi, 0.0, M, pmax, upper_s, deadline, rel=1e-3, replicas=replicas,
                                   rest_s=rest_s, locality=locality, w_cap=w_cap,
                                   pmin=master.pmin)
        lb = max(lb, min(cert, upper_s))
        for sh in new:
            master.add(sh)
    budget = DP_CALLS  # DP calls per certificate (raised when one runs out of them unclosed)
    phase1 = False  # price at the slack's duals this iteration (a master short of P_lo pipelines)
    while it < max_iterations and (deadline is None or time.monotonic() < deadline):
        it += 1
        est, below = _master_root(master, M, lb, upper_s)
        # whole batches: V_R is a step function, and the duals just below its step prove that step
        _, pi, mu = master.solve(below if master.whole and below < est else est, slack_duals=phase1)
        phase1, was_phase1 = False, phase1
        # price only as precisely as the current gap needs (tight at the end: rel_tol/10)
        rel = max(0.1 * rel_tol, 0.25 * (est - lb) / est) if est > 0 and not retry else 0.1 * rel_tol
        retry = False
        cert, new, tight = certificate(tables, pi, mu, M, pmax, upper_s, deadline, max_dp=budget, rel=rel,
                                       replicas=replicas,
                                       rest_s=rest_s, locality=locality, whole=master.whole, w_cap=w_cap,
                                       exact_whole=exact_whole, pmin=master.pmin if master.counted else 0)
        duals = (tuple(pi.tolist()), mu)
        if master.whole and not tight and not exact_whole and cert <= lb and ESCALATE_EXACT and pr.engine == "jit":
            # the Lagrangian boxes stopped short below the bound already proven: from now on price them
            # exactly (on hexiscale-het2 55 of 58 such certificates raised nothing, 21 of 60 s)
            exact_whole = True
        lb = max(lb, min(cert, upper_s))
        logger.debug("fluid iteration %d: master %.6g s, bound %.6g s, %d new columns, pricing %s", it, est, lb,
                     len(new), "closed" if tight else "open")
        added = sum(master.add(s) for s in new)
        if est - lb <= rel_tol * est:
            converged = True
        elif not added and master.short and not was_phase1 and SLACK_PRICING:
            # the master is short of P_lo pipelines and the duals without the count row price nothing
            # new: price once at the slack's duals, which value the missing pipelines (hexiscale-het1, P = 8)
            phase1 = True
            continue
        elif not added:  # pricing proves no new column improves the master (within its tolerance)
            if tight and rel > 0.1 * rel_tol * (1 + 1e-9):
                retry = True
                continue  # closed only to a loose tolerance: price again, tightest
            if master.whole and not tight and not exact_whole and ESCALATE_EXACT and pr.engine == "jit":
                exact_whole = retry = True  # the Lagrangian boxes stopped short: price them exactly
                continue
            if not tight and budget < DP_RAISE * DP_CALLS:
                budget, retry = 2 * budget, True  # the pricing ran out of boxes before it closed: more
                continue
            converged = tight
        else:
            continue
        if master.whole or not converged or not integral:
            break
        master.whole, converged = True, False  # fractional master done: its duals start the whole one
    logger.info("fluid bound %.6g s (master %.6g s, %d iterations, %d columns)", lb, est, it, len(master.cols))
    master.solve(est)
    solution = tuple((sh, float(v)) for sh, v in zip(*master.last) if v > 1e-9)
    return FluidResult(lb_s=lb, upper_s=est, iterations=it, columns=len(master.cols), converged=converged,
                       shapes=tuple(master.cols), last_duals=duals, solution=solution,
                       floors=tuple(floors(sh) for sh, _ in solution), replicas=replicas,
                       rest_s=rest_s, whole=master.whole, exact=exact_whole and master.whole)


def _master_root(master: _Master, M: int, lo: float, hi: float) -> tuple[float, float]:
    """Least t in [lo, hi] with V_R(t) ≥ M (bisection; V_R is nondecreasing in t; hi if none) and
    the greatest t seen below it (lo if none)."""
    reach = M * (1 - 1e-9)  # V_R ≥ M up to the LP's rounding (an LP value of M − 1e-11 is M)
    if master.value(hi) < reach:
        return hi, hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if master.value(mid) >= reach:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi, lo


LAMBDAS = (0.0, 0.5, 1.0, 2.0, 4.0)  # Lagrange multipliers of the box bound, in units of the box's least U
DP_CALLS = 400  # a certificate's DP calls before it stops unclosed (then doubled, up to DP_RAISE×)
DP_RAISE = 8
LEAST_COUNT = True  # a run for plans of P_lo … P_hi pipelines has Σ x ≥ P_lo too (Σ x = P for one P)
ESCALATE_EXACT = True  # a whole-batch certificate whose Lagrangian boxes stop unclosed: price them exactly
SLACK_PRICING = True  # a short master whose capped duals price nothing new prices at the slack's once
# ``rate_first``: a certificate at multipliers proportional to each GPU's layer rate, π·G = this share of M:
# where column generation converges slowly its first duals prove little (gen-512, P = 74..85: 0.248 s against
# 2.343 s at share 0.9; shares 0.5 / 0.8 / 0.95 / 1.0 / 1.2: 1.79 / 2.26 / 2.35 / 2.34 / 1.96 s, 2026-12-06)
RATE_SHARE = 0.9
LABEL_SPAN = 0.05  # whole-batch boxes with hi ≤ lo·(1 + this) (and their halves) are priced by labels


def certificate(tables: CostTables, pi: np.ndarray, mu: float, M: int, pmax: int, top: float,
                 deadline: float | None, max_dp: int = DP_CALLS, rel: float = 1e-5, *, replicas: int = 1,
                 rest_s: float = 0.0, locality: Locality = NO_LOCALITY,
                 whole: bool = False, w_cap: float = math.inf,
                 exact_whole: bool = False, pmin: int = 0) -> tuple[float, list[Shape], bool]:
    """T_cert(π, μ) = min over shapes of S + W + U·max(0, π·g + κ), κ = ρ − 1 + μ (or, with ``pmin``
    pipelines at least and π·G > M, κ = (M − π·G)/pmin − 1), by branch and bound
    over boxes of (U, max σ, max o); with ``whole``, of S + W + U·max(0, ⌊π·g + κ + 1⌋) over boxes
    that also cut π·g (:func:`_box_bound`; a box flat in all of them is a Lagrangian bound, so the
    search stops unclosed) — except, with ``exact_whole`` on the compiled engine, boxes narrow in U
    (hi ≤ lo·(1 + LABEL_SPAN)) or flat in U, σ and o, whose floor term is then exact (Pareto labels
    of S and π·g, :meth:`.ShapePricer.solve_whole`): slower, so :func:`fluid_lower_bound` asks for it
    only once the Lagrangian boxes stop unclosed (and the search for leaves it cannot branch).

    Box U ∈ (lo, hi], max σ ∈ (a, b], max o ∈ (oa, ob]: every shape in it has W ≥ w(box) :=
    max(R, a⁺ + oa⁺) (its largest sync and its largest optimizer step, :func:`.stage_floors.stage_maxima`)
    and value ≥ DP(hi, b, ob; lo) + w(box) + min(lo·κ, hi·κ), DP = min S + Σ_k π_n·t·max(lo, u_k) over
    shapes with every u ≤ hi, σ ≤ b and o ≤ ob (:func:`.stage_floors.sync_tables`; each stage's share
    of U·π·g at its own time where that exceeds lo: exact for a balanced shape, whose stages all run
    near U, so the boxes need cutting in U only for unbalanced ones). The two W dimensions let the
    search close on shapes whose sync and optimizer maxima sit on different stages, which one cap on
    w = σ + o per stage cannot see (hexiscale-het3: a 4090 stage's sync beside an A100 stage's AdamW
    step over 25 layers). Returns the proven minimum (the least box bound), the argmin shapes met on
    the way (new columns) and whether the search closed (least bound within ``rel`` of the best shape
    found) rather than hit a limit. The box of least bound is cut along the dimension whose
    relaxation costs its best shape most."""
    pr = pricer_for(tables)
    floors = _Floors(tables, replicas, rest_s, locality, w_cap)
    extras = floors.extras
    caps = np.array([float(n.count) for n in tables.problem.cluster.nodes])
    pi_g = float(pi @ caps)
    A = pi_g + mu * pmax
    if pmin > 0 and pi_g >= M * (1 - 1e-9):
        # every plan has ≥ pmin pipelines: κ' = (M − π·G)/pmin < 0 is valid (Σ_p κ' ≤ κ'·pmin)
        kappa = (M - pi_g) / pmin - 1.0
    else:
        if A >= M * (1 - 1e-9):  # at the master's root A = V_R = M: shrink the multipliers (any π, μ ≥ 0 are valid)
            shrink = M * (1 - 1e-9) / A
            pi, mu, A = pi * shrink, mu * shrink, M * (1 - 1e-9)
        # κ' = κ + 1 = (M − π·G)/pmax ≥ 0: μ cancels, so a counted master's free μ (< 0) is harmless here
        kappa = (M - A) / pmax - 1.0 + mu
    lo0 = pr.u_floor
    if top <= lo0:
        return top, [], True
    # W ∈ [w0, top]: W = max(R, max_k w_k) ≥ w0 = max(R, least w), and a larger W leaves no time
    w0 = max(rest_s, _entry_range(extras)[0])
    w_top = min(top, w_cap)  # plans of a W cell have W ≤ w_cap
    if w0 > w_top:
        return top, [], True  # no shape of the cell fits: its plans (none) finish after any time
    base = pr.sync_tables(extras, math.inf, w_cap)
    s_lo, s_hi = _entry_range(base)
    s0 = max(0.0, s_lo)  # no stage syncs in less (nor a shape's largest)
    s_top = min(w_top, s_hi)  # nor in more
    o_all = extras.opt if extras.opt is not None else np.zeros(1)
    o0, o_top = float(o_all.min()) * (1 - 1e-9), min(w_top, float(o_all.max()))
    u_edges = list(np.geomspace(lo0, top, 9))
    # (boxes above the largest stage σ or o would repeat the one below: the DP caps only from above)
    s_edges = [-math.inf, s0] + (list(np.geomspace(s0, s_top, 3)[1:]) if s_top > s0 > 0 else
                                 [s_top] if s_top > s0 else [])
    o_edges = [-math.inf, o0] + (list(np.geomspace(o0, o_top, 3)[1:]) if o_top > o0 > 0 else [])
    o_edges[-1] = math.inf  # (no stage's optimizer part is above o_top: the last box is the base tables)
    # a box: (lo, hi, a, b, g0, g1, oa, ob) — U, max σ, π·g (whole batches), max o
    boxes0 = [(u_edges[i], u_edges[i + 1], s_edges[j], s_edges[j + 1], 0.0, math.inf, o_edges[k], o_edges[k + 1])
              for i in range(len(u_edges) - 1) for j in range(len(s_edges) - 1) for k in range(len(o_edges) - 1)]
    heap: list[tuple[float, int, tuple[float, ...], Shape]] = []
    found: dict[tuple, Shape] = {}
    best_exact = math.inf
    tie = 0
    kp = kappa + 1.0 - 1e-9  # κ' a hair low: the whole-batch certificate needs f_s ≤ a_s − ε
    g_top = float(pi @ caps)  # π·g of a shape never exceeds it

    pgs: dict[tuple[int, ...], float] = {}

    def pg(s: Shape) -> float:  # π·g (remembered by GPU use: shapes share it)
        v = pgs.get(s.gpus)
        if v is None:
            v = pgs[s.gpus] = float(pi @ np.array(s.gpus, dtype=float))
        return v

    def k_of(s: Shape) -> int:  # whole micro-batches: ⌊π·g + κ'⌋
        return max(0, math.floor(pg(s) + kp))

    def linear(s: Shape) -> float:  # the fractional certificate's value: best columns for the fractional master
        return s.total + floors(s) + s.bottleneck * max(0.0, pg(s) + kappa)

    def value(s: Shape) -> float:
        return s.total + floors(s) + s.bottleneck * k_of(s) if whole else linear(s)

    def w_of(box: tuple[float, ...]) -> float:  # the box's floor on W: least max σ plus least max o
        return max(rest_s, max(s0, box[2]) + max(o0, box[6]))

    def tables_of(box: tuple[float, ...]) -> StageExtras:
        return base if box[7] >= o_top else pr.sync_tables(extras, box[7], w_cap)

    # fractional, κ < 0: also S + U·κ ≥ (1 + κ)·S (U ≤ S), so value ≥ (1 + κ)·min[S + Σ π_n·t·max(lo, u)/(1 + κ)]
    # + W — a box far above its argmin's U (the DP admits every U ≤ hi) is then not charged hi·κ < 0
    steep = not whole and -1.0 + 1e-12 < kappa < 0.0
    # fractional, κ ≤ −1 (κ' < 0: Σ x ≥ P_lo): a shape's value is at least S + W (its U term
    # max(0, π·g + κ)·U ≥ 0), S at least the box's least S (the DP at λ = 0) and U > lo; the linear term
    # alone says little there. (Admitting only the box's own U > lo in that DP, as the whole-batch boxes
    # do, closed more tiny certificates but cost hexiscale-het2 0.016 s of bound in 120 s: three solves
    # each, 7.541 against 7.557 s mean, 2026-12-03 09:45-10:00 UTC.)
    flat = not whole and kappa <= -1.0 + 1e-12
    lams = LAMBDAS if whole else (1.0, 1.0 / (1.0 + kappa)) if steep else (1.0, 0.0) if flat else (1.0,)
    J, one = len(lams), lams.index(1.0)
    labels = whole and exact_whole and pr.engine == "jit"  # boxes flat in U and W: exact in π·g
    relaxed = False

    def push_labels(boxes: list[tuple[float, ...]], floor: float) -> None:
        """Whole batches by Pareto labels: each box's bound is its exact least S + lo·k + w(box)
        (at least ``floor``, the bound it had); the boxes come back marked exact (g0 = −1)."""
        nonlocal best_exact, tie, relaxed
        for ex, group in _by_tables(boxes, tables_of):
            lows = np.array([b[0] if b[0] > lo0 else -math.inf for b in group])
            # shapes at or above the best one found (or top) need no label: the certificate is at most its value
            ubs = np.array([min(top, best_exact) - w_of(b) for b in group])
            vals, shapes, rx = pr.solve_whole(np.array([b[1] for b in group]), lows, np.array([b[3] for b in group]),
                                              np.array([b[0] for b in group]), kp, ubs, pi, ex)
            relaxed = relaxed or rx
            for i, box in enumerate(group):
                s = shapes[i]
                if s is None:
                    continue
                tie += 1
                heapq.heappush(heap, (max(floor, float(vals[i]) + w_of(box)), tie,
                                      (*box[:4], -1.0, math.inf, *box[6:]), s))
                exact = value(s)
                if exact < best_exact:
                    best_exact = exact
                found.setdefault(s.stages, s)

    def push(boxes: list[tuple[float, ...]]) -> None:
        nonlocal best_exact, tie
        for ex, group in _by_tables(boxes, tables_of):
            los = np.array([b[0] for b in group])
            lam = los[:, None] * np.array(lams)[None, :]                     # (boxes, J)
            # whole batches: the DP admits only the box's shapes, U > lo (else its argmin can sit below
            # the box, whose bound then never rises as U is cut; the bottom box holds every shape, U ≥ lo0)
            lows = np.repeat([b[0] if b[0] > lo0 else -math.inf for b in group], J) if whole else None
            his, bs = np.array([b[1] for b in group]), np.array([b[3] for b in group])
            # fractional: a box's shapes have U > lo, so U·π·g ≥ Σ π_n·t·max(lo, u) over their stages
            # (each stage's own time, not only the box's floor: exact for a balanced shape)
            slopes = None if whole else np.tile(np.array(lams), len(group))
            vals, shapes = pr.solve(his if J == 1 else np.repeat(his, J), lam.ravel(), pi,
                                    bs if J == 1 else np.repeat(bs, J), ex, lows, slopes)
            vals = vals.reshape(len(group), J)
            for i, box in enumerate(group):
                s = shapes[i * J + one]
                if s is None:
                    continue
                lo, hi, _, _, g0, g1 = box[:6]
                if whole:
                    bound = _box_bound(vals[i], lam[i], lo, kp, top, g0, g1) + w_of(box)
                else:
                    bound = vals[i, one] + w_of(box) + min(lo * kappa, hi * kappa)
                    if steep:
                        bound = max(bound, (1.0 + kappa) * vals[i, 1] + w_of(box))
                    elif flat:
                        bound = max(bound, max(vals[i, 1], lo) + w_of(box))  # (S ≥ U > lo)
                tie += 1
                heapq.heappush(heap, (bound, tie, box, s))
                for s2 in shapes[i * J: (i + 1) * J]:
                    if s2 is None:
                        continue
                    exact = value(s2)
                    if exact < best_exact:
                        best_exact = exact
                    found.setdefault(s2.stages, s2)

    def split(children: list[tuple[float, ...]], parent: float) -> None:
        """Price a cut box's two halves: by labels once the box is exact or narrow in U (few shapes
        fit, so the fronts stay short), else by the Lagrangian DPs."""
        lo, hi, g0 = children[0][0], children[-1][1], children[0][4]
        if labels and (g0 < 0 or hi <= lo * (1 + LABEL_SPAN)):
            push_labels(children, parent)
        else:
            push(children)

    def cut(lo_: float, hi_: float) -> float:  # the split point of (lo_, hi_]: geometric where it can be
        return math.sqrt(lo_ * hi_) if lo_ > 0 else 0.5 * (lo_ + hi_)

    push(boxes0)
    calls, closed = 1, not heap
    while heap and calls < max_dp and (deadline is None or time.monotonic() < deadline):
        bound, _, box, s = heap[0]
        lo, hi, a, b, g0, g1, oa, ob = box
        a_eff, b_eff = max(a, s0), min(b, w_top)
        oa_eff, ob_eff = max(oa, o0), min(ob, o_top)
        u_flat = hi <= lo * (1 + 1e-9)
        s_flat = b_eff - a_eff <= 1e-9 * max(1.0, abs(b_eff))
        o_flat = ob_eff - oa_eff <= 1e-9 * max(1.0, abs(ob_eff))
        w_flat = s_flat and o_flat
        g_flat = not whole or g0 < 0 or min(g1, g_top) - g0 <= 1e-9 * max(1.0, g0)
        # closed: the least bound reaches the best shape found, or it is a point box (exact; with
        # whole batches a point of π·g is still a Lagrangian bound, and so is a label front that
        # was thinned: the search stops unclosed there)
        if bound >= best_exact - rel * abs(best_exact) or (u_flat and w_flat and g_flat):
            closed = bound >= best_exact - rel * abs(best_exact) or not whole or (g0 < 0 and not relaxed)
            break
        heapq.heappop(heap)
        # which relaxation costs the box's own argmin most: U at lo, max σ at a or max o at oa?
        # (then π·g: whole batches)
        if whole:
            slack_u = (s.bottleneck - lo) * k_of(s)
        else:  # the box charges each stage's π_n·t at max(lo, u) instead of at U
            miss = sum(float(pi[pr.node[c]] * pr.tp[c]) * (s.bottleneck - max(lo, u))
                       for (c, _), u in zip(s.stages, pr.stage_times(s.stages)))
            slack_u = miss + s.bottleneck * kappa - min(lo * kappa, hi * kappa)
        _, sig, opt = pr.stage_maxima(s.stages, extras)
        slack_w = floors(s) - w_of(box)  # what the box's W floor misses of the shape's own W
        slack_s = 0.0 if s_flat or slack_w <= 0 else min(slack_w, max(0.0, sig - a_eff))
        slack_o = 0.0 if o_flat or slack_w <= 0 else min(slack_w, max(0.0, opt - oa_eff))
        if u_flat and w_flat and labels:  # only π·g is left: the labels price it exactly
            push_labels([box], bound)
        elif u_flat and w_flat:  # only π·g is left to split
            g_s = pg(s)
            gc = g_s if g0 < g_s < min(g1, g_top) else 0.5 * (g0 + min(g1, g_top))
            push([(lo, hi, a, b, g0, gc, oa, ob), (lo, hi, a, b, gc, g1, oa, ob)])
        elif not w_flat and (u_flat or max(slack_s, slack_o) >= slack_u):
            if not o_flat and (s_flat or slack_o > slack_s):
                mid = cut(oa_eff, ob_eff)
                split([(lo, hi, a, b, g0, g1, oa, mid), (lo, hi, a, b, g0, g1, mid, ob)], bound)
            else:
                mid = cut(a_eff, b_eff)
                split([(lo, hi, a, mid, g0, g1, oa, ob), (lo, hi, mid, b, g0, g1, oa, ob)], bound)
        else:
            mid = math.sqrt(lo * hi)
            split([(lo, mid, a, b, g0, g1, oa, ob), (mid, hi, a, b, g0, g1, oa, ob)], bound)
        calls += 1
    cert = heap[0][0] if heap else top
    if labels:  # the label boxes leave out shapes above the best one found, which bounds them all
        cert = min(cert, best_exact)
    logger.debug("certificate %.6g, best shape %.6g, %d DP calls, closed %s", cert, best_exact, calls, closed)
    good = {s.stages: s for key in (linear, value) for s in sorted(found.values(), key=key)[:8]}
    return min(cert, top), list(good.values()), closed


def _entry_range(ex: StageExtras) -> tuple[float, float]:
    """Least and largest finite entry of a floor table's stage positions (0, 0 when none is finite)."""
    fin = [t[np.isfinite(t)] for t in (ex.mid, ex.first, ex.last, ex.single)]
    fin = [f for f in fin if f.size]
    if not fin:
        return 0.0, 0.0
    return min(float(f.min()) for f in fin), max(float(f.max()) for f in fin)


def _by_tables(boxes: list[tuple[float, ...]], tables_of: Callable[[tuple[float, ...]], StageExtras],
               ) -> list[tuple[StageExtras, list[tuple[float, ...]]]]:
    """The boxes grouped by the floor tables their optimizer cap selects (one DP batch per table)."""
    groups: dict[int, tuple[StageExtras, list[tuple[float, ...]]]] = {}
    for box in boxes:
        ex = tables_of(box)
        groups.setdefault(id(ex), (ex, []))[1].append(box)
    return list(groups.values())


def _box_bound(D: np.ndarray, lam: np.ndarray, lo: float, kp: float, top: float, g0: float, g1: float) -> float:
    """A lower bound on S + U·k_s, k_s = max(0, ⌊π·g + κ'⌋), over the shapes of a box (U > lo,
    g0 ≤ π·g < g1), given D_j = min S + λ_j·π·g over a superset: a shape with k_s = k has π·g in
    [max(g0, k − κ'), min(g1, k + 1 − κ')), so S ≥ D_j − λ_j·(that range's upper end if λ_j ≥ 0, else
    its lower end) and the value ≥ lo·k + max_j of those (docs/formulation.md §14). That is convex in
    k, so its least whole k is found by bisection; k beyond top/lo cannot beat top."""
    finite = np.isfinite(D)
    if not finite.any():
        return math.inf
    D, lam = D[finite], lam[finite]
    kmax = max(0, math.ceil(top / lo)) + 1 if lo > 0 else 0
    k_lo = max(0, math.floor(g0 + kp))
    k_hi = min(kmax, math.floor(g1 + kp)) if math.isfinite(g1) else kmax
    if k_hi < k_lo:
        return math.inf

    def f(k: int) -> float:
        up, down = min(g1, k + 1 - kp), max(g0, k - kp)
        return lo * k + float(np.max(D - np.where(lam >= 0, lam * up, lam * down)))

    a, b = k_lo, k_hi
    while a < b:  # least k of a convex f
        m = (a + b) // 2
        if f(m + 1) < f(m):
            a = m + 1
        else:
            b = m
    out = f(a)
    return min(out, lo * (kmax + 1)) if k_hi == kmax else out


def sync_lower_bound(tables: CostTables, pipelines: int) -> float:
    """Seconds of gradient sync no plan with ``pipelines`` pipelines beats: every pipeline's first
    stage holds the embedding and ≥ 1 layer (its last the head and ≥ 1 layer), and one GPU of it
    all-reduces its 1/t share over the ``pipelines`` replicas — bounded below per option by
    :meth:`CostTables.sync_layer_lb` on the combined payload (one latency: never above the exact sum)."""
    if pipelines < 2:
        return 0.0
    model = tables.problem.model
    first = min(tables.sync_layer_lb(o.index, pipelines, model.params_per_layer + model.embedding_params)
                for o in tables.options)
    last = min(tables.sync_layer_lb(o.index, pipelines, model.params_per_layer + model.head_params)
               for o in tables.options)
    # some pipeline uses at most ⌊N/P⌋ GPUs, and its GPUs share all the model's parameters
    # (Σ_k t_k·params_k/t_k = total), so one of them holds at least total/⌊N/P⌋ of them
    share = model.total_params / max(1, tables.problem.cluster.num_gpus // pipelines)
    heavy = min(tables.sync_layer_lb(o.index, pipelines, share * o.tp) for o in tables.options)
    cl = tables.problem.cluster
    if len(cl.nodes) > 1 and pipelines > max(node.count for node in cl.nodes):
        # the P holders of a piece (one GPU per pipeline) cannot share one node: their slowest link
        # is no faster than the fastest link between two nodes (gradsync's ordering)
        payload = share * tables.problem.training.dtype_bytes
        heavy = max(heavy, min(cost.collective_time(OpClass.ALL_REDUCE, pipelines, payload, lk, tables.profile)
                               for lk in tables.inter_node_links))
    return max(0.0, first, last, heavy)
