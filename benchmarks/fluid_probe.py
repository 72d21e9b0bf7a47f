"""Fluid bound for one pipeline count at a time: fractional micro-batches against whole ones.

Runs :func:`hexhelix.solver.fluid_bound.fluid_lower_bound` for each P given (no locality branching,
the hexiscale plan as incumbent and seed), once with the fractional master alone and once continuing
with whole micro-batches (docs/formulation.md §14), side by side with the same deadline, and prints
the proven bound, the master's own estimate and whether the run converged. The planner settings are
those of benchmarks/planner.py (global batch 64, micro-batch 1, seq 4096, full recompute).

    python benchmarks/fluid_probe.py homo-32xa100 5,7 --seconds 40
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
from hexhelix.solver.fluid_bound import fluid_lower_bound, optimizer_lower_bound, sync_lower_bound
from hexhelix.solver.solve import solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import CLUSTERS, problem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster", help="an example cluster name (examples/clusters/NAME.yaml)")
    ap.add_argument("pipelines", help="pipeline counts, comma-separated, e.g. 5,7")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--seconds", type=float, default=40.0, help="deadline of each run")
    args = ap.parse_args(argv)
    try:
        counts = [int(p) for p in args.pipelines.split(",")]
        pb = problem(load_cluster(CLUSTERS / f"{args.cluster}.yaml"), args.model, 64)
    except (ValueError, KeyError, InvalidInputError) as err:  # a typo gets one line, not a traceback
        ap.error(f"{err} (pipelines: comma-separated integers; model: one of {', '.join(sorted(PRESETS))})")
    heur = solve(pb, "hexiscale")
    tables = build_tables(pb)
    print(f"{args.cluster} / {args.model}: hexiscale incumbent {heur.iteration_time_s:.4f} s "
          f"({len(heur.plan.pipelines)} pipelines)")
    print("P  micro-batches  bound s  master s  converged  seconds")
    for P in counts:
        rest = sync_lower_bound(tables, P) + optimizer_lower_bound(tables, P)
        for whole in (False, True):
            t0 = time.monotonic()
            fr = fluid_lower_bound(tables, pmax=P, replicas=P, rest_s=rest, upper_s=heur.iteration_time_s,
                                   seed_plans=(heur.plan,), deadline=t0 + args.seconds, integral=whole)
            print(f"{P:<2} {'whole' if whole else 'fractional':<14} {fr.lb_s:7.4f}  {fr.upper_s:8.4f}  "
                  f"{fr.converged!s:<9}  {time.monotonic() - t0:5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
