"""Plans for the compiler tests: a 16-layer tiny-width model on a synthetic cluster of 4-GPU nodes,
one node per stage, so pipelines of depth 1–8 fold under W-shape with any TP mix of 1, 2, 4."""

from __future__ import annotations

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import ModelConfig, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan

MODEL16 = ModelConfig(name="tiny16", layers=16, hidden=64, heads=4, kv_heads=4, ffn=176, vocab=256)


def cluster(nodes: int = 24) -> Cluster:
    """``nodes`` nodes of 4 GPUs (two GPU types alternating, so links and speeds differ)."""
    return Cluster.from_dict({"name": "synthetic", "inter_GBps": 12.5, "latency_us": 10, "nodes": [
        {"name": f"n{i}", "gpu": "A100-SXM4-80GB" if i % 2 == 0 else "A40", "count": 4, "intra_GBps": 100}
        for i in range(nodes)]})


def even_layers(num_stages: int, layers: int = 16) -> list[tuple[int, int]]:
    base, extra = divmod(layers, num_stages)
    out, lo = [], 0
    for k in range(num_stages):
        n = base + (1 if k < extra else 0)
        out.append((lo, lo + n))
        lo += n
    return out


def random_layers(rng, num_stages: int, layers: int = 16, minimum: int = 1) -> list[tuple[int, int]]:
    """A random split of ``layers`` into ``num_stages`` contiguous ranges of >= ``minimum`` layers."""
    cuts = sorted(rng.sample(range(1, layers - num_stages * (minimum - 1)), num_stages - 1))
    sizes = [b - a + minimum - 1 for a, b in zip([0, *cuts], [*cuts, layers - num_stages * (minimum - 1)])]
    out, lo = [], 0
    for n in sizes:
        out.append((lo, lo + n))
        lo += n
    return out


def make_plan(pipes: list[tuple[int, int, tuple[int, ...]]], schedule: str = "1f1b",
              model: ModelConfig = MODEL16, layers: list[list[tuple[int, int]]] | None = None) -> Plan:
    """``pipes``: per pipeline (stages P, micro-batches m, TP degrees cycled over the stages);
    ``layers``: optional per-pipeline layer ranges (default: as even as possible)."""
    cl = cluster()
    node = 0
    out = []
    for p, (P, m, tps) in enumerate(pipes):
        stages = []
        for k, lay in enumerate(layers[p] if layers else even_layers(P, model.layers)):
            tp = tps[k % len(tps)]
            first = cl.node_gpus(node)[0]
            stages.append(StagePlan(node=node, gpus=tuple(range(first, first + tp)), layers=lay))
            node += 1
        out.append(PipelinePlan(stages=tuple(stages), micro_batches=m))
    tr = TrainingConfig(global_batch=sum(m for _, m, _ in pipes), micro_batch=1, seq_len=32)
    return Plan(problem=PlanProblem(cluster=cl, model=model, training=tr, schedule=schedule), pipelines=tuple(out))
