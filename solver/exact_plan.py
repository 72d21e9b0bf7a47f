"""The exact heterogeneous planner: decomposition over the pipeline count P, a warm start from the
heuristics, and logic-based Benders cuts that make the gradient-sync term exact.

For every P = 1 … P_max (P_max from memory: each pipeline needs GPUs holding the whole model state)
the P-pipeline model of :mod:`.plan_formulation` is solved by a backend (CP-SAT, CBC or HiGHS).
Its objective is exact for pipeline time and optimizer time and a valid lower bound for gradient
sync; each solution is decoded and scored by the one evaluator, and if the evaluator's time exceeds
the model's (sync underestimated) an exact no-good cut for that structure is added and the model
re-solved. The model value is a lower bound for every plan with P pipelines, so

    bound = min_P max(backend bound of the last solve for P, fluid bound F_P),
    incumbent = best evaluated plan (heuristics, plans rounded from the fluid masters, model solutions),

F_P being the column-generation bound of :mod:`.fluid_bound` (a P with F_P ≥ incumbent needs no
solve). The result is called optimal only when the relative gap is within ``gap_tol`` (1e-6) plus the
rounding of the integer time scale; a larger proven gap is reported with status timeout/feasible.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from hexhelix.ir.checks import finite_number
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import Plan, PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from . import cost, kernels
from .candidates import CostTables, build_tables, memory_shortfall
from .depth_bound import depth_lower_bounds, memory_depends_on_depth
from .evaluate import Evaluation, evaluate
from .exact_budget import (
    BUILD_AND_CALL_S_PER_TERM,
    DEFAULT_TIME_LIMIT,
    DEPTH_SHARE,
    EXACT_SHARE_SPLIT,
    FLUID_ALONE_MARGIN,
    FLUID_ALONE_SHARE,
    FLUID_COLLECT_S,
    FLUID_PARALLEL_MIN_S,
    FLUID_SHARE,
    FLUID_SPLIT_MIN_GPUS,
    GAP_WEIGHT_FLOOR,
    REGROUP_MORE_S,
    REGROUP_MORE_SHARE,
    SHAPE_BOUND_SHARE,
    SINGLE_PIPELINE_SHARE,
    SYMMETRIC_MORE_S,
    SYMMETRIC_MORE_SHARE,
    TICKS_AT_RATE_BOUND,
    WARM_START_ALONE_SHARE,
    WARM_START_IMPROVE_S,
    WARM_START_REGROUP_EVALS,
    WARM_START_SHARE,
)
from .fluid_bound import terms_lower_bound
from .fluid_job import FluidJob, FluidOutcome, can_fork, run_fluid, start_fluid
from .hexiscale import polish, regroup_more, symmetric_more
from .node_merge import fluid_view
from .plan_formulation import BackendOutcome, LinearModel, build_plan_model
from .result import SolveResult, SolveStatus
from .shape_bound import shape_lower_bound
from .single_pipeline import single_pipeline_bound

__all__ = ["DEFAULT_TIME_LIMIT", "max_pipelines", "min_gpus_per_pipeline", "solve_exact"]

logger = logging.getLogger(__name__)

# (model, seconds, hint, interrupt): a backend may stop early once interrupt() is True (CP-SAT does)
Backend = Callable[[LinearModel, float, "dict[int, int] | None", "Callable[[], bool] | None"], BackendOutcome]


def _unbuilt_cost_s(terms: int, per_term_s: float = BUILD_AND_CALL_S_PER_TERM) -> float:
    """Seconds to build a P-model of ``terms`` node-pair and micro-batch terms and make its first backend call, beyond
    that call's search (``per_term_s``: the backend's rate)."""
    return terms * per_term_s


def min_gpus_per_pipeline(tables: CostTables) -> int:
    """Fewest GPUs any pipeline can use: the largest memories (less the runtime reserve) must hold
    the model states (16 B/param by default) — a valid bound; activations only raise it."""
    pb = tables.problem
    need = cost.model_state_bytes(pb.model.total_params, 1, pb.training)
    reserve = tables.profile.runtime_reserve_bytes
    mems = sorted((pb.cluster.gpu_of_node(n).memory_bytes - reserve for n, node in enumerate(pb.cluster.nodes)
                   for _ in range(node.count)), reverse=True)
    total = 0.0
    for k, mem in enumerate(mems, 1):
        total += max(mem, 0)
        if total >= need:
            return k
    return len(mems) + 1


def max_pipelines(tables: CostTables) -> int:
    """P_max = min(micro-batches, GPUs // fewest GPUs per pipeline)."""
    pb = tables.problem
    return max(0, min(pb.training.num_micro_batches, pb.cluster.num_gpus // min_gpus_per_pipeline(tables)))


def _warm_start_plans(problem: PlanProblem, seed: int, profile: Profile, options: dict[str, Any],
                      budget: float, unfinished: list[Plan] | None = None) -> list[Plan]:
    """The heuristics' plans (and ``initial_plan``), each given ``budget`` seconds; hexiscale's, when its
    grouping search ran out of time before a local optimum, is also put in ``unfinished``."""
    plans: list[Plan] = []
    if options.get("initial_plan") is not None:
        plans.append(options["initial_plan"])
    if options.get("warm_start", True):
        from .solve import solve  # lazy: solve imports this module's callers

        for name in options.get("warm_start_methods", ("hexiscale", "megatron")):
            # hexiscale's grouping search may use the warm start's time up to WARM_START_IMPROVE_S (it stops
            # earlier at a local optimum): a better incumbent is worth more here than its step count's determinism
            improve = min(budget, WARM_START_IMPROVE_S)
            res = solve(problem, name, seed=seed, profile=profile, time_limit=budget,
                        options={"regroup_evals": WARM_START_REGROUP_EVALS, "improve_s": improve})
            if res.plan is not None and res.evaluation is not None and res.evaluation.feasible:
                plans.append(res.plan)
                if unfinished is not None and res.params.get("regroup_stopped") == "time":
                    unfinished.append(res.plan)
            else:
                logger.info("warm start %s gave no plan: %s", name, res.reason or res.status)
    return plans


def solve_exact(problem: PlanProblem, backend: Backend, *, solver: str, seed: int = 0,
                profile: Profile = DEFAULT_PROFILE, time_limit: float | None = None,
                options: dict[str, Any] | None = None,
                build_s_per_term: float = BUILD_AND_CALL_S_PER_TERM) -> SolveResult:
    """Run the exact method with ``backend``; ``build_s_per_term``: its seconds per node-pair term to
    build a P-model and make the first call beyond the search (a model that would not fit the time
    left is not built: :data:`BUILD_AND_CALL_S_PER_TERM` for CP-SAT, more through PuLP).

    Options: ``warm_start`` (default True: best of the hexiscale and megatron heuristics, each given
    25 % of the limit — 50 % where no P-model could be built and called in the time left to
    the models, ``params['models_fit']`` False — hints the model and cuts off worse plans; where
    hexiscale's grouping search ran out of its min(10 s, 25 %) and the fluid search runs in a child, it
    goes on here meanwhile, ``params['regroup_more']``; with the child, plans of identical pipelines are
    first listed here beyond hexiscale's step budget for ``symmetric_more_s`` seconds (default
    min(10 s, 10 % of the limit); False: not at all), ``params['symmetric_more']``),
    ``initial_plan`` (a Plan used the same way), ``max_pipelines`` (cap P; the bound is then only over
    the P explored and the result cannot be optimal),
    ``gap_tol`` (relative gap accepted as optimal on top of the time-scale rounding, default 1e-6),
    ``fluid_bound`` (default True: the per-P column-generation bound of :mod:`.fluid_bound`, given at
    most ``fluid_share`` = 60 % of the time, 97 % where no P-model fits; it proves P values unable to
    beat the incumbent; with ``fluid_parallel`` — default: when the time limit is at least 10 s and a
    second core and ``fork`` are available — it runs instead in a forked child for the whole time limit
    while the exact models run here, and its bounds and rounded plans join theirs at the end; with
    ``fluid_split`` — default: from 16 GPUs on, where some P-model fits — the child searches the even
    pipeline counts and this process, after giving the exact models ``exact_share`` = 2 % of the time,
    the odd ones; with
    ``merge_nodes`` — default True — on a cluster of more than eight nodes the search runs on the view
    that merges interchangeable nodes, :mod:`.node_merge`, and gives bounds only, ``params['fluid_nodes']``),
    ``single_pipeline`` (default True: P = 1 bounded with every node's GPUs counted, :mod:`.single_pipeline`,
    in 5 % of the time left after the warm start; its laid-out stage multisets join the plans,
    ``params['single_pipeline_bound_s']`` and ``['single_pipeline_plan_s']``),
    ``shape_bound`` (default True unless split: the order-free shape enumeration bound of
    :mod:`.shape_bound`, given at most 25 % of the models' time), ``max_model_rows`` (P-models estimated
    larger are skipped: their bound stays the total-work bound and the result cannot be optimal),
    ``export_model`` (path: write the first P-model built as an LP file, e.g. for a bug report),
    ``workers``, ``log``.

    The numba kernels are compiled (a fresh install's first solve, ~25 s) or loaded from their disk
    cache before the clock starts (:func:`.kernels.warm`); ``params['kernels_s']`` says how long that took.
    """
    opts = dict(options or {})
    slot = opts.get("symmetric_more_s", True)  # seconds for identical pipelines beside the fluid child
    if not isinstance(slot, bool) and not (finite_number(slot) and slot >= 0):
        raise InvalidInputError(f"must be seconds >= 0, True (the default share) or False (off), got {slot!r}",
                                field="symmetric_more_s")
    kernels_s = kernels.warm()  # before the clock starts: a fresh install compiles them here (~25 s), once
    res = _ExactRun(problem, backend, solver, seed, profile, time_limit, opts, build_s_per_term).run()
    if kernels_s >= 0.01:
        res.params["kernels_s"] = round(kernels_s, 3)
    return res


class _ExactRun:
    """One exact solve (:func:`solve_exact`): the incumbent, the per-P bounds and proofs, the fluid
    search (here or in a child) and the P-models, in the order :meth:`run` gives them time."""

    tables: CostTables
    pmax: int
    gmin: int  # fewest GPUs per pipeline
    parallel: bool  # the fluid search runs in a child on a second core
    alone: bool  # no P-model could run in its share: the warm start gets half the limit, the fluid search the rest
    scale: float  # ticks per second of the integer time scale
    rate: float  # the a-priori bound: total work over total rate (or the shape bound)
    p_values: list[int]  # the pipeline counts modelled, in order

    def __init__(self, problem: PlanProblem, backend: Backend, solver: str, seed: int, profile: Profile,
                 time_limit: float | None, opts: dict[str, Any], build_s_per_term: float) -> None:
        self.problem, self.backend, self.solver, self.seed, self.profile = problem, backend, solver, seed, profile
        self.opts, self.build_s_per_term = opts, build_s_per_term
        self.t0 = time.monotonic()
        self.limit = float(time_limit) if time_limit is not None else DEFAULT_TIME_LIMIT
        self.deadline = self.t0 + self.limit
        self.solve_deadline = self.deadline  # the exact models' own (earlier when a fluid child must be collected)
        self.params: dict[str, Any] = {"seed": seed, "time_limit": self.limit,
                                       **{k: v for k, v in opts.items() if k != "initial_plan"}}
        self.gap_tol = float(opts.get("gap_tol", 1e-6))
        self.best: tuple[Plan, Evaluation] | None = None
        self.fluid: dict[int, float] = {}   # per P, the fluid bound (two searches: the larger)
        self.depth: dict[int, float] = {}   # per P, the bound with memory at depth (docs §16)
        self.single: dict[int, float] = {}  # P = 1: the one-pipeline bound counting every node's GPUs (docs §18)
        self.unsearched: frozenset[int] = frozenset()  # pipeline counts settled before the fluid search
        self.bounds: dict[int, float] = {}  # per P explored, the best bound
        self.terms: dict[tuple[int, float], float] = {}  # (P, rate) -> the term-by-term floor (_floor)
        self.proven: dict[int, bool] = {}
        self.job: FluidJob | None = None
        self.child_counts: frozenset[int] | None = None  # the pipeline counts the child searches (None: all)
        self.logs: list[str] = []
        self.iterations = 0
        self.models: dict[int, Any] = {}
        self.skipped: set[int] = set()
        self.too_big: dict[int, int] = {}  # P -> estimated rows of a model not built (one warning for all)
        self.max_rows = int(opts.get("max_model_rows", 400_000))
        self.models_exported = False
        self.seen: dict[int, set[tuple[int, ...]]] = {}
        self.fixed: dict[int, float] = {}  # P -> the most seconds a backend call of its model took beyond its search
        self.overrun = 0.0  # seconds the backends' own runs went past the limits they were given, all calls

    def result(self, status: SolveStatus, plan: Plan | None, ev: Evaluation | None, bound: float | None,
               reason: str = "", log: str = "", objective: float = math.inf) -> SolveResult:
        """The solve's result, timed from its start, with its params."""
        return SolveResult(solver=self.solver, status=status, plan=plan, evaluation=ev, objective_s=objective,
                           bound_s=bound, solve_time_s=time.monotonic() - self.t0, reason=reason,
                           params=self.params, log=log)

    @property
    def incumbent_s(self) -> float | None:
        """The best plan's iteration time so far (None before any plan)."""
        return self.best[1].iteration_time_s if self.best is not None else None

    def run(self) -> SolveResult:
        problem, opts = self.problem, self.opts
        self.tables = tables = build_tables(problem, self.profile)
        # the fluid search runs on a merged view of a cluster of many interchangeable nodes (node_merge)
        self.view = fluid_view(problem) if opts.get("merge_nodes", True) else None
        self.fluid_tables = tables if self.view is None else build_tables(self.view.problem, self.profile,
                                                                          node_sizes=self.view.node_sizes)
        self.params["fluid_nodes"] = len(self.fluid_tables.problem.cluster.nodes)
        short = memory_shortfall(tables)
        self.pmax = pmax = max_pipelines(tables)
        if short or pmax < 1:
            return self.result(SolveStatus.INFEASIBLE, None, None, None,
                               short or "memory: no group of GPUs can hold the model states of "
                                        f"{problem.model.name}; see `hexhelix gpus` for capacities")
        self.gmin = min_gpus_per_pipeline(tables)
        parallel = opts.get("fluid_parallel")
        self.parallel = can_fork() and (self.limit >= FLUID_PARALLEL_MIN_S if parallel is None else bool(parallel))
        # no P-model could run in its share of the time: the warm start and the fluid search take it all
        models_s = (1 - WARM_START_SHARE) * self.limit  # the models' time: all that the warm start leaves, beside a child
        self.alone = not self._some_model_fits(
            models_s if self.parallel else models_s * (1 - float(opts.get("fluid_share", FLUID_SHARE))))
        self.params["models_fit"] = not self.alone
        unfinished: list[Plan] = []  # hexiscale's plan when its grouping search ran out of the warm-start budget
        warm = WARM_START_ALONE_SHARE if self.alone else WARM_START_SHARE
        for plan in _warm_start_plans(problem, self.seed, self.profile, opts, budget=warm * self.limit,
                                      unfinished=unfinished):
            self._offer(plan, evaluate(plan, self.profile))
        self.scale = TICKS_AT_RATE_BOUND / tables.gpu_rate_bound()
        self.rate = tables.gpu_rate_bound()
        if opts.get("single_pipeline", True):
            self._single_pipeline()
        if opts.get("depth_bound", True) and self.best is not None and memory_depends_on_depth(tables):
            self.depth = depth_lower_bounds(tables, pmax, self.best[1].iteration_time_s,
                                            deadline=self._share_of_rest(float(opts.get("depth_share", DEPTH_SHARE))))
            self.params["depth_bound_s"] = min(self.depth.values()) if len(self.depth) == pmax else None
        split, mine = self._start_fluid_search()
        if self.job is not None and self.best is not None:
            self._beside_child(unfinished)
        self.params["fluid_split"] = split
        models_deadline = time.monotonic() + float(opts.get("exact_share", EXACT_SHARE_SPLIT)) * max(
            0.0, self.solve_deadline - time.monotonic()) if split else self.solve_deadline
        if opts.get("shape_bound", not split):  # order-free shape enumeration: a bound valid for every P
            sb = shape_lower_bound(tables, deadline=self._share_of(SHAPE_BOUND_SHARE, models_deadline))
            if sb is not None:
                self.rate = max(self.rate, sb)
            self.params["shape_bound_s"] = sb
        self.p_values = self._pipeline_counts()
        self.model_passes(models_deadline)
        if split:  # this process's share of the fluid search, then what time it leaves back to the models
            if self.best is not None and not all(self.proven.get(P, False) for P in mine):
                self.take_fluid(run_fluid(self.fluid_tables, pmax, self.best[1].iteration_time_s,
                                          self._fluid_seed(self.best[0]), self.solve_deadline, only=mine,
                                          keep_plan=self.view is None))
                self.settle_fluid()
            self.model_passes(self.solve_deadline)
        _warn_too_big(self.too_big, self.max_rows)
        if self.job is not None and all(self.proven.get(P, False) for P in range(1, pmax + 1)):
            self.job.cancel()  # the exact models proved every pipeline count: nothing left for the child to add
        elif self.job is not None:  # the child's bounds join the exact models' ones, P by P
            self.take_fluid(self.job.collect())
            self.settle_fluid()
        return self._finish()

    def _single_pipeline(self) -> None:
        """P = 1 bounded with every node's GPUs counted (:mod:`.single_pipeline`); the stage multisets
        of its best caps, laid out as one pipeline each, are offered as plans."""
        res = single_pipeline_bound(self.tables, upper_s=self.incumbent_s, rel_tol=self.gap_tol,
                                    deadline=self._share_of_rest(SINGLE_PIPELINE_SHARE))
        if res is None:
            return
        plans = res.plans(self.tables)
        laid = [evaluate(plan, self.profile) for plan in plans]
        for plan, ev in zip(plans, laid):
            self._offer(plan, ev)
        fits = [ev.iteration_time_s for ev in laid if ev.feasible]
        self.params["single_pipeline_plan_s"] = min(fits) if fits else None
        self.single[1] = res.bound_s
        self.params["single_pipeline_bound_s"] = res.bound_s

    def _early(self, P: int) -> float:
        """P's bounds found before the fluid search: memory at depth, one pipeline (0 where none)."""
        return max(self.depth.get(P, 0.0), self.single.get(P, 0.0))

    def _share_of_rest(self, share: float) -> float:
        """A deadline ``share`` of the time left from now."""
        return self._share_of(share, self.deadline)

    @staticmethod
    def _share_of(share: float, until: float) -> float:
        """A deadline ``share`` of the time from now to ``until``."""
        return time.monotonic() + share * max(0.0, until - time.monotonic())

    def _offer(self, plan: Plan, ev: Evaluation) -> bool:
        """Keep ``plan`` if it is feasible and beats the incumbent; whether it did."""
        if ev.feasible and (self.best is None or ev.iteration_time_s < self.best[1].iteration_time_s):
            self.best = (plan, ev)
            return True
        return False

    # ---- the fluid search (docs §14)
    def _start_fluid_search(self) -> tuple[bool, frozenset[int]]:
        """Column generation per P: in a child on a second core for the whole time limit, or here for
        ``fluid_share`` of it. Returns whether the pipeline counts are split between the two processes
        and the ones left to this process."""
        opts, tables, pmax = self.opts, self.fluid_tables, self.pmax
        inc = self.incumbent_s
        # pipeline counts the depth or one-pipeline bound proved unable to beat the incumbent: no fluid search for them
        settled = frozenset(P for P in set(self.depth) | set(self.single)
                            if inc is not None and self._early(P) >= inc * (1 - self.gap_tol))
        self.unsearched = settled  # the fluid search leaves these at a floor: the log shows no fluid bound for them
        parallel = self.parallel
        # no P-model fits: a second search of the odd counts here lost more than it found (gen-256 / gen-512 at 10 s:
        # bounds 2.216 / 2.341 s split, 2.620 / 2.525 s not; at 30 s gen-512 2.626 / 2.627 s, 2026-12-07)
        split = parallel and bool(opts.get("fluid_split", self.problem.cluster.num_gpus >= FLUID_SPLIT_MIN_GPUS
                                           and not self.alone))
        self.params["fluid_parallel"] = parallel
        # split: the odd pipeline counts are searched here once the models had their share, the even ones in the child
        mine, theirs = frozenset(range(1, pmax + 1, 2)) - settled, frozenset(range(2, pmax + 1, 2)) - settled
        if opts.get("fluid_bound", True) and self.best is not None:
            plan, t, keep = self._fluid_seed(self.best[0]), self.best[1].iteration_time_s, self.view is None
            if parallel:  # on a second core, for the whole time limit, while the exact models run here
                self.solve_deadline = self.deadline - FLUID_COLLECT_S
                self.child_counts = theirs if split else None
                self.job = start_fluid(tables, pmax, t, plan, self.solve_deadline,
                                       only=theirs if split else (mine | theirs) if settled else None, keep_plan=keep)
            else:
                if not self.alone and "fluid_share" not in opts:  # the warm start is over: do the models still fit?
                    self.alone = not self._some_model_fits((1 - FLUID_SHARE) * (1 - SHAPE_BOUND_SHARE) * max(
                        0.0, self.deadline - time.monotonic()), settled)
                    self.params["models_fit"] = not self.alone
                share = float(opts.get("fluid_share", FLUID_ALONE_SHARE if self.alone else FLUID_SHARE))
                until = self._share_of_rest(share)
                if self.alone:  # its last steps overshoot the deadline (512 GPUs at 15 s: by 0.7-1.3 s)
                    until = min(until, self.deadline - max(FLUID_COLLECT_S, FLUID_ALONE_MARGIN * self.limit))
                self.take_fluid(run_fluid(tables, pmax, t, plan, until, only=(mine | theirs) if settled else None,
                                          keep_plan=keep))
        return split and self.job is not None, mine  # no fluid search (option, or no incumbent): nothing to split

    def _fluid_seed(self, plan: Plan) -> Plan:
        """``plan`` as the fluid search sees it: on the merged view's cluster when there is one."""
        return plan if self.view is None else self.view.map_plan(plan)

    def take_fluid(self, out: FluidOutcome) -> None:
        """Record the fluid bounds and the best plan its rounded masters gave (the primal side)."""
        for P, b in out.bounds.items():  # two searches (odd and even P) each bound every P: keep the larger
            self.fluid[P] = max(self.fluid.get(P, 0.0), b)
        # a pipeline count settled before the search was left at a floor there: it counts at the bound that settled it
        by_p = [max(b, self._early(P)) if P in self.unsearched else b for P, b in self.fluid.items()]
        self.params["fluid_bound_s"] = min(by_p) if len(self.fluid) == self.pmax else None
        if out.plan is not None and self.best is not None:
            self._offer(out.plan, evaluate(out.plan, self.profile))

    def settle_fluid(self) -> None:
        """Fluid bounds into the per-P bounds; a P whose bound reaches the incumbent cannot improve on it."""
        inc = self.incumbent_s
        for P in set(self.fluid) | set(self.depth) | set(self.single):
            fb = max(self.fluid.get(P, 0.0), self._early(P))
            self.bounds[P] = max(self.bounds.get(P, 0.0), self._floor(P), fb)
            if inc is not None and fb >= inc * (1 - self.gap_tol):
                self.proven[P] = True

    def poll_child(self) -> None:
        """Take the child's outcome as soon as it is there (its search may end long before the limit)."""
        if self.job is not None and self.job.ready():
            self.take_fluid(self.job.collect())
            self.settle_fluid()
            self.job = None

    def _child_answered_on(self, P: int) -> bool:
        """Whether the fluid child, searching P, has answered: a P-model's solve stops to take it in. One
        on a P the child does not search goes on (hexiscale-het2 with LLaMA 30B: P = 3's proof had been cut
        off 15 s in, when the child answered on the even counts)."""
        return self.job is not None and (self.child_counts is None or P in self.child_counts) and self.job.ready()

    def _beside_child(self, unfinished: list[Plan]) -> None:
        """While the child searches bounds on the second core, improve the incumbent here: plans of
        identical pipelines listed beyond hexiscale's step budget (hexiscale-het2 without recompute:
        6.413 -> 6.311 s), then hexiscale's grouping search from where the warm start stopped it
        (hexiscale-het1, selective recompute: 7.255 -> 7.084 s)."""
        assert self.best is not None
        slot = self.opts.get("symmetric_more_s", True)
        if slot is not False:
            t_sym = time.perf_counter()
            seconds = min(SYMMETRIC_MORE_S, SYMMETRIC_MORE_SHARE * self.limit) if slot is True else float(slot)
            sym = symmetric_more(self.best[0], self.profile, deadline=self._perf_deadline(seconds))
            self.params["symmetric_more"] = {"from_s": self.best[1].iteration_time_s,
                                             "seconds": time.perf_counter() - t_sym,
                                             "to_s": None if sym is None else sym[1].iteration_time_s}
            if sym is not None and sym[1].iteration_time_s < self.best[1].iteration_time_s:
                self.best = polish(sym[0], self.profile, deadline=time.perf_counter() + 1.0)
        if unfinished and unfinished[0] is self.best[0]:
            more = regroup_more(self.best[0], self.profile,
                                deadline=self._perf_deadline(min(REGROUP_MORE_S, REGROUP_MORE_SHARE * self.limit)))
            self.params["regroup_more"] = {"scored": more.scored, "stopped": more.stopped,
                                           "from_s": self.best[1].iteration_time_s,
                                           "to_s": more.evaluation.iteration_time_s}
            if more.evaluation.feasible and more.evaluation.iteration_time_s < self.best[1].iteration_time_s:
                self.best = polish(more.plan, self.profile, deadline=time.perf_counter() + 1.0)

    def _perf_deadline(self, seconds: float) -> float:
        """A ``time.perf_counter()`` deadline ``seconds`` from now, within the exact models' own one."""
        return time.perf_counter() + max(0.0, min(seconds, self.solve_deadline - time.monotonic()))

    # ---- the P-models
    def _pipeline_counts(self) -> list[int]:
        """The pipeline counts to model: the incumbent's first (best cutoff early), then the most
        promising by fluid (or depth) bound. Settles the fluid bounds found so far."""
        p_values = self._modelled_counts()
        if self.best is not None and len(self.best[0].pipelines) in p_values:
            p_values.remove(len(self.best[0].pipelines))
            p_values.insert(0, len(self.best[0].pipelines))
        self.settle_fluid()
        if p_values:
            head = p_values[0]
            p_values.sort(key=lambda P: (P != head, max(self.fluid.get(P, 0.0), self._early(P))))
        return p_values

    def _modelled_counts(self) -> list[int]:
        """1 … P_max, capped by the ``max_pipelines`` option."""
        cap = int(self.opts.get("max_pipelines") or self.pmax)
        return list(range(1, min(self.pmax, cap) + 1))

    def _floor(self, P: int) -> float:
        """P's bound before its model says anything: term by term (the total-work or shape bound on the
        slowest pipeline plus R_P), fluid, depth, one pipeline."""
        key = (P, self.rate)
        if key not in self.terms:
            self.terms[key] = terms_lower_bound(self.tables, P, self.rate)
        return max(self.terms[key], self.fluid.get(P, 0.0), self._early(P))

    def model_passes(self, until: float) -> None:
        """Passes over the unproven pipeline counts, each P-model solved (and cut) in its share of the
        time to ``until`` (by its gap, :meth:`_weights`), until all are proven or the time is up."""
        while True:
            todo = [P for P in self.p_values if not self.proven.get(P, False) and P not in self.skipped]
            if not todo or until - time.monotonic() <= 0.05:
                break
            inc = self.incumbent_s
            if inc is not None and self.rate >= inc * (1 - self.gap_tol):
                break  # the a-priori bound already proves the incumbent optimal
            progress_made, attempted = False, False
            for idx, P in enumerate(todo):
                self.poll_child()
                if self.proven.get(P, False):
                    continue
                remaining = until - time.monotonic()
                if remaining <= 0.05:
                    break
                weights = self._weights([Q for Q in todo[idx:] if not self.proven.get(Q, False)])
                outcome = self._model_pass(P, until, remaining,
                                           time.monotonic() + remaining * weights[P] / sum(weights.values()))
                if outcome is None:
                    continue
                attempted = attempted or outcome
                progress_made = progress_made or self.proven[P]
                logger.info("P=%d: bound %.6g s, proven %s, %d cuts", P, self.bounds[P], self.proven[P],
                            self.models[P].cuts)
            if not progress_made and (until - time.monotonic() <= 0.05 or not attempted):
                break

    def _weights(self, counts: list[int]) -> dict[int, float]:
        """The weights of ``counts`` (the rest of a pass) in its time: each P's gap to the incumbent, at
        least GAP_WEIGHT_FLOOR of the largest over every modelled P (the bound is the least over P, so time
        on a P already near the incumbent buys little); even without an incumbent."""
        inc = self.incumbent_s
        if inc is None:
            return dict.fromkeys(counts, 1.0)
        gaps = {P: max(0.0, inc - (self.bounds[P] if P in self.bounds else self._floor(P))) / inc
                for P in self.p_values}
        floor = max(GAP_WEIGHT_FLOOR * max(gaps.values(), default=0.0), 1e-9)
        return {P: max(gaps[P], floor) for P in counts}

    def _model_size(self, P: int) -> tuple[int, int, int]:
        """P's model: stage slots K per pipeline, node-pair and micro-batch terms, estimated rows."""
        problem = self.problem
        K = max(1, min(problem.model.layers, problem.cluster.num_gpus - (P - 1) * self.gmin))
        terms = P * K * len(problem.cluster.nodes) ** 2 + 2 * P * (problem.training.num_micro_batches - P + 1)
        return K, terms, P * K * len(self.tables.options) * (8 + K) + terms

    def _some_model_fits(self, seconds: float, settled: frozenset[int] = frozenset()) -> bool:
        """Whether some P-model, ``settled`` ones aside, is small enough to build and could be built and
        called within ``seconds`` (the tests a pass makes before building one, :meth:`_model_pass`)."""
        for P in set(self._modelled_counts()) - settled:
            _, terms, size = self._model_size(P)
            if size <= self.max_rows and _unbuilt_cost_s(terms, self.build_s_per_term) < seconds:
                return True
        return False

    def _model_pass(self, P: int, until: float, remaining: float, p_deadline: float) -> bool | None:
        """One pass's turn of P: its model built if it fits the time and size, then solved and cut to
        ``p_deadline``. Returns whether a backend call was made; None when P was passed over."""
        tables = self.tables
        ub = self.incumbent_s
        K, terms, size = self._model_size(P)
        need = self.fixed.get(P, 0.0) if P in self.models else _unbuilt_cost_s(terms, self.build_s_per_term)
        if need >= p_deadline - time.monotonic() and size <= self.max_rows:
            if need >= remaining:
                return None  # its fixed cost alone would outlast the pass: a later pass may have more time
            p_deadline = until  # too slow for its share: it takes the rest of the pass
        if P not in self.models:
            if size > self.max_rows:  # too big to build: bound stays the rate bound
                self.too_big[P] = size
                self.bounds[P], self.proven[P] = self._floor(P), False
                self.skipped.add(P)
                return None
            self.models[P] = build_plan_model(tables, P, K, self.scale, cutoff_s=ub, pipe_lb_s=self.rate)
            if self.opts.get("export_model") and not self.models_exported:  # the first model built, as an LP file
                from .milp_plan import to_pulp

                to_pulp(self.models[P].lin, name=f"hexhelix_plan_P{P}")[0].writeLP(str(self.opts["export_model"]))
                self.models_exported = True
            self.seen[P] = set()
            self.bounds[P], self.proven[P] = self._floor(P), False
        elif ub is not None:
            self.models[P].lin.add(dict(self.models[P].lin.objective), "<=", math.ceil(ub * self.scale), "cutoff_pass")
        return self._solve_model(P, p_deadline)

    def _solve_model(self, P: int, p_deadline: float) -> bool:
        """Solve P's model to ``p_deadline``, adding a sync cut and solving again while its solution's
        evaluated time exceeds the model's (docs §6); whether a backend call was made."""
        pm, scale = self.models[P], self.scale
        M, L = self.problem.training.num_micro_batches, self.problem.model.layers
        ub = self.incumbent_s
        hint = pm.encode(self.best[0]) if self.best else None
        attempted = False
        while True:
            left = p_deadline - time.monotonic()
            if left <= max(0.05, self.fixed.get(P, 0.0)):  # its fixed cost alone would outlast it
                break
            # a fluid child that has answered may prove this P: stop the solve to take it in
            t_call = time.monotonic()
            out = self.backend(pm.lin, left, hint, lambda: self._child_answered_on(P))
            self.fixed[P] = max(self.fixed.get(P, 0.0), out.overhead_s, time.monotonic() - t_call - left)
            self.overrun += out.overrun_s
            attempted = True
            self.iterations += 1
            if out.log:
                self.logs.append(f"--- P={P} iteration {self.iterations}\n{out.log}")
            if out.status == "error":  # the backend failed: do not retry this P
                logger.warning("P=%d: backend error", P)
                self.skipped.add(P)
                break
            if out.status == "infeasible":
                self.bounds[P] = ub if ub is not None else math.inf
                self.proven[P] = True
                break
            if out.bound is not None:
                self.bounds[P] = max(self.bounds[P], self._floor(P), out.bound / scale)
            if out.values is None:
                break
            plan = pm.decode(out.values)
            ev = evaluate(plan, self.profile)
            if not ev.feasible:  # would be a modelling bug: say so loudly, never return it
                logger.error("model solution violates the evaluator: %s", "; ".join(ev.violations))
                break
            if self._offer(plan, ev):
                ub = ev.iteration_time_s
                pm.lin.add(dict(pm.lin.objective), "<=", math.ceil(ub * scale), f"cutoff_{self.iterations}")
            true_ticks = ev.iteration_time_s * scale
            key = tuple(i for i in pm.structure_vars() if out.values[i] > 0.5)
            slack = true_ticks - (out.objective or 0.0)
            if P > 1 and slack > _rounding_ticks(M, pm.max_stages, L) + self.gap_tol * true_ticks \
                    and key not in self.seen[P]:
                self.seen[P].add(key)
                pm.add_sync_cut(out.values, ev.grad_sync_s)
                hint = pm.encode(self.best[0])
                continue
            self.proven[P] = out.status == "optimal"
            break
        return attempted

    # ---- the result
    def _finish(self) -> SolveResult:
        """Status, bound and gap from the per-P bounds and the incumbent (docs §11)."""
        problem, pmax, bounds, proven = self.problem, self.pmax, self.bounds, self.proven
        explored_all = set(self.p_values) <= set(bounds) and len(self.p_values) == pmax
        by_p = {P: max(bounds.get(P, 0.0), self._floor(P)) for P in range(1, pmax + 1)}
        lower = min(by_p.values(), default=self.rate)
        self.params.update({"pipelines_explored": sorted(bounds), "pipelines_max": pmax,
                            "iterations": self.iterations,
                            "sync_cuts": sum(pm.cuts for pm in self.models.values()),
                            "backend_overrun_s": round(self.overrun, 3),
                            "pipelines_skipped": sorted(self.skipped),
                            "ticks_per_second": self.scale, "bound_by_pipelines": by_p})
        searched = {P: b for P, b in self.fluid.items() if P not in self.unsearched}
        log = "\n".join([_summary(by_p, searched, self.depth, self.single, proven, self.incumbent_s), *self.logs])
        if self.best is None:
            if explored_all and all(proven.values()) and all(math.isinf(b) for b in bounds.values()):
                return self.result(SolveStatus.INFEASIBLE, None, None, None,
                                   "memory: no placement fits every stage in GPU memory at micro-batch "
                                   f"{problem.training.micro_batch}, seq-len {problem.training.seq_len}", log)
            return self.result(SolveStatus.TIMEOUT, None, None, lower if math.isfinite(lower) else None,
                               f"no plan found within the time limit of {self.limit:g} s", log)
        plan, ev = self.best
        plan = Plan(problem=plan.problem, pipelines=plan.pipelines, meta={**plan.meta, "solver": self.solver})
        bound = min(lower, ev.iteration_time_s)
        gap = (ev.iteration_time_s - bound) / ev.iteration_time_s
        M, L, N = problem.training.num_micro_batches, problem.model.layers, problem.cluster.num_gpus
        tol = self.gap_tol + _rounding_ticks(M, max(1, min(L, N)), L) / (ev.iteration_time_s * self.scale)
        unproven = [P for P in range(1, pmax + 1) if not proven.get(P, False)]
        if gap <= tol:  # the bound is valid whichever way it was obtained
            status, reason = SolveStatus.OPTIMAL, ""
        elif unproven:
            status = SolveStatus.TIMEOUT
            reason = (f"time limit {self.limit:g} s: pipeline counts {unproven} of 1..{pmax} not proven "
                      f"(gap {gap:.2%})")
        else:
            status, reason = SolveStatus.FEASIBLE, f"stopped with gap {gap:.2%} (not proven)"
        return self.result(status, plan, ev, bound, reason, log, objective=ev.iteration_time_s)


def _summary(by_p: dict[int, float], fluid: dict[int, float], depth: dict[int, float], single: dict[int, float],
             proven: dict[int, bool], incumbent: float | None) -> str:
    """The planner's own lines of ``--log``: per pipeline count its bound, where it came from, proven or not
    (the backends' logs follow; a run the fluid search settles may have none)."""
    rows = [f"planner: incumbent {incumbent:.6g} s" if incumbent is not None else "planner: no incumbent",
            "pipelines  bound_s     fluid_s     depth_s     one_pipe_s  proven"]

    def cell(x: float | None) -> str:
        return f"{x:<10.6g}" if x is not None else f"{'-':<10}"

    for P, b in by_p.items():
        rows.append(f"{P:9d}  {cell(b)}  {cell(fluid.get(P))}  {cell(depth.get(P))}  {cell(single.get(P))}  "
                    f"{'yes' if proven.get(P, False) else 'no'}")
    return "\n".join(rows)


def _warn_too_big(too_big: dict[int, int], limit: int) -> None:
    """One line for every P-model too big to build (at 512 GPUs that is each of 256 counts)."""
    if too_big:
        ps, rows = sorted(too_big), too_big.values()
        which = f"P={ps[0]}" if len(ps) == 1 else f"{len(ps)} pipeline counts in {ps[0]}..{ps[-1]}"
        logger.warning("%s: model of ~%d–%d rows skipped (max_model_rows %d); their bound is the fluid or "
                       "total-work bound", which, min(rows), max(rows), limit)


def _rounding_ticks(M: int, K: int, L: int) -> float:
    """Ticks the floored coefficients can lose on one plan: (m−1)·U and Σu lose < 1 tick per
    layer-coefficient and per fixed term of each stage, plus sync and optimizer terms."""
    return float((M + K + 2) * (L + 4))
