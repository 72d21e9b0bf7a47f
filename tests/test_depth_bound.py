"""The depth bound of solver/depth_bound.py: its DP equals an enumeration of every shape with memory
checked at each stage's depth, a shape's cap is the most micro-batches the evaluator accepts, the
bound never exceeds a brute-force optimum (per pipeline count too), and where memory binds it proves
what the one-in-flight fluid bound cannot."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import numpy as np
import pytest
from fluid_cases import random_instance
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem, StagePlan
from hexhelix.solver import depth_bound as db
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import stage_cost
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.result import SolveStatus
from hexhelix.solver.solve import solve

ROOT = Path(__file__).resolve().parents[1]


def _compositions(L: int):
    for K in range(1, L + 1):
        for cuts in itertools.combinations(range(1, L), K - 1):
            bounds = (0, *cuts, L)
            yield [bounds[i + 1] - bounds[i] for i in range(K)]


def _enumerated(dt: db.DepthTables, v: int, cap: float, w: float, alpha: float, pg: np.ndarray) -> float:
    """min over every stage list of alpha·S + w·Σ pg with stage times ≤ cap and memory at depth."""
    best = math.inf
    C = len(dt.rep)
    for parts in _compositions(dt.layers):
        K = len(parts)
        for opts in itertools.product(range(C), repeat=K):
            total, ok = 0.0, True
            for k, (o, ell) in enumerate(zip(opts, parts)):
                pos = "single" if K == 1 else "first" if k == 0 else "last" if k == K - 1 else "mid"
                u = float(getattr(dt, f"u_{pos}")[o, ell - 1])
                if u > cap or ell > dt.lm(pos, dt.inflight(K - k, v))[o]:
                    ok = False
                    break
                total += alpha * u + w * pg[o]
            if ok:
                best = min(best, total)
    return best


@pytest.mark.parametrize("seed", [0, 3, 13, 20, 37])
def test_the_depth_dp_is_the_least_over_every_shape_that_fits_at_its_depth(seed: int) -> None:
    dt = db.depth_tables(build_tables(random_instance(seed)))
    rng = np.random.default_rng(seed)
    M = dt.tables.micro_batches
    pricer = db._Pricer(dt, M)
    finite = dt.u_mid[np.isfinite(dt.u_mid)]
    for v in pricer.vs:
        pg = rng.uniform(0.0, 2.0, len(dt.rep))
        caps = np.array([float(finite.max()) * 3, float(np.median(finite)) * 1.5, float(finite.min()) * 2])
        weights = rng.uniform(0.0, 1.0, len(caps))
        for alpha in (1.0, 0.0, 0.4):
            vals, rows, counts = pricer._dp(v, caps, weights, alpha, pg)
            for k in range(len(caps)):
                want = _enumerated(dt, v, caps[k], weights[k], alpha, pg)
                assert vals[k] == pytest.approx(want, rel=1e-12, abs=1e-12), (v, k, alpha)
                if math.isfinite(vals[k]):  # the argmin is a shape of that value
                    st = [tuple(r) for r in rows[k, :counts[k]]]
                    assert sum(ell for _, ell in st) == dt.layers


def test_a_shapes_cap_is_the_most_micro_batches_the_evaluator_accepts() -> None:
    """hexiscale-het1 without recompute: TP-1 4090 stages hold fewer layers the deeper they sit."""
    pb = PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / "hexiscale-het1.yaml"),
                     model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096))
    dt = db.depth_tables(build_tables(pb))
    o1 = next(i for i, c in enumerate(dt.rep) if dt.tables.options[c].tp == 1 and dt.tables.options[c].node == 2)
    o8 = next(i for i, c in enumerate(dt.rep) if dt.tables.options[c].tp == 8 and dt.tables.options[c].node == 2)
    for stages in [((o8, 20), (o1, 2), (o1, 2), (o1, 3), (o1, 3), (o1, 2)), ((o8, 26), (o1, 2), (o1, 2), (o1, 2))]:
        col = db._column(dt, stages, 64)
        assert col is not None and 1 <= col.cap < 64

        out, start, free = [], 0, iter(range(24, 32))  # TP-8 on 4090 node 2, TP-1 stages on node 3
        for o, ell in stages:
            node, ids = (2, tuple(range(16, 24))) if dt.tp[o] == 8 else (3, (next(free),))
            out.append(StagePlan(node=node, gpus=ids, layers=(start, start + ell)))
            start += ell
        for m in (col.cap, col.cap + 1):  # the evaluator's own per-stage memory at m micro-batches
            fits = all((c := stage_cost(pb, st, k, len(out), m, None)).memory_bytes <= c.capacity_bytes
                       for k, st in enumerate(out))
            assert fits == (m <= col.cap), (stages, m)


@pytest.mark.parametrize("seed", range(14))
def test_the_depth_bound_never_exceeds_a_bruteforce_optimum(seed: int) -> None:
    pb = random_instance(seed)
    bf = solve(pb, "bruteforce")
    if bf.status is not SolveStatus.OPTIMAL:
        pytest.skip(f"no plan fits this random instance ({bf.reason})")
    tables = build_tables(pb)
    bounds = db.depth_lower_bounds(tables, max_pipelines(tables), 2 * bf.iteration_time_s,
                                   deadline=time.monotonic() + 5)
    assert min(bounds.values()) <= bf.iteration_time_s * (1 + 1e-9)
    assert bounds[len(bf.plan.pipelines)] <= bf.iteration_time_s * (1 + 1e-9)


def test_memory_at_depth_proves_what_one_micro_batch_in_flight_cannot() -> None:
    """hexiscale-het1, Llama-2 7B without recompute, two pipelines: the fluid bound's pricing at one
    micro-batch in flight proves 6.53 s at this P (docs/gap-analysis.md); counting each stage's depth
    proves over 10 s (the plan: 11.58 s)."""
    pb = PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / "hexiscale-het1.yaml"),
                     model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096))
    tables = build_tables(pb)
    assert db.memory_depends_on_depth(tables)
    b = db.depth_lower_bounds(tables, 2, 11.579, deadline=time.monotonic() + 30, only=frozenset({2}))
    assert 10.0 < b[2] <= 11.579


def test_full_recompute_leaves_the_time_to_the_fluid_bound() -> None:
    """With full recompute a layer keeps little per micro-batch in flight: the planner skips this bound."""
    pb = PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / "hexiscale-het1.yaml"),
                     model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full"))
    assert not db.memory_depends_on_depth(build_tables(pb))


def test_the_planner_takes_the_depth_bound_where_memory_depends_on_depth() -> None:
    pb = random_instance(0)
    assert db.memory_depends_on_depth(build_tables(pb))
    bf = solve(pb, "bruteforce")
    res = solve(pb, "cpsat", time_limit=10)
    assert res.params.get("depth_bound_s") is not None
    assert res.params["depth_bound_s"] <= bf.iteration_time_s * (1 + 1e-9)
    assert res.bound_s <= bf.iteration_time_s * (1 + 1e-9)


def test_a_pipeline_count_that_cannot_certify_gives_up_and_leaves_the_others_their_rounds() -> None:
    """small-mixed (8 GPUs), Llama-2 7B without recompute: P = 1 never certifies (the DP admits more
    T4 stages than the node has, at dual price 0). It stops after a few rounds without a column or a
    certificate, so P = 2–4 are still proven at the plan (13.4556 s, optimal) within the share."""
    pb = PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / "small-mixed.yaml"),
                     model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096))
    tables = build_tables(pb)
    dt = db.depth_tables(tables)
    run = db.DepthRun(dt, 1, 13.4556, db._Pricer(dt, tables.micro_batches))
    rounds = 0
    while not run.done:
        run.step()
        rounds += 1
        assert rounds <= 30, "a P without progress must give up"
    assert run.proven <= 13.4556
    b = db.depth_lower_bounds(tables, 4, 13.4556, deadline=time.monotonic() + 30)
    assert all(b[P] == pytest.approx(13.4556) for P in (2, 3, 4)), b
    assert b[1] <= 13.4556 * (1 + 1e-9)
