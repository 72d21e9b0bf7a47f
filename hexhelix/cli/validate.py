"""``hexhelix validate``: static checks and the multi-rank dry run of a program file."""

from __future__ import annotations

import argparse
import sys

from hexhelix.ir.program import Program


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a program: static rules and a deadlock dry run",
                       description="Validate a program (hexhelix.program/1): schema and references, completeness "
                                   "and order per (pipeline, stage, micro-batch, strand), SEND/RECV matching and "
                                   "per-channel FIFO, TP lock-step, collective order, strand barriers, the "
                                   "gradient-sync slice plan, then a multi-rank dry run. Exit 0 when valid; "
                                   "otherwise exit 1 and print the first problem.")
    p.add_argument("program", help="program JSON file")
    p.add_argument("--all", action="store_true", help="print every finding, not just the first")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.ir.dryrun import dry_run
    from hexhelix.ir.validate import format_finding, validate

    program = Program.load(args.program)
    findings = validate(program, stop_early=not args.all)
    if findings:
        shown = findings if args.all else findings[:1]
        for f in shown:
            print(f"{args.program}: {format_finding(f)}", file=sys.stderr)
        if not args.all and len(findings) > 1:
            print(f"({len(findings) - 1} more finding(s); --all lists them)", file=sys.stderr)
        return 1
    rep = dry_run(program)
    if rep.error is not None:
        print(f"{args.program}: {rep.error}", file=sys.stderr)
        return 1
    n = sum(len(p) for p in program.programs)
    print(f"{args.program}: valid ({program.schedule}, {program.world_size} ranks, {n} instructions; dry run "
          f"finished, estimated step {rep.makespan_s:.3f} s)")
    return 0
