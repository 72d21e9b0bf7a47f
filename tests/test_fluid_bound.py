"""The fluid (column-generation) bound of solver/fluid_bound.py and its search over pipeline counts
(solver/fluid_branch.py): valid against brute force on many random tiny instances and per pipeline
count, never above any heuristic's evaluated plan, and column generation ends with no column of
positive reduced cost (checked against an enumeration of every shape)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time

import numpy as np
import pytest
from fluid_cases import (
    ROOT,
    all_shapes,
    assert_each_pipeline_counts_bound_below_its_best_plan,
    best_per_pipeline_count,
    goal_problem,
    random_instance,
    twin_instance,
)
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import fluid_bound, fluid_branch
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import (
    _Master,
    _master_root,
    fluid_lower_bound,
    optimizer_lower_bound,
    sync_lower_bound,
    terms_lower_bound,
)
from hexhelix.solver.fluid_branch import _jump_ranges, _orbit, _split, fluid_bounds_by_pipelines
from hexhelix.solver.fluid_certificate import ShapeFloors, certificate
from hexhelix.solver.master_rounding import round_master
from hexhelix.solver.result import SolveStatus
from hexhelix.solver.shape_pricing import pricer_for
from hexhelix.solver.solve import solve
from hexhelix.solver.stage_floors import Locality
from test_planner_exact import make_problem


@pytest.mark.parametrize("seed", range(14))
def test_fluid_bound_never_exceeds_bruteforce_optimum(seed: int) -> None:
    pb = random_instance(seed)
    bf = solve(pb, "bruteforce")
    if bf.status is not SolveStatus.OPTIMAL:
        pytest.skip(f"no plan fits this random instance ({bf.reason})")
    tables = build_tables(pb)
    bounds, runs = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=2 * bf.iteration_time_s,
                                             branch_nodes=30)
    plans = [pl for P, fr in runs.items() for pl in round_master(tables, fr.solution, pipelines=P)]
    assert min(bounds.values()) <= bf.iteration_time_s * (1 + 1e-9)
    # per pipeline count too: the brute-force optimum's own P
    assert bounds[len(bf.plan.pipelines)] <= bf.iteration_time_s * (1 + 1e-9)
    for plan in plans:  # rounded plans are plans: never better than the optimum
        ev = evaluate(plan)
        assert not ev.feasible or ev.iteration_time_s >= bf.iteration_time_s * (1 - 1e-9)


def test_orbits_hold_the_undecided_interchangeable_nodes() -> None:
    tables = build_tables(twin_instance(0))
    assert _orbit(tables, Locality(), 0) == [0, 1] and _orbit(tables, Locality(), 1) == [0, 1]
    assert _orbit(tables, Locality(), 2) == [2]                     # the slow node has no twin
    assert _orbit(tables, Locality(visit=frozenset({1})), 0) == [0]  # a decided twin is no longer free
    assert _orbit(tables, Locality().with_spread(0, 1), 0) == [0]


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "examples" / "clusters").glob("*.yaml")))
def test_node_groups_are_the_classes_of_the_interchangeable_relation(name: str) -> None:
    """The planner's node groups (CP-SAT symmetry breaking, hexiscale's layout memo) and the fluid
    search's orbits rest on one relation: two nodes share a group exactly when they are
    interchangeable; a distinct link from one member to a third node takes it out of its group."""
    from hexhelix.ir.cluster import Link
    from hexhelix.solver.candidates import identical_node_groups

    cl = load_cluster(ROOT / "examples" / "clusters" / f"{name}.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=8))
    groups = identical_node_groups(pb)
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    n = len(cl.nodes)
    assert sorted(group_of) == list(range(n))
    for a in range(n):
        for b in range(n):
            assert (group_of[a] == group_of[b]) == (a == b or cl.interchangeable(a, b)), (name, a, b)
    big = next((g for g in groups if len(g) >= 2), None)
    if big is not None and n > 2:
        a, other = big[0], next(m for m in range(n) if m not in big[:2])
        faster = dataclasses.replace(cl, links=(*cl.links, Link(a=cl.nodes[a].name, b=cl.nodes[other].name,
                                                                       GBps=cl.inter_GBps * 3, latency_us=1.0)))
        assert not faster.interchangeable(big[0], big[1])
        split = identical_node_groups(dataclasses.replace(pb, cluster=faster))
        assert not any(a in g and big[1] in g for g in split)


def test_swapping_interchangeable_nodes_keeps_every_plans_iteration_time() -> None:
    """What orbital branching rests on: exchanging the two twin nodes (GPU ids and node indices) maps
    every plan to a plan of the same evaluated time; the slow node is not a twin of either."""
    from hexhelix.ir.plan import PipelinePlan, Plan, StagePlan

    pb = twin_instance(1)
    cl = pb.cluster
    assert cl.interchangeable(0, 1) and not cl.interchangeable(0, 2)
    gpu_swap = {0: 2, 1: 3, 2: 0, 3: 1}
    node_swap = {0: 1, 1: 0}
    checked = 0
    for plan in itertools.islice(enumerate_plans(pb), 300):
        swapped = Plan(problem=pb, pipelines=tuple(PipelinePlan(micro_batches=p.micro_batches, stages=tuple(
            StagePlan(node=node_swap.get(st.node, st.node), gpus=tuple(gpu_swap.get(g, g) for g in st.gpus),
                      layers=st.layers) for st in p.stages)) for p in plan.pipelines))
        a, b = evaluate(plan), evaluate(swapped)
        assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12) and a.feasible == b.feasible
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("seed", range(4))
def test_orbital_node_branching_keeps_every_pipeline_counts_bound_below_its_best_plan(seed: int) -> None:
    """With interchangeable nodes the quiet child makes the whole orbit quiet (the visited child
    stands for any of them up to a swap): the bound per P stays below every enumerated plan."""
    assert_each_pipeline_counts_bound_below_its_best_plan(twin_instance(seed))


@pytest.mark.parametrize("seed", range(6))
def test_every_pipeline_counts_bound_stays_below_its_best_enumerated_plan(seed: int) -> None:
    """Per P, with the search's node- and pair-level locality branching (docs §15): the bound never
    exceeds the best plan with P pipelines among all enumerated plans."""
    rng = random.Random(seed)
    pb = make_problem(gpus=(rng.randint(2, 3), rng.randint(2, 3)), mem=(4, 4), gb=rng.randint(3, 6), seq=1024,
                      layers=rng.randint(2, 3), inter=rng.choice([1.0, 2.0, 5.0]),
                      tflops=(100.0, rng.choice([40.0, 90.0])))
    assert_each_pipeline_counts_bound_below_its_best_plan(pb)


def test_fluid_bound_below_heuristics_on_an_example_cluster() -> None:
    cl = load_cluster(ROOT / "examples" / "clusters" / "small-mixed.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=32, micro_batch=1, seq_len=4096, recompute="full"))
    tables = build_tables(pb)
    times = [r.iteration_time_s for r in (solve(pb, m) for m in ("hexiscale", "megatron")) if r.evaluation
             and r.evaluation.feasible]
    assert times
    bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=2 * max(times),
                                          deadline=time.monotonic() + 8)
    lb = min(bounds.values())
    assert 0 < lb <= min(times)
    # the bound is not trivial: above the total-work bound
    assert lb > tables.gpu_rate_bound()


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_column_generation_ends_without_improving_column(seed: int) -> None:
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0 + seed, layers=3)
    tables = build_tables(pb)
    P = max_pipelines(tables)
    fr = fluid_lower_bound(tables, pmax=P, upper_s=100.0, integral=False)  # the fractional master alone
    assert fr.converged
    shapes = all_shapes(tables, pb.model.layers)
    pi, mu = np.array(fr.last_duals[0]), fr.last_duals[1]
    T = fr.upper_s
    pr = pricer_for(tables)
    W = {s.stages: pr.stage_w(s.stages, pr.extras(1)) for s in shapes}  # one replica: optimizer floors only
    rc = [s.micro_batches_within(T - W[s.stages]) - pi @ np.array(s.gpus) - mu for s in shapes
          if s.total + W[s.stages] <= T]
    min_u = min(s.bottleneck for s in shapes)
    assert max(rc) <= 1e-4 * T / min_u + 1e-6
    # the branch-and-bound pricing equals the enumeration's minimum of S + U·(π·g + κ) (within its tolerance)
    M = tables.micro_batches
    cert, _, closed = certificate(tables, pi, mu, M, P, 1e9, None, max_dp=5000)
    assert closed
    A = float(pi @ np.array([n.count for n in pb.cluster.nodes])) + mu * P
    if A >= M * (1 - 1e-9):
        pi, mu, A = pi * M * (1 - 1e-9) / A, mu * M * (1 - 1e-9) / A, M * (1 - 1e-9)
    kappa = (M - A) / P - 1 + mu
    true = min(s.total + W[s.stages] + s.bottleneck * (pi @ np.array(s.gpus) + kappa) for s in shapes)
    assert cert <= true * (1 + 1e-9) + 1e-12
    assert cert >= true - 1e-4 * abs(true)


@pytest.mark.parametrize("seed", [1, 2, 9])
def test_a_run_for_one_pipeline_count_counts_exactly_that_many_pipelines(seed: int, monkeypatch) -> None:
    """A run for P_lo … P_hi pipelines has Σ x ≥ P_lo beside Σ x ≤ P_hi (every pipeline runs a
    micro-batch, docs §14): for one P its converged master holds exactly P pipelines where the
    master with Σ x ≤ P alone merges GPUs into fewer, and it proves more (instances where it does)."""
    rng = random.Random(seed)
    pb = make_problem(gpus=(rng.randint(2, 3), rng.randint(2, 4)), mem=(4, 4), gb=rng.randint(6, 10), seq=2048,
                      layers=3, inter=rng.choice([2.0, 5.0]), tflops=(100.0, rng.choice([20.0, 40.0])))
    tables = build_tables(pb)
    P = 4
    rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
    counted = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=100.0, integral=False)
    monkeypatch.setattr(fluid_bound, "LEAST_COUNT", False)
    capped = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=100.0, integral=False)
    assert counted.converged
    assert sum(x for _, x in counted.solution) == pytest.approx(P, rel=1e-6)
    assert sum(x for _, x in capped.solution) < P - 0.25
    assert counted.lb_s > 1.05 * capped.lb_s


def test_a_master_short_of_its_pipelines_prices_at_the_slack_duals(monkeypatch) -> None:
    """hexiscale-het1 at P = 8: the root master's columns cannot make eight pipelines below the
    incumbent, and the duals without the count row price no shape that would (their run stalls
    5 % under it); priced once at the slack's duals, the run finds the small shapes and proves the
    incumbent — a larger bound, still no larger than a plan's time."""
    pb = goal_problem("hexiscale-het1")
    tables = build_tables(pb)
    heur = solve(pb, "hexiscale")
    P = 8
    rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)

    def run() -> fluid_bound.FluidResult:
        return fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=heur.iteration_time_s,
                                 seed_plans=(heur.plan,), integral=False)

    priced = run()
    monkeypatch.setattr(fluid_bound, "SLACK_PRICING", False)
    stalled = run()
    assert stalled.upper_s > 1.03 * stalled.lb_s  # its master stays far above what it proves
    assert priced.lb_s > 1.03 * stalled.lb_s
    assert priced.lb_s <= heur.iteration_time_s * (1 + 1e-9)


def test_the_term_by_term_floor_stays_below_every_plan_of_its_pipeline_count() -> None:
    """The iteration time is the slowest pipeline plus sync plus optimizer step, each bounded on its own (the
    total-work bound, R_P): their sum stays below the best enumerated plan of every pipeline count, and
    from two pipelines on it is above either part alone."""
    checked = 0
    for seed in range(10):
        pb = random_instance(seed)
        tables = build_tables(pb)
        for P, t in best_per_pipeline_count(pb).items():
            floor = terms_lower_bound(tables, P)
            assert floor <= t * (1 + 1e-9), (seed, P, floor, t)
            if P >= 2:
                parts = max(tables.gpu_rate_bound(), sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P))
                assert floor > parts
                checked += 1
    assert checked >= 5


def test_sync_lower_bound_below_evaluated_sync() -> None:
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=100)
    bf = solve(pb, "bruteforce")
    tables = build_tables(pb)
    P = len(bf.plan.pipelines)
    assert P > 1
    assert sync_lower_bound(tables, P) <= bf.evaluation.grad_sync_s * (1 + 1e-12)


@pytest.mark.parametrize("method", ["milp-highs", "cpsat"])
def test_exact_solvers_with_fluid_bound_stay_exact(method: str) -> None:
    """With the warm start (so the fluid bound and its HiGHS LPs run first, in this process) the exact
    solvers still prove the brute-force optimum; regression: a HiGHS LP with another thread count
    broke PuLP's HiGHS."""
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=100)
    bf = solve(pb, "bruteforce")
    res = solve(pb, method, time_limit=60, options={"fluid_parallel": False})
    assert res.params.get("fluid_bound_s") is not None
    assert res.params["fluid_bound_s"] <= bf.iteration_time_s * (1 + 1e-9)
    assert res.status is SolveStatus.OPTIMAL, res.reason
    assert res.iteration_time_s == pytest.approx(bf.iteration_time_s, rel=1e-6)


def test_pipeline_ranges_split_at_the_sync_floor_jump_then_into_single_counts() -> None:
    """A range of pipeline counts is bounded with its least P's floors, so it splits where the global
    floor jumps (e.g. more pipelines than GPUs per node), then into single P once it is small."""
    rest = {P: 0.01 * P for P in range(1, 33)}
    rest.update({P: 1.0 + 0.01 * P for P in range(9, 33)})  # P > 8: inter-node sync
    assert _split(rest, 2, 32, upper_s=5.0) == [(2, 8), (9, 32)]
    assert _split(rest, 2, 8, upper_s=5.0) == [(P, P) for P in range(2, 9)]
    assert _split(rest, 9, 32, upper_s=5.0) == [(9, 20), (21, 32)]
    # a jump under 1 % of the incumbent is not worth a split of its own
    assert _split(rest, 2, 32, upper_s=500.0) == [(2, 17), (18, 32)]
    # the search starts from the ranges between such jumps (no run over the whole span first)
    rest.update({P: 2.0 + 0.01 * P for P in range(17, 33)})  # P > 16: a second jump
    assert _jump_ranges(rest, 2, 32, upper_s=5.0) == [(2, 8), (9, 16), (17, 32)]
    assert _jump_ranges(rest, 2, 32, upper_s=500.0) == [(2, 32)]
    assert _jump_ranges(rest, 2, 2, upper_s=5.0) == [(2, 2)]


def test_the_fluid_search_on_a_second_core_gives_a_valid_bound_and_joins_the_exact_one() -> None:
    """With ``fluid_parallel`` the search runs in a forked child for the whole time limit; its bounds
    and rounded plans join the exact model's at the end, and the result stays exact."""
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0, layers=3)
    bf = solve(pb, "bruteforce")
    res = solve(pb, "cpsat", time_limit=8, options={"fluid_parallel": True, "max_pipelines": 1})
    assert res.params["fluid_parallel"] is True
    # P = 2, 3, ... are left to the fluid bound alone (max_pipelines): its child must have answered
    assert res.params["fluid_bound_s"] is not None
    assert res.params["fluid_bound_s"] <= bf.iteration_time_s * (1 + 1e-9)
    assert res.bound_s <= bf.iteration_time_s * (1 + 1e-9)
    assert res.iteration_time_s >= bf.iteration_time_s * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_a_search_over_some_pipeline_counts_bounds_those_and_leaves_the_others_at_their_floor(seed: int) -> None:
    """``only`` (two searches on two cores share the counts): its counts get bounds that stay below
    their best enumerated plans, the other counts keep the global floor R_P, and ``only`` = every
    count is the plain search, leaf for leaf."""
    rng = random.Random(seed)
    pb = make_problem(gpus=(rng.randint(2, 3), rng.randint(2, 3)), mem=(4, 4), gb=rng.randint(4, 6), seq=1024,
                      layers=rng.randint(2, 3), inter=rng.choice([1.0, 2.0, 5.0]), tflops=(100.0, 40.0))
    best = best_per_pipeline_count(pb)
    tables = build_tables(pb)
    pmax, top = max_pipelines(tables), 2 * max(best.values())
    assert pmax >= 3
    odd = frozenset(range(1, pmax + 1, 2))
    plain, _ = fluid_bounds_by_pipelines(tables, pmax=pmax, upper_s=top, branch_nodes=40)
    every, _ = fluid_bounds_by_pipelines(tables, pmax=pmax, upper_s=top, branch_nodes=40,
                                         only=frozenset(range(1, pmax + 1)))
    part, _ = fluid_bounds_by_pipelines(tables, pmax=pmax, upper_s=top, branch_nodes=40, only=odd)
    assert every == plain
    for P in range(1, pmax + 1):
        floor = min(top, sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P))
        if P in odd:
            assert part[P] <= best.get(P, math.inf) * (1 + 1e-9), (P, part[P], best.get(P))
        else:
            assert part[P] == floor, (P, part[P], floor)


def test_two_fluid_searches_on_two_cores_split_the_pipeline_counts_and_keep_the_result_exact() -> None:
    """``fluid_split``: odd counts searched here after the exact models' share, even ones in the
    child; both halves answer (P ≥ 2 is left to them: ``max_pipelines``), and the bound still lies
    below the brute-force optimum."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    bf = solve(pb, "bruteforce")
    res = solve(pb, "cpsat", time_limit=6, options={"fluid_parallel": True, "fluid_split": True,
                                                   "max_pipelines": 1})
    assert res.params["fluid_split"] is True
    assert res.params["fluid_bound_s"] is not None
    assert res.bound_s <= bf.iteration_time_s * (1 + 1e-9)
    assert res.iteration_time_s >= bf.iteration_time_s * (1 - 1e-9)
    assert res.gap is not None and res.gap >= 0


def test_with_split_searches_the_time_they_leave_goes_back_to_the_exact_models() -> None:
    """The exact models get no share up front (``exact_share`` = 0): once both fluid searches have
    ended, the models run in what is left and still prove the brute-force optimum."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    bf = solve(pb, "bruteforce")
    res = solve(pb, "cpsat", time_limit=20, options={"fluid_parallel": True, "fluid_split": True,
                                                    "exact_share": 0.0})
    assert res.params["fluid_split"] is True and res.params["iterations"] >= 1
    assert res.status is SolveStatus.OPTIMAL
    assert res.iteration_time_s == pytest.approx(bf.iteration_time_s, rel=1e-6)


def test_a_fluid_run_cut_off_before_its_first_iteration_does_not_settle_its_leaf() -> None:
    """A leaf whose slice ends before one column-generation iteration (the first DP call compiling,
    say) proved nothing yet: it gets more time rather than being taken as stalled at its floor."""
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=6, seq=1024, inter=2.0, layers=3)
    tables = build_tables(pb)
    h = solve(pb, "hexiscale")
    real = fluid_branch.fluid_lower_bound
    calls = []

    def first_cut_off(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the P = 1 leaf's first run: no iteration, no bound
            kwargs["deadline"] = time.monotonic() - 1.0
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fluid_branch, "fluid_lower_bound", first_cut_off)
        bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=h.iteration_time_s,
                                              seed_plans=(h.plan,), branch_nodes=40)
    assert bounds[1] == pytest.approx(h.iteration_time_s, rel=1e-6)  # P = 1 searched to the end anyway


@pytest.mark.parametrize("failure", ["raises", "dies"])
def test_a_failing_fluid_child_leaves_a_valid_result_and_a_warning(monkeypatch, caplog, failure: str) -> None:
    """A child that raises or exits without a word: the planner warns and goes on without its bound."""
    import os

    from hexhelix.solver import fluid_job

    def broken(*_args, **_kwargs):
        if failure == "dies":
            os._exit(3)
        raise RuntimeError("boom")

    monkeypatch.setattr(fluid_job, "run_fluid", broken)
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0, layers=3)
    with caplog.at_level("WARNING", logger="hexhelix.solver.fluid_job"):
        res = solve(pb, "cpsat", time_limit=3, options={"fluid_parallel": True, "max_pipelines": 1})
    assert res.plan is not None and res.params["fluid_parallel"] is True
    assert res.params.get("fluid_bound_s") is None
    assert "fluid bound search failed" in caplog.text
    assert ("boom" in caplog.text) == (failure == "raises")


@pytest.mark.parametrize("whole", [False, True])
def test_the_kept_master_model_gives_the_values_of_a_fresh_one_as_columns_arrive(whole: bool) -> None:
    """The bisection's warm-started master (one HiGHS model grown column by column, costs and live
    columns changed per T) gives V_R(T) equal to a fresh model of the live columns, at every T and
    after every batch of new columns — fractional and whole micro-batches alike."""
    pb = make_problem(gpus=(3, 2), mem=(4, 4), gb=8, seq=1024, layers=3, inter=2.0)
    tables = build_tables(pb)
    P = max_pipelines(tables)
    fr = fluid_lower_bound(tables, pmax=P, replicas=2, rest_s=0.0, upper_s=100.0)
    cols = list(fr.shapes)
    assert len(cols) >= 5
    floors = ShapeFloors(tables, 2, 0.0)
    kept = _Master([n.count for n in pb.cluster.nodes], P, floors)
    kept.whole = whole
    ts = np.linspace(min(s.total for s in cols), 3 * max(s.total + floors(s) for s in cols), 9)
    checked = 0
    for batch in (cols[:2], cols[2:4], cols[4:]):
        for s in batch:
            kept.add(s)
        for t in (*ts, *ts[::-1]):  # up and down: the warm basis comes from another T each time
            fresh = _Master(kept.caps, P, floors)
            fresh.whole = whole
            for s in kept.cols:
                fresh.add(s)
            want = fresh.solve(float(t))[0]
            assert kept.value(float(t)) == pytest.approx(want, rel=1e-7, abs=1e-9)
            checked += want > 0
    assert checked >= 6


def test_the_masters_root_takes_an_lp_value_a_rounding_short_of_the_batch_for_the_batch() -> None:
    """V_R is a step function with whole micro-batches, and HiGHS reports a value of M as M − 1e-11:
    the bisection must take that as reaching M, or it climbs to the incumbent and its duals (taken
    where V_R = M) prove only the step below (seen on hexiscale-het2, P = 4: 7.677 instead of 7.602)."""

    class Step:
        def value(self, t: float) -> float:
            return 64.0 - 1e-11 if t >= 7.6 else 63.7

    est, below = _master_root(Step(), 64, 7.5, 7.677)  # type: ignore[arg-type]
    assert est == pytest.approx(7.6, abs=1e-5) and below < 7.6 <= est


@pytest.mark.parametrize("seed", range(6))
def test_a_first_certificate_at_rate_multipliers_stays_below_every_plan_of_its_pipeline_count(seed: int) -> None:
    """``rate_first``: before any master is solved, one certificate at multipliers proportional to each
    GPU's layer rate — any multipliers give a valid bound, so for every P it stays at or below the best
    enumerated plan with P pipelines, and for a range lo … hi (floors of lo replicas, Σ x ≤ hi) below
    the best plan of any P in it (the search's roots and range children start this way from 256 GPUs
    on)."""
    rng = random.Random(100 + seed)
    pb = make_problem(gpus=(rng.randint(2, 3), rng.randint(1, 3)), mem=(4, 4), gb=rng.randint(3, 6), seq=1024,
                      layers=rng.randint(2, 4), inter=rng.choice([1.0, 5.0]), tflops=(100.0, rng.choice([40.0, 90.0])))
    best = best_per_pipeline_count(pb)
    tables = build_tables(pb)
    for lo, hi in itertools.combinations_with_replacement(sorted(best), 2):
        t = min(v for P, v in best.items() if lo <= P <= hi)
        rest = sync_lower_bound(tables, lo) + optimizer_lower_bound(tables, lo)
        fr = fluid_lower_bound(tables, pmax=hi, replicas=lo, rest_s=rest, upper_s=2 * t, max_iterations=0,
                               rate_first=True)
        assert fr.lb_s <= t * (1 + 1e-9), (lo, hi, fr.lb_s, t)


def test_a_search_whose_roots_and_ranges_start_at_rate_multipliers_stays_below_every_plan(monkeypatch) -> None:
    """With rate multipliers first on every cluster (the search does so from 256 GPUs on: each root's
    first run and each range's children), the bound per P stays below the best enumerated plan."""
    monkeypatch.setattr(fluid_branch, "RATE_FIRST_MIN_GPUS", 1)
    for seed in range(3):
        rng = random.Random(200 + seed)
        assert_each_pipeline_counts_bound_below_its_best_plan(make_problem(
            gpus=(rng.randint(2, 3), rng.randint(2, 3)), mem=(4, 4), gb=rng.randint(3, 6), seq=1024,
            layers=rng.randint(2, 3), inter=rng.choice([1.0, 5.0]), tflops=(100.0, rng.choice([40.0, 90.0]))))


def test_rate_multipliers_prove_more_than_the_total_work_bound_before_any_master() -> None:
    """small-mixed, Llama-2 7B, two pipelines: the rate certificate alone (no master solved) proves
    more than the total-work bound and the sync + optimizer floor — what makes the roots of a 256-GPU
    cluster useful in seconds (gen-256, fluid search alone for 60 s: 1.212 → 2.278 s; its plan 2.979 s)."""
    pb = dataclasses.replace(goal_problem("small-mixed"), training=TrainingConfig(
        global_batch=32, micro_batch=1, seq_len=4096, recompute="full"))
    tables = build_tables(pb)
    rest = sync_lower_bound(tables, 2) + optimizer_lower_bound(tables, 2)
    plain = fluid_lower_bound(tables, pmax=2, replicas=2, rest_s=rest, upper_s=100.0, max_iterations=0)
    rated = fluid_lower_bound(tables, pmax=2, replicas=2, rest_s=rest, upper_s=100.0, max_iterations=0,
                              rate_first=True)
    assert plain.lb_s == rest
    assert rated.lb_s > max(rest, tables.gpu_rate_bound()) * 1.05
    heur = solve(pb, "hexiscale")  # a plan of two pipelines: the bound stays below it
    assert len(heur.plan.pipelines) == 2 and rated.lb_s <= heur.iteration_time_s
