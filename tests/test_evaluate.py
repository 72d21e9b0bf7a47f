"""The one evaluator (solver/evaluate.py): the example plan scores, memory overflow is reported with
stage, GPU type and GiB, and iteration time / throughput are composed from the cost model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.ir.profile import DEFAULT_PROFILE
from hexhelix.solver import cost
from hexhelix.solver.evaluate import evaluate, stage_cost

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLAN = ROOT / "examples" / "plans" / "small-mixed-llama2-7b.json"


@pytest.fixture
def example_plan() -> Plan:
    return Plan.from_dict(json.loads(EXAMPLE_PLAN.read_text()), source=str(EXAMPLE_PLAN))


def test_example_plan_evaluates_and_fits(example_plan: Plan) -> None:
    ev = evaluate(example_plan)
    assert ev.feasible and ev.violations == ()
    assert len(ev.pipeline_times_s) == 2 and [len(p) for p in ev.stages] == [2, 2]
    assert 0 < ev.mfu < 1
    assert ev.grad_sync_s > 0  # two pipelines: gradients are all-reduced across them
    d = ev.to_dict()
    assert d["feasible"] is True and json.loads(json.dumps(d)) == d


def test_iteration_time_and_throughput_compose(example_plan: Plan) -> None:
    ev = evaluate(example_plan)
    tr = example_plan.problem.training
    for times, pipe, stages in zip(ev.pipeline_times_s, example_plan.pipelines, ev.stages):
        assert times == pytest.approx(cost.pipeline_time([s.time for s in stages], pipe.micro_batches))
    assert ev.iteration_time_s == pytest.approx(max(ev.pipeline_times_s) + ev.grad_sync_s + ev.optimizer_s)
    assert ev.throughput_tokens_per_s == pytest.approx(tr.global_batch * tr.seq_len / ev.iteration_time_s)
    cl, model = example_plan.problem.cluster, example_plan.problem.model
    flops = tr.global_batch * tr.seq_len * cost.model_flops_per_token(model, tr.seq_len)
    assert ev.mfu == pytest.approx(flops / ev.iteration_time_s / cl.total_peak_flops())


def _one_pipeline_plan(cluster, *, node: int, gpus: tuple[int, ...], recompute: str, gb: int = 8) -> Plan:
    problem = PlanProblem(cluster=cluster, model=PRESETS["llama2-7b"],
                          training=TrainingConfig(global_batch=gb, micro_batch=1, seq_len=4096, recompute=recompute))
    stage = StagePlan(node=node, gpus=gpus, layers=(0, 32))
    return Plan(problem=problem, pipelines=(PipelinePlan(stages=(stage,), micro_batches=gb),))


def test_memory_overflow_names_stage_gpu_and_gib(small_cluster) -> None:
    # the whole 7B model on two T4s (16 GiB each): ~50 GiB of model states per GPU alone
    plan = _one_pipeline_plan(small_cluster, node=2, gpus=(6, 7), recompute="full")
    ev = evaluate(plan)
    assert not ev.feasible and len(ev.violations) == 1
    msg = ev.violations[0]
    sc = ev.stages[0][0]
    m = re.fullmatch(r"memory: pipeline 0 stage 0 \(T4 x2, 32 layers\) needs ([\d.]+) GiB per GPU, "
                     r"has ([\d.]+) GiB", msg)
    assert m, msg
    assert float(m[1]) == pytest.approx(sc.memory_bytes / 2**30, abs=0.01)
    assert float(m[2]) == pytest.approx(16.0, abs=0.01)
    assert float(m[1]) > float(m[2])
    # an overflowing plan is still scored: the verdict is a status, not an exception
    assert ev.iteration_time_s > 0


def test_stage_memory_is_states_plus_inflight_activations_plus_reserve(small_cluster) -> None:
    plan = _one_pipeline_plan(small_cluster, node=0, gpus=(0, 1, 2, 3), recompute="selective")
    model = plan.problem.model
    sc = evaluate(plan).stages[0][0]
    # one stage holds everything: 16 B/param over 4 GPUs; 1F1B with one stage keeps 1 micro-batch
    states = 16 * model.total_params / 4
    acts = 32 * 34 * 4096 * 4096 / 4 + 4 * 4096 * 4096 * (1 + 32000 / 4096) / 4
    assert sc.memory_bytes == pytest.approx(states + acts + 2**30, rel=1e-9)
    assert sc.params == pytest.approx(model.total_params / 4)
    assert sc.capacity_bytes == 80 * 2**30
    assert sc.comm == 0.0  # a single stage sends nothing


def test_one_pipeline_has_no_grad_sync(small_cluster) -> None:
    ev = evaluate(_one_pipeline_plan(small_cluster, node=0, gpus=(0, 1, 2, 3), recompute="full"))
    assert ev.grad_sync_s == 0.0 and ev.feasible


def test_inflight_depends_on_schedule(example_plan: Plan) -> None:
    pipe = example_plan.pipelines[0]
    mem = {}
    for sched in ("gpipe", "1f1b", "wshape"):
        mem[sched] = stage_cost(example_plan, pipe.stages[1], 1, 2, pipe.micro_batches, None,
                                DEFAULT_PROFILE, schedule=sched).memory_bytes
    # last stage: 1F1B holds 1 micro-batch, GPipe all 22
    assert mem["1f1b"] < mem["gpipe"]
    # W-shape holds P = 2 micro-batches on every stage but moves the head (its states and
    # activations) to stage 0, where the folded model's both ends meet.
    p = example_plan.problem
    st = pipe.stages[1]
    act = cost.activation_bytes_per_layer(p.model, p.training, st.tp) * st.num_layers
    head = (cost.head_activation_bytes(p.model, p.training, st.tp)
            + cost.model_state_bytes(p.model.head_params, st.tp, p.training))
    assert mem["wshape"] - mem["1f1b"] == pytest.approx(act * (2 - 1) - head)


def test_wshape_pair_savings_shorten_the_iteration(example_plan: Plan) -> None:
    p = example_plan.problem
    w = Plan(problem=PlanProblem(cluster=p.cluster, model=p.model, training=p.training, schedule="wshape"),
             pipelines=example_plan.pipelines)
    plain = evaluate(w)
    # g = 0: the W-shape makespan is the 1F1B formula on the folded stages' costs
    expect = [cost.pipeline_time([c.time for c in st], pp.micro_batches)
              for st, pp in zip(plain.stages, w.pipelines)]
    assert plain.pipeline_times_s == pytest.approx(tuple(expect))
    saved = evaluate(w, pair_savings={2: 0.2})
    assert saved.iteration_time_s < plain.iteration_time_s


def test_each_stage_costs_what_stage_cost_gives_it_alone() -> None:
    """evaluate() computes a repeated stage once per plan: stages alike in node, TP, layers and
    position but not in micro-batches (memory in flight) or next node (send) keep their own costs."""
    from hexhelix.ir.cluster import load_cluster

    cl = load_cluster(ROOT / "examples" / "clusters" / "hexiscale-het2.yaml")
    problem = PlanProblem(cluster=cl, model=PRESETS["llama2-7b"],
                          training=TrainingConfig(global_batch=64, micro_batch=1, seq_len=4096, recompute="full"))
    g = [tuple(cl.node_gpus(n)) for n in range(len(cl.nodes))]

    def pipe(m: int, i: int, second: int) -> PipelinePlan:
        stages = (StagePlan(node=0, gpus=g[0][2 * i:2 * i + 2], layers=(0, 3)),
                  StagePlan(node=second, gpus=g[second][i:i + 1] if second else g[0][7:], layers=(3, 14)),
                  StagePlan(node=3, gpus=g[3][2 * i:2 * i + 2], layers=(14, 32)))
        return PipelinePlan(stages=stages, micro_batches=m)

    plan = Plan(problem=problem, pipelines=(pipe(2, 0, 2), pipe(31, 1, 2), pipe(31, 2, 0)))
    ev = evaluate(plan)
    for p, pl in enumerate(plan.pipelines):
        n = len(pl.stages)
        alone = [stage_cost(problem, st, k, n, pl.micro_batches, pl.stages[k + 1] if k + 1 < n else None)
                 for k, st in enumerate(pl.stages)]
        assert list(ev.stages[p]) == alone
    assert ev.stages[0][0].memory_bytes < ev.stages[1][0].memory_bytes  # 2 micro-batches in flight, not 3
    assert ev.stages[1][0].comm > ev.stages[2][0].comm  # sends to the 4090 node, or within its own node
