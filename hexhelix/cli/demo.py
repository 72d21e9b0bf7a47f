"""``hexhelix demo``: a guided tour on a built-in heterogeneous example (no GPU needed).

Today it prints the cluster, the model, the cost model's view of one layer on every GPU type and
the evaluation of the example plan in ``examples/plans``; later stages of the toolkit extend it.
"""

from __future__ import annotations

import argparse
import json

from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import load_model
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import DEFAULT_PROFILE
from hexhelix.solver import cost
from hexhelix.solver.evaluate import evaluate

from .common import EXAMPLES

DEMO_CLUSTER = "small-mixed"
DEMO_PLAN = "small-mixed-llama2-7b.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="guided tour on a built-in heterogeneous example (no GPU)",
                       description="Print a built-in cluster, the cost model's view of it and the score of "
                                   "an example plan.")
    p.add_argument("--model", default="llama2-7b", help="model preset (default llama2-7b)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster = load_cluster(EXAMPLES / "clusters" / f"{DEMO_CLUSTER}.yaml")
    model = load_model(args.model)
    plan_path = EXAMPLES / "plans" / DEMO_PLAN
    plan = Plan.from_dict(json.loads(plan_path.read_text()), source=str(plan_path))
    train = plan.problem.training
    print(f"== cluster {cluster.name}: {cluster.num_gpus} GPUs, {cluster.total_peak_flops() / 1e15:.2f} PFLOPS peak")
    for i, n in enumerate(cluster.nodes):
        g = cluster.gpu_types[n.gpu]
        print(f"  node {i} {n.name:<8} {n.count} x {n.gpu:<16} {g.tflops:7.1f} TF  {g.memory_gib:4.0f} GiB  "
              f"intra {n.intra_GBps:g} GB/s")
    print(f"  between nodes {cluster.inter_GBps:g} GB/s, latency {cluster.latency_us:g} us, "
          f"{len(cluster.links)} link override(s)")
    print(f"== model {model.name}: {model.layers} layers, hidden {model.hidden}, {model.total_params / 1e9:.2f} B params")
    print(f"   one layer forward at b=1, s={train.seq_len}: "
          f"{cost.layer_forward_flops(model, 1, train.seq_len) / 1e12:.2f} TFLOP")
    print("== one layer, one micro-batch, per GPU type and TP degree (cost model defaults)")
    print(f"  {'GPU':<16} {'TP':>2} {'fwd ms':>8} {'bwd ms':>8} {'TP comm ms':>10} {'act MiB':>8}")
    for i, n in enumerate(cluster.nodes):
        gpu = cluster.gpu_types[n.gpu]
        for tp in (1, 2, 4):
            if tp > n.count:
                continue
            lc = cost.layer_cost(model, train, tp, gpu, cost.cluster_link(cluster, i, i), DEFAULT_PROFILE)
            act = cost.activation_bytes_per_layer(model, train, tp)
            print(f"  {n.gpu:<16} {tp:>2} {lc.fwd * 1e3:8.2f} {lc.bwd * 1e3:8.2f} "
                  f"{(lc.fwd_comm + lc.bwd_comm) * 1e3:10.2f} {act / 2**20:8.0f}")
    ev = evaluate(plan)
    print(f"== example plan {plan_path.name} (hand-written)")
    for p, pipe in enumerate(plan.pipelines):
        stages = ", ".join(f"{cluster.nodes[s.node].gpu}x{s.tp}:L{s.layers[0]}-{s.layers[1] - 1}" for s in pipe.stages)
        print(f"  pipeline {p}: {pipe.micro_batches} micro-batches; {stages}; {ev.pipeline_times_s[p]:.2f} s")
    print(f"  iteration {ev.iteration_time_s:.2f} s (grad sync {ev.grad_sync_s:.3f} s), "
          f"{ev.throughput_tokens_per_s:,.0f} tokens/s, MFU {ev.mfu:.1%}, "
          f"{'fits in memory' if ev.feasible else 'DOES NOT FIT: ' + '; '.join(ev.violations)}")
    return 0
