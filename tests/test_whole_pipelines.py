"""The whole-pipeline diagnostic of solver/whole_pipelines.py: over a fixed set of columns it equals
a brute-force search over every multiset of P columns, never undercuts the fractional master over
the same columns, and never exceeds a plan whose pipelines are among them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fluid_cases import goal_problem, random_instance
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.fluid_bound import fluid_lower_bound, optimizer_lower_bound, sync_lower_bound
from hexhelix.solver.fluid_certificate import ShapeFloors
from hexhelix.solver.solve import solve
from hexhelix.solver.whole_pipelines import whole_pipeline_time


def _brute_force(tables, shapes, P: int, rest: float) -> float:
    """Least t over every multiset of P columns that fits the nodes: the least breakpoint
    t = W + S + (k − 1)·U at which Σ ⌊1 + (t − W − S)/U⌋ reaches the global batch."""
    floors = ShapeFloors(tables, P, rest)
    cols = [s for s in shapes if math.isfinite(s.bottleneck) and math.isfinite(floors(s))]
    caps = np.array([n.count for n in tables.problem.cluster.nodes])
    M = tables.micro_batches
    best = math.inf
    for combo in itertools.combinations_with_replacement(cols, P):
        if np.any(np.sum([s.gpus for s in combo], axis=0) > caps):
            continue
        times = sorted({floors(s) + s.total + (k - 1) * s.bottleneck for s in combo for k in range(1, M + 1)})
        for t in times:
            runs = sum(max(0, math.floor(1 + (t - floors(s) - s.total) / s.bottleneck + 1e-9))
                       for s in combo if floors(s) + s.total <= t)
            if runs >= M:
                best = min(best, t)
                break
    return best


def _root(pb, P: int, heur=None):
    tables = build_tables(pb)
    heur = heur if heur is not None else solve(pb, "hexiscale")
    rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
    seeds = (heur.plan,) if heur.plan is not None else ()
    fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=heur.iteration_time_s if seeds else None,
                           seed_plans=seeds, max_iterations=60)
    return tables, heur, rest, fr


# random tiny instances (seed, P) with P whole pipelines among their root columns; on most of them
# whole pipelines need more time than the fractional master, on (3, 2) and (17, 3) the same
CASES = [(1, 2), (3, 2), (5, 3), (9, 2), (13, 2), (17, 3), (19, 3), (27, 3), (38, 3)]


@pytest.mark.parametrize(("seed", "P"), CASES)
def test_whole_pipelines_equal_a_brute_force_over_the_same_columns(seed: int, P: int) -> None:
    tables, _, rest, fr = _root(random_instance(seed), P)
    want = _brute_force(tables, fr.shapes, P, rest)
    assert math.isfinite(want)
    assert whole_pipeline_time(tables, fr.shapes, P, rest) == pytest.approx(want, rel=1e-5)
    assert want >= fr.upper_s * (1 - 1e-6)  # whole copies never beat fractional ones over the same columns


def test_no_choice_of_whole_pipelines_that_fits_the_nodes_is_inf() -> None:
    tables, _, rest, fr = _root(random_instance(0), 2)
    assert math.isinf(_brute_force(tables, fr.shapes, 2, rest))
    assert math.isinf(whole_pipeline_time(tables, fr.shapes, 2, rest))


def test_whole_pipelines_sit_between_the_fractional_master_and_the_plan() -> None:
    """small-mixed: the hexiscale plan's own pipelines are among the columns, so P whole copies of
    them run the batch by the plan's iteration time (W is a floor on its sync + optimizer)."""
    pb = goal_problem("small-mixed")
    heur = solve(pb, "hexiscale")
    P = len(heur.plan.pipelines)
    tables, _, rest, fr = _root(pb, P, heur)
    got = whole_pipeline_time(tables, fr.shapes, P, rest)
    assert fr.upper_s * (1 - 1e-6) <= got <= heur.iteration_time_s * (1 + 1e-6)
