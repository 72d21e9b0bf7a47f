"""``hexhelix pair``: DHelix segment pairing of one layer pair on a TP group of the cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.files import read_json
from hexhelix.ir.pairing import PairingPlan, dhelix_default_plan

from .common import add_model_args, emit_json, load_inputs, progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pair", help="pair forward/backward segments of two strands (DHelix)",
        description="Cut the forward of one micro-batch strand and the backward of another into segments "
                    "and co-execute them so each strand's TP communication hides under the other's compute. "
                    "The GPU type and intra-node link come from the cluster (first node with >= --tp GPUs, "
                    "or --node).")
    add_model_args(p)
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree of the stage")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (the default; see --no-sp)")
    p.add_argument("--node", default=None, help="node name to take the GPU type and link from")
    p.add_argument("--solver", default="all",
                   choices=["dp", "lattice", "lattice-highs", "cpsat", "sequential", "all"],
                   help="method (default all)")
    p.add_argument("--segments", choices=["groups", "all"], default="groups",
                   help="DP/lattice segment set: refinements of DHelix's base groups (paper) or every "
                        "contiguous segment (default groups)")
    p.add_argument("--time-limit", type=float, default=9.0, help="seconds per exact solve (default 9)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    p.add_argument("--block-overhead-us", type=float, default=0.0,
                   help="launch + barrier cost charged per block, microseconds (default 0)")
    p.add_argument("--plan", default=None,
                   help="also score a barrier plan: a JSON file (hexhelix.pairing/1 or the authors' "
                        "{\"DCBlocks\": ...}) or 'dhelix-default' for the paper's 17-block plan")
    p.add_argument("--export-problem", default=None, metavar="FILE",
                   help="write the pairing problem (hexhelix.problem/1, kind pairing) for `hexhelix solve`")
    p.add_argument("--show-blocks", action="store_true", help="print the blocks of each result")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.solver.cost import cluster_link
    from hexhelix.solver.pairing import (
        results_to_dict,
        score_pairing_plan,
        solve_pairing,
        solve_pairing_all,
    )
    from hexhelix.solver.pairing_costs import build_pairing_problem
    from hexhelix.solver.solve import check_time_limit

    if args.sp and args.no_sp:
        raise InvalidInputError("choose one of --sp and --no-sp", field="--sp")
    check_time_limit(args.time_limit)
    if args.workers < 1:
        raise InvalidInputError(f"must be a positive integer, got {args.workers}", field="--workers")
    if not args.block_overhead_us >= 0:
        raise InvalidInputError(f"must be >= 0, got {args.block_overhead_us}", field="--block-overhead-us")
    cluster, model, train, profile = load_inputs(args)
    assert cluster is not None
    if args.tp < 1:
        raise InvalidInputError(f"must be >= 1, got {args.tp}", field="--tp")
    try:
        model.check_tp(args.tp)
    except InvalidInputError as err:
        raise InvalidInputError(err.message, field="--tp") from None
    node = _pick_node(cluster, args.tp, args.node)
    gpu, link = cluster.gpu_of_node(node), cluster_link(cluster, node, node)
    problem = build_pairing_problem(model, train, args.tp, gpu, link, profile,
                                    block_overhead_s=args.block_overhead_us * 1e-6)
    problem.meta["node"] = cluster.nodes[node].name
    if args.export_problem:
        Path(args.export_problem).write_text(json.dumps(problem.to_dict(), indent=1) + "\n")
        progress(f"wrote {args.export_problem}")
    options = {"segments": args.segments, "time_limit": args.time_limit, "workers": args.workers}
    if args.solver == "all":
        results = solve_pairing_all(problem, options)
    else:
        results = [solve_pairing(problem, args.solver, options)]
    if args.plan:
        plan = dhelix_default_plan() if args.plan == "dhelix-default" else _load_plan(args.plan)
        results.append(score_pairing_plan(problem, plan, name=f"plan:{args.plan}"))
    out = results_to_dict(problem, results)
    if args.json:
        emit_json(out)
        return 0
    seq, lb = out["sequential_s"], out["lower_bound_s"]
    print(f"{model.name} layer pair on {gpu.name} x{args.tp} ({cluster.nodes[node].name}, "
          f"{link.bandwidth / 1e9:g} GB/s), seq {train.seq_len}, micro-batch {train.micro_batch}, "
          f"SP {'on' if problem.meta['sequence_parallel'] else 'off'}")
    print(f"sequential {seq * 1e3:.3f} ms   lower bound max(compute, busiest link) {lb * 1e3:.3f} ms")
    print(f"{'solver':<24} {'status':<10} {'time ms':>9} {'bound ms':>9} {'g':>6} {'hidden':>7} "
          f"{'blocks':>6} {'solve s':>8}")
    for r in results:
        if r.plan is None:
            print(f"{r.solver:<24} {r.status.value:<10} {'-':>9} {'-':>9} {'-':>6} {'-':>7} {'-':>6} "
                  f"{r.solve_time_s:8.2f}  {r.reason}")
            continue
        bound = f"{r.bound_s * 1e3:9.3f}" if r.bound_s is not None else f"{'-':>9}"
        g = max(0.0, 1 - r.makespan_s / seq) if seq > 0 else 0.0
        print(f"{r.solver:<24} {r.status.value:<10} {r.makespan_s * 1e3:9.3f} {bound} {g:6.3f} "
              f"{r.hidden_comm_fraction:7.1%} {len(r.plan.blocks):>6} {r.solve_time_s:8.2f}")
        if args.show_blocks and r.plan:
            for k, b in enumerate(r.plan.blocks):
                print(f"    {k + 1:>2}  {', '.join(b.fwd) or '-'}  ||  {', '.join(b.bwd) or '-'}  "
                      f"[comm: {', '.join(b.comm) or '-'}]")
    return 0


def _pick_node(cluster, tp: int, name: str | None) -> int:
    if name is not None:
        i = cluster.node_index(name)
        if cluster.nodes[i].count < tp:
            raise InvalidInputError(f"node {name!r} has {cluster.nodes[i].count} GPUs, fewer than --tp {tp}",
                                    field="--node")
        return i
    for i, n in enumerate(cluster.nodes):
        if n.count >= tp:
            return i
    raise InvalidInputError(f"no node has {tp} GPUs (largest has {max(n.count for n in cluster.nodes)}); "
                            "TP groups stay inside one node", field="--tp")


def _load_plan(path: str) -> PairingPlan:
    return PairingPlan.from_dict(read_json(path), source=path)
