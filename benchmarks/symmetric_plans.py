"""Best plan of P identical pipelines, without limits: a primal check on the planner's incumbents.

Lists every shape of :mod:`hexhelix.solver.symmetric` for each P given (no step budget, unlike the
candidates hexiscale takes), lays each out exactly, and scans them fastest pipeline first with the
evaluator until a pipeline alone is slower than the best plan (:func:`best_symmetric`): the best
plan of the class, each shape with the layer counts that minimise its pipeline time. The class
holds every plan whose layers all sync on one node's link, the structure of hexiscale-het1's and
-het3's incumbents (docs/gap-analysis.md). Planner settings as in benchmarks/planner.py (global batch
64, micro-batch 1, seq 4096, full recompute, 1F1B); the hexiscale line is the planner's own result.

    python benchmarks/symmetric_plans.py hexiscale-het1 2,3,4,5,6,7,8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import Plan
from hexhelix.solver.layer_assign import StageCostTable
from hexhelix.solver.phase2 import PipelineSolver
from hexhelix.solver.solve import solve
from hexhelix.solver.symmetric import best_symmetric, ranked_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import CLUSTERS, problem


def describe(plan: Plan) -> str:
    cl = plan.problem.cluster
    return ", ".join(f"{cl.nodes[s.node].name} x{s.tp} [{s.num_layers}]" for s in plan.pipelines[0].stages)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster", help="an example cluster name (examples/clusters/NAME.yaml)")
    ap.add_argument("pipelines", help="pipeline counts, comma-separated, e.g. 3,4")
    ap.add_argument("--model", default="llama2-7b")
    args = ap.parse_args(argv)
    try:
        counts = [int(p) for p in args.pipelines.split(",")]
        if min(counts) < 1:
            raise ValueError(f"pipeline counts must be >= 1, got {args.pipelines}")
        pb = problem(load_cluster(CLUSTERS / f"{args.cluster}.yaml"), args.model, 64)
    except (ValueError, KeyError, InvalidInputError) as err:
        ap.error(str(err))
    heur = solve(pb, "hexiscale")
    print(f"{args.cluster}, {args.model}: hexiscale {heur.iteration_time_s:.4f} s, "
          f"{len(heur.plan.pipelines)} pipelines ({heur.params.get('winner')})")
    print("| P | shapes | best iteration s | slowest pipeline s | sync s | pipeline 0: node xTP [layers] | time s |")
    print("|---|---|---|---|---|---|---|")
    for P in counts:
        t0 = time.perf_counter()
        layout = PipelineSolver(pb, StageCostTable(pb), 3).layout
        ranked = ranked_shapes(pb, P, layout)
        best = best_symmetric(pb, P, layout, ranked=ranked)
        n = len(ranked or ())
        dt = time.perf_counter() - t0
        if best is None:
            print(f"| {P} | {n} | no plan fits | – | – | – | {dt:.0f} |")
        else:
            plan, ev = best
            print(f"| {P} | {n} | {ev.iteration_time_s:.4f} | {max(ev.pipeline_times_s):.4f} | {ev.grad_sync_s:.4f} | "
                  f"{describe(plan)} | {dt:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
