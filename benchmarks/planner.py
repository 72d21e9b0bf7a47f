"""Planner benchmark: exact (CP-SAT, MILP/HiGHS, MILP/CBC) vs heuristics on the example clusters.

Writes three tables into the "Planner" section of benchmarks/README.md:

1. every example cluster x model: each solver's iteration time, gap to the best proven bound, solve time;
2. scaling of the exact solvers' solve time and gap from 8 to 512 GPUs (generated A100/A40 clusters);
3. the heterogeneous clusters against their homogeneous counterparts of about equal total FLOPS.

Each mode writes its own section, so one run never erases another's tables: ``--goal`` (the issue's
goal set: every example GPU cluster, Llama-2 7B, CP-SAT against hexiscale, 120 s) the ``planner``
section (with ``--recompute none`` or ``selective``, or with ``--models`` other than Llama-2 7B, sections of
their own: the scaling table, 7B only, is then left out); ``--full`` (every cluster, 7B/13B/30B, all six solvers, scaling 8..512 GPUs; on 2 cores a
120 s limit would take hours, so pass ``--time-limit``) the ``planner-full`` section. The default
run is a reduced smoke run (a subset, 20 s limits) that only prints.

    python benchmarks/planner.py --goal                   # 9 clusters x 120 s: ~25 min
    python benchmarks/planner.py --goal --recompute none  # the same without recompute (the CLI default)
    python benchmarks/planner.py --goal --models llama2-13b,llama-30b  # the goal's setting, larger models: ~30 min
    python benchmarks/planner.py --full --time-limit 15   # ~24 min on 2 cores
    python benchmarks/planner.py                          # reduced, printed only
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver.solve import solve

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"
README = ROOT / "benchmarks" / "README.md"
SECTIONS = {"goal": ("planner", "Planner: exact vs heuristics (issue 3)"),
            "full": ("planner-full", "Planner: every cluster, model and solver (issue 3)"),
            "goal-none": ("planner-none", "Planner: the goal's set without activation recompute (the CLI default)"),
            "goal-selective": ("planner-selective", "Planner: the goal's set with selective recompute"),
            "goal-models": ("planner-models", "Planner: the goal's setting with the larger models")}
DISPLAY = {"llama2-7b": "Llama-2 7B", "llama2-13b": "Llama-2 13B", "llama-30b": "LLaMA 30B"}  # model names in headers
RECOMPUTE = "full"  # the paper's setting; ``--recompute`` (goal runs only) sets it for the whole run
HET_HOMO = [("hexiscale-het1", "homo-for-het1"), ("hexiscale-het2", "homo-for-het2"), ("hexiscale-het3", "homo-for-het3")]


def problem(cluster: Cluster, model: str, gb: int) -> PlanProblem:
    """The benchmarks' training setting: micro-batch 1, seq 4096 (30B: 2048), :data:`RECOMPUTE`."""
    seq = 2048 if model == "llama-30b" else 4096
    return PlanProblem(cluster=cluster, model=PRESETS[model],
                       training=TrainingConfig(global_batch=gb, micro_batch=1, seq_len=seq, recompute=RECOMPUTE))


def generated(gpus: int) -> Cluster:
    """Alternating 8-GPU A100 / A40 nodes (4 + 4 for 8 GPUs), 25 GB/s between nodes."""
    if gpus <= 8:
        nodes = [{"name": "a100-0", "gpu": "A100-SXM4-80GB", "count": gpus // 2, "intra_GBps": 300},
                 {"name": "a40-0", "gpu": "A40", "count": gpus - gpus // 2, "intra_GBps": 25}]
    else:
        nodes = [{"name": f"n{i}", "gpu": "A100-SXM4-80GB" if i % 2 == 0 else "A40", "count": 8,
                  "intra_GBps": 300 if i % 2 == 0 else 25} for i in range(gpus // 8)]
    return Cluster.from_dict({"name": f"gen-{gpus}", "nodes": nodes, "inter_GBps": 25})


def fmt(v: float | None, spec: str) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


EXACT_GAPS: list[tuple[str, float | None, bool]] = []  # (instance, proven gap of cpsat, shape bound computed)
RESULTS: dict[tuple[str, str], list] = {}  # (cluster, model) -> the results of run_row, for the later tables
GOAL_GAP = 0.02  # the issue's goal: proven gap <= 2 %
# (instance, the 2 % line = (1 - GOAL_GAP) x cpsat's plan, cpsat's proven bound per pipeline count) of the rows
# whose gap is above the goal's: which pipeline counts hold them there
SHORT_ROWS: list[tuple[str, float, dict[int, float]]] = []


def run_row(pb: PlanProblem, solvers: list[str], limit: float) -> list:
    out = []
    for s in solvers:
        t0 = time.monotonic()
        r = solve(pb, s, time_limit=limit, options={"max_model_rows": 400_000})
        if s == "cpsat":
            EXACT_GAPS.append((f"{pb.cluster.name}/{pb.model.name}", r.gap, r.params.get("shape_bound_s") is not None))
            by_p = r.params.get("bound_by_pipelines")
            if r.gap is not None and r.gap > GOAL_GAP and by_p:
                SHORT_ROWS.append((f"{pb.cluster.name}/{pb.model.name}", (1 - GOAL_GAP) * r.iteration_time_s,
                                   {int(k): float(v) for k, v in by_p.items()}))
        print(f"  {pb.cluster.name} {pb.model.name} {s}: {r.status.value} {fmt(r.iteration_time_s, '.3f')} s "
              f"bound {fmt(r.bound_s, '.3f')} in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        out.append(r)
    return out


def table_clusters(clusters: list[str], models: list[str], solvers: list[str], limit: float, gb: int) -> str:
    lines = ["| cluster | GPUs | model | best bound s | " + " | ".join(f"{s} iter s / gap / time s" for s in solvers) + " |",
             "|---|---|---|---|" + "---|" * len(solvers)]
    for cname in clusters:
        cl = load_cluster(CLUSTERS / f"{cname}.yaml")
        for m in models:
            res = run_row(problem(cl, m, gb), solvers, limit)
            RESULTS[(cname, m)] = res
            bounds = [r.bound_s for r in res if r.bound_s is not None and math.isfinite(r.bound_s)]
            best = max(bounds) if bounds else None
            cells = []
            for r in res:
                if r.evaluation is None:
                    cells.append(f"{r.status.value} / – / {r.solve_time_s:.1f}")
                    continue
                gap = (r.iteration_time_s - best) / r.iteration_time_s if best else None
                cells.append(f"{r.iteration_time_s:.3f} / {fmt(gap, '.1%')} / {r.solve_time_s:.1f}"
                             + (" (opt)" if r.status.value == "optimal" else ""))
            lines.append(f"| {cname} | {cl.num_gpus} | {m} | {fmt(best, '.3f')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_scaling(sizes: list[int], solvers: list[str], limit: float) -> str:
    lines = ["| GPUs | global batch | " + " | ".join(f"{s} status / iter s / gap / time s" for s in solvers) + " |",
             "|---|---|" + "---|" * len(solvers)]
    for g in sizes:
        gb = max(64, g)
        res = run_row(problem(generated(g), "llama2-7b", gb), solvers, limit)
        cells = [f"{r.status.value} / {fmt(r.iteration_time_s, '.3f')} / {fmt(r.gap, '.1%')} / {r.solve_time_s:.1f}"
                 for r in res]
        lines.append(f"| {g} | {gb} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_het_homo(pairs: list[tuple[str, str]], models: list[str], solvers: list[str], limit: float, gb: int) -> str:
    lines = ["| heterogeneous | homogeneous | model | het TFLOPS | homo TFLOPS | het tokens/s (solver) | "
             "homo tokens/s (solver) | het / homo |", "|---|---|---|---|---|---|---|---|"]
    for het, homo in pairs:
        for m in models:
            row = []
            for cname in (het, homo):
                cl = load_cluster(CLUSTERS / f"{cname}.yaml")
                if (cname, m) not in RESULTS:  # the first table's solves where it had this row
                    RESULTS[(cname, m)] = run_row(problem(cl, m, gb), solvers, limit)
                res = sorted((r for r in RESULTS[(cname, m)] if r.solver in solvers and r.evaluation is not None
                              and r.evaluation.feasible), key=lambda r: solvers.index(r.solver))
                best = max(res, key=lambda r: r.evaluation.throughput_tokens_per_s, default=None)
                row.append((cl, best))
            (hc, hb), (oc, ob) = row
            ht = hb.evaluation.throughput_tokens_per_s if hb else None
            ot = ob.evaluation.throughput_tokens_per_s if ob else None
            lines.append(f"| {het} | {homo} | {m} | {hc.total_peak_flops() / 1e12:,.0f} | {oc.total_peak_flops() / 1e12:,.0f} "
                         f"| {fmt(ht, ',.0f')} ({hb.solver if hb else '–'}) | {fmt(ot, ',.0f')} ({ob.solver if ob else '–'}) "
                         f"| {fmt(ht / ot if ht and ot else None, '.2f')} |")
    return "\n".join(lines)


def behind(baseline: str) -> str:
    """How far ``baseline`` falls behind hexiscale over the first table's rows: the ratio of iteration
    times (baseline / hexiscale) where both plans fit, and how many rows it had no fitting plan for."""
    ratios, missing = [], 0
    for res in RESULTS.values():
        by = {r.solver: r for r in res}
        h, b = by.get("hexiscale"), by.get(baseline)
        if h is None or b is None or h.evaluation is None or not h.evaluation.feasible:
            continue
        if b.evaluation is None or not b.evaluation.feasible:
            missing += 1
            continue
        ratios.append(b.iteration_time_s / h.iteration_time_s)
    if not ratios:
        return f"{baseline}: no row where both it and hexiscale have a fitting plan"
    return (f"{baseline} takes {min(ratios):.2f}–{max(ratios):.2f}× hexiscale's iteration time (median "
            f"{statistics.median(ratios):.2f}×, "
            f"{len(ratios)} rows where both fit; no fitting plan on {missing} more)")


def _ranges(values: list[int]) -> str:
    """2, 3, 4, 7 -> '2–4, 7'."""
    out: list[tuple[int, int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in out)


def short_counts() -> str:
    """Where the rows above the goal's gap sit: the pipeline counts whose proven bound lies under the 2 % line
    (the bound is the least over the counts, so each of them has to rise above the line)."""
    parts = []
    for name, line, by_p in SHORT_ROWS:
        under = {P: b for P, b in by_p.items() if b < line}
        if under:
            least = min(under, key=under.__getitem__)
            parts.append(f"{name} P = {_ranges(list(under))} under {line:.3f} s (least {under[least]:.3f} s at "
                         f"P = {least})")
    return (f"Pipeline counts whose proven bound lies under the {GOAL_GAP * 100:g} % line ({1 - GOAL_GAP:.2f} × cpsat's plan), "
            "per row above the goal's gap: " + "; ".join(parts) + ". ") if parts else ""


def reading(limit: float, baselines: bool = True, goal: bool = True) -> str:
    """The paragraph under the tables, from the numbers of this run (``goal``: the goal's own run,
    whose verdict it states; other runs point at it)."""
    gaps = [(n, g) for n, g, _ in EXACT_GAPS if g is not None]
    worst = max(gaps, key=lambda x: x[1], default=None)
    met = bool(gaps) and all(g <= GOAL_GAP for _, g in gaps)
    span = f"{min(g for _, g in gaps):.1%}-{worst[1]:.1%} (worst: {worst[0]})" if worst else "-"
    verdict = ("met in this run" if met and limit >= 120 else
               "met in this run, at a shorter time limit than the goal's" if met else "NOT met")
    return ("Reading. Gaps are to the best *proven* lower bound: per pipeline count P the max of the P-model's "
            "bound and the fluid column-generation bound of solver/fluid_bound.py with per-stage sync and optimizer "
            "floors and branch and price on layer locality (docs/formulation.md §14-15), for one pipeline the "
            "bound of solver/single_pipeline.py that counts every node's GPUs (§18), "
            "and the order-free shape bound where it is small enough to compute. CP-SAT's proven gap in this run: "
            f"{span}. " + (f"The issue's goal (proven gap <= 2 % within 120 s on 2 cores for every example cluster "
                           f"up to 64 GPUs) is {verdict}. " if goal else
                           "The issue's goal (proven gap <= 2 % within 120 s on 2 cores, every example cluster up to "
                           "64 GPUs) is measured by `python benchmarks/planner.py --goal` (its own section). ") +
            short_counts() +
            ("Without full recompute a stage holds up to one micro-batch in flight per later stage, which the "
             "fluid bound counts as one; the depth bound of solver/depth_bound.py (§16: memory at each stage's "
             "depth, no sync floors nor locality) takes the first 25 % of each solve and its per-P bounds join "
             "the fluid bound's. "
             if RECOMPUTE != "full" else "") +
            "The remaining gap comes from the fluid relaxation (fractional "
            "pipelines; whole micro-batches only through a Lagrangian bound over π·g, §14; lenient memory), "
            "from the locality branching not finishing within the limit (it fixes one layer per level), and from "
            "leaves whose column generation did not converge in the time (56-64 GPUs); the primal side "
            "(rounding the fluid masters into plans) rarely beats hexiscale on the example clusters (where cpsat's "
            "iteration time is below hexiscale's, it did)." + (
                f" Baselines: {behind('hexiscale-released')}; {behind('megatron')} (megatron runs the uniform shape "
                "that fits the smallest GPU; 'no fitting plan': the released planner's plan exceeds memory under "
                "the hexhelix cost model, or no uniform shape fits)." if baselines else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true",
                    help="every cluster and model, all solvers, 8..512 GPUs (the planner-full section)")
    ap.add_argument("--goal", action="store_true",
                    help="the issue's goal: every example GPU cluster (<= 64 GPUs), Llama-2 7B, cpsat vs hexiscale, 120 s")
    ap.add_argument("--time-limit", type=float, help="seconds per exact solve (default 120 full/goal, 20 reduced)")
    ap.add_argument("--recompute", choices=("full", "selective", "none"), default="full",
                    help="activation recompute of every problem (default full, as the paper; with --goal, none and "
                         "selective write sections of their own)")
    ap.add_argument("--no-write", action="store_true", help="print the section instead of editing README.md")
    ap.add_argument("--clusters", help="comma-separated example clusters instead of the mode's (a partial run)")
    ap.add_argument("--models", help="comma-separated model presets instead of the mode's")
    ap.add_argument("--sizes", help="comma-separated GPU counts of the scaling table instead of the mode's")
    args = ap.parse_args(argv)
    if args.full and args.goal:
        ap.error("--full and --goal are two runs with their own sections: pass one")
    if args.recompute != "full" and not args.goal:
        ap.error("--recompute none|selective is for --goal runs (their own section); --full keeps the paper's full recompute")
    global RECOMPUTE
    RECOMPUTE = args.recompute
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        ap.error(f"--time-limit must be a positive number of seconds, not {args.time_limit:g}")
    limit = args.time_limit or (120.0 if args.full or args.goal else 20.0)
    solvers = ["cpsat", "milp-highs", "milp-cbc", "hexiscale", "hexiscale-released", "megatron"]
    gb = 64
    if args.full:
        clusters = sorted(p.stem for p in CLUSTERS.glob("*.yaml") if p.stem != "local-cpu")
        models, sizes = ["llama2-7b", "llama2-13b", "llama-30b"], [8, 16, 32, 64, 128, 256, 512]
        pairs, hh_models = HET_HOMO, ["llama2-7b", "llama2-13b", "llama-30b"]
        scal_solvers = ["cpsat", "milp-highs", "hexiscale"]
    elif args.goal:
        clusters = sorted(p.stem for p in CLUSTERS.glob("*.yaml") if p.stem != "local-cpu")
        models, solvers = ["llama2-7b"], ["cpsat", "hexiscale"]
        sizes, pairs, hh_models = [8, 16, 32, 64], [], []
        scal_solvers = ["cpsat", "hexiscale"]
    else:
        clusters, models = ["small-mixed", "mixed-a100-a40-t4", "hexiscale-het2"], ["llama2-7b"]
        solvers = ["cpsat", "milp-highs", "hexiscale", "hexiscale-released", "megatron"]
        sizes, pairs, hh_models = [8, 16, 32, 64], HET_HOMO[1:2], ["llama2-7b"]
        scal_solvers = ["cpsat", "hexiscale"]
    try:
        if args.clusters:
            clusters = args.clusters.split(",")
            for c in clusters:
                load_cluster(CLUSTERS / f"{c}.yaml")
        models = args.models.split(",") if args.models else models
        unknown = [m for m in models if m not in PRESETS]  # a typo fails here, before any solve
        if unknown:
            raise KeyError(f"unknown model {unknown[0]!r}")
        sizes = [int(g) for g in args.sizes.split(",")] if args.sizes else sizes
        larger = args.goal and models != ["llama2-7b"]  # the goal's setting for other models: a section of its own
        if larger and args.recompute != "full":
            raise ValueError("--models with --goal keeps the goal's full recompute")
        if larger and not args.sizes:
            sizes = []  # the scaling table is Llama-2 7B's
    except (KeyError, ValueError, InvalidInputError) as err:
        ap.error(f"{err} (clusters: names in examples/clusters; models: {', '.join(sorted(PRESETS))}; "
                 "sizes: integers)")
    cmd = "python benchmarks/planner.py" + (" --full" if args.full else "") + (" --goal" if args.goal else "") + \
        (f" --recompute {args.recompute}" if args.recompute != "full" else "") + \
        (f" --time-limit {args.time_limit:g}" if args.time_limit else "") + \
        "".join(f" --{k} {v}" for k, v in (("clusters", args.clusters), ("models", args.models),
                                           ("sizes", args.sizes)) if v)
    t0, began = time.monotonic(), time.strftime("%H:%M", time.gmtime())
    t1 = table_clusters(clusters, models, solvers, limit, gb)
    t2 = table_scaling(sizes, scal_solvers, limit) if sizes else ""
    t3 = table_het_homo(pairs, hh_models, ["hexiscale", "megatron", "cpsat"], limit, gb) if pairs else ""  # ties credit the heuristic
    total = time.monotonic() - t0
    when = f"run {began}–{time.strftime('%H:%M', time.gmtime())} UTC on {time.strftime('%Y-%m-%d', time.gmtime())}"
    names = ", ".join(DISPLAY.get(m, m) for m in models)
    mode = f"full, {when}" if args.full else (
        f"the goal's set: every example GPU cluster, {names}, CP-SAT against hexiscale, {when}" if args.goal else
        f"REDUCED: a subset of clusters and models with short time limits, {when}")
    tag, heading = SECTIONS["full" if args.full else "goal-models" if larger else
                            "goal" if args.recompute == "full" else f"goal-{args.recompute}"]
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    body = "\n".join([
        begin,
        f"Produced by `{cmd}` ({mode}; "
        f"{total / 60:.1f} min). Settings: global batch {gb} (scaling: max(64, GPUs)), micro-batch 1, seq 4096 "
        f"(30B: 2048), recompute {RECOMPUTE}, 1F1B; exact solvers: time limit {limit:g} s each, warm-started from the "
        "heuristics; gap = (iteration time - best proven bound over all solvers) / iteration time; (opt) = proven "
        "optimal. Every plan is scored by the one evaluator.",
        "",
        "### Example clusters",
        "",
        t1,
        "",
        *(["### Scaling (generated clusters of alternating 8-GPU A100 and A40 nodes, Llama-2 7B)", "", t2, ""]
          if t2 else []),
        *(["### Heterogeneous vs homogeneous cluster of about equal peak FLOPS (best plan of the solvers run)",
           "", t3, ""] if t3 else []),
        reading(limit, baselines="megatron" in solvers, goal=not args.full),
        end,
    ])
    if args.no_write or not (args.full or args.goal):  # the reduced run is a smoke run: never a README table
        print(body)
        return 0
    text = README.read_text()
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + body + "\n"
    README.write_text(text)
    print(f"wrote {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
