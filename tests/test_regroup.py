"""The phase-1 local search of hexiscale: moves of GPU blocks between pipelines (solver/regroup.py)."""

from __future__ import annotations

import pytest
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.hexiscale import REGROUP_MAX_EVALS, plan_hexiscale, regroup_more
from hexhelix.solver.regroup import groups_of, neighbours, node_counts, regroup

GOAL_TRAIN = TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full")


def _problem(examples_dir, cluster: str = "small-mixed") -> PlanProblem:
    return PlanProblem(cluster=load_cluster(examples_dir / "clusters" / f"{cluster}.yaml"),
                       model=PRESETS["llama2-7b"], training=GOAL_TRAIN)


def test_neighbours_are_distinct_single_moves_within_node_capacity(examples_dir):
    pb = _problem(examples_dir)                      # nodes: 4 A100, 2 A40, 2 T4
    start = ((2, 1, 1), (2, 1, 1))
    caps = [n.count for n in pb.cluster.nodes]
    got = list(neighbours(pb, start))
    assert len(got) == len(set(got)) and start not in got
    for g in got:
        assert g == tuple(sorted(g)) and all(any(row) for row in g)
        assert all(sum(row[n] for row in g) <= caps[n] for n in range(len(caps)))
        busy_changed = [n for n in range(len(caps)) if sum(r[n] for r in g) != sum(r[n] for r in start)]
        assert len(busy_changed) <= 1       # only a block to or from the idle pool changes what is busy
    assert ((2, 0, 1), (2, 2, 1)) in got               # transfer: an A40 from one pipeline to the other
    assert ((2, 1, 1), (2, 1, 2)) not in got            # (no T4 is idle: nothing to recruit)
    assert ((1, 1, 1), (2, 1, 1)) in got                # an A100 to the idle pool
    assert ((0, 2, 1), (4, 0, 1)) in got                # exchange: 2 A100 for an A40


def test_a_transfer_of_a_pipelines_last_block_drops_that_pipeline(examples_dir):
    pb = _problem(examples_dir)
    got = list(neighbours(pb, ((0, 2, 2), (4, 0, 0))))
    assert ((4, 2, 2),) in got
    assert ((0, 2, 2), (2, 0, 0)) in got and ((0, 2, 2), (3, 0, 0)) in got    # whole count and TP sizes


def test_groups_of_hands_out_each_nodes_gpus_once(examples_dir):
    pb = _problem(examples_dir)
    groups = groups_of(pb, ((1, 1, 2), (3, 1, 0)))
    flat = [g for grp in groups for g in grp]
    assert len(flat) == len(set(flat)) == 8
    devs = pb.cluster.devices()
    assert [sorted(devs[g].node for g in grp) for grp in groups] == [[0, 1, 2, 2], [0, 0, 0, 1]]


def test_regroup_never_returns_a_worse_plan_and_keeps_to_its_budget(examples_dir):
    pb = _problem(examples_dir)
    base = plan_hexiscale(pb, regroup_evals=0)
    calls: list[list[list[int]]] = []

    def finish(groups, below):
        assert below == base.iteration_time_s
        calls.append(groups)
        return None                                     # nothing is feasible: the start must come back

    plan, ev, n, stopped = regroup(base.plan, base.evaluation, finish, max_evals=5)
    assert plan is base.plan and ev.iteration_time_s == base.iteration_time_s
    assert n == len(calls) == 5 and stopped == "budget"


def test_hexiscale_splits_a_node_between_pipelines_where_phase_1_could_not(examples_dir):
    """small-mixed, Llama-2 7B: phase 1 gives both pipelines one A40; the search moves it so one
    pipeline has both and the other none — the plan CP-SAT finds too (benchmarks/README.md)."""
    pb = _problem(examples_dir)
    before = plan_hexiscale(pb, regroup_evals=0)
    after = plan_hexiscale(pb)
    assert after.iteration_time_s < before.iteration_time_s * (1 - 1e-3)
    assert node_counts(before.plan) == ((2, 1, 1), (2, 1, 1))
    assert node_counts(after.plan) == ((2, 0, 1), (2, 2, 1))
    assert after.params["winner"].endswith("regrouped") and 0 < after.params["regrouped"] <= REGROUP_MAX_EVALS
    assert evaluate(after.plan).iteration_time_s == after.iteration_time_s
    again = plan_hexiscale(pb)
    assert again.plan.to_dict() == after.plan.to_dict()             # deterministic: a count budget, no clock


def test_solve_passes_the_search_budget_to_hexiscale_only(examples_dir):
    from hexhelix.solver.solve import solve

    pb = _problem(examples_dir)
    off = solve(pb, "hexiscale", options={"regroup_evals": 0})
    on = solve(pb, "hexiscale", options={"regroup_evals": 7})
    assert off.params["regrouped"] == 0 and on.params["regrouped"] == 7
    assert solve(pb, "megatron", options={"regroup_evals": 0}).plan is not None   # ignored by the others


def test_the_search_goes_on_from_a_plan_to_the_same_local_optimum(examples_dir):
    """regroup_more (what the exact planner runs beside its fluid child when the warm start's search
    ran out of time) from phase 1's plan ends where hexiscale's own search ends, and says why."""
    import time

    pb = _problem(examples_dir)
    start = plan_hexiscale(pb, regroup_evals=0)
    assert start.params["regroup_stopped"] == "off"
    more = regroup_more(start.plan, deadline=time.perf_counter() + 60)
    assert more.stopped == "local optimum" and node_counts(more.plan) == ((2, 0, 1), (2, 2, 1))
    assert more.evaluation.iteration_time_s == evaluate(more.plan).iteration_time_s < start.iteration_time_s
    assert plan_hexiscale(pb).params["regroup_stopped"] == "local optimum"
    cut = regroup_more(start.plan, deadline=time.perf_counter() - 1)     # out of time before the first grouping
    assert cut.stopped == "time" and cut.scored == 0 and cut.plan is start.plan


def test_improve_s_ends_the_search_and_the_polish_but_not_the_sweep(examples_dir):
    """``improve_s`` = 0: the sweep over pipeline counts runs as before (not truncated, same winner)
    while the grouping search stops for time before its first grouping, so the plan is the sweep's
    winner, unpolished; the exact planner's warm start uses it to give a large cluster's sweep its
    share of the limit while the improvement keeps to 10 s. Not a number of seconds >= 0: bad input."""
    from hexhelix.ir.errors import InvalidInputError
    from hexhelix.solver.solve import solve

    pb = _problem(examples_dir)
    full = plan_hexiscale(pb, time_limit=60.0)
    cut = solve(pb, "hexiscale", time_limit=60.0, options={"improve_s": 0.0})
    assert not cut.params["truncated"] and cut.params["candidates_tried"] == full.params["candidates_tried"]
    assert cut.params["regroup_stopped"] == "time" and cut.params["regrouped"] == 0
    assert cut.iteration_time_s == cut.params["before_polish_s"] > full.iteration_time_s
    for bad in (-1.0, float("nan"), True, "5"):
        with pytest.raises(InvalidInputError, match="improve_s"):
            plan_hexiscale(pb, improve_s=bad)
