"""The fluid (column-generation) bound of solver/fluid_bound.py: valid against brute force on many
random tiny instances, never above any heuristic's evaluated plan, and column generation ends with
no column of positive reduced cost (checked against an enumeration of every shape)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time

import numpy as np
import pytest
from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import fluid_bound, fluid_branch, shape_dp_jit
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import (
    _Floors,
    _Master,
    _master_root,
    certificate,
    fluid_lower_bound,
    optimizer_lower_bound,
    shape_from_stages,
    sync_lower_bound,
)
from hexhelix.solver.fluid_branch import _jump_ranges, _orbit, _split, fluid_bounds_by_pipelines
from hexhelix.solver.master_rounding import round_master
from hexhelix.solver.result import SolveStatus
from hexhelix.solver.shape_pricing import ShapePricer, pricer_for
from hexhelix.solver.solve import solve
from hexhelix.solver.stage_floors import (
    Locality,
    fits_visits,
    stage_extras,
    stage_maxima,
    stage_w,
    sync_tables,
)
from test_planner_exact import make_problem

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def random_instance(seed: int) -> PlanProblem:
    rng = random.Random(seed)
    return make_problem(gpus=(rng.randint(1, 3), rng.randint(0, 2)), mem=(rng.choice([1.6, 2.5, 4.0]), rng.choice([2.0, 3.0])),
                        layers=rng.randint(2, 4), gb=rng.randint(2, 6), seq=rng.choice([512, 1024, 2048]),
                        inter=rng.choice([2.0, 5.0, 50.0]), tflops=(100.0, rng.choice([20.0, 40.0, 90.0])),
                        schedule=rng.choice(["1f1b", "1f1b", "gpipe"]))


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


def twin_instance(seed: int) -> PlanProblem:
    """Two interchangeable 2-GPU "Fast" nodes and a "Slow" node: node decisions branch on orbits."""
    rng = random.Random(seed)
    base = make_problem(gpus=(2, rng.randint(1, 2)), mem=(4, 4), gb=rng.randint(3, 5), seq=1024,
                        layers=rng.randint(2, 3), inter=rng.choice([1.0, 2.0, 5.0]), tflops=(100.0, 40.0))
    d = base.cluster.to_dict()
    twin = {**d["nodes"][0], "name": "n0b"}
    cl = Cluster.from_dict({**d, "nodes": [d["nodes"][0], twin, *d["nodes"][1:]]})
    return PlanProblem(cluster=cl, model=base.model, training=base.training, schedule=base.schedule)


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


def best_per_pipeline_count(pb: PlanProblem) -> dict[int, float]:
    """The best iteration time of the enumerated feasible plans, per pipeline count."""
    best: dict[int, float] = {}
    for plan in enumerate_plans(pb):
        ev = evaluate(plan)
        if ev.feasible:
            best[len(plan.pipelines)] = min(best.get(len(plan.pipelines), math.inf), ev.iteration_time_s)
    return best


def assert_each_pipeline_counts_bound_below_its_best_plan(pb: PlanProblem) -> None:
    """The search's bound for every P (node- and pair-level branching, 60 fluid runs) is at most the
    best enumerated plan with P pipelines; plans with 2 and more pipelines must exist."""
    best = best_per_pipeline_count(pb)
    assert len(best) >= 3
    tables = build_tables(pb)
    bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=2 * max(best.values()),
                                          branch_nodes=60)
    for P, t in best.items():
        assert bounds[P] <= t * (1 + 1e-9), (P, bounds[P], t)


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


def _goal_problem(cluster: str) -> PlanProblem:
    """The planner goal's problem on an example cluster: Llama-2 7B, global batch 64 of 4096 tokens,
    micro-batch 1, full recompute (benchmarks/planner.py)."""
    return PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.yaml"),
                       model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=64, micro_batch=1,
                                                                           seq_len=4096, recompute="full"))


def _all_shapes(tables, L: int) -> list:
    out = []
    for K in range(1, L + 1):
        for cuts in itertools.combinations(range(1, L), K - 1):
            sizes = [b - a for a, b in zip((0, *cuts), (*cuts, L))]
            for opts in itertools.product(range(len(tables.options)), repeat=K):
                s = shape_from_stages(tables, list(zip(opts, sizes)))
                if np.isfinite(s.bottleneck):
                    out.append(s)
    return out


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_column_generation_ends_without_improving_column(seed: int) -> None:
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0 + seed, layers=3)
    tables = build_tables(pb)
    P = max_pipelines(tables)
    fr = fluid_lower_bound(tables, pmax=P, upper_s=100.0, integral=False)  # the fractional master alone
    assert fr.converged
    shapes = _all_shapes(tables, pb.model.layers)
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


def _runs_fit(tables, s) -> bool:
    """Every run of consecutive stages on one node fits that node's GPUs (what the pricing DP admits)."""
    caps = [n.count for n in tables.problem.cluster.nodes]
    run, prev = 0, None
    for c, _ in s.stages:
        o = tables.options[c]
        run = o.tp + (run if o.node == prev else 0)
        prev = o.node
        if run > caps[o.node]:
            return False
    return True


def three_node_problem() -> PlanProblem:
    """Three nodes of 2, 3 and 1 GPUs and a 3-layer model: shapes whose runs re-enter nodes, few
    enough to enumerate."""
    two = make_problem(gpus=(2, 3), mem=(4, 4), gb=4, seq=1024, layers=3, inter=5.0)
    third = {"name": "n2", "gpu": "Fast", "count": 1, "intra_GBps": 50}
    cl = Cluster.from_dict({**two.cluster.to_dict(), "nodes": [*two.cluster.to_dict()["nodes"], third]})
    return PlanProblem(cluster=cl, model=two.model, training=two.training, schedule=two.schedule)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pricing_that_requires_nodes_equals_the_enumeration_of_shapes_using_them(seed: int) -> None:
    """A cell that requires every pipeline to use a GPU of some nodes (docs §15): the DP's minimum of
    S + π·g under a cap on every stage time equals the minimum over the enumerated shapes that use
    those nodes within their room (with two pipelines: one GPU of the 2-GPU node, in one run; at
    most two consecutive of the 3-GPU node; none of the 1-GPU node), and its argmin is one of them."""
    rng = np.random.default_rng(seed)
    pb = three_node_problem()
    tables = build_tables(pb)
    pr = pricer_for(tables)
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if _runs_fit(tables, s)]
    for visit in ((), (0,), (1,), (2,), (0, 1), (1, 2)):
        ex = pr.extras(2, Locality(visit=frozenset(visit)))
        us = [s.bottleneck for s in shapes]
        for pi, cap in itertools.product((np.zeros(len(pb.cluster.nodes)), rng.uniform(0.0, 0.05, len(pb.cluster.nodes))),
                                         (math.inf, *np.quantile(us, [0.1, 0.25, 0.5]))):
            vals, found = pr.solve(np.array([cap]), np.array([1.0]), pi, extras=ex)
            fits = [s for s in shapes if s.bottleneck <= cap and fits_visits(s.stages, ex, pr.node_list, pr.tp_list)]
            true = min((s.total + pi @ np.array(s.gpus) for s in fits), default=math.inf)
            assert vals[0] == pytest.approx(true, rel=1e-9, abs=1e-12), (visit, cap)
            if fits:
                assert all(found[0].gpus[n] > 0 for n in visit)
                assert fits_visits(found[0].stages, ex, pr.node_list, pr.tp_list)


@pytest.mark.skipif(not shape_dp_jit.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pricing_with_a_floor_on_the_bottleneck_equals_the_enumeration_of_shapes_above_it(seed: int) -> None:
    """A box U ∈ (lo, cap] of the certificate: the compiled DP's minimum of S + π·g over shapes with
    every u ≤ cap and some u > lo equals the minimum over the enumerated shapes whose bottleneck lies
    there (also in cells that require nodes), its argmin lies in the box, and no low is no floor."""
    rng = np.random.default_rng(seed)
    pb = three_node_problem()
    tables = build_tables(pb)
    pr = ShapePricer(tables, engine="jit")
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if _runs_fit(tables, s)]
    us = np.array(sorted({s.bottleneck for s in shapes}))
    pi = rng.uniform(0.0, 0.05, len(pb.cluster.nodes))
    boxes = [(lo, hi) for lo, hi in itertools.combinations(np.quantile(us, [0.0, 0.2, 0.4, 0.6, 0.9, 1.0]), 2)]
    boxes += [(us[i], us[i]) for i in (0, len(us) // 2)]  # empty: U > lo = cap
    boxes += [(us[i] * (1 - 1e-9), us[i]) for i in (0, len(us) // 3)]  # just one U value
    for visit in ((), (1,), (0, 2)):
        ex = pr.extras(2, Locality(visit=frozenset(visit)))
        los, his = np.array([b[0] for b in boxes]), np.array([b[1] for b in boxes])
        vals, found = pr.solve(his, np.ones(len(boxes)), pi, extras=ex, lows=los)
        plain, _ = pr.solve(his, np.ones(len(boxes)), pi, extras=ex)
        unbounded, _ = pr.solve(his, np.ones(len(boxes)), pi, extras=ex, lows=np.full(len(boxes), -math.inf))
        np.testing.assert_array_equal(unbounded, plain)
        for k, (lo, hi) in enumerate(boxes):
            fits = [s for s in shapes if lo < s.bottleneck <= hi and fits_visits(s.stages, ex, pr.node_list, pr.tp_list)]
            true = min((s.total + pi @ np.array(s.gpus) for s in fits), default=math.inf)
            assert vals[k] == pytest.approx(true, rel=1e-9, abs=1e-12), (visit, lo, hi)
            assert vals[k] >= plain[k]
            if fits:
                assert lo < found[k].bottleneck <= hi
            else:
                assert found[k] is None


@pytest.mark.parametrize("engine", ["numpy", "jit"] if shape_dp_jit.AVAILABLE else ["numpy"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pricing_with_stage_weights_equals_the_enumerated_minimum(engine: str, seed: int) -> None:
    """With slopes, a stage's share π_n·t of π·g is weighted by max(w, slope·u) at its own time u
    (docs §14: a box of U > lo pays U·π·g ≥ Σ π_n·t·max(lo, u)): the DP's minimum of
    S + Σ π_n·t·max(w, slope·u) equals the enumeration's, its argmin attains it, and slope 0 is the
    plain weight w·π·g."""
    rng = np.random.default_rng(seed)
    pb = three_node_problem()
    tables = build_tables(pb)
    pr = ShapePricer(tables, engine=engine)
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if _runs_fit(tables, s)]
    pi = rng.uniform(1.0, 20.0, len(pb.cluster.nodes))
    us = np.array(sorted({s.bottleneck for s in shapes}))
    caps = np.quantile(us, [0.1, 0.3, 0.6, 1.0, 1.0, 1.0])
    weights = caps * rng.uniform(0.05, 0.5, len(caps))
    slopes = np.array([1.0, 1.0, 0.5, 1.0, 2.0, 0.0])

    def cost(s, w: float, slope: float) -> float:
        return s.total + sum(pi[pr.node[c]] * pr.tp[c] * max(w, slope * u)
                             for (c, _), u in zip(s.stages, pr.stage_times(s.stages)))

    for visit in ((), (1,)):
        ex = pr.extras(2, Locality(visit=frozenset(visit)))
        vals, found = pr.solve(caps, weights, pi, extras=ex, slopes=slopes)
        plain, _ = pr.solve(caps, weights, pi, extras=ex)
        for k in range(len(caps)):
            fits = [s for s in shapes if s.bottleneck <= caps[k] and fits_visits(s.stages, ex, pr.node_list, pr.tp_list)]
            true = min((cost(s, weights[k], slopes[k]) for s in fits), default=math.inf)
            assert vals[k] == pytest.approx(true, rel=1e-9, abs=1e-12), (visit, k)
            if not fits:
                assert found[k] is None
                continue
            assert cost(found[k], weights[k], slopes[k]) == pytest.approx(vals[k], rel=1e-9)
            assert vals[k] >= plain[k] - 1e-12  # max(w, slope·u) ≥ w
        assert vals[-1] == plain[-1]


@pytest.mark.parametrize("engine", ["numpy", "jit"] if shape_dp_jit.AVAILABLE else ["numpy"])
def test_pricing_on_sync_tables_admits_exactly_the_shapes_under_a_sync_and_an_optimizer_cap(engine: str) -> None:
    """A box of the certificate over (max σ, max o): the DP on :func:`sync_tables` (σ = w − o, inf
    where o exceeds the optimizer cap or w the cell's cap) capped at b gives the least S + π·g over the
    enumerated shapes whose largest sync is ≤ b, largest optimizer step ≤ the cap and every w ≤ the
    cell's cap (:func:`stage_maxima`); a shape's joint floor is its largest sync plus its largest step."""
    rng = np.random.default_rng(3)
    pb = three_node_problem()
    tables = build_tables(pb)
    pr = ShapePricer(tables, engine=engine)
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if _runs_fit(tables, s)]
    pi = rng.uniform(0.0, 0.05, len(pb.cluster.nodes))
    ex = pr.extras(2, Locality())
    maxima = {s.stages: stage_maxima(s.stages, ex, pr.node_list, pr.tp_list) for s in shapes}
    for s in shapes:
        w, sig, o = maxima[s.stages]
        assert stage_w(s.stages, ex, pr.node_list, pr.tp_list) == pytest.approx(max(w, sig + o), rel=1e-12)
        assert w <= sig + o * (1 + 1e-9) + 1e-15
    sigs = np.quantile([m[1] for m in maxima.values()], [0.1, 0.5, 1.0])
    opts = np.quantile([m[2] for m in maxima.values()], [0.2, 0.6, 1.0])
    w_caps = (math.inf, float(np.quantile([m[0] for m in maxima.values()], 0.7)))
    checked = 0
    for o_cap, w_cap in itertools.product(opts, w_caps):
        tab = sync_tables(ex, float(o_cap), w_cap)
        vals, _ = pr.solve(np.full(len(sigs), 1e9), np.ones(len(sigs)), pi, sigs, tab)
        for k, b in enumerate(sigs):
            fits = [s for s in shapes if maxima[s.stages][1] <= b and maxima[s.stages][2] <= o_cap
                    and _stage_ws_within(s, ex, pr, w_cap)]
            true = min((s.total + pi @ np.array(s.gpus) for s in fits), default=math.inf)
            assert vals[k] == pytest.approx(true, rel=1e-9, abs=1e-12), (o_cap, w_cap, b)
            checked += bool(fits)
    assert checked >= 10


def _stage_ws_within(s, ex, pr, cap: float) -> bool:
    """Every stage's own floor w is within ``cap`` (what the pricing DP's w caps admit)."""
    return stage_w(s.stages, ex, pr.node_list, pr.tp_list, joint=False) <= cap


@pytest.mark.skipif(not shape_dp_jit.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_whole_batch_pricing_by_labels_equals_the_enumerated_minimum_in_each_box(seed: int) -> None:
    """The exact whole-batch pricing (Pareto labels of S and π·g, solver/shape_labels_jit.py): for
    boxes lo < U ≤ hi it returns the least S + lo·max(0, ⌊π·g + κ'⌋) over the enumerated shapes in
    the box (also in cells that require nodes), its argmin lies in the box and has that value; with
    one label per front it may only come out lower, and says so."""
    rng = np.random.default_rng(seed)
    two = make_problem(gpus=(2, 3), mem=(4, 4), gb=4, seq=4096, layers=5, inter=5.0)  # S falls with more GPUs: long fronts
    third = {"name": "n2", "gpu": "Fast", "count": 1, "intra_GBps": 50}
    cl = Cluster.from_dict({**two.cluster.to_dict(), "nodes": [*two.cluster.to_dict()["nodes"], third]})
    pb = PlanProblem(cluster=cl, model=two.model, training=two.training, schedule=two.schedule)
    tables = build_tables(pb)
    pr = ShapePricer(tables, engine="jit")
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if _runs_fit(tables, s)]
    us = np.array(sorted({s.bottleneck for s in shapes}))
    boxes = [(lo, hi) for lo, hi in itertools.combinations(np.quantile(us, [0.0, 0.3, 0.6, 1.0]), 2)]
    boxes += [(-math.inf, us[-1]), (us[len(us) // 2], us[len(us) // 2])]
    los, his = np.array([b[0] for b in boxes]), np.array([b[1] for b in boxes])
    ubs = np.full(len(boxes), 1e9)  # no value cut
    for visit in ((), (1,), (0, 2)):
        ex = pr.extras(2, Locality(visit=frozenset(visit)))
        for _ in range(12):
            # prices with some free nodes, and floor terms from small (S decides) to large (π·g does)
            pi = rng.uniform(0.0, 3.0, len(pb.cluster.nodes)) * (rng.uniform(size=len(pb.cluster.nodes)) < 0.7)
            kp = float(rng.uniform(0.0, 1.0))
            scale = np.where(np.isfinite(los), los, us[0]) * rng.choice([0.05, 0.3, 1.0, 3.0])
            vals, found, relaxed = pr.solve_whole(his, los, None, scale, kp, ubs, pi, ex)
            assert not relaxed
            for k, (lo, hi) in enumerate(boxes):
                fits = [s for s in shapes if lo < s.bottleneck <= hi and fits_visits(s.stages, ex, pr.node_list, pr.tp_list)]

                def val(s, k=k, pi=pi, kp=kp, scale=scale):
                    return s.total + scale[k] * max(0, math.floor(pi @ np.array(s.gpus) + kp))
                true = min((val(s) for s in fits), default=math.inf)
                assert vals[k] == pytest.approx(true, rel=1e-9, abs=1e-12), (visit, lo, hi)
                if fits:
                    assert lo < found[k].bottleneck <= hi and val(found[k]) == pytest.approx(vals[k], rel=1e-9)
            tight, _, relaxed1 = pr.solve_whole(his, los, None, scale, kp, ubs, pi, ex, cap_labels=1)
            assert np.all(tight <= vals + 1e-12)
            assert relaxed1 or np.array_equal(tight, vals)
            # a value cut: boxes whose least value is under it keep it, the others come back at or above it
            if not np.isfinite(vals).any():
                continue
            cut = float(np.median(vals[np.isfinite(vals)]))
            under, _, _ = pr.solve_whole(his, los, None, scale, kp, np.full(len(boxes), cut), pi, ex)
            for k in range(len(boxes)):
                assert (under[k] == vals[k] if vals[k] < cut else under[k] >= cut), (k, under[k], vals[k], cut, boxes[k])


@pytest.mark.skipif(not shape_dp_jit.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("cluster", ["small-mixed", "mixed-a100-a40-t4", "hexiscale-het1"])
def test_compiled_pricing_equals_the_numpy_pricing(cluster: str) -> None:
    """The compiled DP (solver/shape_dp_jit.py) returns the numpy DP's values, under caps on u and w,
    weights (plain and per stage), node prices, visited nodes and fixed local/spread pairs; both argmins exist together
    and each argmin's S + weight·π·g is the value it claims."""
    pb = _goal_problem(cluster)
    tables = build_tables(pb)
    ref, fast = ShapePricer(tables, engine="numpy"), ShapePricer(tables, engine="jit")
    rng = np.random.default_rng(len(cluster))
    N = ref.N
    cells = [Locality(), Locality(visit=frozenset({0})), Locality(visit=frozenset({0, N - 1})),
             Locality(local=frozenset({(3, 0), (4, 0)}), spread=frozenset({(5, N - 1), (9, 1)}))]
    for loc, P in itertools.product(cells, (1, 2, 4)):
        caps = np.geomspace(0.05, 5.0, 10)
        weights = caps * rng.uniform(0.0, 20.0, len(caps))
        pi = rng.uniform(0.0, 0.6, N)
        # a box (lo, cap] with lo = a fraction of the cap: weight λ·lo, slope λ (stages above lo pay more)
        slopes = np.where(rng.uniform(size=len(caps)) < 0.3, 0.0, weights / (caps * rng.uniform(0.1, 0.8, len(caps))))
        for wcaps, extras in ((np.geomspace(0.05, 2.0, 10), ref.extras(P, loc)), (None, ref.extras(P, loc)), (None, None)):
            want, _ = ref.solve(caps, weights, pi, wcaps, extras)
            got, shapes = fast.solve(caps, weights, pi, wcaps, extras)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
            want_s, _ = ref.solve(caps, weights, pi, wcaps, extras, slopes=slopes)  # per-stage weights too
            got_s, _ = fast.solve(caps, weights, pi, wcaps, extras, slopes=slopes)
            np.testing.assert_allclose(got_s, want_s, rtol=1e-12, atol=1e-12)
            for k, sh in enumerate(shapes):
                assert (sh is None) == (not math.isfinite(want[k]))
                if sh is not None:
                    assert sh.total + weights[k] * float(pi @ np.array(sh.gpus)) == pytest.approx(got[k], rel=1e-9)


@pytest.mark.parametrize("exact_whole", [True, False], ids=["labels", "lagrangian"])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_whole_batch_certificate_equals_the_enumerated_minimum(seed: int, exact_whole: bool) -> None:
    """With whole micro-batches the certificate is min over shapes of S + W + U·max(0, ⌊π·g + κ'⌋)
    (docs §14): never above the enumeration's minimum (validity), and equal to it when it closes —
    with narrow boxes priced by Pareto labels (the default) and by the Lagrangian in π·g alike."""
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0 + seed, layers=3)
    tables = build_tables(pb)
    P = max_pipelines(tables)
    M = tables.micro_batches
    fr = fluid_lower_bound(tables, pmax=P, upper_s=100.0)
    caps = np.array([n.count for n in pb.cluster.nodes], dtype=float)
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if all(np.array(s.gpus) <= caps)]  # fits its nodes
    pr = pricer_for(tables)
    W = {s.stages: pr.stage_w(s.stages, pr.extras(1)) for s in shapes}
    rng = np.random.default_rng(seed)
    duals = [(np.array(fr.last_duals[0]), fr.last_duals[1])]
    duals += [(rng.uniform(0, 2 * M / caps.sum(), len(caps)), float(rng.uniform(0, 2))) for _ in range(4)]
    for pi, mu in duals:
        cert, _, closed = certificate(tables, pi, mu, M, P, 1e9, None, max_dp=5000, whole=True,
                                      exact_whole=exact_whole)
        A = float(pi @ caps) + mu * P
        if A >= M * (1 - 1e-9):
            pi, mu, A = pi * M * (1 - 1e-9) / A, mu * M * (1 - 1e-9) / A, M * (1 - 1e-9)
        kp = (M - A) / P + mu - 1e-9
        true = min(s.total + W[s.stages] + s.bottleneck * max(0, math.floor(pi @ np.array(s.gpus) + kp))
                   for s in shapes)
        assert cert <= true * (1 + 1e-9) + 1e-12
        if closed:
            assert cert >= true - 1e-4 * abs(true)


@pytest.mark.parametrize("mode", ["fractional", "labels", "lagrangian"])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_a_least_pipeline_count_lets_the_certificate_constant_fall_below_zero(seed: int, mode: str) -> None:
    """Plans with at least pmin pipelines admit multipliers with π·G > M (docs §14): the per-pipeline
    constant κ' = (M − π·G)/pmin is then negative, and the certificate — fractional, S + W +
    U·max(0, π·g + κ' − 1), or whole, S + W + U·max(0, ⌊π·g + κ'⌋) — is still never above the
    enumeration's minimum, and equal to it when it closes."""
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0 + seed, layers=3)
    tables = build_tables(pb)
    P = max_pipelines(tables)
    M = tables.micro_batches
    caps = np.array([n.count for n in pb.cluster.nodes], dtype=float)
    shapes = [s for s in _all_shapes(tables, pb.model.layers) if all(np.array(s.gpus) <= caps)]
    pr = pricer_for(tables)
    W = {s.stages: pr.stage_w(s.stages, pr.extras(1)) for s in shapes}
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(5):
        pi = rng.uniform(0.5, 3.0, len(caps)) * M / caps.sum()  # π·G between M/2 and 3M
        pmin = int(rng.integers(1, P + 1))
        cert, _, closed = certificate(tables, pi, 0.0, M, P, 1e9, None, max_dp=5000, whole=mode != "fractional",
                                      exact_whole=mode == "labels", pmin=pmin)
        g = float(pi @ caps)
        kp = (M - g) / (pmin if g >= M * (1 - 1e-9) else P)
        checked += kp < 0
        if mode == "fractional":
            true = min(s.total + W[s.stages] + s.bottleneck * max(0.0, pi @ np.array(s.gpus) + kp - 1) for s in shapes)
        else:
            true = min(s.total + W[s.stages] + s.bottleneck * max(0, math.floor(pi @ np.array(s.gpus) + kp - 1e-9))
                       for s in shapes)
        assert cert <= true * (1 + 1e-9) + 1e-12
        if closed:
            assert cert >= true - 1e-4 * abs(true)
    assert checked >= 1


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
    pb = _goal_problem("hexiscale-het1")
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


def test_stage_floors_equal_the_sync_and_optimizer_formulas() -> None:
    """w = σ + o, σ from CostTables.sync_layer_lb on the stage's parameters (vectorised exactly) where
    the node has room for every replica; never below it where it has not."""
    pb = make_problem(mem=(4, 4), gb=8, seq=2048, inter=5.0, layers=4)
    tables = build_tables(pb)
    model = pb.model
    pr = pricer_for(tables)
    for P in (1, 2, 3):
        ex = pr.extras(P)
        for pos, (first, last) in {"mid": (0, 0), "first": (1, 0), "last": (0, 1), "single": (1, 1)}.items():
            for o in tables.options:
                for ell in range(1, model.layers + 1):
                    params = ell * model.params_per_layer + first * model.embedding_params + last * model.head_params
                    opt = (tables.opt_layer[o.index] * ell + first * tables.opt_first[o.index]
                           + last * tables.opt_last[o.index])
                    want = tables.sync_layer_lb(o.index, P, params) + opt
                    got = getattr(ex, pos)[o.index, 0, ell - 1]
                    if o.tp + P - 1 <= pb.cluster.nodes[o.node].count:
                        assert got == pytest.approx(want, rel=1e-8)
                        assert got <= want
                    else:  # no room for the other replicas on this node: its layers sync across nodes
                        assert got >= want * (1 - 1e-9)


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_every_stage_floor_is_below_the_evaluated_sync_plus_optimizer(seed: int) -> None:
    rng = random.Random(seed)
    pb = make_problem(mem=(4, 4), gb=rng.randint(4, 8), seq=2048, inter=rng.choice([2.0, 5.0, 100.0]))
    bf = solve(pb, "bruteforce")
    tables = build_tables(pb)
    pr = pricer_for(tables)
    ev = bf.evaluation
    P = len(bf.plan.pipelines)
    for p in range(P):
        s = shape_from_stages(tables, [(next(o.index for o in tables.options if (o.node, o.tp) == (st.node, st.tp)),
                                        st.num_layers) for st in bf.plan.pipelines[p].stages])
        assert pr.stage_w(s.stages, pr.extras(P)) <= (ev.grad_sync_s + ev.optimizer_s) * (1 + 1e-12)


def test_a_shapes_floor_charges_its_largest_sync_and_its_largest_optimizer_step_apart() -> None:
    """The plan pays max sync + max optimizer over its GPUs, which can sit on different stages: on
    mixed-a100-a40-t4's hexiscale plan the floor of a pipeline is above the best single stage's
    σ + o (by the T4 stage's AdamW step against the A40 stage's) and still below sync + opt."""
    pb = _goal_problem("mixed-a100-a40-t4")
    res = solve(pb, "hexiscale")
    tables = build_tables(pb)
    pr = pricer_for(tables)
    P = len(res.plan.pipelines)
    ex = pr.extras(P)
    s = shape_from_stages(tables, [(next(o.index for o in tables.options if (o.node, o.tp) == (st.node, st.tp)),
                                    st.num_layers) for st in res.plan.pipelines[0].stages])
    w = pr.stage_w(s.stages, ex)
    ev = res.evaluation
    assert w <= (ev.grad_sync_s + ev.optimizer_s) * (1 + 1e-12)
    joint = pr.stage_w(s.stages, dataclasses.replace(ex, opt=None))  # max over stages of σ_k + o_k only
    assert w > joint * (1 + 0.02)


def plan_locality(plan) -> Locality:
    """The locality cell a plan lies in, as deep as the search can go: (layer, node) local when every
    pipeline holds the layer on that node, spread otherwise; nodes with a local layer required of every
    pipeline, nodes without one quiet (every pair spread)."""
    held: dict[tuple[int, int], int] = {}
    for pipe in plan.pipelines:
        for st in pipe.stages:
            for i in range(*st.layers):
                held[(i, st.node)] = held.get((i, st.node), 0) + 1
    P = len(plan.pipelines)
    local = frozenset(k for k, v in held.items() if v == P)
    loc = Locality(local=local, spread=frozenset(k for k, v in held.items() if v < P),
                   visit=frozenset(n for _, n in local))  # a node with a local layer: every pipeline uses it
    for n in range(len(plan.problem.cluster.nodes)):  # a node with none: all its pairs spread
        if all(m != n for _, m in local):
            loc = loc.with_quiet(n, plan.problem.model.layers)
    return loc


@pytest.mark.parametrize("seed", range(6))
def test_stage_floors_in_a_plans_own_locality_cell_stay_below_its_sync_plus_optimizer(seed: int) -> None:
    """The branch-and-price lemma (docs §15): under the locality the plan itself has, no stage's floor
    exceeds the plan's evaluated sync + optimizer — for every enumerated plan with ≥ 2 pipelines."""
    rng = random.Random(seed)
    pb = make_problem(gpus=(rng.randint(1, 3), rng.randint(1, 3)), mem=(4, 4), gb=rng.randint(2, 5), seq=1024,
                      layers=rng.randint(2, 4), inter=rng.choice([2.0, 5.0, 100.0]))
    tables = build_tables(pb)
    pr = pricer_for(tables)
    idx = {(o.node, o.tp): o.index for o in tables.options}
    checked = 0
    for plan in itertools.islice(enumerate_plans(pb), 400):
        P = len(plan.pipelines)
        if P < 2:
            continue
        ev = evaluate(plan)
        ex = pr.extras(P, plan_locality(plan))
        for pipe in plan.pipelines:
            stages = tuple((idx[(st.node, st.tp)], st.num_layers) for st in pipe.stages)
            w = stage_w(stages, ex, [o.node for o in tables.options], [o.tp for o in tables.options])
            assert w <= (ev.grad_sync_s + ev.optimizer_s) * (1 + 1e-12), (plan, w, ev.grad_sync_s, ev.optimizer_s)
            assert all(any(st.node == n for st in pipe.stages) for n in ex.visit)  # the cell's shapes use them
            assert fits_visits(stages, ex, [o.node for o in tables.options], [o.tp for o in tables.options])
        checked += 1
    assert checked > 0


def test_a_spread_layer_costs_more_than_an_open_one_and_local_forbids_other_nodes() -> None:
    pb = make_problem(gpus=(2, 2), mem=(4, 4), gb=4, seq=1024, inter=2.0)
    tables = build_tables(pb)
    open_ = stage_extras(tables, 2)
    spread = stage_extras(tables, 2, Locality(spread=frozenset({(1, 0)})))
    local = stage_extras(tables, 2, Locality(local=frozenset({(1, 0)})))
    fast = next(o.index for o in tables.options if o.node == 0)
    slow = next(o.index for o in tables.options if o.node == 1)
    # a stage on node 0 holding layers 0..1: layer 1 now syncs across nodes
    assert spread.mid[fast, 0, 1] > open_.mid[fast, 0, 1]
    # layer 1 local at node 0: node 1 may not hold it, node 0 may (at its own link)
    assert np.isinf(local.mid[slow, 1, 0]) and np.isfinite(local.mid[fast, 1, 0])
    assert np.isfinite(local.mid[slow, 2, 0])


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
    floors = _Floors(tables, 2, 0.0)
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
    pb = dataclasses.replace(_goal_problem("small-mixed"), training=TrainingConfig(
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
