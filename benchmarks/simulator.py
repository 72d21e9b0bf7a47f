"""Simulator benchmark: speed (instructions per second, growth with ranks and micro-batches, up to
1,024 ranks × 64 micro-batches) and the DHelix comparison in simulation (W-shape vs 1F1B on
communication-heavy A40 / A800 settings, next to the paper's reported gains).

Usage::

    python benchmarks/simulator.py                 # both parts, print the tables
    python benchmarks/simulator.py --part speed    # or: --part dhelix, --part agreement
    python benchmarks/simulator.py --write-readme  # also replace the simulator section of benchmarks/README.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, Plan, PlanProblem, StagePlan
from hexhelix.runtime.sim import SimOptions, simulate
from hexhelix.runtime.sim_synth import synthetic_program
from hexhelix.solver import cost
from hexhelix.solver.compile import compile_plan
from hexhelix.solver.evaluate import evaluate
from hexhelix.solver.pairing import pair_saving

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- simulator:begin -->", "<!-- simulator:end -->"


# ----------------------------------------------------------------------------- speed
def _time_sim(program, record: bool, repeats: int) -> tuple[float, float]:
    """Median (CPU seconds, wall seconds) of ``repeats`` simulations. CPU time (time.process_time)
    is what one core spends; wall time also counts waiting for the shared machine's other jobs."""
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        simulate(program, SimOptions(record=record))
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall)


def speed(quick: bool = False) -> list[str]:
    """1F1B programs of 8-stage pipelines (DP = ranks/8), a p2p transfer of 0.1 f, 8 ranks per node,
    one gradient-sync bucket per stage index; plus W-shape and 64-stage pipelines at the top size."""
    ranks_grid = [8, 64, 256, 1024] if not quick else [8, 64]
    mb_grid = [8, 16, 32, 64] if not quick else [8, 16]
    rows = ["| schedule | ranks | stages × pipelines | micro-batches | instructions | CPU s (no timeline) | "
            "CPU s (with timeline) | wall s (with timeline) | instructions per CPU s |",
            "|---|---|---|---|---|---|---|---|---|"]
    cases = [("1f1b", r, 8, m) for r in ranks_grid for m in mb_grid]
    top_r, top_m = ranks_grid[-1], mb_grid[-1]
    cases += [("1f1b", top_r, 64 if top_r >= 64 else 8, top_m), ("wshape", top_r, 8, top_m)]
    rates: list[tuple[int, float]] = []
    for sched, ranks, P, m in cases:
        prog = synthetic_program(sched, P, m, pipes=ranks // P, f=1.0, b=2.0, comm=0.1, act_bytes=1 << 20,
                                 grad_sync=0.5, opt=0.05, ranks_per_node=8)
        n = sum(len(p) for p in prog.programs)
        top = ranks == top_r and m == top_m
        reps = 3 if top else 1
        bare, _ = _time_sim(prog, False, reps)
        full, wall = _time_sim(prog, True, reps)
        rows.append(f"| {sched} | {ranks} | {P} × {ranks // P} | {m} | {n:,} | {bare:.2f} | {full:.2f} | "
                    f"{wall:.2f} | {n / bare:,.0f} |")
        rates.append((n, n / bare))
        print(rows[-1], flush=True)
    grid = rates[:len(ranks_grid) * len(mb_grid)]
    small = [r for n, r in grid if n >= 2000][:2] or [grid[0][1]]
    big = [r for _, r in grid[-2:]]
    rows += ["", f"Instructions per CPU second: {statistics.mean(small):,.0f} on the smallest programs of over 2,000 "
                 f"instructions, {statistics.mean(big):,.0f} on the two largest 1F1B grid points "
                 f"({grid[-1][0]:,} instructions): the time per instruction grows "
                 f"{statistics.mean(small) / statistics.mean(big):.1f}× over a {grid[-1][0] / grid[0][0]:,.0f}× range "
                 "of sizes (heap depth O(log n), larger working set)."]
    return rows


# ----------------------------------------------------------------------------- DHelix comparison
def _cluster(gpu: str, intra_GBps: float, inter_GBps: float) -> Cluster:
    return Cluster.from_dict({"name": f"64x{gpu}", "inter_GBps": inter_GBps, "latency_us": 10,
                              "nodes": [{"name": f"{gpu.lower()}-{i}", "gpu": gpu, "count": 8,
                                         "intra_GBps": intra_GBps} for i in range(8)]})


def _uniform_plan(cluster: Cluster, model: str, seq: int, global_batch: int, dp: int, tp: int, pp: int,
                  recompute: str = "selective") -> Plan:
    """DP identical pipelines of PP stages, each stage TP consecutive GPUs inside one node, layers
    split evenly (the Megatron layout the paper runs)."""
    mc = PRESETS[model]
    problem = PlanProblem(cluster=cluster, model=mc, training=TrainingConfig(global_batch=global_batch, seq_len=seq,
                                                                          recompute=recompute))
    per = mc.layers // pp
    pipes = []
    for q in range(dp):
        stages = []
        for k in range(pp):
            block = q * pp + k
            gpus = tuple(range(block * tp, (block + 1) * tp))
            stages.append(StagePlan(node=gpus[0] // 8, gpus=gpus,
                                    layers=(k * per, mc.layers if k == pp - 1 else (k + 1) * per)))
        pipes.append(PipelinePlan(stages=tuple(stages), micro_batches=global_batch // dp))
    return Plan(problem=problem, pipelines=tuple(pipes))


# (cluster, stand-in model, paper model, DP, TP, PP, seq, global batch, paper gain); the 32k row uses
# full recompute (selective would need ~2x the A800's 80 GB at 32k without CP)
SETTINGS = [
    ("A40", "llama2-7b", "Llama-8B (16,4,1)", 16, 4, 1, 4096, 128, "1.31×"),
    ("A40", "gpt-6.7b", "GPT-6.7B (16,4,1)", 16, 4, 1, 4096, 128, "1.26×"),
    ("A40", "llama2-13b", "Llama-25B (8,8,1)", 8, 8, 1, 4096, 64, "1.40×"),
    ("A40", "llama2-13b", "Llama-39B (4,8,2)", 4, 8, 2, 4096, 64, "1.27×"),
    ("A40", "llama2-13b", "Llama-25B long-seq (4,8,CP2,1)", 8, 8, 1, 16384, 32, "1.30×"),
    ("A40", "llama2-13b", "Llama-39B long-seq (2,8,CP2,2)", 4, 8, 2, 16384, 32, "1.39×"),
    ("A800", "llama2-7b", "— (A800 TP 8 short-seq point)", 8, 8, 1, 4096, 64, "1.02–1.29× range"),
    ("A800", "llama2-70b", "Llama-66B seq 16k (2,8,CP2,2)", 2, 8, 4, 16384, 16, "1.07×"),
    ("A800", "llama2-70b", "Llama-66B seq 32k (1,8,CP4,2)", 1, 8, 8, 32768, 16, "1.24×"),
]
LINKS = {"A40": (25.0, 12.5), "A800": (200.0, 25.0)}  # intra (PCIe / NVLink) and IB GB/s


def dhelix(quick: bool = False) -> list[str]:
    rows = ["| GPUs | our model (stand-in for) | DP,TP,PP | seq | m/pipe | g | 1F1B s (sim) | W s (sim) | "
            "W gain sim | W gain evaluator | paper (DHelix vs Megatron) | peak GiB 1F1B / W (cap) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for gpu, model, paper_model, dp, tp, pp, seq, gb, paper in (SETTINGS[:3] if quick else SETTINGS):
        cluster = _cluster(gpu, *LINKS[gpu])
        plan = _uniform_plan(cluster, model, seq, gb, dp, tp, pp, "full" if seq >= 32768 else "selective")
        tr = plan.problem.training
        g = pair_saving(plan.problem.model, tr, tp, cluster.gpu_of_node(0), cost.cluster_link(cluster, 0, 0))
        savings = {tp: g}
        one = simulate(compile_plan(plan, "1f1b"), SimOptions(record=False))
        w = simulate(compile_plan(plan, "wshape", pairing=savings), SimOptions(record=False))
        ev1 = evaluate(Plan(problem=_with(plan, "1f1b"), pipelines=plan.pipelines)).iteration_time_s
        evw = evaluate(Plan(problem=_with(plan, "wshape"), pipelines=plan.pipelines),
                       pair_savings=savings).iteration_time_s
        gib = 2.0**30
        cap = one.ranks[0].capacity_bytes / gib
        rows.append(
            f"| 64×{gpu} | {model} ({paper_model}) | {dp},{tp},{pp} | {seq // 1024}k | {gb // dp} | {g:.3f} | "
            f"{one.makespan_s:.3f} | {w.makespan_s:.3f} | {one.makespan_s / w.makespan_s:.2f}× | "
            f"{ev1 / evw:.2f}× | {paper} | "
            f"{max(one.peak_memory_bytes) / gib:.1f} / {max(w.peak_memory_bytes) / gib:.1f} ({cap:.0f}) |")
        print(rows[-1], flush=True)
    return rows


def _with(plan: Plan, schedule: str) -> PlanProblem:
    import dataclasses

    return dataclasses.replace(plan.problem, schedule=schedule)


# ----------------------------------------------------------------------------- agreement with the evaluator
def agreement() -> list[str]:
    """Simulated iteration time of compiled programs vs solver.evaluate's prediction, for the example
    plan and planner plans (HexiScale heuristic, seed 0)."""
    import dataclasses
    import json

    from hexhelix.ir.cluster import load_cluster
    from hexhelix.solver.solve import solve

    root = Path(__file__).resolve().parents[1] / "examples"
    cases: list[tuple[str, Plan]] = []
    example = Plan.from_dict(json.loads((root / "plans" / "small-mixed-llama2-7b.json").read_text()))
    for sched in ("1f1b", "gpipe", "wshape"):
        cases.append((f"example plan, {sched}", Plan(problem=dataclasses.replace(example.problem, schedule=sched),
                                                     pipelines=example.pipelines)))
    for cl, model in (("small-mixed", "llama2-7b"), ("mixed-a100-a40-t4", "llama2-7b"),
                      ("homo-32xa100", "llama2-13b"), ("hexiscale-het1", "llama2-7b")):
        prob = PlanProblem(cluster=load_cluster(root / "clusters" / f"{cl}.yaml"), model=PRESETS[model],
                           training=TrainingConfig(global_batch=64, seq_len=4096))
        res = solve(prob, "hexiscale", seed=0, time_limit=30)
        if res.plan is not None:
            shape = "+".join(str(len(p.stages)) for p in res.plan.pipelines)
            cases.append((f"hexiscale on {cl}, {model} ({shape} stages)", res.plan))
    rows = ["| plan | evaluator s | sim s (rendezvous, as compiled: RECV posted 1 op early) | gap | "
            "sim s (rendezvous, `compile --recv-ahead 0`: RECV right before its consumer) | gap | "
            "sim s (eager) | gap | pipeline phase, no comm: sim / closed form |", "|---|---|---|---|---|---|---|---|---|"]
    for name, plan in cases:
        ev = evaluate(plan)
        prog = compile_plan(plan)
        rv = simulate(prog, SimOptions(record=False)).makespan_s
        ea = simulate(prog, SimOptions(record=False, p2p="eager")).makespan_s
        ah = simulate(compile_plan(plan, recv_ahead=0), SimOptions(record=False)).makespan_s
        free = simulate(prog, SimOptions(comm_scale=0.0))
        ratios = []
        if plan.problem.schedule != "wshape":
            for p, pipe in enumerate(prog.pipes):
                ranks = {r for st in pipe.stages for r in prog.stages[st].ranks}
                end = max(e for r in ranks for _, e, _, i in free.timeline.spans[r]
                          if prog.programs[r][i].op.value in ("F", "B"))
                closed = cost.pipeline_time([c.fwd + c.bwd for c in ev.stages[p]], pipe.micro_batches)
                ratios.append(f"{end / closed:.4f}")
        it = ev.iteration_time_s
        rows.append(f"| {name} | {it:.3f} | {rv:.3f} | {100 * (rv / it - 1):+.1f}% | {ah:.3f} | {100 * (ah / it - 1):+.1f}% | "
                    f"{ea:.3f} | {100 * (ea / it - 1):+.1f}% | {', '.join(ratios) or '—'} |")
        print(rows[-1], flush=True)
    return rows


# ----------------------------------------------------------------------------- README
def write_readme(speed_rows: list[str], dhelix_rows: list[str], agree_rows: list[str], wall: float) -> None:
    text = README.read_text()
    body = "\n".join([
        BEGIN,
        "## Discrete-event simulator: `benchmarks/simulator.py`",
        "",
        f"Command: `python benchmarks/simulator.py --write-readme` (whole run {wall:.0f} s wall on the shared "
        "2-core CPU while other engineers' jobs ran, load average ~10-14; the simulator is single-threaded, so "
        "*CPU s* (time.process_time) is the one-core cost and *wall s* includes waiting for the other jobs; "
        "medians of 3 for the largest cases, one run otherwise).",
        "",
        "### Speed",
        "",
        "Synthetic uniform programs (`hexhelix.runtime.sim_synth.synthetic_program`): 1F1B over pipelines "
        "of 8 one-GPU stages (DP = ranks/8), every boundary transfer 0.1 f, 8 ranks per node, one gradient-"
        "sync bucket per stage index; the last two rows are 64-stage pipelines and W-shape at the largest size. "
        "*no timeline* = `SimOptions(record=False)` (summary only); *with timeline* keeps every op's interval "
        "for traces (the CLI records only with `--trace`/`--gantt`). Times include the static preparation "
        "(matching, liveness bytes) and the result statistics. Goal: 1,024 ranks × 64 micro-batches in ≤ 10 s "
        "on one core.",
        "",
        *speed_rows,
        "",
        "One heap event per timed op (O(log n) each), no per-event scan over ranks; W-shape programs have "
        "about twice the instructions of 1F1B (a SYNC per tick, per-layer PAIRs when compiled with a pairing).",
        "",
        "### Agreement with the cost model",
        "",
        "Compiled programs (`solver.compile.compile_plan`, default profile) simulated against "
        "`solver.evaluate`'s iteration time. *gap* = sim / evaluator − 1. Last column: each pipeline's "
        "simulated F/B phase with communication switched off (`comm_scale=0`) over the closed form "
        "(m−1)·max(f+b) + Σ(f+b) (1.0000 = exact).",
        "",
        *agree_rows,
        "",
        "Where they differ and why (each checked in tests/test_sim_compiled.py): (1) the closed form is exact "
        "for equal stages and whenever the bottleneck is the last stage, and over-estimates when a slower stage "
        "sits upstream (the fill and drain of faster downstream stages hide under its work); (2) the evaluator "
        "charges each boundary transfer once, to the sending stage's u; the compiler posts every RECV one "
        "compute op before its consumer (`ir.lower.prepost_recvs`, docs/program.md §4), so under rendezvous "
        "the transfer runs while the receiver computes and the steady-state period is f + b + 2c, the "
        "evaluator's u; with each RECV right before its consumer (`--recv-ahead 0` column) each receiver "
        "waits for its transfers and the 1F1B F/B cycle between neighbours makes the period f + b + 4c on "
        "interior stages; (3) the evaluator adds all gradient sync after the "
        "slowest pipeline, while buckets whose members finished early overlap that pipeline's drain (the "
        "two-pipeline plan of the tests: sim 2.69 s vs evaluator 2.89 s).",
        "",
        "### DHelix in simulation: W-shape vs 1F1B",
        "",
        "64 GPUs, 8 per node; A40: PCIe 25 GB/s inside a node, 100 Gb/s IB (12.5 GB/s) between; A800: "
        "NVLink 200 GB/s, 200 Gb/s IB (25 GB/s). Megatron layout (uniform layers, TP inside a node, SP on), "
        "micro-batch 1, bf16, selective recompute (FlashAttention-style: no s² activations), default profile (documented assumptions, not measurements). Our presets stand "
        "in for the paper's models (no 8B/25B/39B/66B presets; the shapes differ) and we have no context "
        "parallelism, so the paper's CP runs are modelled as TP 8 + SP at the same sequence length. "
        "*g* = pair saving of one co-executed layer pair from the pairing DP (`solver.pairing.pair_saving`), "
        "passed to `compile_plan(..., pairing={tp: g})`; W programs are simulated with those PAIR times. "
        "1F1B is Megatron without any TP-communication overlap. *W gain sim* = simulated 1F1B / W iteration "
        "time (gradient sync and optimizer included, identical in both); *W gain evaluator* = the same ratio "
        "from `solver.evaluate`.",
        "",
        *dhelix_rows,
        "",
        "Reading: on A40 the model predicts 1.27–1.42× against the paper's 1.12–1.40× (its per-setting bars: 1.22–1.40×; PCIe TP communication is "
        "27–56 % of a layer at TP 4–8, benchmarks/pairing.py, and W hides most of it); on A800 (NVLink) 1.04–1.26× "
        "against the paper's 1.02–1.29× — the same ranges, though not setting by setting: our 32k A800 row runs "
        "full recompute (no CP to fit the memory), which lowers the communication share and g to 0.09 where the "
        "paper, overlapping CP rings, gains 1.24×, and our stand-in shapes differ from the paper's models. The "
        "spread between settings comes from g (communication share) and from the pipeline ramp (co-execution "
        "needs m > P). These are predictions of our cost model, not measurements: the OEF table is a default, "
        "launch/barrier overheads per block (10–20 % of comm in the paper) are not modelled, and CP is absent.",
        END,
    ])
    if BEGIN in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + body + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    README.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["speed", "dhelix", "agreement", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help="small grid (smoke test)")
    ap.add_argument("--write-readme", action="store_true", help="write the tables into benchmarks/README.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    s = speed(args.quick) if args.part in ("speed", "all") else []
    d = dhelix(args.quick) if args.part in ("dhelix", "all") else []
    a = agreement() if args.part in ("agreement", "all") else []
    if args.write_readme:
        if args.part != "all" or args.quick:
            raise SystemExit("--write-readme needs the full run (--part all, no --quick)")
        write_readme(s, d, a, time.perf_counter() - t0)
        print(f"wrote {README}")


if __name__ == "__main__":
    main()
