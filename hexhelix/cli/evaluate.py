"""``hexhelix evaluate plan.json``: score any plan (a solver's or a hand-written one) with the cost model.

The plan format (schema ``hexhelix.plan/1``) embeds its problem; see
``examples/plans/small-mixed-llama2-7b.json`` for a hand-written example. Exit status 0 when the plan
fits in memory, 1 when some GPU runs out of memory, 2 for an unreadable or invalid plan.
"""

from __future__ import annotations

import argparse

from hexhelix.ir.files import read_structured_file
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import load_profile

from .common import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score a plan file with the cost model",
                       description="Print iteration time, throughput, MFU, per-pipeline times, gradient sync, "
                                   "optimizer time and memory per stage of a plan (hexhelix.plan/1).")
    p.add_argument("plan", help="plan file (JSON or YAML, schema hexhelix.plan/1)")
    p.add_argument("--profile", default=None, help="profile JSON (default: documented defaults)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.solver.evaluate import evaluate

    plan = Plan.from_dict(read_structured_file(args.plan), source=args.plan)
    ev = evaluate(plan, load_profile(args.profile))
    if args.json:
        emit_json({"plan": args.plan, "solver": plan.meta.get("solver"), **ev.to_dict()})
        return 0 if ev.feasible else 1
    cl = plan.problem.cluster
    print(f"{args.plan}: {plan.problem.model.name} on {cl.name} ({plan.num_gpus_used}/{cl.num_gpus} GPUs used), "
          f"made by {plan.meta.get('solver', 'unknown')}")
    print(f"  iteration {ev.iteration_time_s:.4f} s = slowest pipeline {max(ev.pipeline_times_s):.4f} s + grad sync "
          f"{ev.grad_sync_s:.4f} s + optimizer {ev.optimizer_s:.4f} s")
    print(f"  {ev.throughput_tokens_per_s:,.0f} tokens/s, MFU {ev.mfu:.1%}")
    for p, (pipe, costs) in enumerate(zip(plan.pipelines, ev.stages)):
        print(f"  pipeline {p}: {pipe.micro_batches} micro-batches, {ev.pipeline_times_s[p]:.4f} s")
        for st, c in zip(pipe.stages, costs):
            print(f"    {cl.nodes[st.node].name} {cl.nodes[st.node].gpu} x{st.tp} layers {st.layers[0]}-{st.layers[1] - 1}: "
                  f"u = {c.time * 1e3:.2f} ms, memory {c.memory_bytes / 2**30:.2f} / {c.capacity_bytes / 2**30:.2f} GiB")
    for v in ev.violations:
        print(f"  DOES NOT FIT: {v}")
    return 0 if ev.feasible else 1
