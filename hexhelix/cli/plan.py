"""``hexhelix plan``: find a heterogeneous DP x PP x TP plan with one solver.

Exact solvers (cpsat, milp with --backend cbc|highs) report the proven bound and gap; heuristics
(hexiscale, hexiscale-released, megatron) report none. Every plan is scored by the one evaluator.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import SCHEDULES, PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile

from .common import add_model_args, emit_json, load_inputs, progress

SOLVERS = ("cpsat", "milp", "hexiscale", "hexiscale-released", "megatron", "bruteforce")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan asymmetric DP x PP x TP training on a cluster (exact or heuristic)",
                       description="Choose pipelines, TP stages, layer ranges and micro-batches per pipeline. "
                                   "Exit status: 0 plan found, 2 infeasible (e.g. memory), 1 no plan in time.")
    add_model_args(p)
    add_solver_args(p)
    p.add_argument("--solver", default="cpsat", help=f"one of {', '.join(SOLVERS)} (default cpsat)")
    p.add_argument("-o", "--output", help="write the plan (schema hexhelix.plan/1) to this file")
    p.add_argument("--export-problem", metavar="FILE", help="write the problem (hexhelix.problem/1) for `hexhelix solve`")
    p.add_argument("--simulate", action="store_true",
                   help="compile the chosen plan and simulate it (adds the simulation summary; JSON key simulation)")
    p.set_defaults(func=run)


def add_solver_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by plan and compare."""
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--backend", choices=("cbc", "highs"), default="highs", help="MILP backend (default highs)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver (default 60)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--workers", type=int, default=1, help="CP-SAT workers (1 = deterministic; default 1)")
    p.add_argument("--no-warm-start", action="store_true", help="exact solvers: do not start from the heuristics")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--log", action="store_true", help="include the solver log (JSON key log)")
    p.add_argument("--export-model", metavar="FILE", help="exact solvers: write the first model built as an LP file")


def solver_options(args: argparse.Namespace, method: str) -> tuple[str, dict[str, Any]]:
    """(registry method name, options) from the flags; ``milp`` picks up --backend."""
    if args.workers < 1:
        raise InvalidInputError(f"must be a positive integer, got {args.workers}", field="--workers")
    opts: dict[str, Any] = {"workers": args.workers, "log": args.log, "warm_start": not args.no_warm_start}
    if getattr(args, "export_model", None):
        opts["export_model"] = args.export_model
    if method == "milp":
        method = f"milp-{args.backend}"
    return method, opts


@contextlib.contextmanager
def ticker(label: str, limit: float) -> Iterator[None]:
    """Progress lines on stderr for solves that take longer than a second."""
    stop = threading.Event()
    t0 = time.monotonic()

    def loop() -> None:
        if stop.wait(1.0):
            return
        progress(f"{label}: solving (time limit {limit:g} s) ...")
        while not stop.wait(5.0):
            progress(f"{label}: {time.monotonic() - t0:.0f} s elapsed")

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def problem_from_args(args: argparse.Namespace) -> tuple[PlanProblem, Profile]:
    cluster, model, training, profile = load_inputs(args)
    assert cluster is not None
    return PlanProblem(cluster=cluster, model=model, training=training, schedule=args.schedule), profile


def summary(res: Any) -> str:
    """Human-readable lines for one result."""
    lines = [f"solver {res.solver}: {res.status.value}" + (f" ({res.reason})" if res.reason else "")]
    ev, plan = res.evaluation, res.plan
    if ev is not None and plan is not None:
        cl = plan.problem.cluster
        gap = f", gap {res.gap:.3%} to bound {res.bound_s:.4f} s" if res.gap is not None else ""
        lines.append(f"  iteration {ev.iteration_time_s:.4f} s{gap}; {ev.throughput_tokens_per_s:,.0f} tokens/s, "
                     f"MFU {ev.mfu:.1%}; grad sync {ev.grad_sync_s:.4f} s, optimizer {ev.optimizer_s:.4f} s; "
                     f"solved in {res.solve_time_s:.2f} s")
        for p, pipe in enumerate(plan.pipelines):
            st = ", ".join(f"{cl.nodes[s.node].name}:{cl.nodes[s.node].gpu}x{s.tp}[L{s.layers[0]}-{s.layers[1] - 1}]"
                           for s in pipe.stages)
            lines.append(f"  pipeline {p}: {pipe.micro_batches} micro-batches, {ev.pipeline_times_s[p]:.4f} s: {st}")
    return "\n".join(lines)


def report(res: Any, args: argparse.Namespace, simulation: dict[str, Any] | None = None) -> int:
    """Print ``res`` (JSON or text), write -o, and return the exit status."""
    from hexhelix.solver.result import SolveStatus

    if getattr(args, "output", None) and res.plan is not None:
        Path(args.output).write_text(json.dumps(res.plan.to_dict(), indent=1) + "\n")
    if args.json:
        emit_json({**res.to_dict(with_log=args.log), **({"simulation": simulation} if simulation else {})})
    else:
        print(summary(res))
        if simulation:
            from .simulate import format_simulation

            print(format_simulation(simulation))
        if getattr(args, "output", None) and res.plan is not None:
            print(f"wrote {args.output}")
    if res.plan is not None:
        return 0
    if res.status is SolveStatus.INFEASIBLE:
        print(f"hexhelix plan: infeasible: {res.reason}", file=sys.stderr)
        return 2
    print(f"hexhelix plan: no plan: {res.reason or res.status.value}", file=sys.stderr)
    return 1


def export_problem(path: str, problem: PlanProblem, profile: Profile, method: str, args: argparse.Namespace,
                   opts: dict[str, Any]) -> None:
    d = problem.to_dict()
    d["solve"] = {"solver": method, "time_limit": args.time_limit, "seed": args.seed,
                  **{k: v for k, v in opts.items() if k not in ("log", "export_model")}}
    if profile != DEFAULT_PROFILE:
        d["profile"] = profile.to_dict()
    Path(path).write_text(json.dumps(d, indent=1) + "\n")


def run(args: argparse.Namespace) -> int:
    from hexhelix.solver.solve import solve

    problem, profile = problem_from_args(args)
    method, opts = solver_options(args, args.solver)
    if args.export_problem:
        export_problem(args.export_problem, problem, profile, method, args, opts)
    with ticker(f"hexhelix plan [{method}]", args.time_limit):
        res = solve(problem, method, seed=args.seed, profile=profile, time_limit=args.time_limit, options=opts)
    simulation = None
    if args.simulate and res.plan is not None:
        from .simulate import simulate_plan

        simulation = simulate_plan(res.plan, profile, res.evaluation)
    return report(res, args, simulation)
