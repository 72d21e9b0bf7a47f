"""``hexhelix compare``: every planner side by side on one problem, each plan scored by the one
evaluator, with each plan's throughput relative to the best proven bound (1.0 = provably optimal)."""

from __future__ import annotations

import argparse

from hexhelix.ir.errors import InvalidInputError

from .common import add_model_args, cell, emit_json, progress
from .plan import add_solver_args, problem_from_args, solver_options, ticker

DEFAULT_SOLVERS = "cpsat,milp,hexiscale,hexiscale-released,megatron"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run several planners on one problem and compare them",
                       description="Run each solver (same seed, time limit and cost model) and print a table: "
                                   "iteration time, throughput, proven bound and gap, solve time, and throughput "
                                   "relative to the best bound. The heuristics run first; the best plan among them "
                                   "starts the exact solvers (whose time then excludes the heuristics').")
    add_model_args(p)
    add_solver_args(p)
    p.add_argument("--solvers", default=DEFAULT_SOLVERS, help=f"comma-separated (default {DEFAULT_SOLVERS}); "
                   "milp uses --backend, or name milp-cbc / milp-highs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.solver.solve import compare, relative_to_bound

    problem, profile = problem_from_args(args)
    names = list(dict.fromkeys(s.strip() for s in args.solvers.split(",") if s.strip()))  # each once, in order
    if not names:
        raise InvalidInputError(f"names no solver, got {args.solvers!r}; e.g. --solvers {DEFAULT_SOLVERS}",
                                field="--solvers")
    methods, opts = [], {}
    for n in names:
        m, opts = solver_options(args, n)
        methods.append(m)
    with ticker("hexhelix compare", args.time_limit * len(methods)):
        results = compare(problem, methods, opts, seed=args.seed, profile=profile, time_limit=args.time_limit,
                          on_result=lambda r: progress(f"hexhelix compare: {r.solver} {r.status.value} "
                                                       f"in {r.solve_time_s:.1f} s"))
    best, rel = relative_to_bound(results)
    if args.json:
        out = []
        for r, x in zip(results, rel):
            d = r.to_dict(with_log=args.log)
            d["throughput_vs_best_bound"] = x
            out.append(d)
        emit_json({"problem": {"cluster": problem.cluster.name, "model": problem.model.name,
                               "global_batch": problem.training.global_batch,
                               "micro_batch": problem.training.micro_batch, "seq_len": problem.training.seq_len},
                   "best_bound_s": best, "results": out})
        return 0 if any(r.plan is not None for r in results) else 1
    print(f"{problem.model.name} on {problem.cluster.name} ({problem.cluster.num_gpus} GPUs), global batch "
          f"{problem.training.global_batch}, micro-batch {problem.training.micro_batch}, seq {problem.training.seq_len}")
    head = f"{'solver':<20} {'status':<10} {'iter s':>9} {'tokens/s':>10} {'MFU':>6} {'bound s':>9} {'gap':>8} " \
           f"{'vs bound':>8} {'time s':>7}"
    print(head)
    print("-" * len(head))
    for r, x in zip(results, rel):
        ev = r.evaluation
        print(f"{r.solver:<20} {r.status.value:<10} {cell(ev.iteration_time_s if ev else None, '9.4f')} "
              f"{cell(ev.throughput_tokens_per_s if ev else None, '10,.0f')} {cell(ev.mfu if ev else None, '6.1%')} "
              f"{cell(r.bound_s, '9.4f')} {cell(r.gap, '8.2%')} {cell(x, '8.3f')} {r.solve_time_s:7.1f}")
    for r in results:
        if r.reason:
            print(f"  {r.solver}: {r.reason}")
    print(f"best proven bound: {cell(best, '.4f')} s; 'vs bound' = bound / iteration time (1.000 = provably optimal)")
    return 0 if any(r.plan is not None for r in results) else 1
