"""Pricing DP of the fluid bound: the compiled loops (solver/shape_dp_jit.py) against the numpy DP.

Both engines of :class:`hexhelix.solver.shape_pricing.ShapePricer` price the same batches of caps,
side by side in one run: ten caps on the stage time between 0.3 and 0.6 s with node prices and a
cap on the sync + optimizer floor, the batch the whole-batch certificate sends (two boxes × five
multipliers), in the root cell and in a cell that requires two nodes of every pipeline (four times
the states). Each figure is the median of ``--repeats`` calls, after one call that compiles (numba
caches the machine code on disk, so only a fresh install pays it); the values of the two engines
are checked equal before anything is timed.

    python benchmarks/pricing.py                 # print the table
    python benchmarks/pricing.py --write-readme  # also replace its section of benchmarks/README.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from hexhelix.ir.cluster import load_cluster
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.shape_pricing import ShapePricer
from hexhelix.solver.stage_floors import Locality

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import CLUSTERS, generated, problem
from readme_section import write_section

BEGIN, END = "<!-- pricing:begin -->", "<!-- pricing:end -->"
CASES = ["small-mixed", "mixed-a100-a40-t4", "hexiscale-het2", "hexiscale-het1", "hexiscale-het3", "gen-64"]


def _median_ms(pricer: ShapePricer, args: tuple, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pricer.solve(*args)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def table(repeats: int) -> tuple[str, float]:
    rows = ["| cluster | GPUs | nodes | stage options | cell | numpy ms / cap | compiled ms / cap | speed-up |",
            "|---|---|---|---|---|---|---|---|"]
    ups = []
    for name in CASES:
        cl = generated(int(name[4:])) if name.startswith("gen-") else load_cluster(CLUSTERS / f"{name}.yaml")
        tables = build_tables(problem(cl, "llama2-7b", max(64, cl.num_gpus)))
        ref, fast = ShapePricer(tables, engine="numpy"), ShapePricer(tables, engine="jit")
        rng = np.random.default_rng(0)
        K = 10
        caps = np.linspace(0.3, 0.6, K)
        weights, wcaps, pi = caps * 15.0, np.full(K, 0.5), rng.uniform(0.0, 0.5, ref.N)
        for label, loc in (("root", Locality()), ("2 nodes required", Locality(visit=frozenset({0, ref.N - 1})))):
            args = (caps, weights, pi, wcaps, ref.extras(4, loc))
            want, _ = ref.solve(*args)
            got, _ = fast.solve(*args)  # the first call compiles (or loads the cached machine code)
            assert np.allclose(got, want, rtol=1e-12, atol=1e-12), (name, label)
            slow, quick = _median_ms(ref, args, max(3, repeats // 4)) / K, _median_ms(fast, args, repeats) / K
            ups.append(slow / quick)
            rows.append(f"| {name} | {cl.num_gpus} | {ref.N} | {ref.C} | {label} | "
                        f"{slow:.2f} | {quick:.3f} | {slow / quick:.0f}× |")
            print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows), statistics.median(ups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows, median_up = table(args.repeats)
    body = "\n".join([
        BEGIN,
        "## Fluid-bound pricing DP: `benchmarks/pricing.py`",
        "",
        f"Command: `python benchmarks/pricing.py --write-readme` ({time.monotonic() - t0:.0f} s on the 2-core CPU, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). The shortest path behind every column-generation "
        "certificate (docs/formulation.md §14), priced by the numpy DP (vectorised over a batch of caps) and by "
        "the same recursion compiled with numba (solver/shape_dp_jit.py: plain loops that stop a stage's length at "
        "the cap, fresh runs read the best suffix per node instead of every state). Batches of ten caps on the "
        "stage time (0.3–0.6 s) with node prices and a floor cap, Llama-2 7B, four pipelines' floors; medians of "
        f"{args.repeats} calls (numpy: of {max(3, args.repeats // 4)}), after a first call that compiles; both "
        "engines' values checked equal first.",
        "",
        rows,
        "",
        f"Median speed-up {median_up:.0f}×. The search in the planner uses the compiled engine wherever numba "
        "imports (a dependency); the numpy DP stays as its tested oracle (tests/test_shape_pricing.py).",
        END,
    ])
    print(body)
    if args.write_readme:
        write_section(BEGIN, END, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
