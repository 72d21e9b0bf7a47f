"""Simulator on compiled programs: agreement with the cost model's evaluator (solver.evaluate).

The evaluator predicts an iteration as (m−1)·max u + Σ u per pipeline (u = f + b + outgoing p2p)
plus gradient sync plus the optimizer. Without communication the simulated pipeline phase must
equal (m−1)·max(f+b) + Σ(f+b) exactly (the closed form is exact for 1F1B and GPipe on these
plans); with communication the two may differ by how exposed point-to-point transfers are — the
gap must stay under 5 % (the measured values and their explanation are in benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.program import Op
from hexhelix.runtime.sim import SimOptions, simulate
from hexhelix.solver import cost
from hexhelix.solver.compile import compile_plan
from hexhelix.solver.evaluate import evaluate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"



def _example_plan() -> Plan:
    return Plan.from_dict(json.loads((EXAMPLES / "plans" / "small-mixed-llama2-7b.json").read_text()))


def _three_stage_plan() -> Plan:
    """One pipeline over all of small-mixed: A100×4 (TP 4), A40×2 (TP 2), T4×2 (TP 2), uneven layers."""
    problem = PlanProblem(cluster=load_cluster(EXAMPLES / "clusters" / "small-mixed.yaml"),
                          model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=24, seq_len=2048))
    stages = (StagePlan(node=0, gpus=(0, 1, 2, 3), layers=(0, 20)), StagePlan(node=1, gpus=(4, 5), layers=(20, 28)),
              StagePlan(node=2, gpus=(6, 7), layers=(28, 32)))
    return Plan(problem=problem, pipelines=(PipelinePlan(stages=stages, micro_batches=24),))


def _two_pipeline_plan() -> Plan:
    """Two asymmetric pipelines (TP 2+2 on the A100s; TP 2 A40 + TP 2 T4), 12 + 4 micro-batches."""
    problem = PlanProblem(cluster=load_cluster(EXAMPLES / "clusters" / "small-mixed.yaml"),
                          model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=16, seq_len=2048))
    p0 = PipelinePlan(stages=(StagePlan(node=0, gpus=(0, 1), layers=(0, 16)),
                              StagePlan(node=0, gpus=(2, 3), layers=(16, 32))), micro_batches=12)
    p1 = PipelinePlan(stages=(StagePlan(node=1, gpus=(4, 5), layers=(0, 22)),
                              StagePlan(node=2, gpus=(6, 7), layers=(22, 32))), micro_batches=4)
    return Plan(problem=problem, pipelines=(p0, p1))


def _with_schedule(plan: Plan, schedule: str) -> Plan:
    return Plan(problem=dataclasses.replace(plan.problem, schedule=schedule), pipelines=plan.pipelines)


PLANS = {"example": _example_plan, "three-stage": _three_stage_plan, "two-pipelines": _two_pipeline_plan}
GAP_EXPLAINED = {
    "two-pipelines": "the evaluator adds the whole gradient sync after the slowest pipeline; in the program the "
                     "buckets of early-finishing ranks start as soon as their members are done and overlap the "
                     "slower pipeline's drain (sim 2.69 s vs evaluator 2.89 s); see "
                     "test_two_pipeline_gap_is_sync_overlapping_the_drain",
}


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_simulated_iteration_within_5_percent_of_evaluator(name: str, schedule: str,
                                                           request: pytest.FixtureRequest) -> None:
    if name in GAP_EXPLAINED:  # strict: once the compiler or the evaluator is fixed this must pass
        request.applymarker(pytest.mark.xfail(reason=GAP_EXPLAINED[name], strict=True))
    plan = _with_schedule(PLANS[name](), schedule)
    predicted = evaluate(plan).iteration_time_s
    simulated = simulate(compile_plan(plan), SimOptions(record=False)).makespan_s
    assert simulated == pytest.approx(predicted, rel=0.05)


def test_two_pipeline_gap_is_sync_overlapping_the_drain() -> None:
    """The evaluator's iteration = slowest pipeline + all of the gradient sync + optimizer. In the
    compiled program a bucket starts once all its members finished their compute, so buckets of
    the faster pipeline's ranks (and of early-finishing stages) run during the slower pipeline's
    drain: the simulation is faster, by less than the sync time itself."""
    plan = _two_pipeline_plan()
    ev = evaluate(plan)
    program = compile_plan(plan)
    res = simulate(program)
    spans = res.timeline.spans
    last_compute = max(e for r in range(program.world_size) for _, e, _, i in spans[r]
                       if program.programs[r][i].op in (Op.F, Op.B))
    first_sync = min(s for r in range(program.world_size) for s, _, _, i in spans[r]
                     if program.programs[r][i].op is Op.GRAD_SYNC)
    assert first_sync < last_compute  # sync overlaps the drain
    assert res.makespan_s < ev.iteration_time_s
    assert ev.iteration_time_s - res.makespan_s < ev.grad_sync_s


@pytest.mark.parametrize("name", sorted(PLANS))
def test_pipeline_phase_within_closed_form_bounds_without_communication(name: str) -> None:
    """comm_scale = 0: each pipeline's last F/B ends between the bottleneck's busy time m·max(f+b)
    and the closed form (m−1)·max(f+b) + Σ(f+b); the closed form is exact for equal stages
    (tests/test_sim.py) and over-estimates when the bottleneck stage is upstream (the fill and
    drain of faster downstream stages hide under its work)."""
    plan = PLANS[name]()
    ev = evaluate(plan)
    program = compile_plan(plan)
    res = simulate(program, SimOptions(comm_scale=0.0))
    spans = res.timeline.spans
    for p, pipe in enumerate(program.pipes):
        ranks = {r for s in pipe.stages for r in program.stages[s].ranks}
        end = max(e for r in ranks for _, e, _, i in spans[r] if program.programs[r][i].op in (Op.F, Op.B))
        u = [c.fwd + c.bwd for c in ev.stages[p]]
        closed = cost.pipeline_time(u, pipe.micro_batches)
        assert pipe.micro_batches * max(u) * (1 - 1e-9) <= end <= closed * (1 + 1e-9)


@pytest.mark.parametrize("g", [0.0, 0.25])
def test_wshape_with_pair_savings_agrees_with_evaluator(g: float) -> None:
    plan = _with_schedule(_example_plan(), "wshape")
    savings = {1: g, 2: g, 4: g, 8: g}
    predicted = evaluate(plan, pair_savings=savings).iteration_time_s
    program = compile_plan(plan, pairing=savings)
    assert any(i.op is Op.PAIR for i in program.programs[0])
    simulated = simulate(program, SimOptions(record=False)).makespan_s
    assert simulated == pytest.approx(predicted, rel=0.05)
    if g > 0:  # co-execution pays off in simulation too
        base = simulate(compile_plan(plan), SimOptions(record=False)).makespan_s
        assert simulated < base


@pytest.mark.parametrize("ahead", [0, 1])
def test_peak_memory_matches_the_cost_model_up_to_the_receive_buffers(ahead: int) -> None:
    """1F1B: the simulator's liveness peak equals the evaluator's per-stage memory (same model
    states, reserve and K−k micro-batches in flight) plus the receive buffers posted but not yet
    consumed — at most one with each RECV right before its consumer (``recv_ahead=0``), at most
    ``ahead + 1`` when RECVs are posted ``ahead`` compute ops early (in the drain a stage holds
    the buffer of the backward it waits for and the one posted for the next). The evaluator
    charges no receive buffer; the bound is reached on the first stage."""
    plan = _example_plan()
    ev = evaluate(plan)
    program = compile_plan(plan, recv_ahead=ahead)
    res = simulate(program, SimOptions(record=False))
    buf = cost.boundary_bytes(plan.problem.model, plan.problem.training)
    worst = 0.0
    for p, pipe in enumerate(program.pipes):
        for k, s in enumerate(pipe.stages):
            for r in program.stages[s].ranks:
                diff = res.ranks[r].peak_memory_bytes - ev.stages[p][k].memory_bytes
                assert -1e6 <= diff <= (ahead + 1) * buf + 1e6, (p, k, r, diff)
                worst = max(worst, diff)
    assert worst == pytest.approx((ahead + 1) * buf, abs=1e6)


@pytest.mark.parametrize("schedule", ["1f1b", "wshape"])
def test_no_compute_starts_before_its_data_arrives(schedule: str) -> None:
    """Every RECV feeds the first later compute op of its (stage, mb, strand) — with per-layer PAIR
    expansion (W-shape with a pairing) the first layer part — and that op never starts before
    the transfer ends."""
    plan = _with_schedule(_three_stage_plan(), schedule)
    program = compile_plan(plan, pairing={1: 0.2, 2: 0.2, 4: 0.2} if schedule == "wshape" else None)
    if schedule == "wshape":
        assert any(i.op is Op.PAIR and i.pair[0].layer >= 0 for i in program.programs[0])
    res = simulate(program)
    start = [{i: s for s, _, st, i in spans if st == 0} for spans in res.timeline.spans]
    checked = 0
    for _, _, dst, ri, _, end in res.timeline.flows:
        recv = program.programs[dst][ri]
        want = Op.F if recv.kind.value == "act" else Op.B
        for j in range(ri + 1, len(program.programs[dst])):
            ins = program.programs[dst][j]
            parts = ins.pair if ins.op is Op.PAIR else (ins,)
            if any(p.op is want and (p.stage, p.mb, p.strand) == (recv.stage, recv.mb, recv.strand) for p in parts):
                assert start[dst][j] >= end - 1e-12, (dst, str(recv), str(ins))
                checked += 1
                break
    assert checked == len(res.timeline.flows)


def test_deadlock_verdict_agrees_with_the_dry_run() -> None:
    """A compiled program runs in both the dry run (ir.dryrun) and the simulator; moving a rank's
    first backward (with its gradient RECV, which the compiler pre-posts one compute op earlier)
    before its forwards deadlocks both, with the same ranks on the cycle."""
    from hexhelix.ir.dryrun import dry_run
    from hexhelix.ir.errors import ScheduleError

    program = compile_plan(_three_stage_plan())
    assert dry_run(program).error is None
    simulate(program, SimOptions(record=False))
    r = program.stages[0].ranks[0]
    prog = list(program.programs[r])
    first_b = next(k for k, i in enumerate(prog) if i.op is Op.B)
    rg = next(k for k, i in enumerate(prog) if i.op is Op.RECV and (i.kind.value, i.stage, i.mb, i.strand) ==
              ("grad", prog[first_b].stage, prog[first_b].mb, prog[first_b].strand))
    assert rg < first_b - 1  # pre-posted: not adjacent to its consumer
    moved = [prog[rg], prog[first_b]]  # RG then B
    rest = [i for k, i in enumerate(prog) if k not in (rg, first_b)]
    bad = dataclasses.replace(program, programs=tuple(
        tuple(moved + rest) if k == r else p for k, p in enumerate(program.programs)))
    dr = dry_run(bad)
    assert dr.error is not None
    with pytest.raises(ScheduleError, match="deadlock") as err:
        simulate(bad, SimOptions(record=False))
    assert r in {rank for rank, _, _ in err.value.cycle}
    assert r in dr.error.cycle and set(dr.error.cycle) == {rank for rank, _, _ in err.value.cycle}


def test_receive_waits_are_the_rendezvous_gap() -> None:
    """A 4-stage plan whose boundaries cross slow links: compiled with ``recv_ahead=0`` (every RECV
    right before its consumer), rendezvous transfers start only then and the receivers wait them
    out; compiled with the default (each RECV posted one compute op earlier) the rendezvous
    simulation equals the eager reading and sits within 5 % of the evaluator, which charges each
    transfer once."""
    problem = PlanProblem(cluster=load_cluster(EXAMPLES / "clusters" / "small-mixed.yaml"),
                          model=PRESETS["llama2-7b"], training=TrainingConfig(global_batch=32, seq_len=4096))
    stages = (StagePlan(node=1, gpus=(4, 5), layers=(0, 5)), StagePlan(node=2, gpus=(6, 7), layers=(5, 7)),
              StagePlan(node=0, gpus=(0, 1), layers=(7, 20)), StagePlan(node=0, gpus=(2, 3), layers=(20, 32)))
    plan = Plan(problem=problem, pipelines=(PipelinePlan(stages=stages, micro_batches=32),))
    program = compile_plan(plan)
    predicted = evaluate(plan).iteration_time_s
    late = simulate(compile_plan(plan, recv_ahead=0), SimOptions(record=False)).makespan_s
    early = simulate(program, SimOptions(record=False)).makespan_s
    eager = simulate(program, SimOptions(record=False, p2p="eager")).makespan_s
    assert early == pytest.approx(eager, rel=1e-9)
    assert late > early
    assert late > predicted * 1.05  # the late placement is off the cost model by more than 5 %
    assert early == pytest.approx(predicted, rel=0.05)
    # the simulator's own pre-posting option is the same pass: on a late program it gives the default
    assert simulate(compile_plan(plan, recv_ahead=0), SimOptions(record=False, recv_ahead=1)).makespan_s == early


def test_program_carries_the_profile_reserve_into_the_simulation() -> None:
    """A program compiled with a measured profile is replayed with that profile's runtime
    reserve: the simulated peak moves by exactly the difference of the reserves."""
    from hexhelix.ir.profile import DEFAULT_PROFILE

    plan = _example_plan()
    extra = 3 * 2**30
    other = dataclasses.replace(DEFAULT_PROFILE, runtime_reserve_bytes=DEFAULT_PROFILE.runtime_reserve_bytes + extra)
    base = simulate(compile_plan(plan), SimOptions(record=False))
    moved = simulate(compile_plan(plan, profile=other), SimOptions(record=False))
    for a, b in zip(base.ranks, moved.ranks):
        assert b.peak_memory_bytes - a.peak_memory_bytes == extra
