"""Fluid masters rounded into plans while the bound search runs: the incumbent it keeps is always a
real, evaluated plan, never better than the optimum, and the bounds stay valid below it."""

from __future__ import annotations

import math
import time

import pytest
from fluid_cases import random_instance
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import fluid_job
from hexhelix.solver.candidates import CostTables, build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import fluid_lower_bound, optimizer_lower_bound, sync_lower_bound
from hexhelix.solver.fluid_branch import fluid_bounds_by_pipelines
from hexhelix.solver.fluid_job import FluidOutcome, run_fluid
from hexhelix.solver.master_rounding import Incumbent, round_master
from hexhelix.solver.result import SolveStatus
from hexhelix.solver.shape_pricing import Shape
from hexhelix.solver.solve import solve
from test_planner_exact import make_problem


@pytest.mark.parametrize("seed", range(8))
def test_a_search_with_an_incumbent_improves_it_with_real_plans_and_bounds_below_them(seed: int) -> None:
    """Starting from a loose upper bound (twice the optimum, no plan), every master the search solves
    is rounded: the incumbent ends at least as fast as every feasible rounding of the final masters,
    its time is an evaluated feasible plan's and never below the brute-force optimum, and every
    per-P bound stays below the optimum of its P and below the incumbent. (The fluid masters count
    memory with one micro-batch in flight, so their roundings can all break memory: seed 0.)"""
    pb = random_instance(seed)
    bf = solve(pb, "bruteforce")
    if bf.status is not SolveStatus.OPTIMAL:
        pytest.skip(f"no plan fits this random instance ({bf.reason})")
    tables = build_tables(pb)
    inc = Incumbent(None, 2 * bf.iteration_time_s)
    bounds, runs = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=2 * bf.iteration_time_s,
                                             branch_nodes=30, incumbent=inc)
    rounded = [evaluate(pl) for P, fr in runs.items() for pl in round_master(tables, fr.solution, pipelines=P)]
    assert inc.time_s <= min([e.iteration_time_s for e in rounded if e.feasible], default=math.inf) * (1 + 1e-12)
    if inc.improved:
        ev = evaluate(inc.plan)
        assert ev.feasible and ev.iteration_time_s == pytest.approx(inc.time_s, rel=1e-12)
    else:
        assert inc.plan is None and inc.time_s == 2 * bf.iteration_time_s
    assert inc.time_s >= bf.iteration_time_s * (1 - 1e-9)
    assert bounds[len(bf.plan.pipelines)] <= bf.iteration_time_s * (1 + 1e-9)
    assert max(bounds.values()) <= inc.time_s * (1 + 1e-12)


def _master_solution(pb: PlanProblem) -> tuple[CostTables, tuple[tuple[Shape, float], ...]]:
    """A converged-or-not two-pipeline fluid master of ``pb`` (10 s at most)."""
    tables = build_tables(pb)
    P = 2
    rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
    h = solve(pb, "hexiscale")
    fr = fluid_lower_bound(tables, pmax=P, replicas=1, rest_s=rest, upper_s=2 * h.iteration_time_s,
                           deadline=time.monotonic() + 10)
    assert fr.solution
    return tables, fr.solution


def test_an_incumbent_takes_a_rounded_plan_only_when_it_is_faster() -> None:
    """The first offer beats an incumbent with no plan; the same master offered again, or to an
    incumbent already faster than its rounding, changes nothing."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    tables, solution = _master_solution(pb)
    inc = Incumbent(None, math.inf)
    assert inc.offer(tables, solution, pipelines=2)
    first, t1 = inc.plan, inc.time_s
    assert not inc.offer(tables, solution, pipelines=2)
    assert inc.plan is first and inc.time_s == t1 and inc.improved == 1
    fast = Incumbent(None, t1 * (1 - 1e-6))
    assert not fast.offer(tables, solution, pipelines=2)
    assert fast.plan is None and fast.improved == 0


def test_a_fluid_job_hands_back_a_faster_plan_than_it_started_from_and_none_otherwise() -> None:
    """``run_fluid`` seeded with a slow plan returns the faster plan its rounding found; seeded with
    the optimum it has nothing to return."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    tables = build_tables(pb)
    bf = solve(pb, "bruteforce")
    slow = solve(pb, "megatron")
    assert slow.iteration_time_s > bf.iteration_time_s * (1 + 1e-6)
    out = run_fluid(tables, max_pipelines(tables), slow.iteration_time_s, slow.plan, time.monotonic() + 5)
    assert out.plan is not None
    t = evaluate(out.plan).iteration_time_s
    assert bf.iteration_time_s * (1 - 1e-9) <= t < slow.iteration_time_s
    best = run_fluid(tables, max_pipelines(tables), bf.iteration_time_s, bf.plan, time.monotonic() + 5)
    assert best.plan is None


def test_the_exact_planner_takes_the_plan_its_fluid_child_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan the child's search found joins the incumbents: the models may only try P = 1 here
    (``max_pipelines``), so the result can be the child's two-pipeline plan only through it."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    bf = solve(pb, "bruteforce")
    assert len(bf.plan.pipelines) >= 2
    slow = solve(pb, "megatron")
    monkeypatch.setattr(fluid_job, "run_fluid", lambda *a, **k: FluidOutcome(plan=bf.plan))
    res = solve(pb, "cpsat", time_limit=4, options={"fluid_parallel": True, "fluid_split": False,
                                                   "warm_start": False, "initial_plan": slow.plan,
                                                   "max_pipelines": 1})
    assert res.iteration_time_s == pytest.approx(bf.iteration_time_s, rel=1e-9)
    assert len(res.plan.pipelines) == len(bf.plan.pipelines)
