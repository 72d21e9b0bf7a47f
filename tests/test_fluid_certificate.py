"""The certificate of solver/fluid_certificate.py: with whole micro-batches and with a least
pipeline count it is never above the enumerated minimum over every shape, and equals it when it closes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fluid_cases import all_shapes
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import fluid_lower_bound
from hexhelix.solver.fluid_certificate import certificate
from hexhelix.solver.shape_pricing import pricer_for
from test_planner_exact import make_problem


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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if all(np.array(s.gpus) <= caps)]  # fits its nodes
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
    shapes = [s for s in all_shapes(tables, pb.model.layers) if all(np.array(s.gpus) <= caps)]
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
