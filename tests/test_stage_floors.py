"""Per-stage floors on sync + optimizer seconds (solver/stage_floors.py): equal to the cost model's
formulas, never above a plan's evaluated sync + optimizer, in its own locality cell too."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from fluid_cases import goal_problem, plan_locality
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.fluid_bound import shape_from_stages
from hexhelix.solver.shape_pricing import pricer_for
from hexhelix.solver.solve import solve
from hexhelix.solver.stage_floors import Locality, fits_visits, stage_extras, stage_w
from test_planner_exact import make_problem


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
    pb = goal_problem("mixed-a100-a40-t4")
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
