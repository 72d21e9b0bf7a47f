"""``hexhelix compile``: a plan → per-rank programs (hexhelix.program/1), validated and dry-run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hexhelix.ir.files import read_structured_file
from hexhelix.ir.plan import Plan

from .common import progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile a plan into per-rank programs (validated, dry-run)",
                       description="Lower a plan (hexhelix.plan/1) with a pipeline schedule into one instruction "
                                   "list per rank (docs/program.md), run the static validator and the multi-rank "
                                   "dry run, and write the program JSON. Exit 1 with the first problem when the "
                                   "program is invalid or would deadlock.")
    p.add_argument("plan", help="plan file (JSON or YAML, schema hexhelix.plan/1)")
    p.add_argument("--schedule", choices=["gpipe", "1f1b", "wshape"], default=None,
                   help="pipeline schedule (default: the plan's)")
    p.add_argument("-o", "--output", help="program JSON to write (default: stdout)")
    p.add_argument("--torch-csv", metavar="FILE", default=None,
                   help="also write PyTorch pipelining's compute_comms CSV (one pipeline, one strand, TP 1); its "
                        "RECVs sit right before their consumers, as torch's _simulate_comms_compute treats a "
                        "RECV as blocking")
    p.add_argument("--recv-ahead", type=int, default=1, metavar="N",
                   help="post every RECV N compute ops before the op that consumes it, so rendezvous transfers "
                        "overlap the receiver's compute (docs/program.md §4; 0: right before it; default 1)")
    p.add_argument("--profile", default=None, help="profile JSON for the per-op estimates (default: documented "
                   "defaults)")
    p.add_argument("--pair", action="store_true",
                   help="wshape: solve DHelix segment pairing per (GPU type, TP degree) with the dp solver, "
                        "expand every co-executed tick per layer pair and use the pairing's saving in the "
                        "estimates (the blocks are recorded in meta.pairing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hexhelix.ir.dryrun import dry_run
    from hexhelix.ir.profile import load_profile
    from hexhelix.ir.torch_csv import to_torch_csv
    from hexhelix.ir.validate import format_finding, validate
    from hexhelix.solver.compile import compile_plan

    plan = _load_plan(args.plan)
    profile = load_profile(args.profile)
    pairing = None
    if args.pair:
        from hexhelix.ir.errors import UnsupportedError
        from hexhelix.solver.pairing import stage_pairings

        if (args.schedule or plan.problem.schedule) != "wshape":
            raise UnsupportedError("--pair applies to the wshape schedule only")
        pairing = stage_pairings(plan, profile)
    program = compile_plan(plan, args.schedule, profile, pairing, recv_ahead=args.recv_ahead)
    findings = validate(program)
    if findings:
        print(f"hexhelix compile: invalid program: {format_finding(findings[0])}", file=sys.stderr)
        return 1
    rep = dry_run(program)
    if rep.error is not None:
        print(f"hexhelix compile: {rep.error}", file=sys.stderr)
        return 1
    csv_text = None
    if args.torch_csv:  # torch's CSV simulator blocks at a RECV: export the recv_ahead=0 placement
        late = program if args.recv_ahead == 0 else compile_plan(plan, args.schedule, profile, pairing,
                                                                  estimates=False, recv_ahead=0)
        csv_text = to_torch_csv(late)
    text = program.to_json()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    if csv_text is not None:
        Path(args.torch_csv).write_text(csv_text)
    n = sum(len(p) for p in program.programs)
    progress(f"{args.output or 'stdout'}: {program.schedule}, {program.world_size} ranks, {len(program.pipes)} "
             f"pipeline(s), {n} instructions; valid; dry run finished (estimated step {rep.makespan_s:.3f} s)")
    return 0


def _load_plan(path: str) -> Plan:
    return Plan.from_dict(read_structured_file(path), source=path)
