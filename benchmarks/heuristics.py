"""Heuristic planners side by side: HexiScale (fixed), HexiScale as released, Megatron baseline.

For every example cluster and model it reports each method's status, iteration time under the one
evaluator and solve time, plus the fixed planner's speed-up over the other two; then the solve
time of ``hexiscale`` on synthetic mixed clusters from 8 to 512 GPUs. With ``--write`` the tables
replace the "Heuristic planners" section of benchmarks/README.md.

    python benchmarks/heuristics.py [--models llama2-7b,llama2-13b,llama-30b] [--scaling 8,64,512]
                                    [--exact 12 --exact-time-limit 30] [--write]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from pathlib import Path

from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import phase2
from hexhelix.solver.hexiscale import plan_hexiscale
from hexhelix.solver.hexiscale_released import plan_hexiscale_released
from hexhelix.solver.layer_assign_jit import assign_layers_compiled
from hexhelix.solver.megatron import plan_megatron
from hexhelix.solver.result import SolveResult, SolveStatus

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- heuristics:begin -->", "<!-- heuristics:end -->"


def _cell(r: SolveResult) -> str:
    if r.evaluation is not None and r.evaluation.feasible:
        return f"{r.iteration_time_s:.4g}"
    if r.evaluation is not None:
        return f"({r.iteration_time_s:.4g}, OOM)"
    return "no plan"


def _ratio(a: SolveResult, b: SolveResult) -> str:
    if a.evaluation is not None and a.evaluation.feasible and b.evaluation is not None and b.evaluation.feasible:
        return f"{b.iteration_time_s / a.iteration_time_s:.2f}x"
    return "–"


def examples_table(models: list[str], training: TrainingConfig) -> list[str]:
    rows = ["| cluster | GPUs | model | hexiscale s/iter | solve s | released s/iter | megatron s/iter (GPUs) "
            "| fixed vs released | fixed vs megatron |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted((ROOT / "examples" / "clusters").glob("*.yaml")):
        cl = load_cluster(path)
        for m in models:
            pr = PlanProblem(cluster=cl, model=PRESETS[m], training=training)
            h, rel, meg = plan_hexiscale(pr), plan_hexiscale_released(pr), plan_megatron(pr)
            used = f" ({meg.params.get('gpus_used')})" if meg.status is SolveStatus.FEASIBLE else ""
            rows.append(f"| {cl.name} | {cl.num_gpus} | {m} | {_cell(h)} | {h.solve_time_s:.2f} | {_cell(rel)} "
                        f"| {_cell(meg)}{used} | {_ratio(h, rel)} | {_ratio(h, meg)} |")
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def synthetic_cluster(gpus: int) -> Cluster:
    """``gpus``/8 nodes cycling A100 (NVLink), RTX4090 (PCIe) and T4, 12.5 GB/s between nodes."""
    kinds = [("A100-SXM4-80GB", 300), ("RTX4090", 12), ("T4", 12)]
    nodes = []
    for i in range(max(1, gpus // 8)):
        gpu, intra = kinds[i % len(kinds)]
        nodes.append({"name": f"n{i}", "gpu": gpu, "count": min(8, gpus), "intra_GBps": intra})
    return Cluster.from_dict({"name": f"synthetic-{gpus}", "nodes": nodes, "inter_GBps": 12.5})


def scaling_table(sizes: list[int], model: str, training: TrainingConfig) -> list[str]:
    """hexiscale's solve time per cluster size, and side by side the same solve with every layer
    assignment in numpy (the compiled form off): the plans must be equal, the times say what it buys."""
    rows = ["| GPUs | global batch | hexiscale s/iter | pipelines | GPUs used | candidates | solve s "
            "| numpy layouts: solve s | numpy / compiled | same plan |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    default = phase2.COMPILED_AFTER
    assign_layers_compiled([1.0], [0.0], [1], 1, 1)     # numba's one-time load, outside the timings
    for n in sizes:
        tr = TrainingConfig(global_batch=max(training.global_batch, 2 * n), micro_batch=training.micro_batch,
                            seq_len=training.seq_len, recompute=training.recompute)
        pr = PlanProblem(cluster=synthetic_cluster(n), model=PRESETS[model], training=tr)
        t0 = time.perf_counter()
        h = plan_hexiscale(pr)
        dt = time.perf_counter() - t0
        phase2.COMPILED_AFTER = 1 << 62
        try:
            t0 = time.perf_counter()
            hn = plan_hexiscale(pr)
            dn = time.perf_counter() - t0
        finally:
            phase2.COMPILED_AFTER = default
        npipe = len(h.plan.pipelines) if h.plan else 0
        used = h.plan.num_gpus_used if h.plan else 0
        same = "yes" if (h.plan and hn.plan and h.plan.pipelines == hn.plan.pipelines) or (not h.plan and not hn.plan) else "NO"
        rows.append(f"| {n} | {tr.global_batch} | {_cell(h)} | {npipe} | {used} | {h.params['candidates_tried']} "
                    f"| {dt:.2f} | {dn:.2f} | {dn / dt:.2f}x | {same} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def random_instance(rng: random.Random, i: int) -> PlanProblem:
    """A small random mixed cluster (1–3 nodes of 1–4 GPUs) with Llama-2 7B or the tiny model."""
    types = [("A100-SXM4-80GB", 300), ("A40", 25), ("T4", 12), ("RTX4090", 12), ("RTX3090", 12)]
    nodes = []
    for j in range(rng.randint(1, 3)):
        gpu, intra = rng.choice(types)
        nodes.append({"name": f"n{j}", "gpu": gpu, "count": rng.choice([1, 2, 2, 4]), "intra_GBps": intra})
    cl = Cluster.from_dict({"name": f"random-{i}", "nodes": nodes, "inter_GBps": rng.choice([5, 12.5, 25])})
    tr = TrainingConfig(global_batch=rng.choice([8, 16, 32]), seq_len=rng.choice([1024, 2048, 4096]))
    return PlanProblem(cluster=cl, model=PRESETS[rng.choice(["llama2-7b", "tiny"])], training=tr)


def exact_table(count: int, time_limit: float, seed: int) -> list[str]:
    """hexiscale against CP-SAT (cold start, so CP-SAT does not inherit the heuristic's plan)."""
    from hexhelix.solver.solve import solve

    rng = random.Random(seed)
    rows = ["| instance | model | GPUs | hexiscale s/iter | CP-SAT status | CP-SAT s/iter | CP-SAT gap | hexiscale / CP-SAT |",
            "|---|---|---|---|---|---|---|---|"]
    for i in range(count):
        pr = random_instance(rng, i)
        h = solve(pr, "hexiscale")
        e = solve(pr, "cpsat", time_limit=time_limit, options={"warm_start": False})
        gpus = " + ".join(f"{n.count}x{n.gpu}" for n in pr.cluster.nodes)
        ratio = (f"{h.iteration_time_s / e.iteration_time_s:.4f}" if h.plan is not None and e.plan is not None
                 else "–")
        gap = f"{e.gap:.1%}" if e.gap is not None else "–"
        rows.append(f"| {pr.cluster.name} | {pr.model.name} | {gpus} | {_cell(h)} | {e.status.value} | {_cell(e)} "
                    f"| {gap} | {ratio} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama2-7b,llama2-13b,llama-30b")
    ap.add_argument("--scaling", default="8,32,64,128,256,512", help="GPU counts for the scaling table")
    ap.add_argument("--scaling-model", default="llama2-13b")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--recompute", default="none", help="comma list: one examples table per mode")
    ap.add_argument("--exact", type=int, default=0, help="random small instances against CP-SAT (0: skip)")
    ap.add_argument("--exact-time-limit", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=11, help="seed of the random instances")
    ap.add_argument("--write", action="store_true", help="replace the section in benchmarks/README.md")
    args = ap.parse_args(argv)
    modes = args.recompute.split(",")
    trs = [TrainingConfig(global_batch=args.global_batch, seq_len=args.seq_len, recompute=r) for r in modes]
    tr = trs[0]
    cmd = "python benchmarks/heuristics.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    models = [m for m in args.models.split(",") if m]
    ex = []
    for t in trs:
        if models:
            ex += [f"Recompute {t.recompute}:", "", *examples_table(models, t), ""]
    sc = scaling_table([int(x) for x in args.scaling.split(",") if x], args.scaling_model, tr) if args.scaling else []
    qx = exact_table(args.exact, args.exact_time_limit, args.seed) if args.exact else []
    total = time.perf_counter() - t0
    body = [BEGIN, "## Heuristic planners (hexiscale, hexiscale-released, megatron)", "",
            f"Produced by `{cmd.strip()}` ({total:.0f} s in all) on the shared 2-core development machine "
            f"(1-minute load average {load0:.1f} when it started, {os.getloadavg()[0]:.1f} when it ended; above "
            "about 1 other work shared the cores): solve times are indicative. Training: global batch "
            f"{tr.global_batch}, micro-batch {tr.micro_batch}, sequence {tr.seq_len}, recompute as labelled, "
            "1F1B. Iteration times are seconds under the one evaluator; \"(t, OOM)\" is a plan the "
            "released planner chose that exceeds memory under the hexhelix cost model (its own model "
            "ignores in-flight activations and Adam states); megatron shows how many GPUs its uniform "
            "shape could use (smallest-memory types left out when nothing fits them). Ratios are "
            "other / fixed iteration time (higher = the fixed planner is faster).", "", *ex]
    if sc:
        body += [f"Solve time of `hexiscale` on synthetic clusters (8-GPU nodes cycling A100 / RTX4090 / T4, "
                 f"{args.scaling_model}, global batch max({args.global_batch}, 2 x GPUs)); beside it the same "
                 f"solve with every layer assignment in numpy (the default hands them to the numba-compiled "
                 f"form after {phase2.COMPILED_AFTER} layouts), run right after it in the same process. numba's "
                 "one-time load (~0.8 s per process; ~4 s to compile on a fresh install) is left out:", "", *sc,
                 ""]
    if qx:
        body += [f"`hexiscale` against CP-SAT on {args.exact} random small instances (seed {args.seed}; CP-SAT cold "
                 f"start, {args.exact_time_limit:g} s limit; \"optimal\" rows are proven optima, \"timeout\" rows "
                 "compare with CP-SAT's incumbent):", "", *qx, ""]
    body.append(END)
    text = "\n".join(body) + "\n"
    if args.write:
        readme = ROOT / "benchmarks" / "README.md"
        old = readme.read_text()
        if BEGIN in old and END in old:
            new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", lambda _: text, old, flags=re.S)
        else:
            new = old.rstrip("\n") + "\n\n" + text
        readme.write_text(new)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
