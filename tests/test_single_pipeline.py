"""The one-pipeline bound (solver/single_pipeline.py): below every enumerated plan of one pipeline,
often equal to the best of them, and its stage multiset laid out as a plan that fits."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
from fluid_cases import best_per_pipeline_count, random_instance, twin_instance
from hexhelix.ir.cluster import load_cluster
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.single_pipeline import single_pipeline_bound

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = [("random", s) for s in range(16)] + [("twin", s) for s in range(4)]


def _instance(kind: str, seed: int):
    return random_instance(seed) if kind == "random" else twin_instance(seed)


@pytest.fixture(scope="module")
def outcomes() -> list[tuple[float, float, float | None]]:
    """(best enumerated one-pipeline plan, the bound, the best of its laid-out plans) per instance."""
    out = []
    for kind, seed in INSTANCES:
        pb = _instance(kind, seed)
        tables = build_tables(pb)
        res = single_pipeline_bound(tables)
        times = [ev.iteration_time_s for ev in map(evaluate, res.plans(tables)) if ev.feasible]
        out.append((best_per_pipeline_count(pb).get(1, math.inf), res.bound_s, min(times, default=None)))
    return out


def test_the_bound_never_exceeds_the_best_plan_of_one_pipeline(outcomes) -> None:
    for best, bound, _ in outcomes:
        assert bound <= best * (1 + 1e-9)
    assert sum(math.isfinite(best) for best, _, _ in outcomes) >= 12  # most instances fit one pipeline


def test_the_bound_is_inf_only_where_no_plan_of_one_pipeline_fits(outcomes) -> None:
    for best, bound, _ in outcomes:
        if math.isinf(bound):
            assert math.isinf(best)


def test_the_bound_is_tight_on_most_tiny_instances(outcomes) -> None:
    """Order, boundary links and in-flight memory are what it relaxes; on two-node instances of a few
    layers they seldom matter."""
    finite = [(best, bound) for best, bound, _ in outcomes if math.isfinite(best)]
    tight = sum(bound >= best * (1 - 2e-6) for best, bound in finite)
    assert tight >= len(finite) // 2


def test_its_multisets_laid_out_are_plans_no_better_than_the_best_enumerated_one(outcomes) -> None:
    built = [(best, bound, t) for best, bound, t in outcomes if t is not None]
    assert len(built) >= 10
    for best, bound, t in built:
        assert t >= best * (1 - 1e-9) and t >= bound * (1 - 1e-9)


def test_an_incumbent_prunes_caps_but_keeps_the_bound_valid() -> None:
    pb = random_instance(3)
    best = best_per_pipeline_count(pb)[1]
    tables = build_tables(pb)
    full = single_pipeline_bound(tables)
    pruned = single_pipeline_bound(tables, upper_s=0.5 * best)
    assert pruned.caps < full.caps
    assert min(full.bound_s, 0.5 * best) * (1 - 1e-9) <= pruned.bound_s <= full.bound_s * (1 + 1e-6)


def test_a_passed_deadline_gives_no_bound() -> None:
    assert single_pipeline_bound(build_tables(random_instance(0)), deadline=time.monotonic() - 1) is None


def test_llama_30b_on_het1_which_fits_only_as_one_pipeline_is_bounded_within_half_a_percent() -> None:
    """The case it was built for: the fluid bound's columns reuse nodes and mix (17.38 s against a
    19.74 s plan); here the bound and the plan it lays out are within 0.5 % of each other."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from planner import problem

    tables = build_tables(problem(load_cluster(ROOT / "examples/clusters/hexiscale-het1.yaml"), "llama-30b", 64))
    res = single_pipeline_bound(tables)
    ev = min(map(evaluate, res.plans(tables)), key=lambda e: e.iteration_time_s)
    assert ev.feasible and len(ev.pipeline_times_s) == 1
    assert res.bound_s <= ev.iteration_time_s <= res.bound_s * 1.005
    assert ev.iteration_time_s < 19.74  # hexiscale's plan
