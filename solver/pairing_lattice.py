"""Exact barrier-model pairing as a shortest path on the cut-point lattice, written as a MILP
(PuLP with CBC or HiGHS) — the oracle the DP must equal (shared/reference/dhelix.md §2.4, §7 MILP-A).

Lattice: node (x, y) = "first x forward and first y backward ops done, barrier here", 0 ≤ x ≤ F,
0 ≤ y ≤ B. Edges, one binary ``e`` each, for every candidate segment:

* (a, y) → (b, y)   cost P(f[a:b], ∅)         for each forward segment [a, b) and every y,
* (x, c) → (x, d)   cost P(∅, b[c:d])         for each backward segment [c, d) and every x,
* (a, c) → (b, d)   cost P(f[a:b], b[c:d])    for each legal pair of segments.

Constraints (``_add_flow``): Σ_out e − Σ_in e = 1 at (0, 0), −1 at (F, B), 0 elsewhere.
Objective (``_set_objective``): min Σ cost·e, costs in microseconds so solver tolerances
(≈1e-7 absolute) sit far below any meaningful time difference. The constraint matrix is a network
matrix (totally unimodular), so the LP relaxation is integral and the MILP is solved at the root;
a DAG has no cycles, so every unit flow is one path = one plan.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import pulp
from hexhelix.ir.errors import InvalidInputError

from .pairing_costs import CostTable
from .pairing_dp import Edge, path_cost
from .result import SolveStatus

__all__ = ["build_lattice", "map_pulp_status", "solve_lattice"]

logger = logging.getLogger(__name__)
_SCALE = 1e6  # seconds -> microseconds in the objective


def build_lattice(table: CostTable) -> tuple[pulp.LpProblem, dict[tuple[tuple[int, int], tuple[int, int], Edge], pulp.LpVariable]]:
    """Build the lattice MILP; returns the model and its edge variables keyed (tail, head, edge)."""
    prob = pulp.LpProblem("pairing_lattice", pulp.LpMinimize)
    edges: dict[tuple[tuple[int, int], tuple[int, int], Edge], float] = {}
    for s in table.fwd_segs:
        for y in range(table.nb + 1):
            edges[((s[0], y), (s[1], y), (s, None))] = table.alone_f[s]
    for s in table.bwd_segs:
        for x in range(table.nf + 1):
            edges[((x, s[0]), (x, s[1]), (None, s))] = table.alone_b[s]
    for (sf, sb), c in table.pair.items():
        edges[((sf[0], sb[0]), (sf[1], sb[1]), (sf, sb))] = c
    var = {k: prob.add_variable(f"e_{k[0][0]}_{k[0][1]}_{k[1][0]}_{k[1][1]}_{_kind(k[2])}", 0, 1, cat=pulp.LpBinary)
           for k in edges}
    _add_flow(prob, table, var)
    _set_objective(prob, edges, var)
    return prob, var


def _kind(e: Edge) -> str:
    return "p" if e[0] and e[1] else ("f" if e[0] else "b")


def _add_flow(prob: pulp.LpProblem, table: CostTable, var: dict) -> None:
    """Unit flow from (0, 0) to (F, B): Σ_out e − Σ_in e = [node = source] − [node = sink]."""
    out: dict[tuple[int, int], list] = {}
    inc: dict[tuple[int, int], list] = {}
    for k, v in var.items():
        out.setdefault(k[0], []).append(v)
        inc.setdefault(k[1], []).append(v)
    src, dst = (0, 0), (table.nf, table.nb)
    for x in range(table.nf + 1):
        for y in range(table.nb + 1):
            node = (x, y)
            rhs = (node == src) - (node == dst)
            if node not in out and node not in inc:
                continue
            prob += (pulp.lpSum(out.get(node, [])) - pulp.lpSum(inc.get(node, [])) == rhs, f"flow_{x}_{y}")


def _set_objective(prob: pulp.LpProblem, edges: dict, var: dict) -> None:
    """min Σ_e P(e)·e, P in microseconds."""
    prob += pulp.lpSum(edges[k] * _SCALE * var[k] for k in edges)


def map_pulp_status(prob: pulp.LpProblem) -> SolveStatus:
    """One mapping for both PuLP backends. PuLP's ``status`` says Optimal for a CBC incumbent
    stopped by the time limit and Not Solved for the in-process HiGHS in that case; only
    ``sol_status`` tells them apart (conventions §6), so it decides."""
    sol = prob.sol_status
    if sol == pulp.LpSolutionOptimal:
        return SolveStatus.OPTIMAL
    if sol == pulp.LpSolutionIntegerFeasible:
        return SolveStatus.TIMEOUT
    if sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return SolveStatus.INFEASIBLE
    if sol == pulp.LpSolutionNoSolutionFound and prob.status == pulp.LpStatusNotSolved:
        return SolveStatus.TIMEOUT
    return SolveStatus.ERROR


def solve_lattice(table: CostTable, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Solve the lattice MILP. ``options``: ``backend`` ("cbc" | "highs"), ``time_limit`` (s),
    ``export_model`` (path for an LP file), ``msg`` (solver log on stdout).

    Returns a dict with status, cost (Σ P of the decoded path, seconds), path, bound, solve time
    and the MILP objective as the solver reported it.
    """
    opts = dict(options or {})
    backend = opts.get("backend", "cbc")
    tl = opts.get("time_limit")
    msg = bool(opts.get("msg", False))
    t0 = time.perf_counter()
    prob, var = build_lattice(table)
    if opts.get("export_model"):
        prob.writeLP(str(opts["export_model"]))
    if backend == "cbc":
        with warnings.catch_warnings():  # the bundled CBC is PULP_CBC_CMD; COIN_CMD needs a system cbc
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=msg, timeLimit=tl)
    elif backend == "highs":
        # threads=1 like the planner's MILP (solver/milp_plan.py): HiGHS keeps one global thread
        # scheduler per process, and a later solve asking for a different thread count fails
        # with kError (seen when a pairing solve preceded a planner solve in one process).
        solver = pulp.HiGHS(msg=msg, timeLimit=tl, threads=1)
    else:
        raise InvalidInputError(f"must be 'cbc' or 'highs', got {backend!r}", field="options.backend")
    prob.solve(solver)
    status = map_pulp_status(prob)
    path: list[Edge] = []
    if status in (SolveStatus.OPTIMAL, SolveStatus.TIMEOUT):
        chosen = {k[0]: k for k, v in var.items() if (v.value() or 0.0) > 0.5}
        node = (0, 0)
        while node != (table.nf, table.nb) and node in chosen:
            k = chosen.pop(node)
            path.append(k[2])
            node = k[1]
        if not path:
            status = SolveStatus.TIMEOUT if status is SolveStatus.TIMEOUT else SolveStatus.ERROR
        elif node != (table.nf, table.nb):
            logger.warning("lattice: decoded flow does not reach the sink; treating as no solution")
            status, path = SolveStatus.ERROR, []
    cost = path_cost(table, path) if path else float("inf")
    obj = pulp.value(prob.objective)
    return {"status": status, "cost": cost, "path": path,
            "bound": cost if status is SolveStatus.OPTIMAL else None,
            "objective_us": obj, "solve_time_s": time.perf_counter() - t0,
            "backend": backend, "variables": len(var)}
