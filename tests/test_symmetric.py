"""Plans of P identical pipelines (solver/symmetric.py): the listing, the pruned scan against
evaluating every shape, and hexiscale taking them as candidates."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import Plan, PlanProblem
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.hexiscale import plan_hexiscale, symmetric_more
from hexhelix.solver.layer_assign import StageCostTable
from hexhelix.solver.phase2 import PipelineSolver
from hexhelix.solver.symmetric import (
    _Budget,
    _by_node,
    _distinct_orders,
    _shapes,
    _stages,
    best_symmetric,
    mixed_unit_sets,
    ranked_shapes,
    replicate,
    unit_sets,
)


def _problem(model: str = "tiny", batch: int = 8) -> PlanProblem:
    """Four A100s, four A40s, and two interchangeable 1-GPU T4 nodes (a shared unit at P = 2) behind 5 GB/s."""
    cl = Cluster.from_dict({"name": "sym", "inter_GBps": 5, "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "count": 4},
        {"name": "b", "gpu": "A40", "count": 4},
        {"name": "t0", "gpu": "T4", "count": 1},
        {"name": "t1", "gpu": "T4", "count": 1}]})
    return PlanProblem(cluster=cl, model=PRESETS[model],
                       training=TrainingConfig(global_batch=batch, micro_batch=1, seq_len=1024))


def _layout(pb: PlanProblem):
    return PipelineSolver(pb, StageCostTable(pb), tau=3).layout


def _structure(plan: Plan, pipe: int) -> list[tuple[str, int, tuple[int, int]]]:
    """A pipeline's stages up to which of two interchangeable nodes they sit on."""
    cl = plan.problem.cluster
    return [(cl.nodes[s.node].gpu, s.tp, s.layers) for s in plan.pipelines[pipe].stages]


def test_distinct_orders_are_the_distinct_permutations_once_each():
    keys = [("x",), ("y",), ("x",), ("z",), ("y",)]
    got = [tuple(keys[i] for i in order) for order in _distinct_orders(keys)]
    assert len(got) == len(set(got)) == len(set(itertools.permutations(keys)))   # 5!/(2!·2!) = 30
    for order in _distinct_orders(keys):                  # equal keys keep their relative order
        xs = [i for i in order if keys[i] == ("x",)]
        assert xs == sorted(xs)


def test_units_are_single_nodes_or_a_shared_group_of_interchangeable_nodes():
    pb = _problem()
    sets = unit_sets(pb, 2)
    assert len(sets) == 2                                  # the T4 pair node by node, or shared
    caps = sorted((len(u.members), u.cap) for groups in sets for units in groups for u in units)
    # A100/A40: 4 // 2 = 2 GPUs per pipeline (in both sets); T4 alone: 1 // 2 = 0; shared: 1 // 1 = 1
    assert caps == [(1, 0), (1, 0), (1, 2), (1, 2), (1, 2), (1, 2), (2, 1)]


def _slow_sync_problem() -> PlanProblem:
    """Llama-2 7B on 2 A100s, two interchangeable 1-GPU A40 nodes and 2 RTX 3090s behind 5 GB/s: at
    P = 2 the fastest pipelines are not the fastest plans (their layers sync over the slow link)."""
    cl = Cluster.from_dict({"name": "slow-sync", "inter_GBps": 5, "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "count": 2, "intra_GBps": 12},
        {"name": "b0", "gpu": "A40", "count": 1, "intra_GBps": 12},
        {"name": "b1", "gpu": "A40", "count": 1, "intra_GBps": 12},
        {"name": "c", "gpu": "RTX3090", "count": 2, "intra_GBps": 12}]})
    return PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                       training=TrainingConfig(global_batch=8, micro_batch=1, seq_len=1024, recompute="full"))


@pytest.mark.parametrize(("which", "P"), [("tiny", 1), ("tiny", 2), ("tiny", 3), ("tiny", 4),
                                          ("slow-sync", 1), ("slow-sync", 2)])
def test_the_pruned_scan_finds_the_best_of_all_shapes(which, P):
    """Evaluating every listed shape and keeping the best gives the same iteration time as the scan
    that stops once a pipeline alone is slower than the best plan so far."""
    pb = _problem() if which == "tiny" else _slow_sync_problem()
    layout = _layout(pb)
    ranked = ranked_shapes(pb, P, layout)
    assert ranked, "every count here fits the model"
    times = [evaluate(replicate(pb, shape, counts, P)) for _, counts, shape in ranked]
    best_all = min(ev.iteration_time_s for ev in times if ev.feasible)
    got = best_symmetric(pb, P, layout)
    assert got is not None
    plan, ev = got
    assert ev.iteration_time_s == pytest.approx(best_all, rel=1e-12)
    assert len(plan.pipelines) == P and sum(p.micro_batches for p in plan.pipelines) == 8
    if which == "slow-sync" and P == 2:    # the scan has to go past the fastest pipelines
        assert times[0].iteration_time_s > best_all * 1.01
    # a pipeline's time as laid out is what the evaluator charges it (the pruning rests on this)
    for (pipe_s, _, _), ev in zip(ranked, times):
        if ev.feasible:
            assert ev.pipeline_times_s[0] == pytest.approx(pipe_s, rel=1e-9)
    # nothing below the best: the scan returns None
    assert best_symmetric(pb, P, layout, below=best_all * (1 - 1e-9)) is None


def test_pipelines_are_identical_and_a_shared_unit_takes_turns():
    pb = _problem()
    ranked = ranked_shapes(pb, 2, _layout(pb))
    shared = [(c, s) for _, c, s in ranked if any(len(u.members) == 2 for u, _ in s)]
    assert shared and len(shared) < len(ranked)
    for counts, shape in shared[:5]:
        plan = replicate(pb, shape, counts, 2)              # Plan.check: no GPU in two stages
        assert _structure(plan, 0) == _structure(plan, 1)
        t4 = [[pb.cluster.nodes[s.node].name for s in p.stages if pb.cluster.nodes[s.node].gpu == "T4"]
              for p in plan.pipelines]
        assert t4 == [["t0"], ["t1"]]


def test_listing_stops_over_its_step_budget_and_is_deterministic():
    pb = _problem()
    layout = _layout(pb)
    assert ranked_shapes(pb, 2, layout, max_steps=3) is None
    full = ranked_shapes(pb, 2, layout)
    assert ranked_shapes(pb, 2, layout, max_steps=10**6) == full
    a, b = best_symmetric(pb, 2, layout), best_symmetric(pb, 2, _layout(pb))
    assert a[0].to_dict() == b[0].to_dict()


def test_hexiscale_takes_identical_pipelines_where_they_win(examples_dir):
    """hexiscale-het3, Llama-2 7B, full recompute: phase 2 leaves the 3090 node idle (its split is
    chosen by pipeline time); eight identical pipelines with a 1-GPU 3090 stage in front sync faster."""
    cl = load_cluster(examples_dir / "clusters" / "hexiscale-het3.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full"))
    without = plan_hexiscale(pb, symmetric=False)
    with_ = plan_hexiscale(pb)
    assert with_.params["winner"].startswith("symmetric P=")
    assert with_.iteration_time_s < without.iteration_time_s * (1 - 1e-3)
    assert with_.evaluation.feasible and math.isclose(with_.iteration_time_s,
                                                       evaluate(with_.plan).iteration_time_s, rel_tol=1e-12)


def _memory_tight(examples_dir) -> PlanProblem:
    """mixed-a100-a40-t4, Llama-2 7B without recompute: under 1F1B the front stages of a deep pipeline
    hold many micro-batches in flight, so most orders of most split combinations do not fit."""
    cl = load_cluster(examples_dir / "clusters" / "mixed-a100-a40-t4.yaml")
    return PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                       training=TrainingConfig(global_batch=16, micro_batch=1, seq_len=4096, recompute="none"))


@pytest.mark.parametrize(("which", "P"), [("tiny", 1), ("tiny", 2), ("slow-sync", 2), ("tight", 2)])
def test_the_order_free_floor_is_below_every_order_and_fits_is_the_layouts_memory_test(which, P, examples_dir):
    """For every listed shape: the floor of its stages (taken in another order) never exceeds its
    layout's pipeline time, is inf only where memory admits no order, and ``fits`` says exactly
    whether the layout finds layer counts."""
    pb = {"tiny": _problem, "slow-sync": _slow_sync_problem}.get(which, lambda: _memory_tight(examples_dir))()
    ps = PipelineSolver(pb, StageCostTable(pb), tau=3)
    m = math.ceil(pb.training.num_micro_batches / P)
    by_combo: dict[tuple, list[float]] = {}
    for groups in unit_sets(pb, P):
        for shape in _shapes(pb, groups, set(), _Budget(None)):
            stages = [(n, len(g)) for n, g in _stages(_by_node(pb), shape, 0)]
            lay = ps.layout(_stages(_by_node(pb), shape, 0), m)
            assert ps.fits(stages, m) == (lay is not None)
            by_combo.setdefault(tuple(sorted(stages)), []).append(math.inf if lay is None else lay[1])
    tight = 0
    for kinds, times in by_combo.items():
        floor = ps.floor(list(reversed(kinds)), m)
        assert floor <= min(times) * (1 + 1e-12)
        tight += math.isfinite(floor) and floor >= min(times) * (1 - 1e-9)
    if which != "slow-sync":                            # exact somewhere (there, every stage's least
        assert tight > 0                                # fixed time is another position's: never)
    if which == "tight":                                # memory rules whole combinations out
        assert sum(math.isinf(ps.floor(list(k), m)) for k in by_combo) > 0.2 * len(by_combo)


@pytest.mark.parametrize(("which", "P"), [("tiny", 2), ("tight", 2)])
def test_the_pruned_listing_finds_the_same_best_plan_from_fewer_shapes(which, P, examples_dir):
    pb = {"tiny": _problem, "slow-sync": _slow_sync_problem}.get(which, lambda: _memory_tight(examples_dir))()
    ps = PipelineSolver(pb, StageCostTable(pb), tau=3)
    plain = best_symmetric(pb, P, ps.layout)
    assert plain is not None
    below = plain[1].iteration_time_s * (1 + 1e-9)
    pruned = best_symmetric(pb, P, ps.layout, below=below, floor=ps.floor, fits=ps.fits)
    assert pruned is not None and pruned[0].to_dict() == plain[0].to_dict()
    full = ranked_shapes(pb, P, ps.layout)
    short = ranked_shapes(pb, P, ps.layout, floor=ps.floor, fits=ps.fits, below=below)
    assert len(short) < len(full)
    assert {r[2] for r in full if r[0] < below} <= {r[2] for r in short}   # none that could win is lost


def test_identical_pipelines_listed_beyond_the_step_budget_beat_hexiscale(examples_dir):
    """hexiscale-het2, Llama-2 7B without recompute: hexiscale's listing of two identical pipelines
    stops at its step budget (540,912 orders); left out before any layout where the pipelines cannot
    beat its plan or memory admits no order, the listing ends in seconds with a faster plan."""
    cl = load_cluster(examples_dir / "clusters" / "hexiscale-het2.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="none"))
    heur = plan_hexiscale(pb, regroup_evals=0)
    got = symmetric_more(heur.plan, deadline=time.perf_counter() + 60)
    assert got is not None
    plan, ev = got
    assert ev.feasible and ev.iteration_time_s < heur.iteration_time_s * (1 - 1e-2)
    assert math.isclose(ev.iteration_time_s, evaluate(plan).iteration_time_s, rel_tol=1e-12)
    assert _structure(plan, 0) == _structure(plan, 1)
    t0 = time.perf_counter()                            # its deadline holds (listing and layouts)
    symmetric_more(heur.plan, deadline=t0 + 0.3)
    assert time.perf_counter() - t0 < 1.5


# ---- a mixed unit: one node of each of two groups, taken in turn

def test_a_mixed_unit_takes_the_first_nodes_of_two_groups_the_slower_first():
    pb = _problem()
    cl = pb.cluster
    assert mixed_unit_sets(pb, 1) == []                   # one pipeline would sit on one of them only
    sets = mixed_unit_sets(pb, 2)
    pairs = {groups[0][0].members for groups in sets}
    # groups A100 | A40 | T4 x2: every pair of groups, slower GPU first (A40 before A100, T4 before both)
    assert pairs == {(1, 0), (2, 0), (2, 1)}
    for groups in sets:
        mixed = groups[0][0]
        assert len(groups[0]) == 1 and mixed.mixed
        assert mixed.cap == min(cl.nodes[n].count for n in mixed.members) // 1     # ⌈2/2⌉ = 1
        rest = [n for units in groups[1:] for u in units for n in u.members]
        assert sorted(rest + list(mixed.members)) == [0, 1, 2, 3]                    # each node once
        assert not any(u.mixed for units in groups[1:] for u in units)


def test_pipelines_of_a_mixed_unit_alternate_its_nodes_with_one_layer_layout():
    pb = _problem()
    layout = _layout(pb)
    ranked = ranked_shapes(pb, 2, layout, mixed=True)
    assert ranked
    assert all(sum(u.mixed for u, _ in shape) == 1 for _, _, shape in ranked)   # used in every shape, once
    for pipe_s, counts, shape in ranked[:20]:
        plan = replicate(pb, shape, counts, 2)             # Plan.check: no GPU in two stages
        unit = next(u for u, _ in shape if u.mixed)
        on = [{s.node for s in p.stages} & set(unit.members) for p in plan.pipelines]
        assert on == [{unit.members[0]}, {unit.members[1]}]          # pipeline 0 on the slower node
        assert [s.num_layers for s in plan.pipelines[0].stages] == [s.num_layers for s in plan.pipelines[1].stages]
        ev = evaluate(plan)
        if ev.feasible:                                   # the listing's time is pipeline 0's, as charged
            assert ev.pipeline_times_s[0] == pytest.approx(pipe_s, rel=1e-9)
    plain = {shape for _, _, shape in ranked_shapes(pb, 2, layout)}
    assert plain.isdisjoint(shape for _, _, shape in ranked)


def test_the_pruned_scan_over_mixed_units_finds_their_best_plan():
    pb = _problem()
    layout = _layout(pb)
    times = [evaluate(replicate(pb, shape, counts, 2)) for _, counts, shape in ranked_shapes(pb, 2, layout, mixed=True)]
    best_all = min(ev.iteration_time_s for ev in times if ev.feasible)
    got = best_symmetric(pb, 2, layout, mixed=True)
    assert got is not None and got[1].iteration_time_s == pytest.approx(best_all, rel=1e-12)
    assert best_symmetric(pb, 2, layout, below=best_all * (1 - 1e-9), mixed=True) is None


def test_a_mixed_unit_beats_every_plan_of_identical_pipelines_on_het1(examples_dir):
    """hexiscale-het1, Llama-2 7B, full recompute, P = 4: every plan of four identical pipelines
    (each unit a node) is beaten by two pipelines with a 3090 TP 4 stage and two with a 3080 Ti one,
    the same three layers on each: they sync over the slow link, a quarter of a layer per GPU."""
    cl = load_cluster(examples_dir / "clusters" / "hexiscale-het1.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full"))
    ps = PipelineSolver(pb, StageCostTable(pb), tau=3)
    plain = best_symmetric(pb, 4, ps.layout, floor=ps.floor, fits=ps.fits)
    mixed = best_symmetric(pb, 4, ps.layout, floor=ps.floor, fits=ps.fits, mixed=True,
                           below=plain[1].iteration_time_s)
    assert plain is not None and mixed is not None
    assert mixed[1].iteration_time_s < plain[1].iteration_time_s * (1 - 1e-3)
    firsts = sorted((cl.nodes[p.stages[0].node].gpu, p.stages[0].tp, p.stages[0].num_layers)
                    for p in mixed[0].pipelines)
    assert firsts == [("RTX3080Ti", 4, 3)] * 2 + [("RTX3090", 4, 3)] * 2


def test_symmetric_more_lists_mixed_units_after_the_plain_shapes(examples_dir, monkeypatch):
    """From the best plan of identical pipelines at P = 4 on hexiscale-het1 (Llama-2 7B, full
    recompute), the listing beside the fluid child goes on to the mixed units and finds the faster plan
    (budgets cut to 3,000 steps to keep it short: het1's P = 4 mixed listing takes 2,772)."""
    monkeypatch.setattr("hexhelix.solver.hexiscale.SYMMETRIC_MORE_STEPS", (3_000, 3_000, 3_000))
    cl = load_cluster(examples_dir / "clusters" / "hexiscale-het1.yaml")
    pb = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                     training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full"))
    ps = PipelineSolver(pb, StageCostTable(pb), tau=3)
    plain = best_symmetric(pb, 4, ps.layout, floor=ps.floor, fits=ps.fits)
    assert plain is not None
    got = symmetric_more(plain[0], deadline=time.perf_counter() + 120)
    assert got is not None and got[1].iteration_time_s < plain[1].iteration_time_s * (1 - 1e-3)
    assert {cl.nodes[p.stages[0].node].gpu for p in got[0].pipelines} == {"RTX3080Ti", "RTX3090"}
