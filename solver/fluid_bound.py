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
The certificate and its box search are :mod:`.fluid_certificate`; the master and the column
generation are here. Reference: the decomposition is the classic Dantzig–Wolfe / Gilmore–Gomory
column generation with a Lagrangian (Farley-type) bound that is valid at every iteration, not only at
convergence.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
from hexhelix.ir.opgraph import OpClass
from hexhelix.ir.plan import Plan

from . import cost
from .candidates import CostTables
from .fluid_certificate import DP_CALLS, DP_RAISE, ShapeFloors, certificate
from .milp_plan import quiet_stdout
from .shape_pricing import (
    Shape,
    micro_batches_within,
    pricer_for,
    shape_from_stages,
    shape_of_pipeline,
)
from .stage_floors import NO_LOCALITY, Locality

__all__ = ["FluidResult", "Shape", "ShapeFloors", "certificate", "fluid_lower_bound", "optimizer_lower_bound",
           "rest_lower_bound", "shape_from_stages", "shape_of_pipeline", "sync_lower_bound", "terms_lower_bound"]

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

    def __init__(self, caps: list[int], pmax: int, floors: ShapeFloors, pmin: int = 0, penalty: float = 0.0) -> None:
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
    the whole-batch certificate prices its narrow boxes exactly, by Pareto labels (:func:`.fluid_certificate.certificate`;
    slower per certificate, so the search keeps it for leaves nothing else can raise). ``rate_first``:
    before the first master is solved, one certificate at multipliers proportional to each GPU's layer
    rate (:data:`RATE_SHARE`) — where column generation converges slowly (hundreds of GPUs) its first
    duals prove far less.
    """
    pr = pricer_for(tables)
    M = tables.micro_batches
    caps = [node.count for node in tables.problem.cluster.nodes]
    floors = ShapeFloors(tables, replicas, rest_s, locality, w_cap)
    master = _Master(caps, pmax, floors, pmin=replicas if LEAST_COUNT else 0, penalty=float(M))
    master.whole = whole
    _first_columns(master, tables, pool, seed_plans)
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
                                   rest_s=rest_s, locality=locality, w_cap=w_cap, pmin=master.pmin)
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


def _first_columns(master: _Master, tables: CostTables, pool: tuple[Shape, ...], seed_plans: tuple[Plan, ...]) -> None:
    """A run's first columns: ``pool`` (an earlier run's), the seed plans' pipelines, and — without a
    pool — the fastest shape at π = 0 for each of 24 bottleneck caps spread from the least stage time."""
    for s in pool:
        master.add(s)
    for plan in seed_plans:
        for p in range(len(plan.pipelines)):
            master.add(shape_of_pipeline(tables, plan, p))
    if not pool:
        pr = pricer_for(tables)
        grid = pr.u_floor * np.geomspace(1.0, 4.0 * tables.layers * max(1, min(tables.layers, len(master.caps) * 8)), 24)
        _, shapes = pr.solve(grid, np.zeros(len(grid)), np.zeros(pr.N), None, master.floors.extras)
        for s in shapes:
            if s is not None:
                master.add(s)


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


LEAST_COUNT = True  # a run for plans of P_lo … P_hi pipelines has Σ x ≥ P_lo too (Σ x = P for one P)
ESCALATE_EXACT = True  # a whole-batch certificate whose Lagrangian boxes stop unclosed: price them exactly
SLACK_PRICING = True  # a short master whose capped duals price nothing new prices at the slack's once
# ``rate_first``: a certificate at multipliers proportional to each GPU's layer rate, π·G = this share of M:
# where column generation converges slowly its first duals prove little (gen-512, P = 74..85: 0.248 s against
# 2.343 s at share 0.9; shares 0.5 / 0.8 / 0.95 / 1.0 / 1.2: 1.79 / 2.26 / 2.35 / 2.34 / 1.96 s, 2026-12-06)
RATE_SHARE = 0.9


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
    if len(cl.nodes) > 1 and pipelines > max(tables.physical_sizes):
        # the P holders of a piece (one GPU per pipeline) cannot share one node: their slowest link
        # is no faster than the fastest link between two nodes (gradsync's ordering)
        payload = share * tables.problem.training.dtype_bytes
        heavy = max(heavy, min(cost.collective_time(OpClass.ALL_REDUCE, pipelines, payload, lk, tables.profile)
                               for lk in tables.inter_node_links))
    return max(0.0, first, last, heavy)


def rest_lower_bound(tables: CostTables, pipelines: int) -> float:
    """R_P: seconds of gradient sync and optimizer step together that no plan with ``pipelines`` pipelines
    beats (:func:`sync_lower_bound` + :func:`optimizer_lower_bound`: each bounds its own term)."""
    return float(sync_lower_bound(tables, pipelines) + optimizer_lower_bound(tables, pipelines))


def terms_lower_bound(tables: CostTables, pipelines: int, pipe_s: float | None = None) -> float:
    """A bound on every plan with ``pipelines`` pipelines, term by term: the slowest pipeline takes at least
    ``pipe_s`` (default the total-work bound :meth:`CostTables.gpu_rate_bound`), and sync and optimizer
    at least R_P (:func:`rest_lower_bound`), since the iteration time is their sum. The exact planner's floor
    per pipeline count (where the fluid search never roots one): hexiscale-het3 with Llama-2 13B at 15 s left
    P = 10–28 at the total-work bound alone, 4.883 s, where R_P adds 2.4–4 s (2026-12-07)."""
    pipe = tables.gpu_rate_bound() if pipe_s is None else pipe_s
    return float(pipe + rest_lower_bound(tables, pipelines))
