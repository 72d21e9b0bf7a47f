"""One entry point for every heterogeneous-plan method: ``solve(problem, method, ...)`` → SolveResult.

Registry (conventions 6 and 8): ``cpsat`` and ``milp`` (``backend`` cbc|highs; also spelled
``milp-cbc``/``milp-highs``) are the exact models; ``hexiscale``, ``hexiscale-released`` and
``megatron`` are the heuristics and baseline, imported lazily so this module works before (or
without) them. ``bruteforce`` enumerates every plan of a tiny instance (the test oracle). Every
method's plan is re-scored here by the one evaluator so that comparisons are fair.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from hexhelix.ir.checks import check_seconds
from hexhelix.ir.errors import InvalidInputError, SolverError
from hexhelix.ir.plan import PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .evaluate import evaluate
from .result import SolveResult, SolveStatus

__all__ = ["EXACT_METHODS", "HEURISTIC_METHODS", "METHODS", "check_time_limit", "compare", "relative_to_bound", "solve"]

logger = logging.getLogger(__name__)

# method name → (module, function, extra keyword arguments)
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "cpsat": ("cpsat_plan", "plan_cpsat", {}),
    "milp": ("milp_plan", "plan_milp", {}),
    "milp-cbc": ("milp_plan", "plan_milp", {"backend": "cbc"}),
    "milp-highs": ("milp_plan", "plan_milp", {"backend": "highs"}),
    "hexiscale": ("hexiscale", "plan_hexiscale", {}),
    "hexiscale-released": ("hexiscale_released", "plan_hexiscale_released", {}),
    "megatron": ("megatron", "plan_megatron", {}),
    "bruteforce": ("bruteforce", "plan_bruteforce", {}),
}
EXACT_METHODS = ("cpsat", "milp", "milp-cbc", "milp-highs", "bruteforce")
HEURISTIC_METHODS = ("hexiscale", "hexiscale-released", "megatron")
METHODS = tuple(_REGISTRY)
_EXACT_OPTIONS = {"backend", "warm_start", "warm_start_methods", "initial_plan", "max_pipelines", "gap_tol",
                  "workers", "log", "max_model_rows", "shape_bound", "export_model",
                  "fluid_bound", "fluid_share", "fluid_parallel", "fluid_split", "exact_share", "symmetric_more_s",
                  "merge_nodes", "single_pipeline"}
_HEURISTIC_OPTIONS = {"hexiscale": {"regroup_evals", "improve_s"}}


def _resolve(method: str) -> Callable[..., SolveResult]:
    if method not in _REGISTRY:
        raise InvalidInputError(f"unknown solver {method!r}; choose one of {', '.join(METHODS)}", field="--solver")
    module, func, _ = _REGISTRY[method]
    mod = importlib.import_module(f"hexhelix.solver.{module}")
    return getattr(mod, func)


def check_time_limit(time_limit: float | None) -> None:
    """A time limit is None (the method's default) or a positive, finite number of seconds."""
    if time_limit is not None:
        check_seconds(time_limit, "--time-limit", positive=True)


def solve(problem: PlanProblem, method: str, *, seed: int = 0, profile: Profile = DEFAULT_PROFILE,
          time_limit: float | None = None, options: dict[str, Any] | None = None) -> SolveResult:
    """Plan ``problem`` with ``method``; never raises for "no plan" (that is a status).

    ``options`` are passed to exact methods (``backend``, ``warm_start``, ``initial_plan``,
    ``max_pipelines``, ``gap_tol``, ``workers``, ``log``, ``fluid_bound``, ``fluid_share``,
    ``fluid_parallel``, ``fluid_split``, ``exact_share``, ``shape_bound``, ``symmetric_more_s``, ``merge_nodes``, ``max_model_rows``,
    ``export_model``); heuristics get seed, profile and time limit, and hexiscale
    ``regroup_evals`` (its phase-1 local search's budget) and ``improve_s`` (when that search and the
    final polish stop). A heuristic module that is not
    installed yields status ``error`` with the reason.
    A time limit that is not a positive number of seconds is bad input (:class:`InvalidInputError`).
    """
    opts = dict(options or {})
    t0 = time.monotonic()
    check_time_limit(time_limit)
    try:
        fn = _resolve(method)
    except ImportError as err:
        return SolveResult(solver=method, status=SolveStatus.ERROR, plan=None, evaluation=None,
                           reason=f"method {method} is not available: {err}")
    kwargs: dict[str, Any] = {"seed": seed, "profile": profile, "time_limit": time_limit}
    if method == "bruteforce":
        kwargs.update({k: v for k, v in opts.items() if k == "limit"})
    elif method in EXACT_METHODS:
        kwargs.update({k: v for k, v in opts.items() if k in _EXACT_OPTIONS})
        kwargs.update(_REGISTRY[method][2])
    else:
        kwargs.update({k: v for k, v in opts.items() if k in _HEURISTIC_OPTIONS.get(method, ())})
    res = fn(problem, **kwargs)
    if res.plan is not None:  # one ruler for every method
        ev = evaluate(res.plan, profile)
        if res.evaluation is None or abs(ev.iteration_time_s - res.evaluation.iteration_time_s) > 1e-12 * max(
                1.0, ev.iteration_time_s):
            res = SolveResult(solver=res.solver, status=res.status, plan=res.plan, evaluation=ev,
                              objective_s=res.objective_s, bound_s=res.bound_s, solve_time_s=res.solve_time_s,
                              reason=res.reason, params=res.params, log=res.log)
        if not ev.feasible:
            logger.warning("%s returned a plan that does not fit in memory: %s", method, "; ".join(ev.violations))
    if res.solve_time_s == 0.0:
        res = SolveResult(solver=res.solver, status=res.status, plan=res.plan, evaluation=res.evaluation,
                          objective_s=res.objective_s, bound_s=res.bound_s, solve_time_s=time.monotonic() - t0,
                          reason=res.reason, params=res.params, log=res.log)
    return res


def compare(problem: PlanProblem, methods: list[str], options: dict[str, Any] | None = None, *,
            seed: int = 0, profile: Profile = DEFAULT_PROFILE, time_limit: float | None = None,
            on_result: Callable[[SolveResult], None] | None = None, share_plans: bool = True) -> list[SolveResult]:
    """Run every method in ``methods`` on ``problem`` (same seed, profile and time limit); results in
    the order of ``methods``.

    With ``share_plans`` the heuristics run first and the best feasible plan among them starts every
    exact model (``initial_plan``, unless ``options`` name one), so an exact row never shows a worse
    plan than a heuristic of the same run: with a short limit the exact solvers' own warm start
    (25 % of it) can cut hexiscale short (hexiscale-het1 at 5 s: 11.579 s against hexiscale's 10.947
    s). Their solve time then excludes the heuristics'."""
    check_time_limit(time_limit)
    exact = [m in EXACT_METHODS and m != "bruteforce" for m in methods]
    results: dict[int, SolveResult] = {}
    start: SolveResult | None = None
    for i in sorted(range(len(methods)), key=lambda k: exact[k]):   # heuristics first (stable)
        m, opts = methods[i], dict(options or {})
        if share_plans and exact[i] and start is not None and opts.get("initial_plan") is None:
            opts["initial_plan"] = start.plan
        try:
            r = solve(problem, m, seed=seed, profile=profile, time_limit=time_limit, options=opts)
        except SolverError as err:
            r = SolveResult(solver=m, status=SolveStatus.ERROR, plan=None, evaluation=None, reason=str(err))
        if not exact[i] and r.evaluation is not None and r.evaluation.feasible and (
                start is None or r.iteration_time_s < start.iteration_time_s):
            start = r
        results[i] = r
        if on_result:
            on_result(r)
    return [results[i] for i in range(len(methods))]


def relative_to_bound(results: list[SolveResult]) -> tuple[float | None, list[float | None]]:
    """The best proven lower bound over ``results`` and each plan's throughput relative to the
    throughput that bound allows (bound / iteration time; 1.0 = provably optimal)."""
    bounds = [r.bound_s for r in results if r.bound_s is not None and math.isfinite(r.bound_s)]
    best = max(bounds) if bounds else None
    rel = [(best / r.iteration_time_s) if best is not None and r.evaluation is not None else None for r in results]
    return best, rel
