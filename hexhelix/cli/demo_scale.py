"""Scale a planned job down to a few CPU ranks for the demo's torch run (``hexhelix demo``, step 7).

A plan for an 8-GPU Llama-2-7B job cannot run on a laptop, but its *shape* can: the same number of
pipelines and stages, the same schedule, layer ranges and micro-batch shares in proportion, on the
``tiny`` model. :func:`scale_plan` does that and says, line by line, what it changed, so the demo
never passes off a different run as the planned one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, ModelConfig, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan

__all__ = ["ScaledPlan", "cpu_cluster", "scale_plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaledPlan:
    """The scaled plan and the list of what was changed (one human-readable line each)."""

    plan: Plan
    notes: tuple[str, ...]


def cpu_cluster(ranks: int) -> Cluster:
    """One node of ``ranks`` CPU "devices" (gloo ranks). The GPU type only feeds the compiler's
    duration estimates, which the torch run does not use."""
    return Cluster.from_dict({
        "name": f"cpu-{ranks}", "inter_GBps": 10.0,
        "gpu_types": {"cpu-rank": {"tflops": 0.05, "memory_gib": 4}},
        "nodes": [{"name": "cpu0", "gpu": "cpu-rank", "count": ranks, "intra_GBps": 5.0}]})


def _split_layers(bounds: list[int], old_layers: int, new_layers: int, min_per_stage: int) -> list[tuple[int, int]]:
    """Map stage boundaries ``bounds`` (0 = b0 < b1 < ... = old_layers) proportionally onto
    ``new_layers`` layers, every stage keeping at least ``min_per_stage`` layers."""
    k = len(bounds) - 1
    if k * min_per_stage > new_layers:
        raise InvalidInputError(f"{k} stages of >= {min_per_stage} layers do not fit in {new_layers} layers")
    out = [0]
    for i in range(1, k):
        b = round(bounds[i] * new_layers / old_layers)
        b = max(b, out[-1] + min_per_stage)                # room for this stage
        b = min(b, new_layers - (k - i) * min_per_stage)  # room for the stages after it
        out.append(b)
    out.append(new_layers)
    return [(out[i], out[i + 1]) for i in range(k)]


def _scale_counts(counts: list[int], total: int) -> list[int]:
    """Largest-remainder rounding of ``counts`` to sum to ``total`` with every entry >= 1."""
    total = max(total, len(counts))
    s = sum(counts)
    raw = [c * total / s for c in counts]
    out = [max(1, int(r)) for r in raw]
    order = sorted(range(len(counts)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while sum(out) < total:
        out[order[i % len(order)]] += 1
        i += 1
    while sum(out) > total:
        j = max(range(len(out)), key=lambda x: out[x])
        out[j] -= 1
    return out


def scale_plan(plan: Plan, *, max_ranks: int = 4, model: ModelConfig | None = None, micro_batches: int = 8,
               seq_len: int = 32) -> ScaledPlan:
    """Map ``plan``'s shape onto at most ``max_ranks`` CPU ranks running ``model`` (default ``tiny``).

    Rules, applied in order and each reported in ``notes``:

    1. while the plan needs more ranks than ``max_ranks``: halve the largest TP degree; when every
       stage is TP 1, merge the two adjacent stages of the longest pipeline with the fewest layers
       together; when every pipeline is one TP-1 stage, merge the two pipelines with the fewest
       micro-batches;
    2. TP degrees must divide the small model's heads (halved until they do);
    3. each pipeline's stage boundaries are mapped proportionally onto the small model's layers
       (at least 1 layer per stage; 2 for the W-shape, which folds each stage in two);
    4. micro-batch counts are scaled to ``micro_batches`` in total, keeping each pipeline's share
       as closely as integers allow (at least one each); micro-batch size 1, ``seq_len`` tokens,
       fp32 (the runtime computes in fp32), no recompute; sequence parallelism as planned.
    """
    model = model or PRESETS["tiny"]
    cl = plan.problem.cluster
    sched = plan.problem.schedule
    notes: list[str] = []
    # working form: per pipeline [(gpu type, tp, lo, hi), ...], micro-batches
    pipes = [[[cl.gpu_of_node(s.node).name, s.tp, s.layers[0], s.layers[1]] for s in p.stages] for p in plan.pipelines]
    mbs = [p.micro_batches for p in plan.pipelines]

    def ranks() -> int:
        return sum(st[1] for p in pipes for st in p)

    before = ranks()
    while ranks() > max_ranks:
        stages = [st for p in pipes for st in p]
        big = max(stages, key=lambda st: st[1])
        if big[1] > 1:
            notes.append(f"TP {big[1]} -> {big[1] // 2} on the {big[0]} stage of layers {big[2]}-{big[3] - 1}")
            big[1] //= 2
            continue
        longest = max(range(len(pipes)), key=lambda i: len(pipes[i]))
        p = pipes[longest]
        if len(p) > 1:
            j = min(range(len(p) - 1), key=lambda x: p[x][3] - p[x][2] + p[x + 1][3] - p[x + 1][2])
            notes.append(f"pipeline {longest}: merged stages {j} and {j + 1} (layers {p[j][2]}-{p[j + 1][3] - 1})")
            p[j:j + 2] = [[p[j][0], 1, p[j][2], p[j + 1][3]]]
            continue
        a, b = sorted(range(len(pipes)), key=lambda i: mbs[i])[:2]
        notes.append(f"merged pipelines {a} and {b} ({mbs[a]} + {mbs[b]} micro-batches)")
        mbs[a] += mbs[b]
        del pipes[b], mbs[b]
    for p in pipes:
        for st in p:
            while model.heads % st[1]:
                notes.append(f"TP {st[1]} -> {st[1] // 2}: {model.name} has {model.heads} heads")
                st[1] //= 2
    if ranks() < before:
        notes.insert(0, f"{before} GPUs -> {ranks()} CPU ranks (gloo)")
    min_layers = 2 if sched == "wshape" else 1
    new_mbs = _scale_counts(mbs, micro_batches)
    notes.append(f"{plan.problem.model.name} ({plan.problem.model.layers} layers) -> {model.name} "
                 f"({model.layers} layers, hidden {model.hidden}); stage boundaries mapped proportionally")
    notes.append(f"micro-batches per pipeline {mbs} -> {new_mbs}; micro-batch 1 x {seq_len} tokens "
                 f"(was {plan.problem.training.micro_batch} x {plan.problem.training.seq_len}), fp32, no recompute")
    cluster = cpu_cluster(ranks())
    training = TrainingConfig(global_batch=sum(new_mbs), micro_batch=1, seq_len=seq_len, dtype="fp32",
                              recompute="none", sequence_parallel=plan.problem.training.sequence_parallel)
    problem = PlanProblem(cluster=cluster, model=model, training=training, schedule=sched)
    next_rank = 0
    out_pipes = []
    old_l = plan.problem.model.layers
    for p, m in zip(pipes, new_mbs):
        bounds = [st[2] for st in p] + [p[-1][3]]
        layer_ranges = _split_layers(bounds, old_l, model.layers, min_layers)
        stages = []
        for st, lay in zip(p, layer_ranges):
            gpus = tuple(range(next_rank, next_rank + st[1]))
            next_rank += st[1]
            stages.append(StagePlan(node=0, gpus=gpus, layers=lay))
        out_pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=m))
    scaled = Plan(problem=problem, pipelines=tuple(out_pipes),
                  meta={"scaled_from": plan.meta.get("method", "plan"), "notes": notes})
    return ScaledPlan(plan=scaled, notes=tuple(notes))


def describe(plan: Plan) -> list[str]:
    """One line per pipeline: ``GPUxTP[Llo-hi]`` per stage and the micro-batch count."""
    cl = plan.problem.cluster
    return [f"pipeline {i}: {p.micro_batches} micro-batches; "
            + ", ".join(f"{cl.nodes[s.node].name}:{cl.gpu_of_node(s.node).name}x{s.tp}[L{s.layers[0]}-{s.layers[1] - 1}]"
                        for s in p.stages)
            for i, p in enumerate(plan.pipelines)]
