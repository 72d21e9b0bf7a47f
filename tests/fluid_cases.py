"""Instances and enumerations shared by the fluid bound's tests: tiny random problems, every shape
of a tiny problem, the best enumerated plan per pipeline count."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver.bruteforce import enumerate_plans
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import shape_from_stages
from hexhelix.solver.fluid_branch import fluid_bounds_by_pipelines
from hexhelix.solver.stage_floors import Locality, stage_w
from test_planner_exact import make_problem

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def random_instance(seed: int) -> PlanProblem:
    rng = random.Random(seed)
    return make_problem(gpus=(rng.randint(1, 3), rng.randint(0, 2)), mem=(rng.choice([1.6, 2.5, 4.0]), rng.choice([2.0, 3.0])),
                        layers=rng.randint(2, 4), gb=rng.randint(2, 6), seq=rng.choice([512, 1024, 2048]),
                        inter=rng.choice([2.0, 5.0, 50.0]), tflops=(100.0, rng.choice([20.0, 40.0, 90.0])),
                        schedule=rng.choice(["1f1b", "1f1b", "gpipe"]))


def twin_instance(seed: int) -> PlanProblem:
    """Two interchangeable 2-GPU "Fast" nodes and a "Slow" node: node decisions branch on orbits."""
    rng = random.Random(seed)
    base = make_problem(gpus=(2, rng.randint(1, 2)), mem=(4, 4), gb=rng.randint(3, 5), seq=1024,
                        layers=rng.randint(2, 3), inter=rng.choice([1.0, 2.0, 5.0]), tflops=(100.0, 40.0))
    d = base.cluster.to_dict()
    twin = {**d["nodes"][0], "name": "n0b"}
    cl = Cluster.from_dict({**d, "nodes": [d["nodes"][0], twin, *d["nodes"][1:]]})
    return PlanProblem(cluster=cl, model=base.model, training=base.training, schedule=base.schedule)


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


def goal_problem(cluster: str) -> PlanProblem:
    """The planner goal's problem on an example cluster: Llama-2 7B, global batch 64 of 4096 tokens,
    micro-batch 1, full recompute (benchmarks/planner.py)."""
    return PlanProblem(cluster=load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.yaml"),
                       model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=64, micro_batch=1,
                                                                           seq_len=4096, recompute="full"))


def all_shapes(tables, L: int) -> list:
    out = []
    for K in range(1, L + 1):
        for cuts in itertools.combinations(range(1, L), K - 1):
            sizes = [b - a for a, b in zip((0, *cuts), (*cuts, L))]
            for opts in itertools.product(range(len(tables.options)), repeat=K):
                s = shape_from_stages(tables, list(zip(opts, sizes)))
                if np.isfinite(s.bottleneck):
                    out.append(s)
    return out


def runs_fit(tables, s) -> bool:
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


def stage_ws_within(s, ex, pr, cap: float) -> bool:
    """Every stage's own floor w is within ``cap`` (what the pricing DP's w caps admit)."""
    return stage_w(s.stages, ex, pr.node_list, pr.tp_list, joint=False) <= cap


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
