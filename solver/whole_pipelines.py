"""What whole pipelines would add to a fluid master (a diagnostic, docs/formulation.md §13).

The fluid master of one pipeline count P (§14) takes fractional copies x_s of its columns. Here the
same master over a *fixed* set of columns is solved with integer x (HiGHS MIP): exactly P whole
pipelines within the node capacities, ⌊r_s(t)⌋ micro-batches each, the W floors of the root cell.
Over the columns a converged root run found, the least such t estimates how far branching on
integrality alone (node counts, integer x) could lift that P's root bound. It is *not* a bound (a
column the run never priced could do better), so the search does not use it; benchmarks/fluid_probe.py
prints it beside the root bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import highspy
import numpy as np

from .candidates import CostTables
from .fluid_bound import _Master
from .fluid_certificate import ShapeFloors
from .shape_pricing import Shape


def whole_pipeline_time(tables: CostTables, shapes: Sequence[Shape], pipelines: int, rest_s: float = 0.0,
                        *, rel_tol: float = 1e-6, time_limit: float = 30.0) -> float:
    """Seconds: the least t at which ``pipelines`` whole copies of ``shapes`` (repeats allowed, every
    node's GPUs within its count) run the global batch, each ⌊1 + (t − W − S)/U⌋ micro-batches; inf if
    no such choice exists. ``rest_s`` is the root's floor on sync + optimizer (as in the fluid run)."""
    floors = ShapeFloors(tables, pipelines, rest_s)
    master = _Master([node.count for node in tables.problem.cluster.nodes], pipelines, floors)
    master.whole = True  # ⌊r_s(t)⌋ micro-batches per column (:meth:`_Master._rates`)
    for s in shapes:
        master.add(s)
    master._model()  # the columns' S, W and U
    S, W, U = master._swu
    kept = np.isfinite(W)  # (W = inf: a shape the root cell excludes)
    if not kept.any():
        return math.inf
    S, W, U = S[kept], W[kept], U[kept]
    cols = [s for s, k in zip(master.cols, kept) if k]
    M = tables.micro_batches

    def runs_all(t: float) -> bool:
        live = np.nonzero(S + W <= t)[0]
        if len(live) == 0:
            return False
        rates = master._rates(t)[kept][live]
        h = _mip(master, [cols[i] for i in live], rates, time_limit)
        found = h.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
        return found and -h.getInfo().objective_function_value >= M - 1e-9  # a timed-out MIP's incumbent counts

    lo = float(np.min(S + W))
    hi = float(np.max(S + W + (M - 1) * U))  # every column alone runs the whole batch by then
    if not runs_all(hi):  # no P columns fit the nodes together
        return math.inf
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if runs_all(mid) else (mid, hi)
    return hi


def _mip(master: _Master, cols: list[Shape], rates: np.ndarray, time_limit: float) -> highspy.Highs:
    """max Σ rate_s·x_s over integer x ≥ 0 with Σ x = P and Σ_s gpus_{s,n}·x_s ≤ G_n, solved: the fluid
    master's rows and columns, its count row made an equality."""
    P = float(master.pmax)
    h = master._empty()
    h.changeRowBounds(len(master.caps), P, P)
    master._add_columns(h, cols, P)
    n = len(cols)
    idx = np.arange(n, dtype=np.int32)
    h.changeColsCost(n, idx, -np.asarray(rates, dtype=float))
    h.changeColsIntegrality(n, idx, np.full(n, highspy.HighsVarType.kInteger))
    h.setOptionValue("time_limit", time_limit)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.run()
    return h
