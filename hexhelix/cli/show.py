"""``hexhelix show``: print a program's per-rank token grid (docs/program.md §4 tokens)."""

from __future__ import annotations

import argparse
import sys

from hexhelix.ir.program import Program, format_grid


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="print a program's per-rank instruction tokens",
                       description="Print one line per rank with its instruction tokens (F2.3@1, SA2.3>5#12, "
                                   "GS:b3, ...; see docs/program.md).")
    p.add_argument("program", help="program JSON file")
    p.add_argument("--rank", type=int, action="append", help="only this rank (repeatable)")
    p.add_argument("--width", type=int, default=0, help="pad tokens to this width (default 0: no padding)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.ir.errors import InvalidInputError

    program = Program.load(args.program)
    lines = format_grid(program, width=args.width).splitlines()
    ranks = args.rank if args.rank else range(program.world_size)
    for r in ranks:
        if not 0 <= r < program.world_size:
            raise InvalidInputError(f"rank {r} out of range (world size {program.world_size})", field="--rank")
        sys.stdout.write(lines[r] + "\n")
    return 0
