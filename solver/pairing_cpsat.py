"""Barrier-free exact pairing schedule in CP-SAT (shared/reference/dhelix.md §7, CP-SAT-C).

No blocks and no barriers: every op of both strands is an interval; the solver chooses when each
runs. Its model is the overlap model of :mod:`hexhelix.solver.pairing_costs` without barriers, so
every barrier plan (DP, lattice, the paper's default plan) is one of its feasible schedules and
its optimum is a lower bound for all of them.

Model (time in integer ticks; ``tick`` = sequential time / 10⁶):

* ``_add_intervals``: per op i, start S_i, end E_i, size = ⌊d_i⌋ + Σ_{pairs charged to i} ⌊p_ij⌋·o_ij
  (d solo duration, p the pair penalty (1 − OEF)·min(d_i, d_j), charged to the longer op).
* ``_add_precedence``: E_q ≤ S_i for every dependency q → i (the DAG; the four weight-gradient
  GEMMs are sinks, so their place is free).
* ``_add_resources``: NoOverlap over the compute stream (both strands) and over each link.
* ``_add_interference``: for every pair (i, j) on different resources not ordered by the DAG,
  exactly one of {i before j: E_i ≤ S_j}, {j before i: E_j ≤ S_i}, {o_ij: may overlap, penalty
  paid}. This is the exact disjunctive linearisation of "overlapping pairs pay": a schedule where
  i and j intersect must have o_ij = 1.
* ``_set_objective``: minimise the makespan C ≥ E_i, with the redundant C ≥ Σ sizes per resource.
* ``_add_idle_cuts``: redundant cuts that charge an un-overlapped collective its duration on the
  compute stream (see the function); they only tighten the relaxation.

What is exact: the optimum of this model on the integer grid. Durations and penalties are
rounded *down* to ticks, so every float schedule maps to an integer one that is no longer and the
solver's best bound × tick is a rigorous lower bound of the float model. The schedule returned is
re-timed in floats (:func:`retime`: same resource orders, same overlap decisions, float durations,
longest path), so its makespan is exactly what the float model says. The DP plan, re-timed the
same way without its barriers, is passed as a hint and kept as a fallback, so the result is never
worse than the DP even at a time limit. What is approximate: the penalty model itself (see
pairing_costs), not its solution.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ortools.sat.python import cp_model

from .pairing_costs import OverlapModel
from .result import SolveStatus

__all__ = ["barrier_free_windows", "retime", "solve_cpsat"]

_GRID = 1_000_000


def retime(m: OverlapModel, starts: dict[int, float], ends: dict[int, float],
           charged: set[tuple[int, int]]) -> tuple[dict[int, float], dict[int, float]]:
    """Float schedule with the decisions of (``starts``, ``ends``, ``charged``): each resource keeps
    its order, each penalised pair may overlap, every other candidate pair keeps its order, and
    each op starts as early as its arcs allow (longest path, float durations with penalties)."""
    dur = list(m.base)
    for pair in charged:
        who, pen = m.penalty[pair]
        dur[who] += pen
    return _longest_path(m, starts, ends, charged, dur)


def _longest_path(m: OverlapModel, starts: dict, ends: dict, charged: set[tuple[int, int]],
                  dur: list) -> tuple[dict, dict]:
    """Earliest start times under the arcs implied by a schedule's decisions (see :func:`retime`).
    Every arc goes from a smaller to a larger (start, end, index) key, so one sweep suffices."""
    n = len(dur)
    key = {i: (starts[i], ends[i], i) for i in range(n)}
    order = sorted(range(n), key=key.__getitem__)
    preds: list[list[int]] = [list(m.preds[i]) for i in range(n)]
    last: dict[str, int] = {}
    for i in order:
        r = m.resource[i]
        if r in last:
            preds[i].append(last[r])
        last[r] = i
    for (i, j) in m.penalty:
        if (i, j) not in charged:
            a, b = (i, j) if key[i] < key[j] else (j, i)
            preds[b].append(a)
    s: dict = {}
    e: dict = {}
    for i in order:
        s[i] = max((e[q] for q in preds[i]), default=0 * dur[i])
        e[i] = s[i] + dur[i]
    return s, e


def barrier_free_windows(starts: dict[int, float], ends: dict[int, float]) -> list[list[int]]:
    """Split a schedule at every instant where no op is running: the coarsest block list a
    barrier runtime could use without losing time (ops per window, by start)."""
    order = sorted(starts, key=lambda i: (starts[i], ends[i], i))
    windows: list[list[int]] = []
    frontier = -math.inf
    for i in order:
        if not windows or starts[i] >= frontier:
            windows.append([])
        windows[-1].append(i)
        frontier = max(frontier, ends[i])
    return windows


def solve_cpsat(m: OverlapModel, hint: tuple[dict[int, float], dict[int, float], set[tuple[int, int]]],
                options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Solve the barrier-free model. ``hint`` = (starts, ends, charged pairs) of a feasible float
    schedule (the DP plan's blocks laid end to end). ``options``: ``time_limit`` (s, default 9, so
    a solve with model building stays under 10 s),
    ``workers`` (default 2), ``seed`` (default 0), ``export_model`` (path for the proto as text),
    ``log`` (solver log on stdout).

    Returns a dict with status, makespan (float model), starts, ends, charged pairs, bound (s) and
    solve time; ``hint_used`` says whether the fallback beat the solver's own schedule.
    """
    opts = dict(options or {})
    t0 = time.perf_counter()
    hs, he = retime(m, *hint)
    hint_span = max(he.values(), default=0.0)
    if hint_span > max(hint[1].values(), default=0.0):  # re-timing may only gain; float noise aside
        hs, he, hint_span = dict(hint[0]), dict(hint[1]), max(hint[1].values(), default=0.0)
    tick = max(sum(m.base), 1e-12) / _GRID
    model, h = _build(m, tick, hs, he, hint[2])
    if opts.get("export_model"):
        model.export_to_file(str(opts["export_model"]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(opts.get("time_limit", 9.0))
    solver.parameters.num_workers = int(opts.get("workers", 2))
    solver.parameters.random_seed = int(opts.get("seed", 0))
    solver.parameters.log_search_progress = bool(opts.get("log", False))
    if "linearization_level" in opts:
        solver.parameters.linearization_level = int(opts["linearization_level"])
    code = solver.solve(model)
    status = {cp_model.OPTIMAL: SolveStatus.OPTIMAL, cp_model.FEASIBLE: SolveStatus.TIMEOUT,
              cp_model.UNKNOWN: SolveStatus.TIMEOUT}.get(code, SolveStatus.ERROR)
    starts, ends, charged, used_hint = hs, he, set(hint[2]), True
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        n = len(m.base)
        si = {i: float(solver.value(h["start"][i])) for i in range(n)}
        ei = {i: float(solver.value(h["end"][i])) for i in range(n)}
        ch = {p for p, o in h["o"].items() if solver.value(o)}
        # defensive: a pair that intersects on the integer grid pays in floats (exactly_one makes
        # this a no-op for a correct model)
        ch |= {p for p in m.penalty if min(ei[p[0]], ei[p[1]]) > max(si[p[0]], si[p[1]])}
        fs, fe = retime(m, si, ei, ch)
        if max(fe.values(), default=0.0) <= hint_span:
            starts, ends, charged, used_hint = fs, fe, ch, False
    bound = solver.best_objective_bound * tick if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    return {"status": status, "makespan": max(ends.values(), default=0.0), "starts": starts, "ends": ends,
            "charged": charged, "bound": bound, "tick_s": tick, "hint_used": used_hint,
            "solve_time_s": time.perf_counter() - t0, "cp_status": solver.status_name(code),
            "params": {"time_limit": solver.parameters.max_time_in_seconds,
                       "workers": solver.parameters.num_workers, "seed": solver.parameters.random_seed}}


def _build(m: OverlapModel, tick: float, hs: dict[int, float], he: dict[int, float],
           hint_charged: set[tuple[int, int]]) -> tuple[cp_model.CpModel, dict[str, Any]]:
    model = cp_model.CpModel()
    n = len(m.base)
    d0 = [math.floor(b / tick) for b in m.base]
    pen = {p: (who, math.floor(v / tick)) for p, (who, v) in m.penalty.items()}
    horizon = sum(d0) + sum(v for _, v in pen.values()) + 1
    h: dict[str, Any] = {"start": [], "end": [], "o": {}}
    _add_intervals(model, m, d0, pen, horizon, h)
    _add_precedence(model, m, h)
    _add_resources(model, m, h)
    _add_interference(model, m, h)
    C = _set_objective(model, n, horizon, h)
    _add_idle_cuts(model, m, d0, pen, C, h)
    # hint: the DP plan re-timed on the integer grid (same decisions, floored durations)
    istart = {i: hs[i] / tick for i in range(n)}
    iend = {i: he[i] / tick for i in range(n)}
    gs, ge = _int_retime(m, d0, pen, istart, iend, hint_charged)
    for i in range(n):
        model.add_hint(h["start"][i], gs[i])
        model.add_hint(h["end"][i], ge[i])
    for p, o in h["o"].items():
        model.add_hint(o, p in hint_charged)
        i, j = p
        model.add_hint(h["before"][p], p not in hint_charged and (gs[i], ge[i], i) < (gs[j], ge[j], j))
        model.add_hint(h["after"][p], p not in hint_charged and (gs[i], ge[i], i) > (gs[j], ge[j], j))
    span = max(ge.values(), default=0)
    model.add_hint(C, span)
    model.add(C <= span)  # the hint is feasible, so this only prunes
    return model, h


def _int_retime(m: OverlapModel, d0: list[int], pen: dict, s: dict[int, float], e: dict[int, float],
                charged: set[tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    """:func:`retime` on the integer grid (floored durations), for the hint."""
    dur = list(d0)
    for p in charged:
        who, v = pen[p]
        dur[who] += v
    return _longest_path(m, s, e, charged, dur)


def _add_intervals(model: cp_model.CpModel, m: OverlapModel, d0: list[int], pen: dict, horizon: int,
                   h: dict[str, Any]) -> None:
    """S_i, E_i ∈ [0, H]; size_i = ⌊d_i⌋ + Σ ⌊p_ij⌋·o_ij over the pairs charged to i."""
    n = len(d0)
    for p in m.penalty:
        h["o"][p] = model.new_bool_var(f"o_{p[0]}_{p[1]}")
    extra: list[list[Any]] = [[] for _ in range(n)]
    pen_of: list[list[int]] = [[] for _ in range(n)]
    for p, (who, v) in pen.items():
        if v:
            extra[who].append(v * h["o"][p])
            pen_of[who].append(v)
    h["interval"], h["size"], h["resource"] = [], [], m.resource
    for i in range(n):
        s = model.new_int_var(0, horizon, f"S_{i}")
        e = model.new_int_var(0, horizon, f"E_{i}")
        size: Any = d0[i]
        if extra[i]:
            size = model.new_int_var(d0[i], d0[i] + sum(v for v in pen_of[i]), f"D_{i}")
            model.add(size == d0[i] + sum(extra[i]))
        h["start"].append(s)
        h["end"].append(e)
        h["size"].append(size)
        h["interval"].append(model.new_interval_var(s, size, e, f"I_{i}"))


def _add_precedence(model: cp_model.CpModel, m: OverlapModel, h: dict[str, Any]) -> None:
    """E_q ≤ S_i for each dependency q → i."""
    for i, ps in enumerate(m.preds):
        for q in ps:
            model.add(h["end"][q] <= h["start"][i])


def _add_resources(model: cp_model.CpModel, m: OverlapModel, h: dict[str, Any]) -> None:
    """One NoOverlap per resource: the shared compute stream and each link."""
    for r in sorted(set(m.resource)):
        model.add_no_overlap([iv for iv, res in zip(h["interval"], m.resource) if res == r])


def _add_interference(model: cp_model.CpModel, m: OverlapModel, h: dict[str, Any]) -> None:
    """Exactly one of (i before j, j before i, o_ij) for each pair that may overlap."""
    h["before"], h["after"] = {}, {}
    for (i, j), o in h["o"].items():
        b = model.new_bool_var(f"b_{i}_{j}")
        a = model.new_bool_var(f"a_{i}_{j}")
        model.add_exactly_one(b, a, o)
        model.add(h["end"][i] <= h["start"][j]).only_enforce_if(b)
        model.add(h["end"][j] <= h["start"][i]).only_enforce_if(a)
        h["before"][(i, j)], h["after"][(i, j)] = b, a


def _add_idle_cuts(model: cp_model.CpModel, m: OverlapModel, d0: list[int], pen: dict, C: Any,
                   h: dict[str, Any]) -> None:
    """Redundant cut per link L: C ≥ Σ_compute size_i + Σ_{k on L} w_k, with
    w_k ≥ ⌊d_k⌋ − Σ_c o_ck·ub_c, w_k ≥ 0 (ub_c = ⌊d_c⌋ + every penalty that can land on c), and
    its integral form w_k ≥ ⌊d_k⌋·z_k, z_k + Σ_c o_ck ≥ 1 (z_k = 1: no compute op may overlap k).

    Valid because only compute ops with o_ck = 1 can run during collective k (every other compute
    op is ordered against k, by the DAG or by the disjunction), so the compute stream idles for at
    least w_k inside k's span; the collectives of one link never overlap each other, so these idle
    spans are disjoint and add to the compute stream's busy time. It tells the LP relaxation that
    hiding a collective needs compute of the other strand that pays its penalty, which lifts the
    bound above max(compute, link).
    """
    ub = list(d0)
    for who, v in pen.values():
        ub[who] += v
    comp = [i for i, r in enumerate(m.resource) if r == "compute"]
    touching: dict[int, list[Any]] = {}
    touch_pairs: dict[int, list[tuple[int, int]]] = {}
    for (i, j), o in h["o"].items():
        if m.resource[i] == "compute" and m.resource[j] != "compute":
            touching.setdefault(j, []).append(ub[i] * o)
            touch_pairs.setdefault(j, []).append((i, j))
        elif m.resource[j] == "compute" and m.resource[i] != "compute":
            touching.setdefault(i, []).append(ub[j] * o)
            touch_pairs.setdefault(i, []).append((i, j))
    for link in sorted(set(m.resource) - {"compute"}):
        terms = []
        for k, r in enumerate(m.resource):
            if r != link or not d0[k]:
                continue
            w = model.new_int_var(0, d0[k], f"w_{k}")
            model.add(w + sum(touching.get(k, [])) >= d0[k])
            z = model.new_bool_var(f"z_{k}")  # the same cut, integral: no compute op may overlap k
            model.add(z + sum(h["o"][p] for p in touch_pairs.get(k, [])) >= 1)
            model.add(w >= d0[k] * z)
            terms.append(w)
        if terms:
            model.add(C >= sum(h["size"][i] for i in comp) + sum(terms))


def _set_objective(model: cp_model.CpModel, n: int, horizon: int, h: dict[str, Any]) -> Any:
    """min C, C ≥ E_i for every op."""
    C = model.new_int_var(0, horizon, "C")
    for i in range(n):
        model.add(C >= h["end"][i])
    for r in sorted(set(h["resource"])):  # redundant: a resource runs its ops one after another
        model.add(C >= sum(h["size"][i] for i in range(n) if h["resource"][i] == r))
    model.minimize(C)
    return C
