"""``hexhelix simulate``: replay a compiled program in the discrete-event simulator."""

from __future__ import annotations

import argparse
from typing import Any

from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import Profile
from hexhelix.ir.program import Program

from .common import emit_json, progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a compiled program: timeline, bubbles, memory, trace",
                       description="Replay a program (hexhelix.program/1, from `hexhelix compile`) over all ranks "
                                   "with the per-op durations and bytes it carries: one compute stream and one "
                                   "stream per link class per rank, rendezvous point-to-point, collectives that "
                                   "wait for every member. Prints iteration time, bubble fraction, exposed "
                                   "communication and per-rank peak memory against capacity. A deadlock stops "
                                   "with the wait-for cycle (exit 1).")
    p.add_argument("program", help="program JSON file")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace JSON (open in https://ui.perfetto.dev)")
    p.add_argument("--gantt", metavar="FILE", help="write a Gantt chart PNG (small programs only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema hexhelix.sim/1)")
    p.add_argument("--p2p", choices=["rendezvous", "eager"], default="rendezvous",
                   help="rendezvous: a transfer starts once both ends are posted (default); eager: when sent")
    p.add_argument("--pair-oef", type=float, default=None, metavar="X",
                   help="override every PAIR's time with Ta+Tb-X*min(Ta,Tb) (default: the program's estimate)")
    p.add_argument("--comm-scale", type=float, default=1.0, metavar="X",
                   help="multiply every transfer and collective time (0 = free communication)")
    p.add_argument("--recv-ahead", type=int, default=0, metavar="N",
                   help="post every RECV N compute ops earlier than the program places it (the compiler "
                        "already posts one op ahead; default 0 = as compiled)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.runtime.sim import SimOptions, simulate

    try:
        opts = SimOptions(p2p=args.p2p, pair_oef=args.pair_oef, comm_scale=args.comm_scale,
                          recv_ahead=args.recv_ahead, record=bool(args.trace or args.gantt))
    except InvalidInputError as err:
        raise InvalidInputError(err.message, field="--" + (err.field or "").replace("_", "-")) from None
    program = Program.load(args.program)
    result = simulate(program, opts)
    if args.trace:
        from hexhelix.runtime.trace import write_chrome_trace

        write_chrome_trace(result, args.trace)
        progress(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    if args.gantt:
        from hexhelix.runtime.gantt import write_gantt

        write_gantt(result, args.gantt)
        progress(f"wrote {args.gantt}")
    if args.json:
        emit_json(result.to_dict())
    else:
        print(f"{args.program}: {program.schedule}, {program.world_size} ranks, {result.instructions} instructions")
        print(result.format_table())
        over = result.over_capacity_ranks
        if over:
            print(f"warning: ranks {', '.join(map(str, over))} exceed their GPU memory")
    return 0


def simulate_plan(plan: Plan, profile: Profile, evaluation: Any = None) -> dict[str, Any]:
    """Compile ``plan`` (its own schedule) and simulate it: the summary ``hexhelix plan --simulate``
    adds to its output, with the evaluator's prediction beside it when ``evaluation`` is given."""
    from hexhelix.runtime.sim import SimOptions, simulate
    from hexhelix.solver.compile import compile_plan

    program = compile_plan(plan, plan.problem.schedule, profile)
    res = simulate(program, SimOptions(record=False))
    out = {"schedule": program.schedule, "instructions": res.instructions, **res.summary()}
    if evaluation is not None:
        out["predicted_iteration_s"] = evaluation.iteration_time_s
        out["simulated_vs_predicted"] = res.makespan_s / evaluation.iteration_time_s - 1.0
    return out


def format_simulation(sim: dict[str, Any]) -> str:
    """Human-readable lines for :func:`simulate_plan`'s summary."""
    line = (f"  simulated ({sim['schedule']}, {sim['instructions']} instructions): iteration {sim['makespan_s']:.4f} s, "
            f"bubble {100 * sim['bubble_fraction']:.1f} %, exposed comm {sim['exposed_comm_s']:.4f} s per rank")
    if "simulated_vs_predicted" in sim:
        line += f" ({100 * sim['simulated_vs_predicted']:+.1f} % vs the cost model)"
    gib = 2.0**30
    peak = max(sim["peak_memory_bytes"], default=0) / gib
    line += f"\n  simulated peak memory {peak:.2f} GiB on the fullest GPU"
    if sim["over_capacity_ranks"]:
        line += f"; over capacity on ranks {', '.join(map(str, sim['over_capacity_ranks']))}"
    return line
