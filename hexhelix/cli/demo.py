"""``hexhelix demo``: the whole toolkit end to end on a built-in heterogeneous example, no GPU needed.

Seven steps, each printed on stdout with progress on stderr, every artifact written to one folder
(``--out``, default ``./hexhelix-out``):

1. the cluster (``examples/clusters/small-mixed.yaml``: 4 A100 + 2 A40 + 2 T4) and the model;
2. ``compare``: exact CP-SAT and MILP (short time limits: incumbents, proven bounds and gaps)
   against the HexiScale heuristic, the released HexiScale planner and a Megatron baseline;
3. the best plan found (lowest predicted iteration time that fits in memory);
4. compile it to per-rank programs, validate them and dry-run them for deadlocks;
5. simulate the program (summary, Gantt PNG, Chrome/Perfetto trace), and the W-shaped DHelix
   schedule with pairing beside it;
6. pair one layer (forward of one strand ∥ backward of the other) with the DHelix DP and CP-SAT;
7. run the plan's shape scaled down to ≤ 4 CPU ranks on the ``tiny`` model under ``torchrun``
   with ``--check-reference``; the last line says whether it matched the single-process run.

A step whose part of the toolkit is missing or fails prints one line saying so and the demo goes on;
the exit status is 0 only when every step ran and the reference check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.errors import HexhelixError, InvalidInputError
from hexhelix.ir.model import TrainingConfig, load_model
from hexhelix.ir.plan import PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE

from .common import cell, progress, resolve_cluster_path
from .demo_scale import describe, scale_plan

DEMO_CLUSTER = "small-mixed"
SOLVERS = ("cpsat", "milp-highs", "hexiscale", "hexiscale-released", "megatron")
GIB = 2.0**30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="end-to-end tour on a built-in heterogeneous example (no GPU)",
                       description="Print a built-in mixed cluster, compare exact and heuristic planners, compile, "
                                   "simulate and pair the best plan, and run its shape scaled down on the torch "
                                   "runtime (CPU, gloo) against a single-process reference. About 1-3 minutes on "
                                   "2 cores (--quick: shorter solver limits).")
    p.add_argument("--out", default="hexhelix-out", help="folder for every artifact (default ./hexhelix-out)")
    p.add_argument("--cluster", default=DEMO_CLUSTER, help=f"cluster file or built-in name (default {DEMO_CLUSTER})")
    p.add_argument("--model", default="llama2-7b", help="model preset to plan (default llama2-7b)")
    p.add_argument("--global-batch", type=int, default=64, help="sequences per step (default 64)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds per exact planner (default 10; 3 with --quick)")
    p.add_argument("--ranks", type=int, default=4, choices=(1, 2, 3, 4),
                   help="CPU ranks for the scaled-down torch run (default 4)")
    p.add_argument("--quick", action="store_true", help="short solver time limits (the test suite's variant)")
    p.set_defaults(func=run)


class _Tour:
    """Runs the steps, keeps their status and the artifacts for the closing summary."""

    def __init__(self, out: Path, n_steps: int) -> None:
        self.out, self.n, self.t0 = out, n_steps, time.monotonic()
        self.status: list[tuple[str, str]] = []
        self.artifacts: list[Path] = []

    def write(self, name: str, text: str) -> Path:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.artifacts.append(path)
        return path

    def step(self, title: str, fn: Callable[[], Any]) -> Any:
        k = len(self.status) + 1
        progress(f"[demo {k}/{self.n}, {time.monotonic() - self.t0:5.1f} s] {title} ...")
        print(f"\n== {k}. {title}")
        try:
            value = fn()
        except ImportError as err:
            why = f"not available yet ({err})"
        except HexhelixError as err:
            why = " ".join(str(err).split())
        except Exception as err:  # a demo step must never end the tour with a traceback
            why = f"{type(err).__name__}: {' '.join(str(err).split())}"
        else:
            self.status.append((title, "ok"))
            return value
        print(f"   skipped: {why}")
        progress(f"[demo] step {k} ({title}) skipped: {why}")
        self.status.append((title, f"skipped: {why}"))
        return None


def run(args: argparse.Namespace) -> int:
    if args.global_batch < 1:
        raise InvalidInputError(f"must be >= 1, got {args.global_batch}", field="--global-batch")
    from hexhelix.solver.solve import check_time_limit

    limit = args.time_limit if args.time_limit is not None else (3.0 if args.quick else 10.0)
    check_time_limit(limit)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot create the output folder ({err.strerror})", field="--out") from None
    cluster = load_cluster(resolve_cluster_path(args.cluster))
    model = load_model(args.model)
    training = TrainingConfig(global_batch=args.global_batch)
    problem = PlanProblem(cluster=cluster, model=model, training=training, schedule="1f1b")
    tour = _Tour(out, 7)

    tour.step("cluster and model", lambda: _show_inputs(problem))
    results = tour.step(f"compare planners ({limit:g} s per exact solver)", lambda: _compare(tour, problem, limit))
    best = tour.step("best plan", lambda: _best(tour, results))
    program = tour.step("compile", lambda: _compile(tour, best) if best else _no_plan())
    tour.step("simulate", lambda: _simulate(tour, best, program) if program else _no_plan())
    tour.step("pair one layer (DHelix): dp vs cpsat", lambda: _pair(tour, problem, best, min(limit, 5.0)))
    verdict = tour.step(f"torch runtime, scaled down to <= {args.ranks} CPU ranks",
                        lambda: _runtime(tour, best, args.ranks) if best else _no_plan())

    print("\n== summary")
    for title, st in tour.status:
        print(f"   {'ok     ' if st == 'ok' else 'SKIPPED'} {title}" + ("" if st == "ok" else f" ({st[9:]})"))
    print(f"   next: hexhelix show {out}/program.json --rank 0 | hexhelix compare --model llama2-13b --cluster "
          f"hexiscale-het2 --time-limit 30 | hexhelix pair --model llama2-13b --cluster small-mixed --tp 2")
    print(f"   {time.monotonic() - tour.t0:.0f} s; all artifacts in {out.resolve()}/: "
          + ", ".join(str(p.relative_to(out)) for p in tour.artifacts))
    if verdict is None:
        print("torch runtime vs single-process reference: NOT RUN (see step 7)")
        return 1
    print(verdict[1])
    return 0 if verdict[0] and all(st == "ok" for _, st in tour.status) else 1


def _no_plan() -> None:
    raise HexhelixError("no plan to work with (an earlier step was skipped)")


def _show_inputs(problem: PlanProblem) -> None:
    cl, m, tr = problem.cluster, problem.model, problem.training
    print(f"   cluster {cl.name}: {cl.num_gpus} GPUs, {cl.total_peak_flops() / 1e15:.2f} PFLOPS dense bf16 peak")
    for n in cl.nodes:
        g = cl.gpu_types[n.gpu]
        print(f"     {n.name:<8} {n.count} x {n.gpu:<16} {g.tflops:6.1f} TFLOPS {g.memory_gib:4.0f} GiB  "
              f"intra-node {n.intra_GBps:g} GB/s")
    print(f"     between nodes {cl.inter_GBps:g} GB/s ({len(cl.links)} slower pair override(s)), "
          f"latency {cl.latency_us:g} us")
    print(f"   model {m.name}: {m.layers} layers, hidden {m.hidden}, {m.total_params / 1e9:.2f} B parameters; "
          f"global batch {tr.global_batch} x {tr.seq_len} tokens, micro-batch {tr.micro_batch}, {tr.dtype}, "
          f"recompute {tr.recompute}, SP {'on' if tr.sequence_parallel else 'off'}")


def _compare(tour: _Tour, problem: PlanProblem, limit: float) -> list[Any]:
    from hexhelix.solver import kernels
    from hexhelix.solver.solve import compare, relative_to_bound

    from .plan import ticker

    kernels.warm()  # a fresh install compiles them here (~25 s, logged), not under the ticker's time limit
    with ticker("hexhelix demo: compare", limit * 2):
        results = compare(problem, list(SOLVERS), {"workers": 1, "warm_start": True}, seed=0,
                          profile=DEFAULT_PROFILE, time_limit=limit,
                          on_result=lambda r: progress(f"   {r.solver}: {r.status.value} in {r.solve_time_s:.1f} s"))
    best_bound, rel = relative_to_bound(results)
    print(f"   {'solver':<19} {'status':<10} {'iter s':>8} {'tokens/s':>9} {'MFU':>6} {'bound s':>8} {'gap':>7} "
          f"{'vs bound':>8} {'solve s':>7}")
    rows = []
    for r, x in zip(results, rel):
        ev = r.evaluation
        print(f"   {r.solver:<19} {r.status.value:<10} {cell(ev.iteration_time_s if ev else None, '8.3f')} "
              f"{cell(ev.throughput_tokens_per_s if ev else None, '9,.0f')} {cell(ev.mfu if ev else None, '6.1%')} "
              f"{cell(r.bound_s, '8.3f')} {cell(r.gap, '7.1%')} {cell(x, '8.3f')} {r.solve_time_s:7.1f}")
        if r.plan is not None:
            tour.write(f"plans/{r.solver}.json", json.dumps(r.plan.to_dict(), indent=1) + "\n")
        d = r.to_dict()
        d.pop("plan")
        d["throughput_vs_best_bound"] = x
        rows.append(d)
    for r in results:
        if r.reason:
            print(f"     {r.solver}: {r.reason}")
    print(f"   'vs bound' = best proven bound ({'-' if best_bound is None else f'{best_bound:.3f} s'}) / iteration "
          "time: 1.000 would be provably optimal; a timeout is an incumbent, never called optimal")
    tour.write("compare.json", json.dumps({"best_bound_s": best_bound, "results": rows}, indent=1) + "\n")
    return results


def _best(tour: _Tour, results: list[Any] | None) -> Any:
    if not results:
        raise HexhelixError("no compare results (step 2 was skipped)")
    ok = [r for r in results if r.plan is not None and r.evaluation is not None and r.evaluation.feasible]
    if not ok:
        raise HexhelixError("no planner returned a plan that fits in memory")
    r = min(ok, key=lambda r: r.evaluation.iteration_time_s)
    ties = [x.solver for x in ok if abs(x.evaluation.iteration_time_s - r.evaluation.iteration_time_s)
            <= 1e-9 * r.evaluation.iteration_time_s]
    ev = r.evaluation
    print(f"   from {', '.join(ties)}: iteration {ev.iteration_time_s:.3f} s, {ev.throughput_tokens_per_s:,.0f} "
          f"tokens/s, MFU {ev.mfu:.1%}, gradient sync {ev.grad_sync_s:.3f} s")
    for line in describe(r.plan):
        print(f"     {line}")
    path = tour.write("best-plan.json", json.dumps(r.plan.to_dict(), indent=1) + "\n")
    print(f"   wrote {path}")
    return r.plan


def _compile(tour: _Tour, plan: Any) -> Any:
    from hexhelix.ir.dryrun import dry_run
    from hexhelix.ir.validate import format_finding, validate
    from hexhelix.solver.compile import compile_plan

    program = compile_plan(plan, None, DEFAULT_PROFILE)
    findings = validate(program)
    if findings:
        raise HexhelixError(f"invalid program: {format_finding(findings[0])}")
    rep = dry_run(program)
    if rep.error is not None:
        raise HexhelixError(f"dry run: {rep.error}")
    path = tour.write("program.json", program.to_json())
    n = sum(len(p) for p in program.programs)
    print(f"   {program.schedule}: {program.world_size} ranks, {n} instructions; valid; dry run finished "
          f"(estimated step {rep.makespan_s:.3f} s) -> {path}")
    print(f"   inspect: hexhelix show {path} --rank 0")
    return program


def _simulate(tour: _Tour, plan: Any, program: Any) -> None:
    from hexhelix.runtime.gantt import write_gantt
    from hexhelix.runtime.sim import SimOptions, simulate
    from hexhelix.runtime.trace import write_chrome_trace
    from hexhelix.solver.evaluate import evaluate

    res = simulate(program, SimOptions(record=True))
    ev = evaluate(plan)
    s = res.summary()
    print(f"   1f1b: iteration {res.makespan_s:.3f} s (cost model {ev.iteration_time_s:.3f} s, "
          f"{100 * (res.makespan_s / ev.iteration_time_s - 1):+.1f} %), bubble {100 * res.bubble_fraction:.1f} %, "
          f"communication hidden {100 * s['comm_hidden_fraction']:.0f} %, peak memory "
          f"{max(res.peak_memory_bytes) / GIB:.1f} GiB on the fullest GPU"
          + (f"; OVER CAPACITY on ranks {res.over_capacity_ranks}" if res.over_capacity_ranks else ""))
    trace = write_chrome_trace(res, tour.out / "trace.json")
    tour.artifacts.append(Path(trace))
    print(f"   Perfetto trace: {trace}  (open in https://ui.perfetto.dev)")
    try:
        png = write_gantt(res, tour.out / "gantt.png", title=f"{plan.problem.model.name} on "
                          f"{plan.problem.cluster.name}, 1F1B (simulated)")
        tour.artifacts.append(Path(png))
        print(f"   Gantt chart:    {png}")
    except InvalidInputError as err:
        print(f"   Gantt chart: not drawn ({err})")
    tour.write("simulation.json", res.to_json())
    _simulate_wshape(tour, plan, res.makespan_s)


def _simulate_wshape(tour: _Tour, plan: Any, t_1f1b: float) -> None:
    """The same plan under DHelix's W-shaped schedule with the DP pairing (design.md §6)."""
    from hexhelix.ir.errors import UnsupportedError
    from hexhelix.runtime.sim import SimOptions, simulate
    from hexhelix.solver.compile import compile_plan
    from hexhelix.solver.pairing import stage_pairings

    try:
        pairing = stage_pairings(plan, DEFAULT_PROFILE, "dp")
        prog = compile_plan(plan, "wshape", DEFAULT_PROFILE, pairing)
    except UnsupportedError as err:
        print(f"   wshape: not applicable to this plan ({err})")
        return
    res = simulate(prog, SimOptions(record=False))
    tour.write("program-wshape.json", prog.to_json())
    print(f"   wshape + DP pairing: iteration {res.makespan_s:.3f} s ({t_1f1b / res.makespan_s:.2f}x vs 1f1b; "
          f"peak memory {max(res.peak_memory_bytes) / GIB:.1f} GiB"
          + (f", OVER CAPACITY on ranks {res.over_capacity_ranks}: the plan was sized for 1F1B, where later "
             "stages hold fewer micro-batches in flight" if res.over_capacity_ranks else "")
          + ") -> program-wshape.json")


def _pair(tour: _Tour, problem: PlanProblem, plan: Any, limit: float) -> None:
    from hexhelix.solver.cost import cluster_link
    from hexhelix.solver.pairing import results_to_dict, solve_pairing_all
    from hexhelix.solver.pairing_costs import build_pairing_problem

    cl = problem.cluster
    stages = [s for p in plan.pipelines for s in p.stages] if plan is not None else []
    st = max(stages, key=lambda s: (s.tp, cl.gpu_of_node(s.node).tflops), default=None)
    if st is not None and st.tp > 1:
        node, tp = st.node, st.tp
        why = "the best plan's widest TP stage"
    else:  # TP 1 has no TP communication to hide: show the first node that can hold TP 2
        node = next((i for i, n in enumerate(cl.nodes) if n.count >= 2), None)
        if node is None:
            raise HexhelixError("no node has 2 GPUs: TP 1 has no TP communication to pair")
        tp, why = 2, "TP 2 (the plan has no TP stage)"
    gpu, link = cl.gpu_of_node(node), cluster_link(cl, node, node)
    pp = build_pairing_problem(problem.model, problem.training, tp, gpu, link, DEFAULT_PROFILE)
    results = solve_pairing_all(pp, {"time_limit": limit, "workers": 1}, solvers=("sequential", "dp", "cpsat"))
    d = results_to_dict(pp, results)
    seq = d["sequential_s"]
    print(f"   {problem.model.name} layer pair on {gpu.name} x{tp} ({why}; {link.bandwidth / 1e9:g} GB/s link): "
          f"sequential {seq * 1e3:.2f} ms, lower bound {d['lower_bound_s'] * 1e3:.2f} ms")
    for r, rd in zip(results, d["results"]):
        if r.plan is None:
            print(f"     {r.solver:<11} {r.status.value:<9} no plan ({r.reason})")
            continue
        bound = "-" if r.bound_s is None else f"{r.bound_s * 1e3:.2f}"
        print(f"     {r.solver:<11} {r.status.value:<9} {r.makespan_s * 1e3:8.2f} ms  bound {bound:>7} ms  "
              f"g {rd['saving_g']:5.3f}  comm hidden {r.hidden_comm_fraction:4.0%}  {len(r.plan.blocks):>3} "
              f"blocks  {r.solve_time_s:5.2f} s")
    print("   g = saving of one co-executed layer pair; dp = the paper's Eq. 2 with barriers, cpsat = "
          "barrier-free schedule (a timeout is an incumbent)")
    tour.write("pairing.json", json.dumps(d, indent=1) + "\n")


def _runtime(tour: _Tour, plan: Any, max_ranks: int) -> tuple[bool, str]:
    from hexhelix.solver.compile import compile_plan

    scaled = scale_plan(plan, max_ranks=max_ranks)
    for note in scaled.notes:
        print(f"   scaled: {note}")
    for line in describe(scaled.plan):
        print(f"     {line}")
    tour.write("tiny-plan.json", json.dumps(scaled.plan.to_dict(), indent=1) + "\n")
    program = compile_plan(scaled.plan, None, DEFAULT_PROFILE)
    prog_path = tour.write("tiny-program.json", program.to_json())
    n = program.world_size
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "hexhelix.runtime", str(prog_path), "--check-reference", "--timeout", "60"]
    print(f"   $ torchrun --standalone --nproc-per-node {n} -m hexhelix.runtime {prog_path} --check-reference")
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            text, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            tour.write("runtime.log", text or "")
            raise HexhelixError("the torch run did not finish in 240 s (log: runtime.log)") from None
    log = tour.write("runtime.log", text)
    lines = text.splitlines()
    report = [ln for ln in lines if ln.startswith(("step ", "reference check", "  step", "  gradients",
                                                   "  final parameters"))]
    for ln in report:
        print(f"   {ln.strip()}")
    passed = any(ln.strip() == "reference check: PASS" for ln in lines)
    failed = any(ln.strip().startswith("reference check: FAIL") for ln in lines)
    if passed and proc.returncode != 0:  # the verdict stands; the exit status is a separate fault
        why = next((ln.strip() for ln in lines if "terminate called" in ln or "rror" in ln), "")
        print(f"   warning: torchrun exited {proc.returncode} after the verdict ({why}; log: {log})")
        progress(f"hexhelix demo: warning: torchrun exited {proc.returncode} after a PASS verdict; see {log}")
    if not passed and not failed:
        tail = " | ".join(ln.strip() for ln in lines if "error" in ln.lower())[-400:]
        raise HexhelixError(f"torchrun exited {proc.returncode} without a reference verdict: {tail} (log: {log})")
    shape = f"{len(scaled.plan.pipelines)} pipeline(s), {n} CPU ranks, {program.schedule}"
    if passed:
        return True, (f"MATCH: the scaled-down plan ({shape}) on the torch runtime equals the single-process "
                      "reference (loss, first-step gradients, every parameter)")
    return False, f"MISMATCH: the scaled-down plan ({shape}) differs from the single-process reference (see {log})"
