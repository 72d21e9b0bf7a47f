"""The pricing DP of solver/shape_pricing.py (numpy and compiled alike): each variant — required
nodes, a floor on the bottleneck, stage weights, sync and optimizer caps, whole batches by labels —
returns exactly the minimum over an enumeration of every shape it admits."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fluid_cases import all_shapes, goal_problem, runs_fit, stage_ws_within, three_node_problem
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import shape_dp_jit
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.shape_pricing import ShapePricer, pricer_for
from hexhelix.solver.stage_floors import Locality, fits_visits, stage_maxima, stage_w, sync_tables
from test_planner_exact import make_problem


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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if runs_fit(tables, s)]
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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if runs_fit(tables, s)]
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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if runs_fit(tables, s)]
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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if runs_fit(tables, s)]
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
                    and stage_ws_within(s, ex, pr, w_cap)]
            true = min((s.total + pi @ np.array(s.gpus) for s in fits), default=math.inf)
            assert vals[k] == pytest.approx(true, rel=1e-9, abs=1e-12), (o_cap, w_cap, b)
            checked += bool(fits)
    assert checked >= 10


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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if runs_fit(tables, s)]
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
    pb = goal_problem(cluster)
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
