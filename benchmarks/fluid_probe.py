"""Fluid bound for one pipeline count at a time: fractional micro-batches against whole ones.

Runs :func:`hexhelix.solver.fluid_bound.fluid_lower_bound` for each P given (no locality branching,
the hexiscale plan as incumbent and seed), once with the fractional master alone and once continuing
with whole micro-batches (docs/formulation.md §14), side by side with the same deadline, and prints
the proven bound, the master's own estimate and whether the run converged; after the whole run, the
time P whole pipelines of its columns need (:func:`hexhelix.solver.whole_pipelines.whole_pipeline_time`:
integer pipeline counts over those columns — what branching on integrality alone could reach at the
root, an estimate, not a bound; docs/formulation.md §13). The planner settings are
those of benchmarks/planner.py (global batch 64, micro-batch 1, seq 4096, full recompute).

    python benchmarks/fluid_probe.py homo-32xa100 5,7 --seconds 40

With ``all`` instead of pipeline counts it runs the planner's whole bound search
(:func:`hexhelix.solver.fluid_branch.fluid_bounds_by_pipelines`: ranges of P, locality cells) for the
given seconds and prints each P's bound and the least one — the fluid part of the planner alone:

    python benchmarks/fluid_probe.py hexiscale-het3 all --seconds 69
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.exact_plan import max_pipelines
from hexhelix.solver.fluid_bound import fluid_lower_bound, optimizer_lower_bound, sync_lower_bound
from hexhelix.solver.fluid_branch import fluid_bounds_by_pipelines
from hexhelix.solver.master_rounding import Incumbent
from hexhelix.solver.solve import solve
from hexhelix.solver.whole_pipelines import whole_pipeline_time

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import CLUSTERS, generated, problem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster", help="an example cluster name (examples/clusters/NAME.yaml), or gen-N: the "
                                    "planner benchmark's generated N-GPU A100/A40 cluster")
    ap.add_argument("pipelines", help="pipeline counts, comma-separated, e.g. 5,7; or 'all': the whole search")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--seconds", type=float, default=40.0, help="deadline of each run")
    args = ap.parse_args(argv)
    try:
        counts = [] if args.pipelines == "all" else [int(p) for p in args.pipelines.split(",")]
        if args.cluster.startswith("gen-"):
            n = int(args.cluster[4:])
            pb = problem(generated(n), args.model, max(64, n))
        else:
            pb = problem(load_cluster(CLUSTERS / f"{args.cluster}.yaml"), args.model, 64)
    except (ValueError, KeyError, InvalidInputError) as err:  # a typo gets one line, not a traceback
        ap.error(f"{err} (pipelines: comma-separated integers; model: one of {', '.join(sorted(PRESETS))})")
    heur = solve(pb, "hexiscale")
    tables = build_tables(pb)
    print(f"{args.cluster} / {args.model}: hexiscale incumbent {heur.iteration_time_s:.4f} s "
          f"({len(heur.plan.pipelines)} pipelines)")
    if not counts:
        t0 = time.monotonic()
        inc = Incumbent(heur.plan, heur.iteration_time_s)  # rounded masters may replace it, as in the planner
        bounds, _ = fluid_bounds_by_pipelines(tables, pmax=max_pipelines(tables), upper_s=heur.iteration_time_s,
                                              seed_plans=(heur.plan,), deadline=t0 + args.seconds, incumbent=inc)
        print("P  bound s")
        for P, b in sorted(bounds.items()):
            print(f"{P:<2} {b:.4f}")
        least = min(bounds, key=bounds.__getitem__)
        print(f"least bound {bounds[least]:.4f} s (P = {least}) after {time.monotonic() - t0:.1f} s; "
              f"gap to the incumbent ({inc.time_s:.4f} s, {'rounded' if inc.improved else 'hexiscale'}) "
              f"{1 - bounds[least] / inc.time_s:.1%}")
        return 0
    print("P  micro-batches  bound s  master s  converged  seconds  whole pipelines s")
    for P in counts:
        rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
        for whole in (False, True):
            t0 = time.monotonic()
            fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=heur.iteration_time_s,
                                   seed_plans=(heur.plan,), deadline=t0 + args.seconds, integral=whole)
            took = time.monotonic() - t0
            integer = f"  {whole_pipeline_time(tables, fr.shapes, P, rest):17.4f}" if whole else ""
            print(f"{P:<2} {'whole' if whole else 'fractional':<14} {fr.lb_s:7.4f}  {fr.upper_s:8.4f}  "
                  f"{fr.converged!s:<9}  {took:5.1f}{integer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
