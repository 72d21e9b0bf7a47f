"""``hexhelix solve problem.json``: re-solve an exported problem (schema ``hexhelix.problem/1``).

``kind: plan`` (from ``hexhelix plan --export-problem``) is solved with the solver and settings
recorded in the file unless flags override them; ``kind: pairing`` is handed to the pairing solver
(:func:`hexhelix.solver.pairing.solve_pairing_problem`).
"""

from __future__ import annotations

import argparse
import importlib

from hexhelix.ir.checks import check_seconds
from hexhelix.ir.errors import InvalidInputError, UnsupportedError
from hexhelix.ir.files import read_structured_file
from hexhelix.ir.plan import PROBLEM_SCHEMA, PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.typed import checked

from .common import emit_json
from .plan import report, ticker


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="re-solve an exported problem file (hexhelix.problem/1)",
                       description="Solve a problem exported by `hexhelix plan --export-problem` (kind plan) "
                                   "or by the pairing tools (kind pairing).")
    p.add_argument("problem", help="problem file (JSON or YAML)")
    p.add_argument("--solver", help="override the solver recorded in the file")
    p.add_argument("--time-limit", type=float, help="override the time limit (seconds)")
    p.add_argument("--seed", type=int, help="override the seed")
    p.add_argument("-o", "--output", help="write the plan to this file (kind plan)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--log", action="store_true", help="include the solver log")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    d = read_structured_file(args.problem)
    if not isinstance(d, dict) or d.get("schema") != PROBLEM_SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else type(d).__name__
        raise InvalidInputError(f"expected schema {PROBLEM_SCHEMA!r}, got {got!r}; export it with "
                                "`hexhelix plan --export-problem`", source=args.problem, field="schema")
    kind = d.get("kind")
    if kind == "pairing":
        try:
            mod = importlib.import_module("hexhelix.solver.pairing")
            fn = mod.solve_pairing_problem
        except (ImportError, AttributeError):
            raise UnsupportedError("kind 'pairing' needs hexhelix.solver.pairing.solve_pairing_problem, "
                                   "which this installation lacks") from None
        out = fn(d)
        emit_json(out)
        return 0
    if kind != "plan":
        raise InvalidInputError(f"unknown problem kind {kind!r}; expected 'plan' or 'pairing'", source=args.problem,
                                field="kind")
    from hexhelix.solver.solve import solve

    problem = PlanProblem.from_dict(d, source=args.problem)
    profile = Profile.from_dict(d["profile"], source=args.problem) if d.get("profile") else DEFAULT_PROFILE
    settings = d.get("solve") or {}
    if not isinstance(settings, dict):
        raise InvalidInputError(f"must be an object of solver settings, got {settings!r}", source=args.problem,
                                field="solve")
    try:
        settings = dict(settings)
        method = args.solver or checked(settings.pop("solver", "cpsat"), str, "solve.solver")
        settings.pop("solver", None)
        if method == "milp":
            method = f"milp-{checked(settings.get('backend', 'highs'), str, 'solve.backend')}"
        limit = args.time_limit if args.time_limit is not None else check_seconds(
            settings.pop("time_limit", 60.0), "solve.time_limit", positive=True)
        settings.pop("time_limit", None)
        seed = args.seed if args.seed is not None else checked(settings.pop("seed", 0), int, "solve.seed")
        settings.pop("seed", None)
    except InvalidInputError as err:
        raise err.with_source(args.problem) from None
    settings["log"] = args.log
    with ticker(f"hexhelix solve [{method}]", limit):
        res = solve(problem, method, seed=seed, profile=profile, time_limit=limit, options=settings)
    return report(res, args)
