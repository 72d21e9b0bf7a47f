"""The merged view of solver/node_merge.py: interchangeable nodes as one node is a relaxation — every
plan maps to a plan of the merged cluster that is no slower, the fluid bound computed on the view
stays below every pipeline count's best plan of the original — and the planner uses it (bounds only)
on clusters of more than eight nodes."""

from __future__ import annotations

import math
import random
import time

import pytest
from fluid_cases import best_per_pipeline_count
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_branch import fluid_bounds_by_pipelines
from hexhelix.solver.fluid_job import run_fluid
from hexhelix.solver.node_merge import MERGE_ABOVE_NODES, fluid_view, merged_view
from hexhelix.solver.solve import solve
from test_planner_exact import make_problem


def alternating(seed: int, pairs: int = 2, fast: int = 2, slow: int = 1) -> PlanProblem:
    """``pairs`` × (a ``fast``-GPU "Fast" node, a ``slow``-GPU "Slow" node), alternating like the
    generated benchmark clusters; each node's own link beats the inter-node one."""
    rng = random.Random(seed)
    base = make_problem(gpus=(fast, slow), mem=(4, 4), gb=rng.randint(3, 5), seq=1024, layers=rng.randint(2, 3),
                        inter=rng.choice([1.0, 2.0, 5.0]), tflops=(100.0, 40.0))
    d = base.cluster.to_dict()
    nodes = [{**d["nodes"][k], "name": f"{d['nodes'][k]['name']}-{i}"} for i in range(pairs) for k in (0, 1)]
    return PlanProblem(cluster=Cluster.from_dict({**d, "nodes": nodes}), model=base.model,
                       training=base.training, schedule=base.schedule)


def test_interchangeable_nodes_become_one_node_and_every_gpu_a_gpu_of_it():
    pb = alternating(0, pairs=3)
    view = merged_view(pb)
    assert [(n.gpu, n.count) for n in view.problem.cluster.nodes] == [("Fast", 6), ("Slow", 3)]
    assert view.node_sizes == (2, 1) and view.node_of == (0, 1, 0, 1, 0, 1)
    assert sorted(view.gpu_of) == list(range(pb.cluster.num_gpus))           # a bijection
    merged_devs = view.problem.cluster.devices()
    for d in pb.cluster.devices():
        assert merged_devs[view.gpu_of[d.id]].node == view.node_of[d.node]
    # the TP degrees offered stay within one physical node
    tables = build_tables(view.problem, node_sizes=view.node_sizes)
    assert max(o.tp for o in tables.options if o.node == 0) == 2


def test_nothing_merges_where_the_links_would_change():
    pb = alternating(0)
    d = pb.cluster.to_dict()
    with_override = {**d, "links": [{"between": ["n0-0", "n1-1"], "GBps": 9.0}]}
    slow_own = {**d, "nodes": [{**n, "intra_GBps": 0.5} if n["gpu"] == "Slow" else n for n in d["nodes"]]}
    for data in (with_override, slow_own):
        other = PlanProblem(cluster=Cluster.from_dict(data), model=pb.model, training=pb.training)
        view = merged_view(other)
        if data is with_override:
            assert view is None                       # per-pair links: the merged link set would differ
        else:                                         # the Slow nodes' own link is slower: they stay apart
            assert [n.count for n in view.problem.cluster.nodes] == [4, 1, 1]
    # one group alone keeps a node apart, so the view still has the inter-node link
    homo = PlanProblem(cluster=Cluster.from_dict({**d, "nodes": [d["nodes"][0], {**d["nodes"][0], "name": "x"},
                                                                  {**d["nodes"][0], "name": "y"}]}),
                       model=pb.model, training=pb.training)
    assert [n.count for n in merged_view(homo).problem.cluster.nodes] == [4, 2]


@pytest.mark.parametrize("seed", range(3))
def test_every_plan_maps_to_a_plan_of_the_merged_cluster_that_is_no_slower(seed: int):
    pb = alternating(seed)
    view = merged_view(pb)
    checked = 0
    for plan in enumerate_plans(pb):
        ev = evaluate(plan)
        mapped = evaluate(view.map_plan(plan))
        assert mapped.feasible == ev.feasible
        assert mapped.iteration_time_s <= ev.iteration_time_s * (1 + 1e-12)
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("seed", range(4))
def test_the_fluid_bound_of_the_merged_view_stays_below_each_pipeline_counts_best_plan(seed: int):
    pb = alternating(seed)
    best = best_per_pipeline_count(pb)
    assert len(best) >= 3
    view = merged_view(pb)
    tables = build_tables(view.problem, node_sizes=view.node_sizes)
    bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(build_tables(pb)), upper_s=2 * max(best.values()),
                                          branch_nodes=60)
    for P, t in best.items():
        assert bounds[P] <= t * (1 + 1e-9), (P, bounds[P], t)
    assert max(bounds[P] / t for P, t in best.items()) > 0.5   # and not trivially low
    # as the planner runs it: bounds only, pruned by the cluster's own plan, no plan of the view back
    plan = solve(pb, "hexiscale").plan
    out = run_fluid(tables, max_pipelines(build_tables(pb)), evaluate(plan).iteration_time_s, view.map_plan(plan),
                    time.monotonic() + 10, keep_plan=False)
    assert out.plan is None and all(out.bounds[P] <= t * (1 + 1e-9) for P, t in best.items())


def test_the_planner_bounds_a_cluster_of_many_nodes_on_its_merged_view():
    pb = alternating(1, pairs=MERGE_ABOVE_NODES // 2 + 1, fast=1, slow=1)  # 10 one-GPU nodes
    assert fluid_view(pb) is not None and fluid_view(alternating(1)) is None
    merged = solve(pb, "cpsat", time_limit=20, options={"fluid_parallel": False})
    plain = solve(pb, "cpsat", time_limit=20, options={"fluid_parallel": False, "merge_nodes": False})
    assert merged.params["fluid_nodes"] == 2 and plain.params["fluid_nodes"] == len(pb.cluster.nodes)
    for r in (merged, plain):           # a plan of the original cluster, and a bound below it
        assert r.plan.problem.cluster == pb.cluster and evaluate(r.plan).feasible
        assert r.bound_s <= r.iteration_time_s * (1 + 1e-9)
    assert math.isclose(merged.iteration_time_s, plain.iteration_time_s, rel_tol=0.05)
